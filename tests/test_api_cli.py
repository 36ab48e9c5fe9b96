"""The Python API and the CLI: identical tables, provenance metadata, flows against tshark, plots."""

from __future__ import annotations

import hashlib
from collections import Counter

import pandas as pd
import pytest
from oracle import KERNEL, tshark_fields
from typer.testing import CliRunner

import bigtcp_pcap
from bigtcp_pcap.api import analyze, sample_capture
from bigtcp_pcap.cli import app
from bigtcp_pcap.output.parquet import read_metadata
from bigtcp_pcap.output.tables import TABLES  # the registry (output/tables.py)


def test_api_and_cli_give_identical_tables(tmp_path):
    cap = KERNEL / "v6_snd185000_rcv80000.snd.pcap"
    res = CliRunner().invoke(app, ["analyze", str(cap), "-o", str(tmp_path / "cli"), "--packets",
                                   "--gro-max-size", "80000", "--filter", "tcp port 5201", "--filter", "tcp"])
    assert res.exit_code == 0, res.output
    a = analyze(cap, packets=True, gro_max_size=80000, filters=["tcp port 5201", "tcp"])
    for name in TABLES:
        cli_df = pd.read_parquet(tmp_path / "cli" / f"{name}.parquet", dtype_backend="numpy_nullable")
        api_df = getattr(a, name)
        pd.testing.assert_frame_equal(cli_df, api_df)
    assert len(a.superpackets) > 0 and len(a.packets) == a.info.packets


def test_provenance_metadata(tmp_path):
    cap = KERNEL / "v4_185000.rcv.pcap"
    a = analyze(cap, outdir=tmp_path, packets=True, gro_max_size=185000, gro_ipv4_max_size=185000, sha256=True)
    n_frames = len(tshark_fields(cap, ["frame.number"]))
    assert a.info.packets == n_frames and not a.partial
    for name in ("packets", "superpackets", "flows", "findings"):
        m = read_metadata(tmp_path / f"{name}.parquet")
        assert m["tool_version"] == bigtcp_pcap.__version__
        assert m["source_name"] == cap.name
        assert m["source_size"] == cap.stat().st_size
        assert m["source_sha256"] == hashlib.sha256(cap.read_bytes()).hexdigest()
        assert m["linktypes"] == [1] and m["snaplen"] == [96]
        assert m["packet_count"] == n_frames
        assert m["partial"] is False and m["error"] is None
        assert m["params"]["gro"]["gro_max_size"] == 185000
        assert m["params"]["gro"]["effective_gro_ipv4_max_size"] == 185000


def test_sha256_only_when_asked(tmp_path):
    cap = KERNEL / "v6_185000.rcv.pcap"
    analyze(cap, outdir=tmp_path / "plain", audit=False)
    assert read_metadata(tmp_path / "plain" / "flows.parquet")["source_sha256"] is None
    res = CliRunner().invoke(app, ["analyze", str(cap), "-o", str(tmp_path / "cli"), "--sha256", "--no-audit",
                                   "--no-progress"])
    assert res.exit_code in (0, 1), res.output
    want = hashlib.sha256(cap.read_bytes()).hexdigest()
    for name in ("superpackets", "flows", "findings"):
        assert read_metadata(tmp_path / "cli" / f"{name}.parquet")["source_sha256"] == want


@pytest.mark.parametrize("capture", ["v6_185000.rcv.pcap", "v4_185000.snd.pcap", "mixed_185000.rcv.pcap"])
def test_flow_counts_equal_tshark(capture):
    cap = KERNEL / capture
    a = analyze(cap)
    rows = tshark_fields(cap, ["ip.src", "ipv6.src", "ip.dst", "ipv6.dst", "tcp.srcport", "tcp.dstport",
                               "tcp.len"], "tcp")
    pkts, payload = Counter(), Counter()
    for r in rows:
        key = (r["ip.src"] or r["ipv6.src"], r["ip.dst"] or r["ipv6.dst"], int(r["tcp.srcport"]),
               int(r["tcp.dstport"]))
        pkts[key] += 1
        payload[key] += int(r["tcp.len"])
    flows = a.flows
    got_pkts = {(f.src, f.dst, f.sport, f.dport): f.packets for f in flows.itertuples()}
    got_payload = {(f.src, f.dst, f.sport, f.dport): f.payload_bytes for f in flows.itertuples()}
    assert got_pkts == dict(pkts)
    assert got_payload == dict(payload)
    big = flows[flows.payload_bytes > 1_000_000]
    assert (big.capture_gap_bytes == 0).all() and (big.retransmissions == 0).all()


