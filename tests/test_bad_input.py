"""Bad input: one line naming file, frame and byte offset; exit 3; everything before the fault is kept, partial."""

from __future__ import annotations

import gzip
import struct

import pyarrow.parquet as pq
import pytest
from craft import eth, ipv4, tcp
from oracle import KERNEL, pcapng_epb, pcapng_idb, pcapng_shb, read_pcap_records, write_pcap
from typer.testing import CliRunner

from bigtcp_pcap.cli import app
from bigtcp_pcap.output.parquet import read_metadata

SND = KERNEL / "v4_185000.snd.pcap"
runner = CliRunner()


def _run(*args):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def _record_offsets(raw: bytes) -> list[int]:
    offs, p = [], 24
    while p + 16 <= len(raw):
        offs.append(p)
        p += 16 + struct.unpack("<I", raw[p + 8:p + 12])[0]
    return offs


def _assert_partial(out, frames_before: int):
    meta = read_metadata(out / "packets.parquet")
    assert meta["partial"] is True and meta["error"]
    assert pq.read_table(out / "packets.parquet").num_rows == frames_before
    for name in ("findings", "flows", "superpackets"):
        assert read_metadata(out / f"{name}.parquet")["partial"] is True
    codes = pq.read_table(out / "findings.parquet").column("code").to_pylist()
    assert "capture.partial" in codes


def test_truncated_file(tmp_path):
    raw = SND.read_bytes()
    offs = _record_offsets(raw)
    cut = offs[500] + 30  # inside record 501
    bad = tmp_path / "trunc.pcap"
    bad.write_bytes(raw[:cut])
    res = _run("analyze", bad, "-o", tmp_path / "out", "--packets")
    assert res.exit_code == 3
    lines = [ln for ln in res.stderr.splitlines() if "bigtcp-pcap:" in ln]
    assert len(lines) == 1
    assert f"{bad} (frame 501, byte offset {offs[500]})" in lines[0] and "truncated record" in lines[0]
    _assert_partial(tmp_path / "out", 500)


def test_garbage_bytes(tmp_path):
    bad = tmp_path / "garbage.pcap"
    bad.write_bytes(b"this is not a capture at all" * 10)
    res = _run("analyze", bad, "-o", tmp_path / "out", "--packets")
    assert res.exit_code == 3
    assert f"{bad} (frame 1, byte offset 0): not a pcap or pcapng capture" in res.stderr
    _assert_partial(tmp_path / "out", 0)


def test_garbage_after_good_records(tmp_path):
    raw = SND.read_bytes()
    offs = _record_offsets(raw)
    bad = tmp_path / "tail.pcap"
    bad.write_bytes(raw[:offs[100]] + b"\xff" * 64)
    res = _run("analyze", bad, "-o", tmp_path / "out", "--packets")
    assert res.exit_code == 3
    assert f"(frame 101, byte offset {offs[100]})" in res.stderr and "caplen" in res.stderr
    _assert_partial(tmp_path / "out", 100)


def test_huge_caplen_is_corrupt(tmp_path):
    """A caplen above MAX_CAPLEN (256 MiB) is a corrupt record header (a caplen above the snaplen is not:
    test_field_captures.py); libpcap and tshark refuse anything above 262144 already."""
    pkt = eth(0x0800) + ipv4(20 + 200) + tcp() + b"x" * 200
    raw = bytearray(write_pcap(tmp_path / "ok.pcap", [pkt, pkt, pkt]).read_bytes())
    third = 24 + 2 * (16 + len(pkt))
    raw[third + 8:third + 12] = struct.pack("<I", 0xFFFFFF00)
    bad = tmp_path / "huge.pcap"
    bad.write_bytes(bytes(raw))
    res = _run("analyze", bad, "-o", tmp_path / "out", "--packets")
    assert res.exit_code == 3
    assert f"(frame 3, byte offset {third})" in res.stderr and "caplen 4294967040" in res.stderr
    _assert_partial(tmp_path / "out", 2)


def test_unknown_linktype_is_a_finding_not_an_error(tmp_path):
    bad = write_pcap(tmp_path / "lt.pcap", [b"\x00" * 40], linktype=147)
    res = _run("analyze", bad, "-o", tmp_path / "out")
    assert res.exit_code == 1  # a warn finding; the capture is read whole
    assert "not decoded: 1 frames of linktype 147" in res.stdout


def test_pcapng_block_lengths_disagree(tmp_path):
    recs = read_pcap_records(SND)[:3]
    good = pcapng_shb() + pcapng_idb(1) + pcapng_epb(0, 1, recs[0][0]) + pcapng_epb(0, 2, recs[1][0])
    third = bytearray(pcapng_epb(0, 3, recs[2][0]))
    third[-4:] = struct.pack("<I", len(third) + 4)
    bad = tmp_path / "len.pcapng"
    bad.write_bytes(good + bytes(third))
    res = _run("analyze", bad, "-o", tmp_path / "out", "--packets")
    assert res.exit_code == 3
    assert f"(frame 3, byte offset {len(good)}): pcapng block lengths disagree" in res.stderr
    _assert_partial(tmp_path / "out", 2)


