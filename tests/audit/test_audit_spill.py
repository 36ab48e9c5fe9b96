"""The audit inside ``analyze`` keeps a bounded number of per-frame rows in memory and spills the rest to an
unnamed temporary file in the output directory (``FilterAudit(spill=True)``): the filter_audit table, the counts
and the summary must be those of the in-memory run, and the missed frames tshark's."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from bigtcp_pcap import analyze
from bigtcp_pcap.audit import cbpf

from .conftest import kernel_capture, needs_tshark, tshark_frames

FILTERS = ["tcp port 5201", "ip6 and tcp", "tcp"]


def _run(cap, out, monkeypatch, spill_rows: int | None):
    writes = []
    if spill_rows is not None:
        monkeypatch.setattr(cbpf.FilterAudit, "SPILL_ROWS", spill_rows)
        real = cbpf._Spill.write
        monkeypatch.setattr(cbpf._Spill, "write", lambda self, cols: (writes.append(len(cols[0])), real(self, cols)))
    a = analyze(cap, outdir=out, filters=FILTERS)
    monkeypatch.undo()
    return a, writes


@needs_tshark
@pytest.mark.parametrize("name", ["v6_185000.rcv.pcap", "mixed_185000.rcv.pcap"])
def test_spilled_audit_rows_equal_the_in_memory_run(tmp_path, monkeypatch, name):
    cap = kernel_capture(name)
    whole, w0 = _run(cap, tmp_path / "whole", monkeypatch, None)
    spilled, writes = _run(cap, tmp_path / "spilled", monkeypatch, 7)
    assert not w0 and len(writes) >= 2, "the small run must spill (one batch: once per filter), the default one never"
    a = pq.read_table(tmp_path / "whole" / "filter_audit.parquet")
    b = pq.read_table(tmp_path / "spilled" / "filter_audit.parquet")
    assert a.num_rows >= sum(writes) > 0
    assert a.to_pylist() == b.to_pylist()
    assert whole.summary["filter_audit"] == spilled.summary["filter_audit"]
    # the oracle: every HBH jumbo frame (tshark) is missed by "tcp port 5201", and nothing else
    jumbo = tshark_frames(cap, "ipv6.opt.jumbo")
    missed = {r["frame"] for r in b.to_pylist() if r["filter"] == "tcp port 5201" and r["verdict"] == "missed"}
    assert missed == jumbo
    # nothing left behind: the spill files are unnamed
    assert sorted(p.name for p in (tmp_path / "spilled").iterdir()) == sorted(
        p.name for p in (tmp_path / "whole").iterdir())
    json.dumps(spilled.summary)


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