def test_capture_gap_shows_a_tcp_port_filtered_receiver(tmp_path):
    """Dropping the HBH super-packets (what 'tcp port 5201' does) shows as capture_gap_bytes and a finding."""
    from oracle import read_pcap_records, write_pcap

    recs = read_pcap_records(KERNEL / "v6_185000.rcv.pcap")
    kept = [(d, w) for d, w in recs if not (len(d) > 20 and d[12:14] == b"\x86\xdd" and d[20] == 0)]
    assert len(kept) < len(recs)
    cap = write_pcap(tmp_path / "filtered.pcap", kept, snaplen=96)
    a = analyze(cap)
    data_flow = a.flows.sort_values("payload_bytes").iloc[-1]
    dropped = sum(int(r["tcp.len"]) for r in tshark_fields(KERNEL / "v6_185000.rcv.pcap", ["tcp.len"],
                                                            "ipv6.opt.jumbo"))
    assert int(data_flow.capture_gap_bytes) == dropped
    assert "capture.tcp_port_filter_suspected" in set(a.findings.code)


def test_bundled_sample_is_real_bigtcp():
    a = analyze()
    assert a.info.name == str(sample_capture())
    assert a.summary["bigtcp"]["hbh_jumbo"] > 0 and a.summary["bigtcp"]["v4_totlen0"] > 0


def test_plots_are_written(tmp_path):
    analyze(KERNEL / "v6_snd185000_rcv80000.snd.pcap", outdir=tmp_path, gro_max_size=80000)
    res = CliRunner().invoke(app, ["plot", str(tmp_path)])
    assert res.exit_code == 0, res.output
    paths = res.output.split()
    assert len(paths) == 4  # sizes, segments, size over time, flush reasons over time
    for p in paths:
        with open(p, "rb") as f:
            head = f.read(8)
        assert head == b"\x89PNG\r\n\x1a\n"
        assert __import__("os").path.getsize(p) > 20_000


def test_json_summary(tmp_path):
    import json

    res = CliRunner().invoke(app, ["analyze", str(KERNEL / "v6_185000.rcv.pcap"), "-o", str(tmp_path), "--json"])
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert doc["bigtcp"]["hbh_jumbo"] == len(tshark_fields(KERNEL / "v6_185000.rcv.pcap", ["frame.number"],
                                                             "ipv6.opt.jumbo"))
    assert {r["expr"] for r in doc["filter_audit"]["results"]} == {"tcp", "ip6 and tcp", "tcp port 5201"}


@pytest.mark.parametrize("capture", ["mixed_185000.rcv.pcap", "v4_185000.rcv.pcap", "v6_80000.rcv.pcap"])
def test_default_audit_finds_the_same_mistakes_as_the_full_audit(capture):
    """analyze's default audit skips frames BIG TCP cannot affect; its misses equal audit-filter's."""
    from bigtcp_pcap.audit import audit_capture

    cap = KERNEL / capture
    a = analyze(cap)
    default = {r["expr"]: r for r in a.summary["filter_audit"]["results"]}
    for expr in a.summary["filter_audit"]["audited"]:
        full = audit_capture(expr, cap)
        if full.clean:
            assert expr not in default
            continue
        assert default[expr]["missed"] == full.missed and default[expr]["false_matches"] == full.false_matches
        assert default[expr]["reasons"] == full.reasons
        assert default[expr]["suggestion"] == full.suggestion
        got = a.filter_audit
        assert set(got[got["filter"] == expr].frame) == set(full.frame[full.verdict != 0].tolist())


def test_tables_of_an_earlier_run_do_not_survive(tmp_path):
    analyze(KERNEL / "v6_185000.rcv.pcap", outdir=tmp_path, packets=True, filters=["tcp"])
    assert (tmp_path / "packets.parquet").exists() and (tmp_path / "filter_audit.parquet").exists()
    a = analyze(KERNEL / "v6_65536.rcv.pcap", outdir=tmp_path, audit=False)
    assert not (tmp_path / "packets.parquet").exists()
    assert a.packets is None
    # filter_audit.parquet is always written: here empty, with its schema (the earlier run's rows are gone)
    assert a.filter_audit is not None and len(a.filter_audit) == 0
    assert list(a.filter_audit.columns) == ["frame", "filter", "verdict", "reason"]


