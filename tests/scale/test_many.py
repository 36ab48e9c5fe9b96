"""Many captures as one dataset, one capture cut at idle gaps, Dask: every row against the serial runs.

The oracle is the ordinary serial ``analyze`` of each kernel capture (itself checked against tshark and the
kernel's own traces elsewhere in the suite); the parallel paths must reproduce its tables row for row.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest
from oracle import KERNEL
from typer.testing import CliRunner

from bigtcp_pcap import analyze, analyze_many
from bigtcp_pcap.cli import app
from bigtcp_pcap.many import analyze_split
from bigtcp_pcap.output.parquet import read_metadata
from bigtcp_pcap.output.tables import TABLES  # the registry (output/tables.py)
from bigtcp_pcap.split import find_parts, idle_gap_ns, record_times

SPLIT_FIXTURES = (sorted(KERNEL.glob("*.pcap")) + sorted((KERNEL / "traced").glob("*.pcap"))
                  + sorted((KERNEL / "any").glob("*.pcap")))
LINKTYPES = sorted((KERNEL / "linktypes").glob("*.pcap"))


def _frame(df: pd.DataFrame) -> pd.DataFrame:
    df = df.reset_index(drop=True)
    for c in df.columns:  # dictionary columns: compare the values, not the dictionaries' order
        if isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype(str)
    return df


def assert_same_tables(a, b) -> None:
    for t in TABLES:
        pa_, pb_ = a / f"{t}.parquet", b / f"{t}.parquet"
        assert pa_.exists() == pb_.exists(), t
        if pa_.exists():
            pd.testing.assert_frame_equal(_frame(pd.read_parquet(pa_)), _frame(pd.read_parquet(pb_)),
                                          check_dtype=False, obj=t)


# 200 ms: the default rule; 1 ms: a user who accepts ACK delays up to 1 ms, which cuts inside connections (flows
# span the cuts: the exact flow merge is exercised, see the test below)
@pytest.mark.parametrize("ack_delay_ns", [200_000_000, 1_000_000], ids=["200ms", "1ms"])
@pytest.mark.parametrize("cap", SPLIT_FIXTURES + LINKTYPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_split_capture_equals_serial_run(cap, ack_delay_ns, tmp_path):
    serial = analyze(cap, outdir=tmp_path / "serial", packets=True)
    parts = find_parts(cap, 8, idle_gap_ns(ack_delay_ns=ack_delay_ns))
    split = analyze_split(cap, tmp_path / "split", jobs=1, parts=8, packets=True, ack_delay_ns=ack_delay_ns)
    assert split.params.get("parts", 1) == len(parts)
    if cap in SPLIT_FIXTURES:  # each of these has idle gaps > 200 ms (the tunnel captures on raw IP have none)
        assert len(parts) >= 2
        # really merged from its parts: the parts audit the whole capture's default filters (its first batch's
        # busiest port), where each part once chose its own and the run fell back to a serial one, unreported
        assert "serial_because" not in split.params, split.params
    assert_same_tables(serial.outdir, split.outdir)
    assert split.summary["flows"] == serial.summary["flows"]
    assert split.summary["capture"]["packets"] == serial.summary["capture"]["packets"]
    assert split.summary["superpackets"]["count"] == serial.summary["superpackets"]["count"]
    assert split.summary["bigtcp"] == serial.summary["bigtcp"]
    assert split.summary["findings"] == serial.summary["findings"]
    # summary.json is the serial run's, section for section: the audit's counts added up over the parts, the
    # top flows' values ints (not pandas floats), the capture kind and the diagnosis of the whole capture
    on_disk = json.loads((split.outdir / "summary.json").read_text())
    want = json.loads((serial.outdir / "summary.json").read_text())
    assert ("parts" in on_disk) == ("serial_because" not in split.params and split.params.get("parts", 1) > 1)
    for k in want:
        assert on_disk[k] == want[k], k
    for t in TABLES:  # and each table's provenance (the audited filters, the packet count ...)
        if (serial.outdir / f"{t}.parquet").exists():
            assert read_metadata(split.outdir / f"{t}.parquet") == read_metadata(serial.outdir / f"{t}.parquet"), t


@pytest.mark.parametrize("ack_delay_ns", [200_000_000, 1_000_000], ids=["200ms", "1ms"])
def test_cuts_are_at_whole_capture_idle_gaps(ack_delay_ns, tmp_path):
    """The cut points are real idle gaps of the whole capture; with 1 ms, flows cross them."""
    spanning = 0
    for k, cap in enumerate(SPLIT_FIXTURES):
        parts = find_parts(cap, 8, idle_gap_ns(ack_delay_ns=ack_delay_ns))
        out = analyze(cap, outdir=tmp_path / str(k), packets=True).outdir
        ts = np.array(pd.read_parquet(out / "packets.parquet")["ts_ns"].astype("int64"))
        flows = pd.read_parquet(out / "flows.parquet")
        for p in parts[1:]:
            i = p.first_record
            assert ts[i] - ts[:i].max() > ack_delay_ns
            t = ts[i]
            spanning += int(((flows["ts_first_ns"].astype("int64") < t) & (flows["ts_last_ns"].astype("int64") > t))
                            .sum())
    if ack_delay_ns == 1_000_000:
        assert spanning >= 10


def test_split_across_processes_equals_serial(tmp_path):
    cap = KERNEL / "mixed_185000.snd.pcap"
    serial = analyze(cap, outdir=tmp_path / "serial")
    split = analyze_split(cap, tmp_path / "split", jobs=2)
    assert split.params["parts"] == 2
    assert_same_tables(serial.outdir, split.outdir)


DATASET = [KERNEL / "v4_185000.rcv.pcap", KERNEL / "v6_185000.rcv.pcap", KERNEL / "mixed_185000.rcv.pcap"]


def _check_dataset(root, tmp_path, missing: str | None = None) -> None:
    import duckdb

    for cap in DATASET:
        one = analyze(cap, outdir=tmp_path / "one" / cap.name)
        for t in ("superpackets", "flows", "findings"):
            whole = pd.read_parquet(root / t)  # pandas: the partitions as one table with a capture column
            mine = whole[whole["capture"] == cap.name].drop(columns="capture")
            pd.testing.assert_frame_equal(_frame(mine), _frame(getattr(one, t)), check_dtype=False)
    n = {cap.name: len(analyze(cap, outdir=tmp_path / "one" / cap.name).flows) for cap in DATASET}
    # pyarrow.dataset with hive partitioning
    t = ds.dataset(root / "flows", format="parquet", partitioning="hive").to_table()
    assert t.num_rows == sum(n.values())
    # DuckDB, the README's form
    rows = duckdb.sql(f"select capture, count(*) from read_parquet('{root}/flows/*/*.parquet', "
                      "hive_partitioning=true) group by capture").fetchall()
    assert dict(rows) == n
    if missing is not None:  # the failed capture is marked in its findings partition
        f = pd.read_parquet(root / "findings")
        bad = f[f["capture"] == missing]
        assert list(bad["code"]) == ["capture.partial"] and "cannot open" in bad["message"].iloc[0]


def test_many_captures_one_dataset(tmp_path):
    root = tmp_path / "ds"
    m = analyze_many([*DATASET, tmp_path / "missing.pcap"], root, jobs=2)
    _check_dataset(root, tmp_path, missing="missing.pcap")
    s = m.summary
    assert s["totals"]["captures"] == 4 and s["totals"]["failed"] == 1
    by = {c["capture"]: c for c in s["captures"]}
    for cap in DATASET:
        one = analyze(cap, outdir=tmp_path / "o2" / cap.name)
        assert by[cap.name]["packets"] == one.summary["capture"]["packets"]
        assert by[cap.name]["flows"] == len(one.flows)
        assert by[cap.name]["largest_superpacket"] == one.flows["max_superpacket_len"].max()
    assert s["totals"]["packets"] == sum(by[c.name]["packets"] for c in DATASET)
    # a second run over the same directory replaces the partitions (no duplicate rows)
    analyze_many(DATASET, root, jobs=1)
    assert len(pd.read_parquet(root / "flows")) == sum(by[c.name]["flows"] for c in DATASET)


def test_dask_localcluster(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    dd = pytest.importorskip("dask.dataframe")
    root = tmp_path / "ds"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc, \
            distributed.Client(lc) as client:
        m = analyze_many(DATASET, root, client=client)
        assert not m.failed
        _check_dataset(root, tmp_path)
        flows = dd.read_parquet(str(root / "flows")).compute()
        assert len(flows) == sum(c["flows"] for c in m.summary["captures"])
        # one capture cut at its idle gaps, the parts as cluster tasks
        cap = KERNEL / "v6_80000.snd.pcap"
        split = analyze_split(cap, tmp_path / "split", client=client, parts=3)
        assert split.params["parts"] >= 2
        # the nanny fixed the workers' glibc trim threshold; their tasks set both thresholds (tune_malloc)
        env = client.run(lambda: __import__("os").environ.get("MALLOC_TRIM_THRESHOLD_"))
        assert set(env.values()) == {"65536"}, env
        assert all(client.run(lambda: __import__("bigtcp_pcap.buffers").buffers._MALLOC_TUNED).values())
    assert_same_tables(analyze(cap, outdir=tmp_path / "serial").outdir, split.outdir)


def test_cli_directory_and_json(tmp_path):
    src = tmp_path / "caps"
    src.mkdir()
    for cap in DATASET:
        (src / cap.name).write_bytes(cap.read_bytes())
    res = CliRunner().invoke(app, ["analyze", str(src), "-o", str(tmp_path / "ds"), "--jobs", "2", "--json"])
    assert res.exit_code in (0, 1), res.output
    doc = json.loads(res.stdout)
    assert [c["capture"] for c in doc["captures"]] == sorted(c.name for c in DATASET)
    assert doc["totals"]["flows"] == len(pd.read_parquet(tmp_path / "ds" / "flows"))
    res = CliRunner().invoke(app, ["analyze", str(src / "*.pcap"), "-o", str(tmp_path / "ds2"), "--json"])
    assert json.loads(res.stdout)["totals"] == doc["totals"]


@pytest.mark.parametrize("args, says", [
    (["--report"], "--report need one capture's tables"),
    (["--plots", "--report"], "--plots and --report need one capture's tables"),
    (["--wireshark-sidecar"], "--wireshark-sidecar needs one capture analysed by one process"),
    (["--filter", "tcp port"], "bad filter expression 'tcp port'"),
    (["-"], "'-' (stdin) is read by one process"),
])
def test_many_refuses_what_it_cannot_do_before_any_work(args, says, tmp_path):
    """Several captures: options the dataset form cannot honour, a filter libpcap compiles for no link type, and
    stdin among files are one usage error (exit 2) before anything is written, not silently dropped."""
    out = tmp_path / "ds"
    extra = [a for a in args if a == "-"]
    opts = [a for a in args if a != "-"]
    res = CliRunner().invoke(app, ["analyze", str(DATASET[0]), str(DATASET[1]), *extra, "-o", str(out), *opts])
    assert res.exit_code == 2, res.output
    assert says in res.output
    assert not out.exists()


def test_jobs_on_one_capture_writes_plots_and_report_and_reads_stdin_serially(tmp_path):
    """--jobs on one capture honours --plots/--report (as the serial run does); stdin with --jobs is read by one
    process and gives the serial run's tables (it was once handed to a worker and lost)."""
    cap = DATASET[2]
    res = CliRunner().invoke(app, ["analyze", str(cap), "-o", str(tmp_path / "j"), "--jobs", "2", "--plots",
                                   "--report"])
    assert res.exit_code in (0, 1), res.output
    assert (tmp_path / "j" / "report.html").stat().st_size > 0
    assert sorted(p.name for p in (tmp_path / "j" / "plots").glob("*.png"))
    res = CliRunner().invoke(app, ["analyze", "-", "-o", str(tmp_path / "s"), "--jobs", "2"],
                             input=cap.read_bytes())
    assert res.exit_code in (0, 1), res.output
    analyze(cap, outdir=tmp_path / "ref")
    assert_same_tables(tmp_path / "s", tmp_path / "ref")


