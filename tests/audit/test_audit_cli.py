"""``audit-filter`` through typer: numbers from the oracles, exit codes 0/1/2, one-line errors."""

from __future__ import annotations

import collections
import json

import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from bigtcp_pcap.audit.cli import register

from .conftest import kernel_capture, needs_tcpdump, needs_tshark, tcpdump_count, tcpdump_error, tshark_frames

JSON_KEYS = {"matched", "truth", "missed", "false_matches", "reasons", "suggestion", "suggestion_verified", "flows",
             "expr", "frames"}


@pytest.fixture
def app():
    app = typer.Typer()
    register(app)

    @app.callback()
    def main() -> None:  # keeps typer in multi-command mode, as on the real app
        pass

    return app


def run(app, *args):
    return CliRunner().invoke(app, ["audit-filter", *args])


@needs_tshark
@needs_tcpdump
def test_text_report_and_exit_1_when_packets_are_missed(app):
    cap = kernel_capture("v6_185000.rcv.pcap")
    truth = len(tshark_frames(cap, "tcp.port == 5201"))
    kept = tcpdump_count(cap, "tcp port 5201")
    r = run(app, "tcp port 5201", str(cap))
    assert r.exit_code == 1, r.output
    assert f"matched {kept}   truth {truth}   missed {truth - kept}   false matches 0" in r.output
    assert "ipv6_hbh_jumbo" in r.output and "suggestion (verified" in r.output
    assert "ip6[48+ip6[41]*8:2]=5201" in r.output


@needs_tshark
@needs_tcpdump
def test_json_document(app, tmp_path):
    cap = kernel_capture("mixed_185000.rcv.pcap")
    truth = tshark_frames(cap, "not tcp")
    r = run(app, "not tcp", str(cap), "--json", "--parquet", str(tmp_path / "filter_audit.parquet"))
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert JSON_KEYS <= doc.keys()
    assert doc["truth"] == len(truth) and doc["matched"] == tcpdump_count(cap, "not tcp")
    assert doc["false_matches"] == doc["matched"] - len(truth) and doc["missed"] == 0
    assert doc["suggestion_verified"] is True and tcpdump_count(cap, doc["suggestion"]) == len(truth)
    assert sum(f["false_matches"] for f in doc["flows"]) == doc["false_matches"]
    assert len(doc["frames"]) == doc["false_matches"]
    table = pq.read_table(tmp_path / "filter_audit.parquet").to_pandas()
    assert (table["verdict"] == "false_match").sum() == doc["false_matches"]
    assert set(table.columns) >= {"frame", "verdict", "reason"}


@needs_tshark
def test_exit_0_on_a_capture_without_big_tcp(app):
    cap = kernel_capture("v6_65536.rcv.pcap")
    r = run(app, "tcp port 5201", str(cap), "--json")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc["missed"] == doc["false_matches"] == 0 and doc["truth"] == len(tshark_frames(cap, "tcp.port == 5201"))
    assert doc["suggestion"] is None


@needs_tcpdump
@pytest.mark.parametrize("expr", ["tcp port", "ip6 and tcp[13] & 2 != 0"])
def test_bad_expression_exit_2_with_libpcaps_text(app, expr):
    r = run(app, expr, str(kernel_capture("sample.pcap")))
    assert r.exit_code == 2
    assert tcpdump_error(expr) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output


@pytest.mark.usefixtures("no_libpcap")
def test_missing_libpcap_exit_2_with_install_hint(app):
    r = run(app, "tcp", str(kernel_capture("sample.pcap")))
    assert r.exit_code == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "apt-get install libpcap0.8" in r.stderr


def test_unreadable_capture_exit_3(app, tmp_path):
    r = run(app, "tcp", str(tmp_path / "missing.pcap"))
    assert r.exit_code == 3 and "missing.pcap" in r.stderr


@needs_tcpdump
def test_bad_expression_is_reported_on_an_empty_capture(app, tmp_path):
    from .conftest import write_pcap

    r = run(app, "tcp port", str(write_pcap(tmp_path / "empty.pcap", [])))
    assert r.exit_code == 2 and tcpdump_error("tcp port") in r.stderr


