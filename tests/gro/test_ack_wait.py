"""Where the poll ends after an ACKed super-packet end when other flows' packets come between
(``rules.acked_end_poll_waits``, ``rules.acked_flow_returns``), on both engines.

The ACK of flow A's end says only that A's next segment came in a later poll. The other flows' packets captured
between the two are taken into the running poll (a receiver taking packets back to back takes what the ring
holds, up to the budget); the poll ends before A's next segment, at the budget, at an idle gap, or after another
flow's ACKed end. With one flow the poll ends after the ACKed segment, as before. The kernel pairs measure the
rule (``scripts/compare_pairs.py``, README "Poll inference"); these tests pin its cases.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bigtcp_pcap.gro import GRO_ENGINES, GroConfig, SuperPacketBatch
from bigtcp_pcap.gro import reasons as R
from bigtcp_pcap.gro.synth import SynthFlow, build_batch, flow_ids

US = 1000
ENGINES = sorted(GRO_ENGINES)
A, B = 40000, 40001


def _interleave(spec: str, gap_after: int | None = None) -> list[dict]:
    """Packets of flows A and B in the order of ``spec`` (one letter per packet), 1 us apart (``gap_after``: 100 us
    after that packet instead)."""
    fa = SynthFlow(sport=A, flow_id=0)
    fb = SynthFlow(sport=B, flow_id=1, seq=500_000)
    out, t = [], 0
    for i, c in enumerate(spec):
        f = fa if c == "A" else fb
        f.t = t
        out.append(f.segment())
        t += 100 * US if i == gap_after else US
    return out


def rows(engine: str, pkts: list[dict], acked, splits=(), **cfg) -> SuperPacketBatch:
    eng = GRO_ENGINES[engine](GroConfig(gro_max_size=185000, **cfg))
    b, fid = build_batch(pkts), flow_ids(pkts)
    ak = np.zeros(len(pkts), bool)
    ak[list(acked)] = True
    parts = [eng.feed(b.take(slice(a, z)), fid[a:z], acked=ak[a:z]) for a, z in itertools.pairwise([0, *splits,
                                                                                                  len(pkts)])]
    return SuperPacketBatch.concat([*parts, eng.flush()])


def run(engine: str, pkts: list[dict], acked, splits=(), **cfg) -> dict[int, list[int]]:
    """Segments per super-packet of each flow (by source port), in delivery order."""
    r = rows(engine, pkts, acked, splits, **cfg)
    out: dict[int, list[int]] = {}
    for sp, n in zip(r.sport.tolist(), r.n_segments.tolist(), strict=True):
        out.setdefault(sp, []).append(n)
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_other_flows_packets_after_an_acked_end_come_in_its_poll(engine):
    pk = _interleave("AAABBBAAB")
    assert run(engine, pk, acked=[]) == {A: [5], B: [4]}  # no evidence, no gap: one poll
    # A's end at packet 2 was ACKed: A's next segment (6) came in a later poll; B's 3, 4, 5 in this one
    assert run(engine, pk, acked=[2]) == {A: [3, 2], B: [3, 1]}
    assert run(engine, pk, acked=[2], splits=[3, 5, 6]) == {A: [3, 2], B: [3, 1]}  # whatever the batches


@pytest.mark.parametrize("engine", ENGINES)
def test_a_single_flow_poll_ends_after_its_acked_segment(engine):
    pk = _interleave("AAAAA")
    assert run(engine, pk, acked=[2]) == {A: [3, 2]}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_second_flows_acked_end_ends_the_waiting_poll(engine):
    pk = _interleave("AAABBABB")
    # B's end at packet 4 was ACKed too: the poll ends there, keeping both ends (A's 5 does not join A's 0-2)
    assert run(engine, pk, acked=[2, 4]) == {A: [3, 1], B: [2, 2]}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_budget_or_an_idle_gap_ends_the_waiting_poll_first(engine):
    pk = _interleave("AAABBBAAB")
    # a budget of 5 packets: the poll ends after B's 4; A's 6 then comes in the poll that holds B's 5
    assert run(engine, pk, acked=[2], napi_weight=5) == {A: [3, 2], B: [2, 2]}
    gap = _interleave("AAABBBAAB", gap_after=3)
    # an idle gap after B's 3 ended the poll: B's 4, 5 and A's 6, 7 come in the next one
    assert run(engine, gap, acked=[2]) == {A: [3, 2], B: [1, 3]}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_acked_flows_row_is_evidenced_whatever_then_ends_the_poll(engine):
    gap = _interleave("AAABBBAAB", gap_after=3)
    r = rows(engine, gap, acked=[2])
    first = {sp: pe for sp, pe in reversed(list(zip(r.sport.tolist(), r.poll_end.tolist(), strict=True)))}
    assert first == {A: R.PE_ACK, B: R.PE_GAP}  # the gap ended the poll; A's end is the ACK's, B's is guessed


@pytest.mark.parametrize("engine", ENGINES)
def test_at_hz_1000_the_poll_ends_after_the_acked_segment(engine):
    pk = _interleave("AAABBBAAB")
    # a full budget at HZ >= 1000 keeps this jiffy's entries (R21.3), so A's could outlive its end: no waiting
    assert run(engine, pk, acked=[2], hz=1000) == {A: [3, 2], B: [4]}
