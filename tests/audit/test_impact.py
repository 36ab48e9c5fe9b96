"""FlowTally groups flagged frames per flow; checked against a plain per-frame tally on the kernel captures."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bigtcp_pcap.audit.impact import FlowTally, _addr, flow_groups, true_payload
from bigtcp_pcap.capture import CaptureReader
from bigtcp_pcap.decode import decode

KERNEL = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"


def _reference(batches) -> dict:
    rows: dict = {}
    for pb, idx, missed in batches:
        pay = true_payload(pb, idx)
        for n, i in enumerate(idx.tolist()):
            v = int(pb.ip_version[i])
            k = (_addr(v, pb.src[i].tobytes()), int(pb.sport[i]), _addr(v, pb.dst[i].tobytes()), int(pb.dport[i]),
                 int(pb.l4_proto[i]))
            r = rows.setdefault(k, [0, 0, 0, 0])
            r[0] += 1
            r[1] += int(missed[i])
            r[2] += int(pb.wirelen[i])
            r[3] += int(pay[n])
    return rows


def test_tally_equals_a_per_frame_count():
    rng = np.random.default_rng(3)
    caps = sorted(p for p in KERNEL.rglob("*.pcap*") if p.is_file())
    batches = []
    for cap in caps:
        for rb in CaptureReader(cap, batch_size=97):
            pb, _ = decode(rb)
            idx = np.flatnonzero(rng.random(len(pb)) < 0.6)
            batches.append((pb, idx, rng.random(len(pb)) < 0.5))
    names = {6: "tcp", 17: "udp", 58: "icmp6", 1: "icmp", 132: "sctp"}
    ref = {(s, sp, d, dp, names.get(p, str(p))): v for (s, sp, d, dp, p), v in _reference(batches).items()}
    assert len(ref) > 20 and sum(v[0] for v in ref.values()) > 5000
    for shared in (False, True):  # the batch's grouping computed by add(), or once and passed in
        tally = FlowTally(("missed",))
        for pb, idx, missed in batches:
            tally.add(pb, idx, flow_groups(pb) if shared else None, missed=missed)
        got = {(r["src"], r["sport"], r["dst"], r["dport"], r["proto"]):
               [r["packets"], r["missed"], r["wire_bytes"], r["payload_bytes"]] for r in tally.rows()}
        assert got == ref
