"""``analyze`` writes the filter audit's rows to filter_audit.parquet batch by batch as it audits them
(``FilterAudits(write=)``), keeping none in memory: the table must hold exactly the rows of each expression's
in-memory audit (``audit_capture``), in frame order and a frame's rows in the order the expressions were given,
whatever the reader's batches; the missed frames are tshark's. An expression libpcap rejects for the link types
met so far has its rows held (in an unnamed file) until it compiles for one."""

from __future__ import annotations

import functools
import json

import pyarrow.parquet as pq
import pytest

from bigtcp_pcap import analyze, api
from bigtcp_pcap.audit import audit_capture, cbpf, stage
from bigtcp_pcap.capture.reader import CaptureReader

from .conftest import kernel_capture, needs_tshark, tshark_frames
from .test_audit_linktypes import v4_then_v6_capture

FILTERS = ["tcp port 5201", "ip6 and tcp", "tcp"]


def _rows(path) -> list[tuple]:
    return [(r["frame"], r["filter"], r["verdict"], r["reason"]) for r in pq.read_table(path).to_pylist()]


def _want(cap, filters: list[str]) -> list[tuple]:
    """Every expression's rows from its own in-memory audit, in frame order, then expression order."""
    want = []
    for i, expr in enumerate(filters):
        r = audit_capture(expr, cap)
        for f, v, why in zip(r.frame.tolist(), r.verdict.tolist(), r.reason.tolist(), strict=True):
            if v != cbpf.OK:
                want.append((f, i, expr, cbpf.VERDICT_NAMES[v], cbpf.REASON_NAMES[why] or None))
    return [(f, e, v, why) for f, _, e, v, why in sorted(want)]


def _small_batches(monkeypatch, size: int) -> list[int]:
    """Reader batches of ``size`` records; returns the list the held rows' writes are counted in."""
    monkeypatch.setattr(api, "CaptureReader", functools.partial(CaptureReader, batch_size=size))
    held = []

    class Spy(stage._Spill):
        def write(self, cols):
            held.append(len(cols[0]))
            super().write(cols)

    monkeypatch.setattr(stage, "_Spill", Spy)
    return held


@needs_tshark
@pytest.mark.parametrize("name", ["v6_185000.rcv.pcap", "mixed_185000.rcv.pcap"])
def test_streamed_audit_rows_equal_the_in_memory_audit(tmp_path, monkeypatch, name):
    cap = kernel_capture(name)
    whole = analyze(cap, outdir=tmp_path / "whole", filters=FILTERS)
    held = _small_batches(monkeypatch, 97)
    small = analyze(cap, outdir=tmp_path / "small", filters=FILTERS)
    assert held == []  # every expression compiles for Ethernet: nothing waits
    monkeypatch.undo()
    rows = _rows(tmp_path / "whole" / "filter_audit.parquet")
    assert len(rows) > 0 and rows == _want(cap, FILTERS)
    assert _rows(tmp_path / "small" / "filter_audit.parquet") == rows  # where batches begin does not matter
    assert whole.summary["filter_audit"] == small.summary["filter_audit"]
    # the oracle: every HBH jumbo frame (tshark) is missed by "tcp port 5201", and nothing else
    jumbo = tshark_frames(cap, "ipv6.opt.jumbo")
    assert {f for f, e, v, _ in rows if e == "tcp port 5201" and v == "missed"} == jumbo
    # nothing left behind: no spill file, the output is the tables and the summary
    assert sorted(p.name for p in (tmp_path / "whole").iterdir()) == [
        "filter_audit.parquet", "findings.parquet", "flows.parquet", "summary.json", "superpackets.parquet"]
    json.dumps(small.summary)


def test_rows_of_a_filter_rejected_for_the_first_link_type_wait_until_it_compiles(tmp_path, monkeypatch):
    """Raw-IPv4 (228) frames first, one per batch, then Ethernet IPv6 ones: ``ip6 and tcp`` is rejected for 228,
    so its not-audited rows of frames 1-2 are held until frame 3 compiles it; then written, in frame order."""
    cap = v4_then_v6_capture(tmp_path)
    held = _small_batches(monkeypatch, 1)
    a = analyze(cap, outdir=tmp_path / "o", filters=["ip6 and tcp", "tcp"])
    assert held == [1, 1]
    rows = _rows(tmp_path / "o" / "filter_audit.parquet")
    assert rows == _want(cap, ["ip6 and tcp", "tcp"])
    assert rows[:2] == [(1, "ip6 and tcp", "not_audited", "filter_rejected_for_linktype"),
                        (2, "ip6 and tcp", "not_audited", "filter_rejected_for_linktype")]
    assert [r["expr"] for r in a.summary["filter_audit"]["results"]] == ["ip6 and tcp", "tcp"]


def test_held_rows_of_a_default_filter_no_link_type_compiles_are_dropped(tmp_path, monkeypatch):
    """The default audit on raw IPv4 only: ``ip6 and tcp`` never compiles; it is not reported and has no rows."""
    cap = v4_then_v6_capture(tmp_path, v6=False)
    held = _small_batches(monkeypatch, 1)
    a = analyze(cap, outdir=tmp_path / "o")
    assert held == [1, 1]
    assert "ip6 and tcp" not in a.summary["filter_audit"]["audited"]
    assert all(e != "ip6 and tcp" for _, e, _, _ in _rows(tmp_path / "o" / "filter_audit.parquet"))
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "filter_audit.parquet", "findings.parquet", "flows.parquet", "summary.json", "superpackets.parquet"]


def test_a_filter_given_twice_is_audited_once(tmp_path):
    # --filter tcp --filter tcp doubled every row of filter_audit.parquet and the summary's results
    from oracle import KERNEL

    cap = KERNEL / "v6_185000.rcv.pcap"
    once = analyze(cap, outdir=tmp_path / "once", filters=["tcp"])
    twice = analyze(cap, outdir=tmp_path / "twice", filters=["tcp", "tcp"])
    assert pq.read_table(tmp_path / "twice" / "filter_audit.parquet").equals(
        pq.read_table(tmp_path / "once" / "filter_audit.parquet"))
    assert [r["expr"] for r in twice.summary["filter_audit"]["results"]] == ["tcp"] == \
        [r["expr"] for r in once.summary["filter_audit"]["results"]]
