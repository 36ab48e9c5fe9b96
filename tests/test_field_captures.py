"""A readable file is analysed whole (issue 14): what tshark reads is never refused, capture-level conditions are
counted findings, pcapng options of any value are never an exception, the epb_flags option is carried."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from craft import eth, ipv4, tcp
from oracle import KERNEL, _pad4, pcapng_block, pcapng_epb, pcapng_idb, pcapng_shb, tshark_fields, write_pcap

import bigtcp_pcap
from bigtcp_pcap.capture.reader import TS_UNKNOWN, CaptureReader, ts_resolution

PKT = eth(0x0800) + ipv4(20 + 200) + tcp() + b"x" * 200
TPACKET = KERNEL / "tpacket"


def _findings(a) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in a.findings.to_dict("records"):
        out.setdefault(row["code"], []).append(row)
    return out


def _epb_with_flags(if_id: int, ts: int, data: bytes, flags: int) -> bytes:
    opts = struct.pack("<HHI", 2, 4, flags) + struct.pack("<HH", 0, 0)
    return pcapng_block(6, struct.pack("<IIIII", if_id, ts >> 32, ts & 0xFFFFFFFF, len(data), len(data))
                        + _pad4(data) + opts)


def test_record_longer_than_snaplen_is_read_whole_like_tshark(tmp_path):
    cut = (PKT[:100], len(PKT))  # cut by the snaplen: the wire length is the whole packet's
    cap = write_pcap(tmp_path / "snap.pcap", [cut, cut, PKT], snaplen=128)
    want = tshark_fields(cap, ["frame.cap_len", "tcp.len"])
    a = bigtcp_pcap.analyze(cap, packets=True, audit=False)
    assert not a.partial
    got = a.packets
    assert [int(r["frame.cap_len"]) for r in want] == got.caplen.tolist() == [100, 100, 254]
    assert [int(r["tcp.len"]) for r in want] == got.tcp_payload_len.tolist()
    (row,) = _findings(a)["capture.snaplen_exceeded"]
    assert row["severity"] == "note" and row["frame"] == 3
    assert "snaplen 128" in row["message"] and "1 frame," in row["message"]


def test_unknown_linktype_is_counted_not_an_error(tmp_path):
    cap = write_pcap(tmp_path / "lt.pcap", [b"\x00" * 40] * 5, linktype=147)
    assert len(tshark_fields(cap, ["frame.number"])) == 5
    a = bigtcp_pcap.analyze(cap, audit=False)
    assert not a.partial and a.info.packets == 5
    (row,) = _findings(a)["frame.unknown_linktype"]  # one row for the link type, not one per frame
    assert row["frame"] == 1 and "linktype 147" in row["message"] and "5 frames" in row["message"]
    assert a.summary["capture"]["linktypes_not_decoded"] == {147: 5}


def test_one_odd_pcapng_interface_does_not_stop_the_others(tmp_path):
    body = [pcapng_epb(0, i, PKT) if i % 3 else pcapng_epb(1, i, b"\x08\x00" + b"\0" * 30) for i in range(1, 151)]
    cap = tmp_path / "two_if.pcapng"
    cap.write_bytes(pcapng_shb() + pcapng_idb(1) + pcapng_idb(147) + b"".join(body))
    want = tshark_fields(cap, ["frame.interface_id", "tcp.len"])
    a = bigtcp_pcap.analyze(cap, packets=True, audit=False)
    assert not a.partial and len(a.packets) == len(want) == 150
    tcp_rows = a.packets[a.packets.if_id == 0]
    assert tcp_rows.tcp_payload_len.tolist() == [int(r["tcp.len"]) for r in want if r["frame.interface_id"] == "0"]
    (row,) = _findings(a)["frame.unknown_linktype"]
    assert row["frame"] == 3 and "linktype 147" in row["message"] and "50 frames" in row["message"]


def test_packet_block_of_an_undefined_interface_is_skipped_and_counted(tmp_path):
    cap = tmp_path / "undef.pcapng"
    cap.write_bytes(pcapng_shb() + pcapng_idb(1) + pcapng_epb(0, 1, PKT) + pcapng_epb(7, 2, PKT)
                    + pcapng_epb(7, 3, PKT) + pcapng_epb(0, 4, PKT))
    a = bigtcp_pcap.analyze(cap, packets=True, audit=False)
    assert not a.partial and len(a.packets) == 2
    (row,) = _findings(a)["capture.undefined_interface"]
    assert "interface 7" in row["message"] and "2 frames" in row["message"]


def test_epb_flags_pass_through_like_tshark(tmp_path):
    """pcapng PR #144: bit 9 checksum not ready, 10 checksum valid, 11 GSO TCP; tshark shows frame.packet_flags."""
    cap = tmp_path / "flags.pcapng"
    cap.write_bytes(pcapng_shb() + pcapng_idb(1) + _epb_with_flags(0, 1, PKT, (1 << 9) | (1 << 11))
                    + pcapng_epb(0, 2, PKT) + _epb_with_flags(0, 3, PKT, 1 << 10))
    want = [int(r["frame.packet_flags"], 16) if r["frame.packet_flags"] else 0
            for r in tshark_fields(cap, ["frame.packet_flags"])]
    assert want == [0xA00, 0, 0x400]
    rb = next(iter(CaptureReader(cap)))
    assert rb.epb_flags.tolist() == want
    a = bigtcp_pcap.analyze(cap, packets=True, audit=False)
    assert a.packets.epb_flags.tolist() == want
    classic = bigtcp_pcap.analyze(write_pcap(tmp_path / "c.pcap", [PKT]), packets=True, audit=False)
    assert classic.packets.epb_flags.tolist() == [0]


