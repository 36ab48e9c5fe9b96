"""The plugin against the toolkit: packets.parquet lengths and kinds, superpackets, filter audits, findings.

Every frame of every kernel capture: bigtcp.ip_len / bigtcp.tcp_len / bigtcp.kind from tshark + bigtcp.lua
equal packets.parquet's ip_len / tcp_payload_len / bigtcp. The sidecar (written from analyze()'s tables) is
then read back through tshark and compared with superpackets.parquet, the filter audit and findings.parquet.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path

import pytest

from bigtcp_pcap.wireshark import read_sidecar
from bigtcp_pcap.wireshark.build import write_analysis_sidecar

from .conftest import count, fields, kernel_captures, kernel_params, needs_tshark

pytestmark = needs_tshark

try:
    from bigtcp_pcap.api import analyze
except ImportError:  # pragma: no cover - the API is not there yet
    analyze = None

needs_api = pytest.mark.skipif(analyze is None, reason="bigtcp_pcap.api.analyze is not available")


def _na(v) -> bool:
    import math

    import pandas as pd

    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _int_or_empty(v) -> str:
    return "" if _na(v) else str(int(v))


def _ordinary(kind: str, ip_len) -> bool:
    """A frame the plugin has nothing to say about (no bigtcp tree): no BIG TCP encoding, one segment at most."""
    return kind == "none" and (_na(ip_len) or int(ip_len) <= 1500)


def _shown_reason(sp_row) -> str:
    """bigtcp.flush_reason as the sidecar shows it: observed rows carry their segment count."""
    r = str(sp_row.flush_reason)
    return f"observed ({int(sp_row.n_segments)} segments)" if r == "observed" else r


@needs_api
@pytest.mark.parametrize("capture", kernel_params())
def test_plugin_lengths_and_kinds_equal_packets_parquet_for_every_frame(ws_home, capture):
    pk = analyze(capture, packets=True).packets
    rows = fields(ws_home, capture, ["frame.number", "bigtcp.kind", "bigtcp.ip_len", "bigtcp.tcp_len"])
    ws = {int(r[0]): tuple(r[1:]) for r in rows}
    assert len(ws) == len(pk)
    bad = []
    for fr, kind, ip_len, tcp_len in zip(pk["frame"], pk["bigtcp"].astype(str), pk["ip_len"],
                                         pk["tcp_payload_len"], strict=True):
        want = ("" if kind == "none" else kind, _int_or_empty(ip_len), _int_or_empty(tcp_len))
        if ws[int(fr)] == ("", "", "") and _ordinary(kind, ip_len):
            continue  # no bigtcp tree on an ordinary frame
        if ws[int(fr)] != want:
            bad.append((int(fr), ws[int(fr)], want))
    assert not bad, bad[:10]
    # -Y bigtcp.kind counts equal the toolkit's
    kinds = pk["bigtcp"].astype(str).value_counts()
    assert count(ws_home, capture, "bigtcp.kind") == int((pk["bigtcp"].astype(str) != "none").sum())
    for k in ("hbh_jumbo", "v6_plen0", "v4_totlen0"):
        assert count(ws_home, capture, f'bigtcp.kind == "{k}"') == int(kinds.get(k, 0)), k


def _receiver_captures() -> list[Path]:
    return [c for c in kernel_captures() if c.name.endswith(".rcv.pcap") or c.name == "sample.pcap"]


def _sender_captures() -> list[Path]:
    return [c for c in kernel_captures() if c.name.endswith(".snd.pcap")]


def _sidecar_fields(ws_home, capture, sidecar, names):
    return fields(ws_home, capture, ["frame.number", *names], extra=["-X", f"lua_script1:sidecar={sidecar}"])


def _check_superpackets(ws_home, capture, tmp_path):
    a = analyze(capture, packets=True)
    sp = a.superpackets
    assert len(sp) > 0
    sidecar = write_analysis_sidecar(tmp_path / "cap.bigtcp.tsv", analysis=a, capture=capture)
    rows = _sidecar_fields(ws_home, capture, sidecar, ["bigtcp.sidecar", "bigtcp.superpacket",
                                                       "bigtcp.flush_reason", "bigtcp.tcp_len"])
    frames_of: dict[int, list[int]] = defaultdict(list)
    payload_of: dict[int, int] = defaultdict(int)
    reason_of: dict[int, set] = defaultdict(set)
    for fr, status, spid, reason, tcp_len in rows:
        assert not status.startswith("refused"), status
        if spid:
            assert status.startswith("applied")
            i = int(spid)
            frames_of[i].append(int(fr))
            payload_of[i] += int(tcp_len)
            reason_of[i].add(reason)
    assert set(frames_of) == set(range(len(sp))), "every super-packet row has its frames in Wireshark"
    for i, r in enumerate(sp.itertuples()):
        assert min(frames_of[i]) == r.first_frame and max(frames_of[i]) == r.last_frame, i
        assert payload_of[i] == r.payload_len, (i, payload_of[i], r.payload_len)  # each payload byte once
        assert reason_of[i] == {_shown_reason(r)}, i
        if r.source == "rebuilt":
            assert len(frames_of[i]) <= r.n_segments
    # filterable
    top = int(sp["payload_len"].idxmax())
    assert count(ws_home, capture, f"bigtcp.superpacket == {top}", ) == 0  # needs the sidecar
    r = fields(ws_home, capture, ["frame.number"], extra=["-X", f"lua_script1:sidecar={sidecar}",
                                                          "-Y", f"bigtcp.superpacket == {top}"])
    assert [int(x[0]) for x in r] == sorted(frames_of[top])


@needs_api
@pytest.mark.parametrize("which", ["sender", "receiver"])
def test_sidecar_superpackets_match_superpackets_parquet(ws_home, tmp_path, which):
    caps = _sender_captures() if which == "sender" else _receiver_captures()
    if not caps:
        pytest.skip(f"no kernel {which} captures")
    _check_superpackets(ws_home, caps[0], tmp_path)


@needs_api
def test_sidecar_filter_miss_matches_filter_audit(ws_home, tmp_path):
    try:
        from bigtcp_pcap.audit import audit_capture
        from bigtcp_pcap.audit.libpcap import LibpcapMissing
    except ImportError:
        pytest.skip("bigtcp_pcap.audit is not available")
    caps = [c for c in _receiver_captures() if c.name.startswith(("v6_", "mixed_"))]
    if not caps:
        pytest.skip("no IPv6 kernel receiver capture")
    capture = caps[0]
    exprs = ["tcp port 5201", "ip6 and tcp", "not tcp"]
    try:
        audits = [audit_capture(e, capture, suggest=False) for e in exprs]
    except LibpcapMissing as e:
        pytest.skip(f"libpcap not usable: {e}")
    a = analyze(capture, packets=True)
    sidecar = write_analysis_sidecar(tmp_path / "cap.bigtcp.tsv", analysis=a, capture=capture, audits=audits)
    assert set(read_sidecar(sidecar).filters.values()) == set(exprs)
    rows = _sidecar_fields(ws_home, capture, sidecar, ["bigtcp.filter_miss", "bigtcp.filter_false_match",
                                                       "bigtcp.kind"])
    for expr, res in zip(exprs, audits, strict=True):
        t = res.frames_table().to_pandas()
        want_miss = set(t.loc[t["verdict"].astype(str) == "missed", "frame"].astype(int))
        want_false = set(t.loc[t["verdict"].astype(str) == "false_match", "frame"].astype(int))
        got_miss = {int(r[0]) for r in rows if expr in r[1].split(",")}
        got_false = {int(r[0]) for r in rows if expr in r[2].split(",")}
        assert got_miss == want_miss, expr
        assert got_false == want_false, expr
        # display filter on the new field
        n = len(fields(ws_home, capture, ["frame.number"], extra=[
            "-X", f"lua_script1:sidecar={sidecar}", "-Y", f'bigtcp.filter_miss == "{expr}"']))
        assert n == len(want_miss)
    # the known blind spot: 'tcp port 5201' misses exactly the HBH jumbo packets of the IPv6 flow
    jumbo = {int(r[0]) for r in rows if r[3] == "hbh_jumbo"}
    miss = {int(r[0]) for r in rows if "tcp port 5201" in r[1].split(",")}
    assert jumbo and miss == jumbo


# --- findings: a crafted capture with RFC 2675 violations -------------------------------------------------------

def _pcap(frames: list[bytes], ts0: int = 1_700_000_000) -> bytes:
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)
    for i, f in enumerate(frames):
        out += struct.pack("<IIII", ts0 + i, 123456, len(f), len(f)) + f
    return out


def _v6_frame(plen: int, ext: bytes, nh: int, l4: bytes) -> bytes:
    eth = bytes.fromhex("020000000002020000000001") + b"\x86\xdd"
    src = bytes.fromhex("fd00b100000000000000000000000001")
    dst = bytes.fromhex("fd00b100000000000000000000000002")
    return eth + struct.pack(">IHBB", 6 << 28, plen, nh, 64) + src + dst + ext + l4


def _tcp(payload: bytes) -> bytes:
    return struct.pack(">HHIIBBHHH", 40000, 5201, 1000, 1, 5 << 4, 0x18, 500, 0, 0) + payload


@needs_api
def test_sidecar_findings_are_expert_info_with_the_same_codes(ws_home, tmp_path):
    body = _tcp(b"x" * 100)
    frames = [
        # valid HBH jumbo (small values are fine for a test: the jumbo value says 70000, the frame is short)
        _v6_frame(0, bytes([6, 0, 0xC2, 4]) + struct.pack(">I", 8 + len(body)), 0, body),  # jumbo <= 65535
        _v6_frame(8 + len(body), bytes([6, 0, 0xC2, 4]) + struct.pack(">I", 70000), 0, body),  # plen != 0
        _v6_frame(0, bytes([6, 0, 1, 4, 0, 0, 0, 0]), 0, body),  # HBH without jumbo, plen 0
        _v6_frame(len(body), b"", 6, body),  # ordinary
    ]
    cap = tmp_path / "rfc2675.pcap"
    cap.write_bytes(_pcap(frames))
    a = analyze(cap, packets=True)
    fnd = a.findings
    per_frame = fnd[fnd["frame"] > 0]
    if per_frame.empty:
        pytest.skip("the decoder reported no per-frame findings on the crafted capture")
    sidecar = write_analysis_sidecar(analysis=a, capture=cap)
    assert sidecar == cap.with_name(cap.name + ".bigtcp.tsv")
    rows = _sidecar_fields(ws_home, cap, sidecar, ["bigtcp.finding", "_ws.expert.message"])
    got = {int(r[0]): r[1].split(",") if r[1] else [] for r in rows}
    for fr, g in per_frame.groupby("frame"):
        assert sorted(got[int(fr)]) == sorted(g["code"].astype(str)), fr
        msgs = next(r[2] for r in rows if int(r[0]) == int(fr))
        for code, msg in zip(g["code"], g["message"], strict=True):
            assert f"[{code}] {msg}" in msgs, (code, msg, msgs)
    for fr in set(got) - set(per_frame["frame"].astype(int)):
        assert got[fr] == [], fr
    # each code is also an expert field bigtcp.<code>, filterable
    code = str(per_frame["code"].iloc[0])
    n = len(fields(ws_home, cap, ["frame.number"], extra=["-X", f"lua_script1:sidecar={sidecar}", "-Y",
                                                          f"bigtcp.{code}"]))
    assert n == int((per_frame["code"] == code).sum())


# --- edge cases: crafted frames, plugin vs decoder --------------------------------------------------------------

def _v4_frame(totlen: int, proto: int, l4: bytes, ihl: int = 5, opts: bytes = b"") -> bytes:
    eth = bytes.fromhex("020000000002020000000001") + b"\x08\x00"
    return eth + struct.pack(">BBHHHBBH4s4s", 0x40 | ihl, 0, totlen, 1, 0x4000, 64, proto, 0, bytes([10, 0, 0, 1]),
                             bytes([10, 0, 0, 2])) + opts + l4


def _edge_frames() -> list[bytes]:
    body = _tcp(b"x" * 100)
    udp = struct.pack(">HHHH", 1, 2, 0, 0) + b"y" * 50
    icmp6 = bytes([128, 0, 0, 0, 0, 1, 0, 1]) + b"z" * 20
    pad = bytes([6, 0, 1, 4, 0, 0, 0, 0])
    return [
        _v6_frame(0, bytes([6, 0, 0xC2, 4]) + struct.pack(">I", 8 + len(body)), 0, body),  # jumbo too small
        _v6_frame(8 + len(body), bytes([6, 0, 0xC2, 4]) + struct.pack(">I", 70000), 0, body),  # plen != 0
        _v6_frame(0, pad, 0, body),  # HBH without jumbo, plen 0: not BIG TCP
        _v6_frame(0, b"", 17, udp),  # v6_plen0 UDP
        _v6_frame(0, b"", 58, icmp6),  # plen 0, ICMPv6: not presumed
        _v6_frame(0, pad, 60, body),  # Destination Options, plen 0
        _v6_frame(0, bytes([6, 0, 0, 0, 0, 0, 0, 7]), 44, body),  # Fragment header, plen 0
        _v6_frame(0, bytes([60, 0, 0xC2, 4]) + struct.pack(">I", 70000) + pad, 0, body),  # jumbo, then DestOpts
        _v4_frame(0, 6, body),  # v4_totlen0 TCP
        _v4_frame(0, 17, udp),  # v4_totlen0 UDP
        _v4_frame(0, 1, icmp6),  # tot_len 0, ICMP: not presumed
        _v4_frame(20 + len(body), 6, body),
        _v4_frame(0, 6, body, ihl=6, opts=b"\x01\x01\x01\x00"),  # IPv4 options
        _v4_frame(3000, 6, body),  # total length exceeds the frame
        _v6_frame(5000, b"", 6, body),  # payload length exceeds the frame
    ]


@needs_api
def test_crafted_edge_cases_equal_packets_parquet(ws_home, tmp_path):
    cap = tmp_path / "edge.pcap"
    cap.write_bytes(_pcap(_edge_frames()))
    pk = analyze(cap, packets=True).packets
    rows = fields(ws_home, cap, ["frame.number", "bigtcp.kind", "bigtcp.ip_len", "bigtcp.tcp_len"])
    ws = {int(r[0]): tuple(r[1:]) for r in rows}
    for fr, kind, ip_len, tcp_len in zip(pk["frame"], pk["bigtcp"].astype(str), pk["ip_len"],
                                         pk["tcp_payload_len"], strict=True):
        want = ("" if kind == "none" else kind, _int_or_empty(ip_len), _int_or_empty(tcp_len))
        assert ws[int(fr)] == want or (ws[int(fr)] == ("", "", "") and _ordinary(kind, ip_len)), int(fr)


# --- end to end: analyze(wireshark_sidecar=True) -> tshark -------------------------------------------------------

def _analyze_with_sidecar(capture, outdir, filters):
    import inspect

    if "wireshark_sidecar" not in inspect.signature(analyze).parameters:
        pytest.skip("analyze() has no wireshark_sidecar option")
    try:
        a = analyze(capture, outdir=outdir, wireshark_sidecar=True, filters=filters)
    except Exception as e:
        if "libpcap" in str(e).lower():
            pytest.skip(str(e))
        raise
    return a


@needs_api
def test_analyze_wireshark_sidecar_end_to_end(ws_home, tmp_path):
    caps = [c for c in _receiver_captures() if c.name.startswith(("mixed_", "v6_"))]
    if not caps:
        pytest.skip("no IPv6 kernel receiver capture")
    capture = caps[0]
    filters = ["tcp port 5201", "ip6 and tcp", "not tcp", "ip"]
    a = _analyze_with_sidecar(capture, tmp_path / "out", filters)
    sidecar = a.sidecar
    assert sidecar is not None and sidecar.is_file()
    sc = read_sidecar(sidecar)
    assert sc.capture_name == capture.name and sc.capture_size == capture.stat().st_size
    assert set(sc.filters.values()) == set(a.params["filters"])
    rows = _sidecar_fields(ws_home, capture, sidecar, ["bigtcp.sidecar", "bigtcp.superpacket",
                                                       "bigtcp.flush_reason", "bigtcp.tcp_len",
                                                       "bigtcp.filter_miss", "bigtcp.filter_false_match"])
    assert all(r[1].startswith("applied") for r in rows if r[1])
    # superpackets.parquet: frames, payload bytes and flush reason per super-packet
    sp = a.superpackets
    frames_of: dict[int, list[int]] = defaultdict(list)
    payload_of: dict[int, int] = defaultdict(int)
    for fr, _status, spid, reason, tcp_len, _m, _f in rows:
        if spid:
            frames_of[int(spid)].append(int(fr))
            payload_of[int(spid)] += int(tcp_len)
            assert reason == _shown_reason(next(sp.iloc[[int(spid)]].itertuples()))
    assert set(frames_of) == set(range(len(sp)))
    assert [payload_of[i] for i in range(len(sp))] == sp["payload_len"].astype(int).tolist()
    assert [min(frames_of[i]) for i in range(len(sp))] == sp["first_frame"].astype(int).tolist()
    assert [max(frames_of[i]) for i in range(len(sp))] == sp["last_frame"].astype(int).tolist()
    # filter_audit.parquet: per filter, the missed and falsely matched frames
    fa = a.filter_audit
    assert fa is not None and len(fa)
    for expr in a.params["filters"]:
        t = fa[fa["filter"] == expr]
        for col, verdict in ((5, "missed"), (6, "false_match")):
            want = set(t.loc[t["verdict"].astype(str) == verdict, "frame"].astype(int))
            got = {int(r[0]) for r in rows if expr in r[col].split(",")}
            assert got == want, (expr, verdict)
    # and the CLI finds it through --outdir
    import typer
    from typer.testing import CliRunner

    from bigtcp_pcap.wireshark.cli import register

    app = typer.Typer()
    app.command()(lambda: None)
    register(app)
    r = CliRunner().invoke(app, ["wireshark", "open", str(capture), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert f"BIGTCP_SIDECAR={sidecar.absolute()}" in r.output