@pytest.mark.parametrize("kind", ["gzip", "bzip2", "xz", "zstd"])
def test_corrupt_compressed_stream(tmp_path, kind):
    import bz2
    import lzma

    import zstandard

    comp = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress,
            "zstd": zstandard.ZstdCompressor().compress}[kind](SND.read_bytes())
    bad = tmp_path / "c.pcap.z"
    bad.write_bytes(comp[: len(comp) // 2])
    res = _run("analyze", bad, "-o", tmp_path / "out", "--packets")
    assert res.exit_code == 3
    line = next(ln for ln in res.stderr.splitlines() if "bigtcp-pcap:" in ln)
    assert f"{bad} (frame " in line and "byte offset" in line
    meta = read_metadata(tmp_path / "out" / "packets.parquet")
    assert meta["partial"] is True
    if kind in ("gzip", "xz"):  # bzip2 and zstd decode in blocks larger than this half file: nothing to keep
        assert pq.read_table(tmp_path / "out" / "packets.parquet").num_rows > 0


def test_truncated_zstd_is_not_a_clean_end(tmp_path):
    """A zstd capture cut inside a frame is an error, not a shorter capture (zstandard alone says EOF)."""
    import zstandard

    raw = SND.read_bytes()
    frames = [zstandard.ZstdCompressor().compress(raw[i:i + 50_000]) for i in range(0, len(raw), 50_000)]
    whole = tmp_path / "ok.pcap.zst"
    whole.write_bytes(b"".join(frames))
    assert _run("analyze", whole, "-o", tmp_path / "ok").exit_code in (0, 1)
    bad = tmp_path / "cut.pcap.zst"
    bad.write_bytes(b"".join(frames[:3]) + frames[3][:20])
    res = _run("analyze", bad, "-o", tmp_path / "out", "--packets")
    assert res.exit_code == 3 and "ends inside a frame" in res.stderr
    assert pq.read_table(tmp_path / "out" / "packets.parquet").num_rows > 0


def test_missing_file(tmp_path):
    res = _run("analyze", tmp_path / "nope.pcap", "-o", tmp_path / "out")
    assert res.exit_code == 3 and "cannot open" in res.stderr


@pytest.mark.parametrize("hdr,code", [
    (eth(0x0800) + bytes([0x43]) + ipv4(20)[1:] + tcp(), "ipv4.bad_ihl"),
    (eth(0x0800) + ipv4(20, tot_len=10) + tcp(), "ipv4.totlen_lt_header"),
    (eth(0x0800) + ipv4(20) + tcp()[:12] + bytes([0x30]) + tcp()[13:], "tcp.bad_doff"),
])
def test_malformed_headers_are_findings(tmp_path, hdr, code):
    cap = write_pcap(tmp_path / "m.pcap", [hdr])
    res = _run("analyze", cap, "-o", tmp_path / "out", "--json")
    assert res.exit_code == 1  # findings present, not a crash
    codes = pq.read_table(tmp_path / "out" / "findings.parquet").column("code").to_pylist()
    assert codes == [code]


def test_usage_error_exit_2(tmp_path):
    res = _run("analyze", SND, "-o", tmp_path / "out", "--gro-max-size", "999999")
    assert res.exit_code == 2 and "gro_max_size" in res.stderr
    for n in ("0", "-1"):  # tcpdump -c refuses both; printing nothing and exit 0 hid the typo
        res = _run("dissect", SND, "-c", n)
        assert res.exit_code == 2 and "--count" in res.stderr and not res.stdout


def test_frames_not_decoded_to_l4_are_counted(tmp_path):
    arp = eth(0x0806) + b"\x00" * 28
    cut_ip = (eth(0x0800) + ipv4(20) + tcp())[:24]
    cut_tcp = (eth(0x0800) + ipv4(20) + tcp())[:40]
    frag = bytearray(eth(0x0800) + ipv4(8))
    frag[14 + 6] = 0x20  # MF set
    cap = write_pcap(tmp_path / "m.pcap", [arp, (cut_ip, 74), (cut_tcp, 74), bytes(frag) + b"\x00" * 8])
    res = _run("analyze", cap, "-o", tmp_path / "out", "--json")
    import json

    doc = json.loads(res.stdout)
    assert doc["not_fully_decoded"] == {"truncated_ip": 1, "truncated_l4": 1, "not_ip": 1, "ip_fragment": 1}
