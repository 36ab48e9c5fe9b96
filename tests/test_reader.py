"""The reader: pcap magics, pcapng sections/interfaces/blocks, compression, stdin; checked against tshark."""

from __future__ import annotations

import bz2
import gzip
import lzma
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest
import zstandard
from oracle import (
    KERNEL,
    ROOT,
    pcapng_block,
    pcapng_epb,
    pcapng_idb,
    pcapng_pb,
    pcapng_shb,
    pcapng_spb,
    read_pcap_records,
    tshark_fields,
)

from bigtcp_pcap.capture import CaptureReader
from bigtcp_pcap.decode import decode

SND = KERNEL / "v6_185000.snd.pcap"
RCV = KERNEL / "v6_185000.rcv.pcap"


def _cols(path, **kw):
    r = CaptureReader(path, **kw)
    rows = []
    for rb in r:
        pb, _ = decode(rb)
        rows.append(np.stack([pb.frame.astype(np.int64), pb.ts_ns, pb.wirelen, pb.caplen, pb.linktype, pb.if_id,
                              pb.ip_len, pb.tcp_payload_len]))
    return np.concatenate(rows, axis=1), r.info


def test_small_chunks_and_batches_give_identical_columns():
    """Records straddling buffer refills and batch ends are read exactly once."""
    ref, _ = _cols(SND)
    small, _ = _cols(SND, chunk_size=1000, batch_size=7)
    assert ref.shape[1] == len(read_pcap_records(SND))
    assert (ref == small).all()


def test_nanosecond_pcap_timestamps_match_tshark():
    got, info = _cols(RCV)
    assert info.format == "pcap" and info.snaplens == {96}
    rows = tshark_fields(RCV, ["frame.time_epoch"])
    want = [int(r["frame.time_epoch"].replace(".", "")) for r in rows]
    assert got[1].tolist() == want


@pytest.mark.parametrize("kind", ["gzip", "bzip2", "xz", "zstd"])
def test_compressed_input(tmp_path, kind):
    raw = SND.read_bytes()
    comp = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress,
            "zstd": zstandard.ZstdCompressor().compress}[kind](raw)
    path = tmp_path / "c.pcap.any"
    path.write_bytes(comp)
    got, info = _cols(path)
    ref, _ = _cols(SND)
    assert info.compression == kind
    assert (got == ref).all()


def test_big_endian_and_microsecond_pcap(tmp_path):
    """All four magics: rewrite the ns capture as big-endian us and as little-endian us."""
    import struct

    recs = read_pcap_records(RCV)[:20]
    for e, magic in ((">", 0xA1B2C3D4), ("<", 0xA1B2C3D4), (">", 0xA1B23C4D)):
        out = [struct.pack(e + "IHHiIII", magic, 2, 4, 0, 0, 96, 1)]
        for i, (d, wl) in enumerate(recs):
            out.append(struct.pack(e + "IIII", 1000 + i, 7 * i, len(d), wl) + d)
        p = tmp_path / "x.pcap"
        p.write_bytes(b"".join(out))
        got, _ = _cols(p)
        mul = 1 if magic == 0xA1B23C4D else 1000
        assert got[1].tolist() == [(1000 + i) * 10**9 + 7 * i * mul for i in range(20)]
        assert got[2].tolist() == [wl for _, wl in recs]
        rows = tshark_fields(p, ["frame.len", "tcp.len"])
        assert [int(r["frame.len"]) for r in rows] == got[2].tolist()


