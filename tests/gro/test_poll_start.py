"""Known NAPI poll boundaries: ``feed(batch, flow_id, poll_start=marks)`` (R21.2 with given marks) and
``polls.align_polls`` / ``poll_starts_from_trace`` (napi:napi_poll trace rows -> marks). Both engines."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bigtcp_pcap.gro import GRO_ENGINES, GroConfig, SuperPacketBatch
from bigtcp_pcap.gro.polls import align_polls, parse_napi_tsv, poll_starts_from_trace
from bigtcp_pcap.gro.synth import SynthFlow, build_batch, flow_ids

US = 1000
ENGINES = sorted(GRO_ENGINES)


def run(engine: str, pkts: list[dict], marks, splits=(), **cfg) -> SuperPacketBatch:
    eng = GRO_ENGINES[engine](GroConfig(**cfg))
    b, fid = build_batch(pkts), flow_ids(pkts)
    m = None if marks is None else np.zeros(len(pkts), bool)
    if m is not None:
        m[list(marks)] = True
    bounds = [0, *splits, len(pkts)]
    parts = [eng.feed(b.take(slice(a, z)), fid[a:z], None if m is None else m[a:z])
             for a, z in itertools.pairwise(bounds)]
    return SuperPacketBatch.concat([*parts, eng.flush()])


def summary(r: SuperPacketBatch) -> list[tuple[int, int, str]]:
    return list(zip(r.first_frame.tolist(), r.n_segments.tolist(), r.reason_labels(), strict=True))


@pytest.mark.parametrize("engine", ENGINES)
def test_poll_start_flushes_held_entries_as_napi_poll(engine):
    a = SynthFlow(sport=40000, flow_id=1)
    b = SynthFlow(sport=40001, flow_id=2, t0_ns=300)
    pk = [p for pair in zip(a.segments(3), b.segments(3), strict=True) for p in pair] + a.segments(2)
    r = run(engine, pk, marks=[6])
    assert summary(r) == [(1, 3, "napi_poll"), (2, 3, "napi_poll"), (7, 2, "end_of_capture")]
    # without marks (1 us apart): one poll
    assert summary(run(engine, pk, None)) == [(1, 5, "end_of_capture"), (2, 3, "end_of_capture")]


@pytest.mark.parametrize("engine", ENGINES)
def test_marks_replace_the_gap_rule(engine):
    f = SynthFlow()
    pk = f.segments(3)
    f.gap(500 * US)
    pk += f.segments(3)
    assert summary(run(engine, pk, None)) == [(1, 3, "napi_poll"), (4, 3, "end_of_capture")]
    assert summary(run(engine, pk, [])) == [(1, 6, "end_of_capture")]  # no gap-rule flush when marks are given
    assert summary(run(engine, pk, [0, 2])) == [(1, 2, "napi_poll"), (3, 4, "end_of_capture")]


@pytest.mark.parametrize("engine", ENGINES)
def test_budget_count_restarts_at_a_poll_start(engine):
    pk = SynthFlow().segments(100)
    assert [n for _, n, _ in summary(run(engine, pk, [], gro_max_size=185000))] == [64, 36]
    r = run(engine, pk, [10], gro_max_size=185000)
    assert summary(r) == [(1, 10, "napi_poll"), (11, 64, "napi_poll"), (75, 26, "end_of_capture")]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_mark_at_a_batch_start_ends_the_previous_batchs_poll(engine):
    pk = SynthFlow().segments(8)
    for splits in ((), (4,), (1, 4, 5)):
        assert summary(run(engine, pk, [0, 4], splits)) == [(1, 4, "napi_poll"), (5, 4, "end_of_capture")]


@pytest.mark.parametrize("engine", ENGINES)
def test_marks_with_gro_flush_timeout_end_polls_like_the_gap_would(engine):
    f = SynthFlow()
    pk = f.segments(5)
    f.gap(50 * US)
    pk += f.segments(5)
    kw = {"gro_flush_timeout_ns": 200 * US}
    assert summary(run(engine, pk, [5], **kw)) == summary(run(engine, pk, None, **kw)) == [(1, 10, "end_of_capture")]
    assert [n for _, n, _ in summary(run(engine, pk, [5]))] == [5, 5]


# --- polls.align_polls ----------------------------------------------------------------------------------------
def _stream(work: list[int], head: int = 0, tail: int = 0):
    """Packets 1 us apart; poll k ends 5 us after its last packet. Extra frames before/after the traced run."""
    ts, rows, t = [], [], 0
    for _ in range(head):
        t += 300 * US
        ts.append(t)
    for w in work:
        for _ in range(w):
            t += 1 * US
            ts.append(t)
        rows.append((t + 5 * US, 0, w))
        t += 40 * US
    for _ in range(tail):
        t += 300 * US
        ts.append(t)
    return np.array(rows, np.int64), np.array(ts, np.int64)


def test_align_exact_totals_marks_each_poll_start():
    rows, ts = _stream([3, 1, 64, 2])
    al = align_polls(rows, ts)
    assert np.flatnonzero(al.marks).tolist() == [0, 3, 4, 68]
    assert (al.skip, al.covered, al.violations, al.sender_extra, al.trace_extra) == (0, 70, 0, 0, 0)


@pytest.mark.parametrize(("head", "tail"), [(2, 1), (0, 3), (3, 0)])
def test_align_extra_capture_frames_at_either_end(head, tail):
    rows, ts = _stream([3, 1, 5, 2], head, tail)
    al = align_polls(rows, ts)
    want = [head + k for k in (0, 3, 4, 9)] + ([head + 11] if tail else [])
    assert np.flatnonzero(al.marks).tolist() == want
    assert (al.skip, al.sender_extra, al.violations) == (head, head + tail, 0)
    assert np.array_equal(poll_starts_from_trace(rows[:, [0, 2]], ts), al.marks)


def test_align_trace_longer_than_capture_and_zero_work_polls():
    rows, ts = _stream([2, 3, 4])
    rows = np.vstack([rows, [[rows[-1, 0] + 10 * US, 1, 0]]])  # a poll that took nothing
    al = align_polls(rows[::-1], ts[2:])  # the capture missed the first poll; rows in any order
    assert (al.skip, al.trace_extra, al.violations) == (-2, 2, 0)
    assert np.flatnonzero(al.marks).tolist() == [0, 3]


def test_parse_napi_tsv():
    text = ("realtime_s\tmono_s\tcpu\tcontext\twork\tbudget\n"
            "1796226090.566698074\t5648.054961000\t0\tiperf3\t1\t64\n"
            "1796226090.5667\t5648.054997000\t1\tksoftirqd/1\t64\t64\n")
    assert parse_napi_tsv(text).tolist() == [[1796226090566698074, 0, 1], [1796226090566700000, 1, 64]]
    assert parse_napi_tsv("realtime_s\n").shape == (0, 3)
    with_napi = ("realtime_s\tmono_s\tcpu\tcontext\twork\tbudget\tnapi\n"
                 "1796226090.566698074\t5648.054961000\t0\tiperf3\t1\t64\t00000000a1b2c3d4\n")
    assert parse_napi_tsv(with_napi).tolist() == [[1796226090566698074, 0, 1]]