def test_split_merges_flows_across_cuts_from_the_parts_merge_rows(tmp_path, monkeypatch):
    """Parts write narrow merge rows instead of their packets tables; flows across the cuts are merged from
    those, in one pass (the parts are not run again)."""
    from bigtcp_pcap import merge

    raised = []
    real = merge.merge_parts

    def counting(*a, **k):
        try:
            return real(*a, **k)
        except merge.NeedPackets:
            raised.append(True)
            raise

    monkeypatch.setattr(merge, "merge_parts", counting)
    cap = KERNEL / "traced" / "v4_65536.snd.pcap"
    serial = analyze(cap, outdir=tmp_path / "serial")
    split = analyze_split(cap, tmp_path / "split", jobs=1, parts=4, ack_delay_ns=1_000_000, part_packets=False)
    assert split.params["parts"] >= 2 and raised == []
    assert split.summary["flows"] == serial.summary["flows"]
    assert not (split.outdir / "packets.parquet").exists()
    assert_same_tables(serial.outdir, split.outdir)


def _replayed(src, dst, copies) -> None:
    """A kernel capture's records written again, each copy ``(records, seconds later)`` (a count, or a
    (start, stop) slice): the same connections (same 5-tuples) come back after a pause, with or without their
    FIN exchange."""
    import struct

    b = src.read_bytes()
    assert struct.unpack("<I", b[:4])[0] == 0xA1B23C4D  # nanosecond pcap, little-endian (tcpdump -j ... nano)
    recs, o = [], 24
    while o < len(b):
        sec, frac, cl, ol = struct.unpack("<IIII", b[o:o + 16])
        recs.append((sec, frac, b[o + 16:o + 16 + cl], ol))
        o += 16 + cl
    out = [b[:24]]
    for count, later in copies:
        for sec, frac, d, ol in (recs[slice(*count)] if isinstance(count, tuple) else recs[:count]):
            out.append(struct.pack("<IIII", sec + later, frac, len(d), ol) + d)
    dst.write_bytes(b"".join(out))