def test_pcapng_sections_interfaces_and_blocks_match_tshark(tmp_path):
    """Two sections (LE, BE), interfaces with own linktype/tsresol/tsoffset, EPB/SPB/PB and an unknown block."""
    recs = read_pcap_records(RCV)
    eth = [d for d, _ in recs[:6]]
    wl = [w for _, w in recs[:6]]
    raw_ip = [d[14:] for d in eth]  # linktype 101 (raw IP) copies of the same packets
    parts = [pcapng_shb("<"),
             pcapng_idb(1, 0, tsresol=9),  # if 0: Ethernet, ns
             pcapng_idb(101, 0, tsresol=6, tsoffset=100),  # if 1: raw IP, us, +100 s
             pcapng_epb(0, 1_700_000_000_123_456_789, eth[0], wl[0]),
             pcapng_epb(1, 1_700_000_000_654_321, raw_ip[1], wl[1] - 14),
             b"\x99\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00",  # unknown block type 0x99
             pcapng_pb(0, 1_700_000_001_000_000_000, eth[2]),
             pcapng_spb(eth[3], wl[3]),
             pcapng_shb(">"),
             pcapng_idb(1, 0, tsresol=0x80 | 20, e=">"),  # 2^-20 s units, big-endian section
             pcapng_epb(0, 1_700_000_002 << 20, eth[4], wl[4], e=">")]
    p = tmp_path / "multi.pcapng"
    p.write_bytes(b"".join(parts))
    got, info = _cols(p)
    assert info.format == "pcapng" and info.linktypes == {1, 101}
    rows = tshark_fields(p, ["frame.len", "frame.time_epoch", "frame.interface_id", "tcp.len", "ip.len",
                             "ipv6.plen"])
    assert len(rows) == got.shape[1] == 5
    assert [int(r["frame.len"]) for r in rows] == got[2].tolist()
    assert got[4].tolist() == [1, 101, 1, 1, 1]
    assert got[5].tolist() == [int(r["frame.interface_id"]) for r in rows][:4] + [0]
    # timestamps: exact integers here; tshark prints 9 decimals
    assert got[1][0] == 1_700_000_000_123_456_789
    assert got[1][1] == (1_700_000_000 + 100) * 10**9 + 654_321_000
    assert [int(r["frame.time_epoch"].replace(".", "")) for r in rows if r["frame.time_epoch"]][:2] == \
        got[1][:2].tolist()
    assert got[1][4] == 1_700_000_002 * 10**9
    tcp = [int(r["tcp.len"]) if r["tcp.len"] else 0 for r in rows]
    assert got[7].tolist() == tcp


def test_blocks_wireshark_numbers_as_frames_keep_frame_numbers_equal(tmp_path):
    """A systemd Journal Export Block and the two Custom Blocks (copyable 0x00000BAD, not copyable 0x40000BAD)
    hold no packet, but Wireshark numbers each as a frame: ``frame`` stays equal to tshark's frame.number for
    every packet after them (it was one less per such block), and the capture counts them. A Decryption Secrets
    Block and an unknown block are no frames (numbering unchanged)."""
    recs = read_pcap_records(RCV)[:12]
    journal = pcapng_block(9, b"__REALTIME_TIMESTAMP=1700000000000000\nMESSAGE=x\n\n\x00\x00")
    cb_copy = pcapng_block(0x00000BAD, (32473).to_bytes(4, "little") + b"custom!!")  # PEN 32473: documentation
    cb_nocopy = pcapng_block(0x40000BAD, (32473).to_bytes(4, "little") + b"private!")
    dsb = pcapng_block(10, (0x544C534B).to_bytes(4, "little") + (8).to_bytes(4, "little") + b"CLIENT_R")
    unknown = pcapng_block(0x99, b"\x00" * 4)
    extra = {2: [journal], 5: [cb_copy, dsb], 8: [cb_nocopy, unknown, cb_copy]}  # before packet i
    parts = [pcapng_shb(), pcapng_idb(1, 0, tsresol=9)]
    for i, (d, w) in enumerate(recs):
        parts += extra.get(i, [])
        parts.append(pcapng_epb(0, 1_700_000_000 * 10**9 + i * 1000, d, w))
    p = tmp_path / "blocks.pcapng"
    p.write_bytes(b"".join(parts))
    reader = CaptureReader(p)
    frames = [int(f) for rb in reader for f in rb.frame]
    assert reader.info.packets == 12 and reader.info.frame_blocks == 4
    rows = tshark_fields(p, ["frame.number", "frame.len"], display_filter="eth")
    assert frames == [int(r["frame.number"]) for r in rows]
    assert frames == list(range(1, 3)) + list(range(4, 7)) + list(range(8, 11)) + list(range(13, 17))


def test_stdin_pipe():
    """`cat capture | bigtcp-pcap dissect -` reads stdin."""
    exe = shutil.which("bigtcp-pcap", path=str(ROOT / ".venv" / "bin")) or shutil.which("bigtcp-pcap")
    if exe is None:
        pytest.skip("console script not installed")
    with open(RCV, "rb") as f:
        out = subprocess.run([exe, "dissect", "-", "--json"], stdin=f, capture_output=True, text=True,
                             timeout=120, check=True).stdout
    assert len(out.splitlines()) == len(read_pcap_records(RCV))


def test_memory_is_one_buffer_whatever_the_size(tmp_path):
    """The reader keeps one chunk: a batch's buffer is the chunk, never the whole file."""
    big = tmp_path / "big.pcap"
    raw = SND.read_bytes()
    recs = raw[24:]
    big.write_bytes(raw[:24] + recs * 20)
    r = CaptureReader(big, chunk_size=1 << 16)
    sizes = {rb.buf.shape[0] for rb in r}
    assert max(sizes) <= 1 << 16
    assert r.info.packets == len(read_pcap_records(SND)) * 20
    assert sys.getsizeof(r) < 10_000


