"""The fuzzing seeds and the corpus of interesting inputs (tests/fuzz/corpus/), built from a kernel capture.

``python tests/fuzz/seeds.py`` rewrites the corpus (it is committed; a few KB). The seeds are the first frames of
``tests/fixtures/kernel/sample.pcap`` (a real BIG TCP receiver capture, HBH jumbo frames included) cut to 96
bytes, as classic pcap, as pcapng (two interfaces, epb_flags, an SPB, a custom block), and compressed (.gz,
.zst); the other files are the damaged inputs found interesting while fuzzing (named for what they hold).
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
SAMPLE = HERE.parent / "fixtures" / "kernel" / "sample.pcap"
SNAP = 96


def _records() -> list[tuple[int, int, bytes, int]]:
    """(sec, usec, data cut to SNAP, wirelen): the sample's first 5 records and its first 3 BIG TCP frames."""
    raw = SAMPLE.read_bytes()
    out, big, p = [], [], 24
    while p + 16 <= len(raw) and len(big) < 3:
        sec, usec, incl, orig = struct.unpack("<IIII", raw[p:p + 16])
        rec = (sec, usec, raw[p + 16:p + 16 + min(incl, SNAP)], orig)
        if len(out) < 5:
            out.append(rec)
        elif orig > 65535:
            big.append(rec)
        p += 16 + incl
    return out + big


def _block(btype: int, body: bytes) -> bytes:
    body += b"\0" * (-len(body) % 4)
    return struct.pack("<II", btype, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))


def seed_pcap() -> bytes:
    head = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, SNAP, 1)
    return head + b"".join(struct.pack("<IIII", s, u, len(d), w) + d for s, u, d, w in _records())


def seed_pcapng() -> bytes:
    shb = _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    idb0 = _block(1, struct.pack("<HHI", 1, 0, SNAP) + struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HH", 0, 0))
    idb1 = _block(1, struct.pack("<HHI", 105, 0, 0) + struct.pack("<HHq", 14, 8, 3600) + struct.pack("<HH", 0, 0))
    out = [shb, idb0, idb1]
    for i, (s, u, d, w) in enumerate(_records()):
        ts = s * 1_000_000_000 + u * 1000
        flags = struct.pack("<HHI", 2, 4, 1 << 11 if w > 65535 else 1 << 10) + struct.pack("<HH", 0, 0)
        pad = b"\0" * (-len(d) % 4)
        out.append(_block(6, struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, len(d), w) + d + pad + flags))
        if i == 3:
            out.append(_block(6, struct.pack("<IIIII", 1, 0, i, 24, 24) + b"\x08\x02" + b"\0" * 22))
            out.append(_block(3, struct.pack("<I", len(d)) + d))
            out.append(_block(0x00000BAD, b"custom block" * 2))
    return b"".join(out)


def corpus() -> dict[str, bytes]:
    """File name -> bytes of every corpus input."""
    import zstandard

    pcap, ng = seed_pcap(), seed_pcapng()
    files = {"seed.pcap": pcap, "seed.pcapng": ng, "seed.pcap.gz": gzip.compress(pcap, 9, mtime=0),
             "seed.pcapng.zst": zstandard.ZstdCompressor(level=19).compress(ng)}
    huge = bytearray(pcap)
    huge[24 + 8:24 + 12] = struct.pack("<I", 0xFFFFFFF0)  # first record's caplen
    files["huge_caplen.pcap"] = bytes(huge)
    over = bytearray(pcap)
    over[16:20] = struct.pack("<I", 40)  # header snaplen below the records' caplen (read whole, noted)
    files["caplen_over_snaplen.pcap"] = bytes(over)
    lying = bytearray(ng)
    p = ng.index(struct.pack("<I", 6))  # the first EPB
    lying[p + 4:p + 8] = struct.pack("<I", 0x7FFFFFFC)  # leading length lies (huge)
    files["lying_block_len.pcapng"] = bytes(lying)
    lying2 = bytearray(ng)
    lying2[p + 4:p + 8] = struct.pack("<I", 16)  # leading length too small for the packet
    files["short_block_len.pcapng"] = bytes(lying2)
    for resol in (0x1C, 0x3F, 0x7F, 0xFF):
        files[f"tsresol_{resol:02x}.pcapng"] = ng.replace(struct.pack("<HHB3x", 9, 1, 9), struct.pack("<HHB3x", 9, 1,
                                                                                                        resol), 1)
    files["tsoffset_2p40.pcapng"] = ng.replace(struct.pack("<HHq", 14, 8, 3600), struct.pack("<HHq", 14, 8, 1 << 40))
    files["undefined_interface.pcapng"] = ng.replace(struct.pack("<IIIII", 1, 0, 3, 24, 24),
                                                     struct.pack("<IIIII", 9, 0, 3, 24, 24))
    files["raw_ipv4_linktype.pcap"] = pcap[:20] + struct.pack("<I", 228) + pcap[24:]
    files["radiotap_linktype.pcap"] = pcap[:20] + struct.pack("<I", 127) + pcap[24:]
    files["truncated.pcap.gz"] = files["seed.pcap.gz"][:388 if len(files["seed.pcap.gz"]) > 388 else -20]
    files["truncated.pcapng.zst"] = files["seed.pcapng.zst"][:-9]
    return files


if __name__ == "__main__":
    CORPUS.mkdir(exist_ok=True)
    for name, data in corpus().items():
        (CORPUS / name).write_bytes(data)
    print(f"{len(corpus())} files, {sum(len(d) for d in corpus().values())} bytes in {CORPUS}")