# (copies, what the serial flow table does at the second copy's first packet)
REPLAYS = {
    "closed_then_30s": ([(None, 0), (None, 30)], "FIN both ways, then silent > 5 s: new rows"),
    "closed_then_200s": ([(None, 0), (None, 200)], "silent > the 120 s idle timeout: new rows"),
    "closed_then_2s": ([(None, 0), (None, 2)], "closed but back within 5 s: the same rows continue"),
    # (record 401 follows a PSH segment: no GRO entry is held at the pause; the cut is at the first pause)
    "closed_then_2s_then_quiet": ([(None, 0), ((0, 401), 2), ((401, None), 10)],
                                  ("back within 5 s, then silent 8 s inside the next part, where only the serial "
                                   "run knows the FINs: the split runs serially")),
    "mid_stream_pause": ([((0, 600), 0), ((600, None), 30)],
                         "a pause with a GRO entry held: what completes it depends on the next part"),
    "open_then_30s": ([(1200, 0), (None, 30)], "no FIN yet, silent 30 s < 120 s: the same rows continue"),
    "open_then_200s": ([(1200, 0), (None, 200)], "no FIN yet, silent > 120 s: new rows"),
}


@pytest.mark.parametrize("name", sorted(REPLAYS))
def test_split_flows_that_end_or_continue_at_a_cut(name, tmp_path):
    """The same 5-tuples before and after a cut: rows continue or end exactly as in the serial run (a split run
    once summed every row of a 5-tuple into one, whatever the flow table had decided)."""
    cap = tmp_path / f"{name}.pcap"
    _replayed(KERNEL / "v4_65536.snd.pcap", cap, REPLAYS[name][0])
    serial = analyze(cap, outdir=tmp_path / "serial")
    split = analyze_split(cap, tmp_path / "split", jobs=1, parts=2)
    assert_same_tables(serial.outdir, split.outdir)
    assert len(serial.flows) == (4 if name in ("open_then_30s", "closed_then_2s", "mid_stream_pause") else 8)
    why = {"closed_then_2s_then_quiet": "a flow continues across a cut after a FIN or RST",
           "mid_stream_pause": "a part ended with GRO entries held"}.get(name)
    assert split.params.get("serial_because") == why
    assert split.params["parts"] == (1 if why else 2)