def test_zstd_reader_across_frames_and_read_sizes():
    """Several zstd frames back to back (as pzstd writes), read in odd sizes: the bytes come out whole."""
    import io
    import itertools

    from bigtcp_pcap.capture.source import ZstdReader

    raw = SND.read_bytes()
    cut = [0, 1000, len(raw) // 2, len(raw)]
    comp = b"".join(zstandard.ZstdCompressor().compress(raw[a:b]) for a, b in itertools.pairwise(cut))
    rng = np.random.default_rng(1)
    for sizes in ((1,), (7, 4096), (1 << 16,), (3 << 20,)):
        r = ZstdReader(io.BufferedReader(io.BytesIO(comp)), zstandard)
        out, k = bytearray(), 0
        while True:
            buf = bytearray(int(sizes[k % len(sizes)]) if len(sizes) > 1 or sizes[0] != 1
                            else int(rng.integers(1, 300)))
            n = r.readinto(buf)
            if not n:
                break
            out += buf[:n]
            k += 1
        assert bytes(out) == raw


def _gzip_then_bad_block(raw: bytes) -> bytes:
    """A gzip member holding ``raw`` (byte-aligned by a full flush), then a deflate block of the reserved type 3:
    zlib raises "invalid block type" right there, after decoding exactly ``raw``."""
    c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return c.compress(raw) + c.flush(zlib.Z_FULL_FLUSH) + b"\x07" + b"\x00" * 64


def test_corrupt_gzip_keeps_what_zlib_decodes_before_it(tmp_path):
    """A corrupt point in a gzip stream costs at most the 4 KiB of input before it (source.IN_SMALL), however
    large the pieces the decompressing thread feeds zlib: the records that zlib itself decodes from the stream
    fed in 4 KiB pieces, up to its error, are all read (the oracle: zlib and the pcap record headers)."""
    from bigtcp_pcap.capture.source import IN_SMALL
    from bigtcp_pcap.errors import CaptureError

    raw = (KERNEL / "v4_185000.snd.pcap").read_bytes()
    comp = _gzip_then_bad_block(raw)
    assert len(comp) > 4 * IN_SMALL
    d, got = zlib.decompressobj(16 + zlib.MAX_WBITS), b""
    with pytest.raises(zlib.error, match="invalid block type"):
        for i in range(0, len(comp), IN_SMALL):
            got += d.decompress(comp[i:i + IN_SMALL])
    assert got == raw[:len(got)] and len(got) > len(raw) // 2
    offs = [o for o in _offsets(raw) if o + 16 <= len(got)]
    whole = sum(1 for o in offs if o + 16 + int.from_bytes(raw[o + 8:o + 12], "little") <= len(got))
    path = tmp_path / "bad.pcap.gz"
    path.write_bytes(comp)
    r, n = CaptureReader(path), 0
    with pytest.raises(CaptureError, match="gzip error"):
        for rb in r:
            n += len(rb)
    assert n == whole > 0


def _offsets(raw: bytes) -> list[int]:
    offs, p = [], 24
    while p + 16 <= len(raw):
        offs.append(p)
        p += 16 + int.from_bytes(raw[p + 8:p + 12], "little")
    return offs


def test_decompressing_thread_ends_with_the_reader(tmp_path):
    """A compressed capture is decompressed on a thread (source.ReadAhead); a reader stopped early, read to the
    end, or given a corrupt stream leaves no such thread behind, and the bytes are those of the plain file."""
    import threading

    def threads():
        return [t for t in threading.enumerate() if t.name == "bigtcp-pcap-decompress"]

    raw = SND.read_bytes()
    path = tmp_path / "c.pcap.gz"
    path.write_bytes(gzip.compress(raw + raw[24:] * 7))  # the records 8 times
    it = iter(CaptureReader(path, batch_size=50))
    next(it)
    it.close()  # as an interrupt closes the stream's generator
    assert not threads()
    ref, _ = _cols(SND)
    got, info = _cols(path)
    assert info.compression == "gzip" and got.shape[1] == 8 * ref.shape[1] and not threads()
    bad = tmp_path / "bad.pcap.gz"
    bad.write_bytes(_gzip_then_bad_block(raw))
    with pytest.raises(Exception, match="gzip error"):
        _cols(bad)
    assert not threads()
