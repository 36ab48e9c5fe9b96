"""dissect (text and JSON lines) against the packets table; the progress bar only on terminals."""

from __future__ import annotations

import io
import json

from oracle import KERNEL, tshark_fields
from rich.console import Console
from typer.testing import CliRunner

from bigtcp_pcap.api import analyze
from bigtcp_pcap.cli import app
from bigtcp_pcap.output.summary import progress_bar

CAP = KERNEL / "mixed_185000.rcv.pcap"


def test_dissect_json_equals_packets_table():
    res = CliRunner().invoke(app, ["dissect", str(CAP), "--json"])
    assert res.exit_code == 0
    rows = [json.loads(x) for x in res.stdout.splitlines()]
    pk = analyze(CAP, packets=True).packets
    assert len(rows) == len(pk)
    for r, p in zip(rows, pk.itertuples()):
        assert r["frame"] == p.frame and r["wirelen"] == p.wirelen and r["bigtcp"] == p.bigtcp
        assert r["ip_len"] == (None if p.ip_version != p.ip_version else int(p.ip_len))
        if r["tcp_payload_len"] is not None:
            assert r["tcp_payload_len"] == p.tcp_payload_len and r["tcp_seq"] == p.tcp_seq


def test_dissect_text_shows_true_lengths_and_count():
    res = CliRunner().invoke(app, ["dissect", str(CAP), "-c", "400"])
    lines = res.stdout.splitlines()
    assert len(lines) == len(tshark_fields(CAP, ["frame.number"]))
    jumbo = tshark_fields(CAP, ["frame.number", "tcp.len"], "ipv6.opt.jumbo")
    for r in jumbo:
        line = lines[int(r["frame.number"]) - 1]
        assert "BIG TCP hbh_jumbo" in line and line.endswith(f"length {r['tcp.len']}")
    assert len(CliRunner().invoke(app, ["dissect", str(CAP), "-c", "5"]).stdout.splitlines()) == 5


def test_progress_bar_draws_on_a_terminal_only(tmp_path):
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=100)
    with progress_bar(True, con) as cb:
        cb(50, 100)
        cb(100, 100)
    assert "reading" in buf.getvalue()
    with progress_bar(False, con) as cb:
        assert cb is None
    # through the CLI (not a TTY here): nothing but the final line on stderr
    res = CliRunner().invoke(app, ["analyze", str(CAP), "-o", str(tmp_path), "--json"])
    assert "reading" not in res.stderr