FORK_CHECK = r"""
import threading, time
import bigtcp_pcap.cli  # what the console command has loaded when it starts its workers
from bigtcp_pcap.many import _fork_is_safe
quiet = _fork_is_safe()
t = threading.Thread(target=time.sleep, args=(2,))
t.start()
busy = _fork_is_safe()
print(quiet, busy)
"""


@pytest.mark.parametrize("fork", [True, False], ids=["fork", "forkserver"])
def test_console_jobs_equal_serial_runs(fork, tmp_path):
    """The console command with --jobs 2, in its own process: its workers are forked from it (it has no thread
    that could hold a lock: checked here) or, with BIGTCP_PCAP_NO_FORK, come from a fork server; either way the
    dataset and a split capture equal the serial runs, every table."""
    import os
    import subprocess
    import sys

    exe = [sys.executable, "-m", "bigtcp_pcap.cli"]
    env = {k: v for k, v in os.environ.items() if k != "BIGTCP_PCAP_NO_FORK"}
    if fork:
        r = subprocess.run([sys.executable, "-c", FORK_CHECK], env=env, capture_output=True, text=True, check=True)
        assert r.stdout.split() == ["True", "False"]
    else:
        env["BIGTCP_PCAP_NO_FORK"] = "1"
    src = tmp_path / "in"
    src.mkdir()
    for cap in DATASET:
        (src / cap.name).write_bytes(cap.read_bytes())
    one = KERNEL / "traced" / "v4_65536.snd.pcap"
    for args in ([str(src), "-o", str(tmp_path / "ds")], [str(one), "-o", str(tmp_path / "split")]):
        r = subprocess.run([*exe, "analyze", *args, "--jobs", "2", "--no-progress"], env=env, capture_output=True,
                           text=True, check=False)
        assert r.returncode == 0, r.stderr[-2000:]
    assert "(2 part(s))" in r.stderr, r.stderr  # merged from its parts, not run serially
    for cap in DATASET:
        serial = analyze(cap, outdir=tmp_path / "serial" / cap.name)
        for t in TABLES:
            part = tmp_path / "ds" / t / f"capture={cap.name}" / "part-0.parquet"
            assert part.exists() == (serial.outdir / f"{t}.parquet").exists(), (cap.name, t)
            if part.exists():
                pd.testing.assert_frame_equal(_frame(pd.read_parquet(part)),
                                              _frame(pd.read_parquet(serial.outdir / f"{t}.parquet")),
                                              check_dtype=False, obj=f"{cap.name} {t}")
    assert_same_tables(analyze(one, outdir=tmp_path / "serial1").outdir, tmp_path / "split")


