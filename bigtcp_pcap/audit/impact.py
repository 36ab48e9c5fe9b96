"""Per-flow tally of the frames an audit flags: one running counter row per directional 5-tuple.

Shared by the cBPF and eBPF audits. Memory grows with the number of affected flows, not with the number of
flagged frames, so a long BIG TCP capture in which every super-packet is missed stays small.
"""

from __future__ import annotations

import ipaddress

import numpy as np

from ..decode.schema import PacketBatch

PROTO_NAMES = {6: "tcp", 17: "udp", 58: "icmp6", 1: "icmp", 132: "sctp"}


def _addr(ver: int, raw: bytes) -> str:
    if ver == 4:
        return str(ipaddress.IPv4Address(raw[:4]))
    if ver == 6:
        return str(ipaddress.IPv6Address(raw))
    return ""


def true_payload(pb: PacketBatch, idx: np.ndarray) -> np.ndarray:
    """True L4 payload bytes of rows ``idx`` (TCP from the IP length, UDP from its length, else IP payload)."""
    proto = pb.l4_proto[idx]
    return np.where(proto == 6, pb.tcp_payload_len[idx].astype(np.int64),
                    np.where(proto == 17, np.maximum(pb.udp_len[idx].astype(np.int64) - 8, 0),
                             np.maximum(pb.ip_len[idx].astype(np.int64) - pb.ip_hdr_len[idx], 0)))


class FlowGroups:
    """The directional 5-tuple of every row of a batch: ``inverse[i]`` is row i's group, ``keys[g]`` its key."""

    def __init__(self, inverse: np.ndarray, first: np.ndarray, keys: list[tuple]):
        self.inverse = inverse
        self.first = first
        self.keys = keys


def flow_groups(pb: PacketBatch) -> FlowGroups:
    """Group the rows of ``pb`` by (IP version, src, dst, protocol, sport, dport) with one sort."""
    n = len(pb)
    key = np.empty((n, 38), np.uint8)
    key[:, 0] = pb.ip_version
    key[:, 1:17] = pb.src
    key[:, 17:33] = pb.dst
    key[:, 33] = pb.l4_proto
    key[:, 34:36] = pb.sport.astype(">u2").view(np.uint8).reshape(-1, 2)
    key[:, 36:38] = pb.dport.astype(">u2").view(np.uint8).reshape(-1, 2)
    _, first, inv = np.unique(key.view(np.dtype((np.void, 38))).ravel(), return_index=True, return_inverse=True)
    ver, proto = pb.ip_version[first].tolist(), pb.l4_proto[first].tolist()
    sport, dport = pb.sport[first].tolist(), pb.dport[first].tolist()
    keys = [(ver[j], pb.src[i].tobytes(), pb.dst[i].tobytes(), proto[j], sport[j], dport[j])
            for j, i in enumerate(first.tolist())]
    return FlowGroups(inv.ravel(), first, keys)


class FlowTally:
    """Counts per flow: packets, one count per named flag, wire bytes and true payload bytes."""

    def __init__(self, flag_names: tuple[str, ...]):
        self.flag_names = flag_names
        self._rows: dict[tuple, list[int]] = {}

    def add(self, pb: PacketBatch, idx: np.ndarray, groups: FlowGroups | None = None, **flags: np.ndarray) -> None:
        """Tally rows ``idx`` of ``pb``; each flag array is indexed like ``pb`` (bool per row).

        The rows are grouped by flow with numpy first (a BIG TCP capture flags nearly every super-packet of a
        few flows), so Python touches one entry per flow and batch. ``groups`` (``flow_groups(pb)``) lets
        several tallies of one batch share that grouping."""
        idx = np.asarray(idx, np.int64)
        if idx.size == 0:
            return
        g = flow_groups(pb) if groups is None else groups
        inv = g.inverse[idx]
        n = g.first.size

        def total(values: np.ndarray) -> np.ndarray:
            if idx.size <= 1 << 20:  # float64 sums of at most 2^20 values below 2^32 are exact
                return np.rint(np.bincount(inv, weights=values.astype(np.float64), minlength=n)).astype(np.int64)
            out = np.zeros(n, np.int64)
            np.add.at(out, inv, values.astype(np.int64))
            return out

        count = np.bincount(inv, minlength=n)
        present = np.flatnonzero(count)
        sums = [count[present].tolist()]
        sums += [total(flags[name][idx])[present].tolist() for name in self.flag_names]
        sums += [total(pb.wirelen[idx])[present].tolist(), total(true_payload(pb, idx))[present].tolist()]
        for c_i, grp in enumerate(present.tolist()):
            k = g.keys[grp]
            row = self._rows.get(k)
            if row is None:
                row = self._rows[k] = [0] * (3 + len(self.flag_names))
            for c, col in enumerate(sums):
                row[c] += col[c_i]

    def rows(self) -> list[dict]:
        """One dict per flow, most wire bytes first: src, sport, dst, dport, proto, packets, <flags>, bytes."""
        out = []
        for (ver, src, dst, proto, sport, dport), r in self._rows.items():
            d = {"src": _addr(ver, src), "sport": sport, "dst": _addr(ver, dst), "dport": dport,
                 "proto": PROTO_NAMES.get(proto, str(proto)), "packets": r[0]}
            d.update({name: r[1 + k] for k, name in enumerate(self.flag_names)})
            d["wire_bytes"], d["payload_bytes"] = r[-2], r[-1]
            out.append(d)
        out.sort(key=lambda d: (d["wire_bytes"], d["packets"]), reverse=True)
        return out