def _exact_ns(units: int, resol: int, off_s: int) -> int | None:
    """Independent oracle: Python's exact rationals, None outside int64 (or when the offset alone is: documented,
    an if_tsoffset beyond +-292 years makes every timestamp of its interface unknown)."""
    if abs(off_s) * 10**9 >= 2**63:
        return None
    unit = Fraction(1, 2 ** (resol & 0x7F)) if resol & 0x80 else Fraction(1, 10 ** resol)
    ns = int(units * unit * 10**9) + off_s * 10**9  # floor for non-negative values
    return ns if -(2**63) < ns < 2**63 else None


@pytest.mark.parametrize("resol", [0, 3, 6, 9, 10, 0x13, 0x1C, 0x1D, 0x3F, 0x7F, 0x80 | 10, 0x80 | 30, 0x80 | 34,
                                   0x80 | 35, 0x80 | 40, 0x80 | 63, 0x80 | 64, 0x80 | 97, 0x80 | 98, 0xFF])
@pytest.mark.parametrize("off_s", [0, 1_000_000, -(2**31), 2**40, -(2**63)])
def test_pcapng_timestamps_of_any_resolution_and_offset(resol, off_s):
    units = [0, 1, 1_700_000_000_123_456_789, 2**63, 2**64 - 1, 12345]
    f = pcapng_shb() + pcapng_idb(1, tsresol=resol, tsoffset=off_s) + b"".join(pcapng_epb(0, u, PKT) for u in units)
    r = CaptureReader(__import__("io").BytesIO(f))
    got = [int(x) for b in r for x in b.ts_ns]
    for u, g in zip(units, got, strict=True):
        want = _exact_ns(u, resol, off_s)
        if want is None:
            assert g == TS_UNKNOWN
        elif resol & 0x80 and (resol & 0x7F) > 34:
            assert abs(g - want) <= 1  # the sub-nanosecond bits are dropped before the multiply
        else:
            assert g == want
    bad = sum(1 for u in units if _exact_ns(u, resol, off_s) is None)
    assert r.info.notes.total(67) == bad


def test_common_resolutions_match_tshark(tmp_path):
    for resol in (6, 9, 0x80 | 20):
        cap = tmp_path / f"r{resol}.pcapng"
        units = [1_700_000_000_123_456, 1_234_567_890_123_456]
        cap.write_bytes(pcapng_shb() + pcapng_idb(1, tsresol=resol, tsoffset=5)
                        + b"".join(pcapng_epb(0, u, PKT) for u in units))
        want = [r["frame.time_epoch"] for r in tshark_fields(cap, ["frame.time_epoch"])]
        got = [int(x) for b in CaptureReader(cap) for x in b.ts_ns]
        assert [f"{g // 10**9}.{g % 10**9:09d}" for g in got] == want


def test_unrepresentable_timestamp_is_null_with_a_finding(tmp_path):
    cap = tmp_path / "far.pcapng"
    cap.write_bytes(pcapng_shb() + pcapng_idb(1, tsresol=9) + pcapng_epb(0, 2**64 - 1, PKT) + pcapng_epb(0, 5, PKT))
    a = bigtcp_pcap.analyze(cap, packets=True, audit=False)
    ts = pq.read_table(a.outdir / "packets.parquet").column("ts_ns").to_pylist()
    assert ts[0] is None and ts[1].value == 5
    (row,) = _findings(a)["capture.ts_out_of_range"]
    assert row["frame"] == 1


def test_resolution_table_bounds():
    for resol in range(256):
        mul, div, shift = ts_resolution(resol)
        assert 0 <= mul < 2**64 and 0 <= div < 2**64 and 0 <= shift < 64


def test_time_is_linear_in_interface_blocks(tmp_path):
    """20,000 IDBs took 91 s (a 4 MiB buffer copy per block); now they are parsed where they lie."""
    times = {}
    for k in (2000, 20000):
        f = pcapng_shb() + pcapng_idb(1) * k + b"".join(pcapng_epb(i % k, i, PKT) for i in range(200))
        t = time.perf_counter()
        r = CaptureReader(__import__("io").BytesIO(f))
        assert sum(len(b) for b in r) == 200
        times[k] = time.perf_counter() - t
    assert times[20000] < 3.0
    assert times[20000] < 20 * times[2000] + 0.5


