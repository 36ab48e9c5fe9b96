"""dissect (text and JSON lines) against the packets table; the progress bar only on terminals."""

from __future__ import annotations

import io
import json
import subprocess

import pandas as pd
import pytest
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
        assert r["ip_len"] == (None if pd.isna(p.ip_version) else int(p.ip_len))  # nullable dtypes: <NA>
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


def _frames(lines: list[str]) -> list[int]:
    return [int(x.split()[0]) for x in lines]


def test_dissect_filter_is_judged_on_true_lengths_like_tshark():
    # tshark (TSO prefs on) parses TCP behind the HBH jumbo header, so its tcp.port selection is the truth that
    # tcpdump's own 'tcp port 5201' misses on the BIG TCP frames
    res = CliRunner().invoke(app, ["dissect", str(CAP), "-f", "tcp port 5201"])
    assert res.exit_code == 0, res.output
    want = [int(r["frame.number"]) for r in tshark_fields(CAP, ["frame.number"], "tcp.port == 5201")]
    assert _frames(res.stdout.splitlines()) == want
    jumbo = [int(r["frame.number"]) for r in tshark_fields(CAP, ["frame.number"], "ipv6.opt.jumbo")]
    assert set(jumbo) <= set(want) and jumbo
    res = CliRunner().invoke(app, ["dissect", str(CAP), "--bigtcp-only"])
    want_big = [int(r["frame.number"]) for r in tshark_fields(
        CAP, ["frame.number"], "ipv6.opt.jumbo or ip.len > 65535 or (ipv6 and ipv6.plen == 0 and not ipv6.hopopts)")]
    assert _frames(res.stdout.splitlines()) == want_big
    res = CliRunner().invoke(app, ["dissect", str(CAP), "-f", "tcp port 5201", "--bigtcp-only", "-c", "3"])
    assert _frames(res.stdout.splitlines()) == want_big[:3]


def test_dissect_bad_filter_is_a_usage_error():
    res = CliRunner().invoke(app, ["dissect", str(CAP), "-f", "tcp port"])
    assert res.exit_code == 2
    assert "bad filter expression 'tcp port'" in res.stderr and "Traceback" not in res.output


def test_dissect_shows_the_tcpdump_v_fields_as_tshark_reads_them():
    import re

    res = CliRunner().invoke(app, ["dissect", str(CAP)])
    lines = {int(x.split()[0]): x for x in res.stdout.splitlines()}
    rows = tshark_fields(CAP, ["frame.number", "ipv6.hlim", "ip.ttl", "ipv6.flow", "ip.id", "tcp.checksum",
                               "tcp.options.timestamp.tsval", "tcp.options.mss_val", "tcp.options.wscale.shift"],
                         "tcp")
    assert len(rows) > 100
    for r in rows:
        line = lines[int(r["frame.number"])]
        if r.get("ipv6.hlim"):
            assert f"hlim {r['ipv6.hlim']}," in line
            flow = int(r["ipv6.flow"], 16)
            assert (f"flowlabel 0x{flow:05x}," in line) == (flow != 0)
        else:
            assert f"ttl {r['ip.ttl']}, id {int(r['ip.id'], 16)}," in line
        assert f"cksum 0x{int(r['tcp.checksum'], 16):04x}," in line
        if r.get("tcp.options.timestamp.tsval"):
            assert f"TS val {r['tcp.options.timestamp.tsval']} ecr" in line
        if r.get("tcp.options.mss_val"):
            assert re.search(rf"options \[mss {r['tcp.options.mss_val']}\b", line)
        if r.get("tcp.options.wscale.shift"):
            assert f"wscale {r['tcp.options.wscale.shift']}" in line


LT_CAPS = [KERNEL / "v4_65536.snd.pcap", KERNEL / "linktypes" / "sll_v4_185000.rcv.pcap",
           KERNEL / "linktypes" / "loop_from_v4.pcap", KERNEL / "linktypes" / "tun_raw.snd.pcap"]


@pytest.mark.parametrize("cap", LT_CAPS, ids=lambda p: p.name)
def test_dissect_tcp_indexing_filter_on_every_link_type(cap):
    # tcp[] indexing is judged by the audit's truth program: libpcap's own for IPv4 (tcpdump agrees frame for
    # frame), extended to IPv6 (tshark's tcp fields); it selected nothing on Ethernet and raw IP and was a usage
    # error on SLL (the link type was passed where the compile key belongs)
    for expr, display in (("tcp[13] & 2 != 0", "tcp.flags.syn == 1"), ("tcp[13] & 8 != 0", "tcp.flags.push == 1")):
        res = CliRunner().invoke(app, ["dissect", str(cap), "-f", expr])
        assert res.exit_code == 0, res.output
        got = _frames(res.stdout.splitlines())
        assert got == [int(r["frame.number"]) for r in tshark_fields(cap, ["frame.number"], display)] and got
        v4 = subprocess.run(["tcpdump", "-nr", str(cap), "-c", "100000", f"ip and {expr}"], capture_output=True,
                            text=True, check=True).stdout.splitlines()
        v4_frames = [int(r["frame.number"]) for r in tshark_fields(cap, ["frame.number"], f"ip and ({display})")]
        assert len(v4) == len(v4_frames) and set(v4_frames) <= set(got)
