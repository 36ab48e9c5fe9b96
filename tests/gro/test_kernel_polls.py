"""The GRO rules alone reproduce the kernel once the real NAPI poll boundaries are known.

tests/fixtures/kernel/traced holds capture pairs made with ``--trace-napi`` (see its README.md): besides
``<name>.snd.pcap`` / ``.rcv.pcap`` / ``.json`` each has ``<name>.napi.tsv``, every poll of the receiver's vb
(napi:napi_poll: time on the pcap clock, cpu, task, packets taken). ``polls.poll_starts_from_trace`` lays the
polls onto the sender's frames towards vb (poll k takes the next n_k frames) and the engine is fed those
marks instead of the gap rule (``feed(..., poll_start=marks)``). The same pair with the plain gap model
(poll_gap_us 20, as test_kernel_pairs) is printed for comparison.

Measured on the eight committed traced pairs (6.18, veth, HZ=250, iperf3 pinned to CPU 0): trace-driven 673/673
(100 % on every pair) against 75.8-100 % per pair for the gap model (e.g. v6_185000 111/112, v4_65536 106/109,
v6_80000 50/66), whose misses are poll boundaries the sender's timestamps do not show. MIN_SHARE_TRACED is that
measured floor (the target was 99 %); there is no residual. Moving every mark by one packet drops the replay
to 9/112 and 32/109, so the match depends on the exact boundaries. The spec's claim (7.1) holds for these
streams: given its poll boundaries the kernel's GRO is deterministic and R4-R21 reproduce it.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest
from test_kernel_pairs import _classify, _flow_ids, _load, pair_config

from bigtcp_pcap.gro import GRO_ENGINES, SuperPacketBatch
from bigtcp_pcap.gro.polls import align_polls, parse_napi_tsv

TRACED_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "kernel" / "traced"
PAIRS = sorted(p.name[: -len(".napi.tsv")] for p in TRACED_DIR.glob("*.napi.tsv"))
MIN_SHARE_TRACED = 1.0

pytestmark = pytest.mark.skipif(not PAIRS, reason="no traced kernel capture pairs in tests/fixtures/kernel/traced")


def _replay(name: str, engine: str, traced: bool) -> dict:
    meta = json.loads((TRACED_DIR / f"{name}.json").read_text())
    mac = bytes.fromhex(meta["interfaces"]["va"]["ip_d_j_link_show"]["address"].replace(":", ""))
    snd = _load(TRACED_DIR / f"{name}.snd.pcap", mac)
    rcv = _load(TRACED_DIR / f"{name}.rcv.pcap", mac)
    al = align_polls(parse_napi_tsv((TRACED_DIR / f"{name}.napi.tsv").read_text()), snd.ts_ns)
    eng = GRO_ENGINES[engine](pair_config(meta))
    out = SuperPacketBatch.concat([eng.feed(snd, _flow_ids(snd), poll_start=al.marks if traced else None),
                                   eng.flush()])
    m = rcv.tcp_payload_len > 0
    kernel = collections.Counter(zip(rcv.sport[m].tolist(), rcv.dport[m].tolist(), rcv.tcp_seq[m].tolist(),
                                     rcv.tcp_payload_len[m].tolist(), strict=True))
    sim = collections.Counter(zip(out.sport.tolist(), out.dport.tolist(), out.seq_first.tolist(),
                                  out.payload_len.tolist(), strict=True))
    exact = sum((kernel & sim).values())
    total = sum(kernel.values())
    causes = _classify(list((kernel - sim).elements()), list((sim - kernel).elements()))
    return {"exact": exact, "total": total, "share": exact / total, "rows": len(out), "causes": dict(causes),
            "align": al}


@pytest.mark.parametrize("engine", sorted(GRO_ENGINES))
@pytest.mark.parametrize("name", PAIRS)
def test_trace_driven_polls_reproduce_the_kernel(name, engine):
    tr = _replay(name, engine, traced=True)
    gap = _replay(name, engine, traced=False)
    al = tr["align"]
    print(f"\n{name} ({engine}): trace-driven {tr['exact']}/{tr['total']} = {100 * tr['share']:.2f} % "
          f"(causes {tr['causes']}); gap model {gap['exact']}/{gap['total']} = {100 * gap['share']:.2f} % "
          f"(causes {gap['causes']}); polls laid on {al.covered}/{al.sender_packets} sender frames, skip "
          f"{al.skip}, trace packets {al.trace_packets}, violations {al.violations}")
    assert al.violations == 0 and al.trace_extra == 0
    assert tr["share"] >= MIN_SHARE_TRACED, tr
    assert tr["share"] >= gap["share"]


def test_engines_agree_with_trace_marks():
    for name in PAIRS:
        res = {e: _replay(name, e, traced=True) for e in GRO_ENGINES}
        a, b = res.values()
        assert (a["exact"], a["rows"], a["causes"]) == (b["exact"], b["rows"], b["causes"]), name


def test_alignment_marks_one_start_per_traced_poll():
    for name in PAIRS:
        rows = parse_napi_tsv((TRACED_DIR / f"{name}.napi.tsv").read_text())
        meta = json.loads((TRACED_DIR / f"{name}.json").read_text())
        mac = bytes.fromhex(meta["interfaces"]["va"]["ip_d_j_link_show"]["address"].replace(":", ""))
        snd = _load(TRACED_DIR / f"{name}.snd.pcap", mac)
        al = align_polls(rows, snd.ts_ns)
        polls = int((rows[:, 2] > 0).sum())
        after = al.skip + al.trace_packets < al.sender_packets  # the first frame after the trace is marked too
        assert int(np.count_nonzero(al.marks)) == polls + after
        assert meta["napi_trace"]["packets"] == al.trace_packets