def test_parquet_of_a_truncated_capture_is_marked_partial(app, tmp_path):
    # the verdicts of the frames before the fault are written; the file said nothing of the fault (analyze's
    # tables carry partial/error), and read_metadata failed on its plain-text filter key
    from bigtcp_pcap.output.parquet import read_metadata

    raw = kernel_capture("v6_185000.rcv.pcap").read_bytes()
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(raw[:5000])
    out = tmp_path / "v.parquet"
    r = run(app, "tcp", str(cut), "--parquet", str(out))
    assert r.exit_code == 3 and "byte offset" in r.stderr
    meta = read_metadata(out)
    assert meta["partial"] is True and meta["filter"] == "tcp" and "cut.pcap (frame " in meta["error"]
    whole = tmp_path / "w.parquet"
    assert run(app, "tcp", str(kernel_capture("v6_185000.rcv.pcap")), "--parquet", str(whole)).exit_code == 1
    assert read_metadata(whole)["partial"] is False and read_metadata(whole)["error"] is None
    assert run(app, "tcp", str(cut), "--max-flows", "-1").exit_code == 2


@needs_tshark
@needs_tcpdump
@pytest.mark.parametrize("name", ["erspan2", "gre_ip", "gre_teb"])
def test_plain_frames_in_a_gre_or_erspan_mirror_are_audited(app, name):
    # a tunnel the normalized copy cannot rewrite used to put every frame in "not audited" (a mirror-port capture
    # could never come out clean); only the frames whose inner packet needs normalizing (here an MLD report with
    # a Hop-by-Hop header) stay unaudited
    from pathlib import Path

    cap = Path(__file__).resolve().parents[1] / "fixtures" / "wrapped" / f"{name}.pcap"
    r = run(app, "proto gre", str(cap), "--json")
    doc = json.loads(r.stdout)
    na = sum(doc["not_audited"].values())
    assert na == len(tshark_frames(cap, "ipv6.hopopts or ipv6.dstopts or ipv6.routing"))
    # matched counts every frame (libpcap's verdict), truth only the audited ones: all GRE here
    assert doc["matched"] == tcpdump_count(cap, "proto gre") == doc["truth"] + na > 20
    assert doc["missed"] == doc["false_matches"] == 0


@needs_tcpdump
def test_a_link_type_libpcap_does_not_know_is_the_captures_fault_not_the_filters(app, tmp_path):
    # it read "bad filter expression 'tcp': unknown data link type 9999", without the file
    raw = bytearray(kernel_capture("v6_185000.rcv.pcap").read_bytes())
    raw[20:24] = (9999).to_bytes(4, "little")
    cap = tmp_path / "lt9999.pcap"
    cap.write_bytes(bytes(raw))
    r = run(app, "tcp", str(cap))
    assert r.exit_code == 2
    (line,) = r.stderr.strip().splitlines()
    assert str(cap) in line and "libpcap knows no link type 9999" in line and "bad filter" not in line


@needs_tshark
def test_rejected_link_types_each_say_their_own_frame_count(app, tmp_path):
    # every rejected link type's note gave the total of all rejected frames (302 for 147 NULL + 155 SLL2)
    import subprocess

    from oracle import KERNEL, tshark_fields

    parts = [KERNEL / "linktypes" / "sll2_v6_185000.rcv.pcap", kernel_capture("v6_185000.rcv.pcap"),
             KERNEL / "linktypes" / "null_from_v6_185000.pcap"]
    cap = tmp_path / "mixed.pcapng"
    subprocess.run(["mergecap", "-F", "pcapng", "-w", str(cap), *map(str, parts)], check=True, capture_output=True)
    encap = collections.Counter(r["frame.encap_type"] for r in tshark_fields(cap, ["frame.encap_type"], prefs=[]))
    doc = json.loads(run(app, "ether host 1:2:3:4:5:6", str(cap), "--json").stdout)
    notes = [n for n in doc["notes"] if "libpcap rejects this expression" in n]
    # tshark's encapsulation numbers: 15 = NULL/loopback, 210 = SLL2 (wiretap's own WTAP_ENCAP values)
    assert len(notes) == 2
    assert f"its {encap['15']} frames" in next(n for n in notes if "(NULL)" in n)
    assert f"its {encap['210']} frames" in next(n for n in notes if "LINUX_SLL2" in n)


@needs_tcpdump
def test_analyze_summary_line_does_not_read_matched_as_a_share_of_truth(tmp_path):
    # "matched 28 of 27 true": matched is libpcap's verdict on every frame, truth only on the audited ones
    import subprocess
    import sys
    from pathlib import Path

    cap = Path(__file__).resolve().parents[1] / "fixtures" / "wrapped" / "gre_ip.pcap"
    r = subprocess.run([sys.executable, "-m", "bigtcp_pcap.cli", "analyze", str(cap), "-o", str(tmp_path),
                        "--filter", "proto gre"], capture_output=True, text=True, timeout=300, check=False)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("filter proto gre"))
    n = tcpdump_count(cap, "proto gre")  # every frame is GRE; one (an MLD report, HBH inside) is not audited
    assert f"libpcap matched {n}, truth {n - 1}," in line and " of " not in line and "not audited 1" in line