def test_every_table_is_written_with_its_schema_when_empty(tmp_path):
    import pyarrow.parquet as pq

    from bigtcp_pcap.output.audit import AUDIT_SCHEMA

    a = analyze(KERNEL / "v6_65536.snd.pcap", outdir=tmp_path, filters=["ip6"])  # a filter that never mis-parses
    (r,) = a.summary["filter_audit"]["results"]
    assert r["missed"] == r["false_matches"] == 0
    t = pq.read_table(tmp_path / "filter_audit.parquet")
    assert t.num_rows == 0 and t.schema.remove_metadata() == AUDIT_SCHEMA.remove_metadata()
    assert t.schema.metadata[b"bigtcp_pcap.source_name"] == b"v6_65536.snd.pcap"


def test_nullable_columns_read_as_nullable_integers_and_provenance_in_the_arrow_schema(tmp_path):
    import json

    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    cap = KERNEL / "v6_185000.rcv.pcap"
    a = analyze(cap, outdir=tmp_path, packets=True)
    p = a.packets
    # jumbo_len is null on ordinary packets: tshark's ipv6.jumbo field is the oracle for where it is present
    jumbo = [r.get("ipv6.opt.jumbo", "") for r in tshark_fields(cap, ["ipv6.opt.jumbo"])]
    assert str(p.jumbo_len.dtype) == "UInt32"
    assert p.jumbo_len.isna().tolist() == [v == "" for v in jumbo]
    assert [int(v) for v in jumbo if v] == p.jumbo_len.dropna().astype(int).tolist()
    assert str(a.flows.mss.dtype).startswith(("UInt", "Int"))
    for path in (tmp_path / "packets.parquet", tmp_path / "superpackets.parquet"):
        for md in (pq.read_table(path).schema.metadata, pq.read_schema(path).metadata,
                   ds.dataset(path).schema.metadata):
            assert md[b"bigtcp_pcap.source_name"] == cap.name.encode()  # plain text, no JSON quotes
            assert json.loads(md[b"bigtcp_pcap.source_size"]) == cap.stat().st_size
        assert pd.read_parquet(path).attrs["bigtcp_pcap"]["source_name"] == cap.name
        assert read_metadata(path)["source_name"] == cap.name


def test_superpacket_addresses_are_their_flows(tmp_path):
    a = analyze(KERNEL / "v6_185000.snd.pcap", outdir=tmp_path)
    sp, flows = a.superpackets, a.flows.set_index("flow_id")
    assert len(sp) > 50 and sp.flow_id.nunique() >= 2
    assert (sp.src.to_numpy() == flows.loc[sp.flow_id, "src"].to_numpy()).all()
    assert (sp.dst.to_numpy() == flows.loc[sp.flow_id, "dst"].to_numpy()).all()


def test_background_sink_writes_the_same_file(tmp_path):
    import pyarrow.parquet as pq

    from bigtcp_pcap.api import iter_batches
    from bigtcp_pcap.flows.table import FlowTable
    from bigtcp_pcap.output import parquet as P

    flows = FlowTable()
    tables = [P.packets_table(pb, flows.assign(pb)) for pb, _ in iter_batches(KERNEL / "v6_185000.snd.pcap",
                                                                             batch_size=100)]
    assert len(tables) > 5
    for background in (False, True):
        sink = P.TableSink(tmp_path / f"{background}.parquet", P.PACKETS_SCHEMA, background=background)
        sink.ROW_GROUP = 150  # many row groups, so several are in flight on the writer thread
        for t in tables:
            sink.write(t)
        sink.close({"run": 1})
    a, b = (pq.ParquetFile(tmp_path / f"{bg}.parquet") for bg in (False, True))
    assert a.metadata.num_rows == sum(t.num_rows for t in tables)
    assert a.metadata.num_row_groups == b.metadata.num_row_groups > 3
    assert a.read().equals(b.read())
    assert P.read_metadata(tmp_path / "True.parquet") == {"run": 1}