def test_tpacket_v2_clamp_on_the_kernel_capture():
    """tcpdump --immediate-mode on a BIG TCP veth: the kernel wrote caplen 65562 for frames of 91486-137182 bytes
    (tshark agrees); the same flow captured with TPACKET_V3 has whole frames and no finding."""
    clamp = TPACKET / "immediate_v6_185000.pcap.gz"
    raw = gzip.decompress(clamp.read_bytes())
    plain = Path(clamp.parent / "_oracle.pcap")
    try:
        plain.write_bytes(raw)
        want = [(int(r["frame.number"]), int(r["frame.len"])) for r in
                tshark_fields(plain, ["frame.number", "frame.cap_len", "frame.len"]) if r["frame.cap_len"] == "65562"]
    finally:
        plain.unlink()
    assert [n for n, _ in want] == [28, 30, 32]
    a = bigtcp_pcap.analyze(clamp, packets=True, audit=False)
    (row,) = _findings(a)["capture.tpacket_v2_clamp"]
    assert row["frame"] == 28 and "caplen 65562" in row["message"] and "3 frames" in row["message"]
    cut = a.packets[a.packets.frame.isin([28, 30, 32])]
    assert cut.wirelen.tolist() == [w for _, w in want]
    assert (cut.ip_len == cut.wirelen - 14).all()  # true lengths from the wire length, not the cut
    whole = bigtcp_pcap.analyze(TPACKET / "ring_v3_v6_185000.pcap.gz", packets=True, audit=False)
    assert "capture.tpacket_v2_clamp" not in _findings(whole)
    assert int(np.max(whole.packets.caplen)) > 65562


def test_snaplen_cut_is_not_the_tpacket_clamp(tmp_path):
    big = eth(0x86DD) + b"\0" * 70000
    cap = write_pcap(tmp_path / "s.pcap", [(big[:65562], len(big))], snaplen=65562)
    a = bigtcp_pcap.analyze(cap, audit=False)
    assert "capture.tpacket_v2_clamp" not in _findings(a)
    cap = write_pcap(tmp_path / "t.pcap", [(big[:65562], len(big))], snaplen=262144)
    assert "capture.tpacket_v2_clamp" in _findings(bigtcp_pcap.analyze(cap, audit=False))


def test_an_empty_file_is_a_capture_of_no_packets(tmp_path):
    """tshark reads a 0-byte file as a capture without packets (exit 0): analysed, not refused, with a note."""
    cap = tmp_path / "empty.pcap"
    cap.write_bytes(b"")
    assert tshark_fields(cap, ["frame.number"]) == []
    a = bigtcp_pcap.analyze(cap, audit=False)
    assert not a.partial and a.info.packets == 0
    (row,) = _findings(a)["capture.empty"]
    assert row["severity"] == "note" and row["frame"] == 0
    res = subprocess.run([sys.executable, "-m", "bigtcp_pcap.cli", "analyze", str(cap), "-o", str(tmp_path / "o"),
                          "--no-progress"], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    header_only = tmp_path / "header.pcap"  # a pcap header and no records: the same, with its size
    header_only.write_bytes((KERNEL / "mixed_185000.rcv.pcap").read_bytes()[:24])
    assert tshark_fields(header_only, ["frame.number"]) == []
    a = bigtcp_pcap.analyze(header_only, audit=False)
    assert not a.partial and a.info.packets == 0
    (row,) = _findings(a)["capture.empty"]
    assert "(24 bytes)" in row["message"]


@pytest.mark.parametrize("gap_s", [1, 10])
def test_flows_near_the_last_representable_nanosecond(tmp_path, gap_s):
    """A pcapng can time packets up to 2**63 - 1 ns (2262). A flow's deadline (last packet + timeout) saturates
    there instead of wrapping to a time long gone, which split one connection into a new flow per packet: packets
    100 s before that end, ``gap_s`` apart and both ways, stay one flow per direction, one conversation as tshark's
    tcp.stream says. (At 10 s the forward direction is quieter than the 5 s close timeout, so the connection's
    deadline is computed from both directions.)"""
    ip = ipv4(20 + 200)
    back = eth(0x0800) + ip[:12] + ip[16:20] + ip[12:16] + ip[20:] + tcp(sport=5201, dport=40000, seq=1, ack=1200)
    t0 = 2**63 - 1 - 100 * 10**9
    frames = [(t0, PKT), (t0 + gap_s * 10**9, back + b"y" * 200), (t0 + 2 * gap_s * 10**9, PKT)]
    cap = tmp_path / "late.pcapng"
    cap.write_bytes(pcapng_shb() + pcapng_idb(1, tsresol=9) + b"".join(pcapng_epb(0, t, f) for t, f in frames))
    rows = tshark_fields(cap, ["tcp.stream", "frame.time_epoch"])
    assert [r["tcp.stream"] for r in rows] == ["0", "0", "0"]
    assert [r["frame.time_epoch"] for r in rows] == [f"{t // 10**9}.{t % 10**9:09d}" for t, _ in frames]
    a = bigtcp_pcap.analyze(cap, audit=False, outdir=tmp_path / "out")
    flows = pq.read_table(a.outdir / "flows.parquet").to_pylist()
    assert sorted((r["sport"], r["packets"]) for r in flows) == [(5201, 1), (40000, 2)]