def test_a_part_run_loads_no_pandas(tmp_path):
    """A split run's part (flow_state: merge rows and FIN/RST state) stays as lean as a plain analyze: no pandas
    import (0.4 s per part; pyarrow's pa.array on numpy arrays imports it)."""
    import subprocess
    import sys

    code = ("import sys; from bigtcp_pcap import analyze; "
            f"analyze({str(KERNEL / 'v4_65536.snd.pcap')!r}, outdir={str(tmp_path / 'o')!r}, flow_state=True); "
            "print('pandas' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"
    assert (tmp_path / "o" / "merge_rows.parquet").exists() and (tmp_path / "o" / "flow_state.parquet").exists()
    # nor does the worker's whole task (its largest super-packet once came from pq.read_table: pyarrow.dataset,
    # which imports pandas, 0.25-0.35 s of a 1 M-packet part)
    cap = SPLIT_FIXTURES[0]
    code = ("import sys, json; from pathlib import Path; import bigtcp_pcap.many as M; "
            f"ps, ts = M._split_tasks({str(cap)!r}, 'c', Path({str(tmp_path / 'parts')!r}), 2, "
            "dict(M._gro_kw({}), ack_delay_ns=None, part_packets=False)); "
            "r = [M.run_task(t) for t in ts]; "
            "print(json.dumps(['pandas' in sys.modules, [x['largest_superpacket'] for x in r], "
            "[x['outdir'] for x in r]]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, largest, outs = json.loads(r.stdout)
    assert loaded is False and len(outs) == 2
    for big, out in zip(largest, outs):
        col = pd.read_parquet(f"{out}/flows.parquet")["max_superpacket_len"].dropna()
        assert big == (int(col.max()) if len(col) else None)
    assert any(b is not None and b > 1500 for b in largest), largest


def _big_endian(src, dst) -> None:
    """``src`` (a little-endian pcap) rewritten with big-endian headers: the same records."""
    import struct

    b = src.read_bytes()
    out = bytearray(struct.pack(">IHHiIII", *struct.unpack("<IHHiIII", b[:24])))
    pos = 24
    while pos + 16 <= len(b):
        hdr = struct.unpack("<IIII", b[pos:pos + 16])
        out += struct.pack(">IIII", *hdr) + b[pos + 16:pos + 16 + hdr[2]]
        pos += 16 + hdr[2]
    dst.write_bytes(bytes(out))


def test_record_times_are_the_readers(tmp_path):
    """The cut finder's own record walk (over a memory map) gives the reader's timestamps and record offsets:
    micro- and nanosecond files, big-endian, a truncated last record; a damaged caplen gives None (runs whole)."""
    from bigtcp_pcap.capture.reader import CaptureReader
    from bigtcp_pcap.errors import CaptureError
    from bigtcp_pcap.split import record_times

    field = KERNEL.parent / "field"
    caps = SPLIT_FIXTURES[:3] + LINKTYPES[:2] + [field / "erspan_zeek.pcap", field / "cisco_fabricpath.pcap"]
    be = tmp_path / "be.pcap"
    _big_endian(SPLIT_FIXTURES[0], be)
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(SPLIT_FIXTURES[1].read_bytes()[:-7])
    magics = set()
    for cap in [*caps, be, cut]:
        magics.add(cap.read_bytes()[:4])
        ts, off = [], []
        try:
            for rb in CaptureReader(cap):
                ts.append(rb.ts_ns)
                off.append(rb.file_off)
        except CaptureError:  # the truncated file: what the reader read before it
            assert cap == cut
        t, o = record_times(cap, chunk=50)  # several walks per file
        assert np.array_equal(t, np.concatenate(ts)), cap
        assert np.array_equal(o, np.concatenate(off)), cap
        assert t.size > 50, cap
    assert len(magics) >= 3, magics  # usec and nsec little-endian, and big-endian
    bad = bytearray(SPLIT_FIXTURES[0].read_bytes())
    bad[24 + 8:24 + 12] = (1 << 30).to_bytes(4, "little")  # the first record's caplen: 1 GiB
    (tmp_path / "bad.pcap").write_bytes(bytes(bad))
    assert record_times(tmp_path / "bad.pcap") is None
    assert find_parts(tmp_path / "bad.pcap", 2, 1)[0].records == -1  # one part: the whole file



def _parts_from_times(path, parts, min_gap_ns):
    """find_parts' cuts computed the plain way, from every record's time and offset at once (the oracle)."""
    import os

    t, off = record_times(path)
    n, size = t.size, os.path.getsize(path)
    gap = t[1:] - np.maximum.accumulate(t)[:-1]
    cand = np.flatnonzero(gap > min_gap_ns) + 1
    if cand.size == 0:
        return [(0, -1)]
    targets = size * np.arange(1, parts) / parts
    bounds = [0, *sorted({int(cand[np.argmin(np.abs(off[cand] - x))]) for x in targets}), n]
    return [(a, b - a, int(off[a]) if a else 24, int(off[b]) if b < n else size, int(t[a]), int(t[b - 1]))
            for a, b in itertools.pairwise(bounds)]


def test_cut_finder_maps_windows(tmp_path):
    """The cut finder walks the file one mapped window at a time: with windows of one page (records cross
    every window edge, and a record larger than a window) it finds the cuts and record times that the whole
    list of record times gives, on kernel captures and a file of 10,000-byte records."""
    import mmap
    import struct

    from bigtcp_pcap.split import record_times

    big = tmp_path / "big_records.pcap"
    recs = [struct.pack("<IIII", 1000 + 3 * (i // 4), 7, 10_000, 10_000) + bytes([i]) * 10_000 for i in range(12)]
    big.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + b"".join(recs))
    page = mmap.ALLOCATIONGRANULARITY
    checked = 0
    for cap in [*SPLIT_FIXTURES[:4], big]:
        t, o = record_times(cap)
        tw, ow = record_times(cap, chunk=37, window=page)
        assert np.array_equal(t, tw) and np.array_equal(o, ow), cap
        gaps = [1, 200_000_000] if cap != big else [1_000_000_000]
        for gap in gaps:
            for nparts in (2, 3, 8):
                want = _parts_from_times(cap, nparts, gap)
                got = find_parts(cap, nparts, gap, window=page)
                if want == [(0, -1)]:
                    assert [p.records for p in got] == [-1]
                    continue
                assert [(p.first_record, p.records, p.start, p.stop, p.ts_first_ns, p.ts_last_ns)
                        for p in got] == want, (cap, gap, nparts)
                checked += len(got) > 1
    assert checked >= 6
    assert [p.records for p in find_parts(big, 3, 1_000_000_000, window=page)] == [4, 4, 4]

MALLINFO = """
import ctypes, json
import numpy as np
class MI(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                             "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MI
from bigtcp_pcap.buffers import tune_malloc

def mapped(nbytes):  # was this array given its own memory map (not carved from the heap)?
    before = libc.mallinfo2().hblkhd
    a = np.ones(nbytes, np.uint8)
    got = libc.mallinfo2().hblkhd - before >= nbytes
    del a
    return got

table, column = 16 << 20, 1 << 20  # a state table; a batch column (65,536 rows of 16 bytes)
out = {"default": [mapped(table), mapped(table), mapped(column)]}
out["changed"] = tune_malloc()
table = 24 << 20  # larger than the hole the default left in the heap (a hole that fits is reused first)
out["tuned"] = [mapped(table), mapped(table), mapped(column)]
print(json.dumps(out))
"""


@pytest.mark.parametrize("trim", ["65536", None], ids=["dask-nanny-env", "default"])
def test_malloc_maps_tables_and_keeps_batches_on_the_heap(trim):
    """glibc's default: the first 16 MiB table is mapped, the next comes from the heap (the dynamic threshold
    rose to it when the first was freed) and stays there as a hole when freed. Under a Dask nanny's
    ``MALLOC_TRIM_THRESHOLD_`` the threshold is fixed at 128 KiB: even a 1 MiB batch column is mapped,
    faulted in and unmapped. ``tune_malloc`` (the CLI and every worker task run it): tables mapped, batch
    columns on the heap, either way."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    if trim:
        env["MALLOC_TRIM_THRESHOLD_"] = trim
    r = subprocess.run([sys.executable, "-c", MALLINFO], capture_output=True, text=True, check=True, env=env)
    got = json.loads(r.stdout)
    want_default = [True, True, True] if trim else [True, False, False]
    assert got == {"default": want_default, "changed": True, "tuned": [True, True, False]}


def test_a_dataset_run_replaces_the_partitions_of_an_earlier_one(tmp_path):
    # a second run into the same OUTDIR left the first run's capture= partitions: pandas read 3 captures' flows
    # where the summary said 2
    out = tmp_path / "ds"
    analyze_many([KERNEL / "v6_185000.rcv.pcap", KERNEL / "traced" / "v6_185000.rcv.pcap"], out, audit=False)
    m = analyze_many([KERNEL / "v6_185000.rcv.pcap", KERNEL / "v4_185000.rcv.pcap"], out, audit=False)
    flows = pd.read_parquet(out / "flows")
    assert sorted(flows["capture"].astype(str).unique()) == sorted(c["name"] for c in m.captures)
    assert len(flows) == sum(c["summary"]["flows"] for c in m.captures) > 0