def test_analyze_refuses_a_config_and_gro_keywords_together():
    from bigtcp_pcap.gro import GroConfig

    with pytest.raises(TypeError, match="gro_max_size"):
        bigtcp_pcap.analyze(gro=GroConfig(), gro_max_size=185000, audit=False)


def test_analyze_refuses_a_misspelled_gro_keyword():
    with pytest.raises(TypeError, match="gro_max_sizee"):
        bigtcp_pcap.analyze(gro_max_sizee=185000, audit=False)


def test_cli_has_no_engine_switch():
    r = CliRunner().invoke(app, ["analyze", "--gro-engine", "reference"])
    assert r.exit_code == 2 and "No such option" in r.output



def test_summary_gives_the_share_of_every_poll_end_the_rows_have(tmp_path):
    """The summary's poll-end line, in words, against the super-packet rows' own poll_end column (a NIC model,
    whose coalescing ends the line once had no words for)."""
    cap = KERNEL / "v6_65536.snd.pcap"
    res = CliRunner().invoke(app, ["analyze", str(cap), "-o", str(tmp_path), "--rx-usecs", "10"],
                             env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    pe = pd.read_parquet(tmp_path / "superpackets.parquet")["poll_end"].astype(str)
    counts = pe[pe != "none"].value_counts()
    text = " ".join(res.output.split())
    assert f"{counts.sum()} super-packets ended at a NAPI poll end" in text
    assert counts["coalescing"] > 0
    assert f"{100 * counts['coalescing'] / counts.sum():.0f} % the NIC's interrupt coalescing" in text


def test_flows_count_their_evidenced_and_guessed_poll_ends_as_the_rows_say():
    """flows.parquet's poll_ends_evidenced / poll_ends_guessed equal, per flow, the super-packet rows whose
    poll_end is ack or trace / gap or push_gap, counted here from the rows (a sender capture with both)."""
    a = analyze(KERNEL / "v6_65536.snd.pcap", audit=False)
    sp = a.superpackets
    pe = sp["poll_end"].astype(str)
    for col, kinds in (("poll_ends_evidenced", ("ack", "trace")), ("poll_ends_guessed", ("gap", "push_gap"))):
        want = sp[pe.isin(kinds)].groupby("flow_id").size()
        got = a.flows.set_index("flow_id")[col]
        assert int(got.sum()) == int(want.sum()) > 0, col
        assert (got.reindex(want.index) == want).all(), col
        assert int(got.drop(want.index).sum()) == 0, col
        # the summary's top flows carry them (and the report and the console table show them)
        top = a.summary["top_flows"]
        assert top and all(r[col] == int(want.get(r["flow_id"], 0)) for r in top), col
    html = a.report().read_text()
    assert "poll ends evidenced" in html and "poll ends guessed" in html


def test_duration_is_the_span_of_the_timestamps_as_capinfos_says(tmp_path):
    """Records need not be in time order (several pcapng sections one after another, mergecap -a, a clock step):
    the capture's duration is latest minus earliest timestamp, as capinfos reports it, also for a split run."""
    import re
    import subprocess

    from bigtcp_pcap.many import analyze_split

    parts = []
    for name, src in (("m", KERNEL / "mixed_185000.rcv.pcap"), ("s", KERNEL / "linktypes" / "sll2_v6_185000.rcv.pcap")):
        out = tmp_path / f"{name}.pcapng"
        subprocess.run(["editcap", "-F", "pcapng", str(src), str(out)], check=True, capture_output=True)
        parts.append(out.read_bytes())
    cap = tmp_path / "sections.pcapng"
    cap.write_bytes(parts[0] + parts[1] + parts[0])  # the second section is years earlier than the first
    info = subprocess.run(["capinfos", "-u", str(cap)], check=True, capture_output=True, text=True).stdout
    want = float(re.search(r"Capture duration:\s+([0-9.]+) seconds", info).group(1))
    s = analyze(cap, outdir=tmp_path / "o").summary["capture"]
    assert s["duration_s"] == pytest.approx(want, abs=1e-6)
    assert s["duration_s"] > 1000
    assert s["end_ns"] - s["start_ns"] == round(want * 1e9)
    split = analyze_split(cap, tmp_path / "j", jobs=2).summary["capture"]
    assert (split["duration_s"], split["start_ns"], split["end_ns"]) == (s["duration_s"], s["start_ns"], s["end_ns"])
