"""Hand-made TCP segment streams as PacketBatch rows: for the rule tests, examples and benchmarks.

A packet is a dict of PacketBatch column values; ``build_batch`` fills everything a decoder would derive
(lengths, offsets, frame numbers) so a test states only what matters to the rule under test::

    f = SynthFlow(ip_version=6, mss=1428)
    batch = build_batch(f.segments(64) + [f.pure_ack()])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..decode.schema import TH_ACK, TH_PSH, PacketBatch

ETH_LEN = 14


def _addr(v: int | bytes, ip_version: int) -> np.ndarray:
    if isinstance(v, (bytes, bytearray)):
        raw = bytes(v)
    else:
        raw = int(v).to_bytes(4 if ip_version == 4 else 16, "big")
    out = np.zeros(16, np.uint8)
    out[: len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def build_batch(pkts: list[dict[str, Any]], first_frame: int = 1) -> PacketBatch:
    """PacketBatch of TCP packets described by dicts (missing fields derived or defaulted, see ``_fill``)."""
    b = PacketBatch.empty(len(pkts))
    for i, p in enumerate(pkts):
        p = _fill(p)
        for name, v in p.items():
            if name in ("src", "dst"):
                getattr(b, name)[i] = _addr(v, p["ip_version"])
            elif name != "flow_id":
                getattr(b, name)[i] = v
        b.frame[i] = p.get("frame", first_frame + i)
    return b


def flow_ids(pkts: list[dict[str, Any]]) -> np.ndarray:
    """The ``flow_id`` of each packet dict (default 0)."""
    return np.array([p.get("flow_id", 0) for p in pkts], dtype=np.int64)


def _fill(p: dict[str, Any]) -> dict[str, Any]:
    p = dict(p)
    v = p.setdefault("ip_version", 6)
    p.setdefault("linktype", 1)
    l2 = p.setdefault("l2_len", ETH_LEN)
    p.setdefault("l3_off", l2)
    p.setdefault("ip_hdr_len", 20 if v == 4 else 40)
    p.setdefault("l4_proto", 6)
    p.setdefault("tcp_hdr_len", 32)
    pay = p.setdefault("tcp_payload_len", 0)
    ip_len = p.setdefault("ip_len", p["ip_hdr_len"] + p["tcp_hdr_len"] + pay)
    p.setdefault("ip_len_field", ip_len if v == 4 else ip_len - 40)
    p.setdefault("wirelen", p["l3_off"] + ip_len)
    p.setdefault("caplen", min(p["wirelen"], 128))
    p.setdefault("l4_off", p["l3_off"] + p["ip_hdr_len"])
    p.setdefault("src", 0x0A000001 if v == 4 else 0xFD00_00B1 << 96 | 1)
    p.setdefault("dst", 0x0A000002 if v == 4 else 0xFD00_00B1 << 96 | 2)
    p.setdefault("l2_hash", 0x1234)
    p.setdefault("ttl", 64)
    p.setdefault("df", 1 if v == 4 else 0)
    p.setdefault("tcp_flags", TH_ACK)
    p.setdefault("tcp_win", 512)
    return p


class SynthFlow:
    """Consecutive segments of one TCP direction: seq, IPv4 ID and time advance per segment."""

    def __init__(self, ip_version: int = 6, mss: int = 1428, sport: int = 40000, dport: int = 5201,
                 seq: int = 1000, ack: int = 1, tcp_hdr_len: int = 32, opt_hash: int = 0xAB, t0_ns: int = 0,
                 spacing_ns: int = 1000, ip_id: int = 100, flow_id: int = 0, **fixed: Any) -> None:
        self.ip_version = ip_version
        self.mss = mss
        self.seq = seq
        self.ip_id = ip_id
        self.t = t0_ns
        self.spacing_ns = spacing_ns
        self.base: dict[str, Any] = {"ip_version": ip_version, "sport": sport, "dport": dport, "tcp_ack": ack,
                                         "tcp_hdr_len": tcp_hdr_len, "tcp_opt_hash": opt_hash, "flow_id": flow_id}
        self.base.update(fixed)

    def _next(self, payload: int, **over: Any) -> dict[str, Any]:
        p = dict(self.base)
        p.update(tcp_payload_len=payload, tcp_seq=self.seq & 0xFFFFFFFF, ts_ns=self.t, ip_id=self.ip_id & 0xFFFF)
        p.update(over)
        self.seq = (p["tcp_seq"] + payload) & 0xFFFFFFFF
        if "ip_id" not in over:  # an explicit ID does not consume the flow's next one
            self.ip_id += 1
        self.t = p["ts_ns"] + self.spacing_ns
        return p

    def segment(self, payload: int | None = None, **over: Any) -> dict[str, Any]:
        """The next data segment (full MSS unless ``payload`` is given); ``over`` overrides any column."""
        return self._next(self.mss if payload is None else payload, **over)

    def segments(self, n: int, payload: int | None = None, last_psh: bool = False, **over: Any) -> list[dict]:
        """n consecutive segments; with ``last_psh`` the last one carries PSH."""
        out = [self.segment(payload, **over) for _ in range(n)]
        if last_psh and out:
            out[-1]["tcp_flags"] = out[-1].get("tcp_flags", TH_ACK) | TH_PSH
        return out

    def pure_ack(self, **over: Any) -> dict[str, Any]:
        """A zero-payload ACK in this direction (does not advance seq)."""
        return self._next(0, **over)

    def gap(self, ns: int) -> None:
        """Let ns of idle time pass before the next packet."""
        self.t += ns


ENGINE = "reference"
"""The engine ``simulate`` builds when none is named (tests/gro/test_rules.py runs every rule on both)."""


def simulate(pkts: list[dict[str, Any]], config: Any = None, *, engine: str | None = None, **config_kw: Any) -> Any:
    """Feed packet dicts to a fresh GRO engine (``engine``: "reference" or "compiled", default ``ENGINE``) with
    ``config`` or ``GroConfig(**config_kw)``, flush, return all rows."""
    from . import make_engine
    from .config import GroConfig
    from .superpacket import SuperPacketBatch

    eng = make_engine(engine or ENGINE, config if config is not None else GroConfig(**config_kw))
    return SuperPacketBatch.concat([eng.feed(build_batch(pkts), flow_ids(pkts)), eng.flush()])


def bulk_stream(n: int, nflows: int = 1, mss: int = 1428, burst: int = 45, burst_gap_ns: int = 50_000,
                spacing_ns: int = 1000, interleave: str = "burst") -> tuple[PacketBatch, np.ndarray]:
    """A large IPv6 bulk-transfer stream, built vectorized (for benchmarks): (batch, flow_id).

    Each flow sends bursts of ``burst`` MSS segments, the last with PSH, TSval ticking every 200 segments.
    ``interleave="burst"`` sends whole bursts flow after flow (a busy link); ``"packet"`` alternates flows
    packet by packet (worst case: every super-packet is one segment).
    """
    idx = np.arange(n)
    if interleave == "packet":
        fl, k = idx % nflows, idx // nflows
    else:
        blk = idx // burst
        fl, k = blk % nflows, (blk // nflows) * burst + idx % burst
    b = PacketBatch.empty(n)
    b.frame[:] = idx + 1
    b.ts_ns[:] = idx * spacing_ns + (idx // burst) * burst_gap_ns
    b.linktype[:] = 1
    b.ip_version[:] = 6
    b.l2_len[:] = ETH_LEN
    b.l3_off[:] = ETH_LEN
    b.ip_hdr_len[:] = 40
    b.tcp_hdr_len[:] = 32
    b.tcp_payload_len[:] = mss
    b.ip_len[:] = 72 + mss
    b.ip_len_field[:] = 32 + mss
    b.wirelen[:] = ETH_LEN + 72 + mss
    b.caplen[:] = 96
    b.l4_proto[:] = 6
    b.sport[:] = 40000 + fl
    b.dport[:] = 5201
    b.src[:, 0], b.src[:, 15] = 0xFD, 1
    b.dst[:, 0], b.dst[:, 15] = 0xFD, 2
    b.ttl[:] = 64
    b.tcp_win[:] = 512
    b.tcp_opt_hash[:] = 7 + k // 200
    b.tcp_seq[:] = (1000 + k * mss) & 0xFFFFFFFF
    b.tcp_ack[:] = 1
    b.tcp_flags[:] = TH_ACK
    b.tcp_flags[(k % burst) == burst - 1] |= TH_PSH
    return b, fl.astype(np.int64)
