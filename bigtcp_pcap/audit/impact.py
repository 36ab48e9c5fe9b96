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
        """Tally rows ``idx`` of ``pb``; each flag array is indexed like ``pb`` (bool per row)."""
        if idx.size == 0:
            return
        payload = true_payload(pb, idx).tolist()
        wire = pb.wirelen[idx].astype(np.int64).tolist()
        cols = [flags[name][idx].tolist() for name in self.flag_names]
        ver, proto = pb.ip_version[idx].tolist(), pb.l4_proto[idx].tolist()
        sport, dport = pb.sport[idx].tolist(), pb.dport[idx].tolist()
        src, dst = pb.src[idx], pb.dst[idx]
        for j in range(idx.size):
            key = (ver[j], src[j].tobytes(), dst[j].tobytes(), proto[j], sport[j], dport[j])
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = [0] * (3 + len(self.flag_names))
            row[0] += 1
            for k, c in enumerate(cols):
                row[1 + k] += bool(c[j])
            row[-2] += wire[j]
            row[-1] += payload[j]

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
