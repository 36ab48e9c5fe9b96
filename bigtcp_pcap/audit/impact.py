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


class FlowTally:
    """Counts per flow: packets, one count per named flag, wire bytes and true payload bytes."""

    def __init__(self, flag_names: tuple[str, ...]):
        self.flag_names = flag_names
        self._rows: dict[tuple, list[int]] = {}

    def add(self, pb: PacketBatch, idx: np.ndarray, **flags: np.ndarray) -> None:
        """Tally rows ``idx`` of ``pb``; each flag array is indexed like ``pb`` (bool per row).

        The rows are grouped by flow with numpy first (a BIG TCP capture flags nearly every super-packet of a
        few flows), so Python touches one entry per flow and batch."""
        idx = np.asarray(idx, np.int64)
        if idx.size == 0:
            return
        ver, proto = pb.ip_version[idx], pb.l4_proto[idx]
        sport, dport = pb.sport[idx], pb.dport[idx]
        key = np.empty((idx.size, 38), np.uint8)
        key[:, 0] = ver
        key[:, 1:17] = pb.src[idx]
        key[:, 17:33] = pb.dst[idx]
        key[:, 33] = proto
        key[:, 34:36] = sport.astype(">u2").view(np.uint8).reshape(-1, 2)
        key[:, 36:38] = dport.astype(">u2").view(np.uint8).reshape(-1, 2)
        _, first, inv = np.unique(key.view(np.dtype((np.void, 38))).ravel(), return_index=True,
                                  return_inverse=True)
        inv = inv.ravel()
        groups = first.size

        def total(values: np.ndarray) -> list[int]:
            if idx.size <= 1 << 20:  # float64 sums of at most 2^20 values below 2^32 are exact
                return np.rint(np.bincount(inv, weights=values.astype(np.float64), minlength=groups)).astype(
                    np.int64).tolist()
            out = np.zeros(groups, np.int64)
            np.add.at(out, inv, values.astype(np.int64))
            return out.tolist()

        sums = [np.bincount(inv, minlength=groups).tolist()]
        sums += [total(flags[name][idx]) for name in self.flag_names]
        sums += [total(pb.wirelen[idx]), total(true_payload(pb, idx))]
        ver_l, proto_l, sport_l, dport_l = ver.tolist(), proto.tolist(), sport.tolist(), dport.tolist()
        src, dst = pb.src[idx], pb.dst[idx]
        for g, j in enumerate(first.tolist()):
            k = (ver_l[j], src[j].tobytes(), dst[j].tobytes(), proto_l[j], sport_l[j], dport_l[j])
            row = self._rows.get(k)
            if row is None:
                row = self._rows[k] = [0] * (3 + len(self.flag_names))
            for c, col in enumerate(sums):
                row[c] += col[g]

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
