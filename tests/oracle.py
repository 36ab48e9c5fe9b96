"""tshark as the decoding oracle (real tshark, run as a subprocess), and small capture-writing helpers."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXTERNAL = ROOT / "tests" / "fixtures" / "external"  # tcpdump's one-packet BIG TCP captures (see its README)
KERNEL = ROOT / "tests" / "fixtures" / "kernel"
TSHARK_PREFS = ["-o", "ipv6.tso_support:TRUE", "-o", "ip.tso_support:TRUE"]


def need_tshark() -> str:
    path = shutil.which("tshark")
    if path is None:
        pytest.skip("tshark is not installed (the README's test command installs it)")
    return path


def tshark_fields(capture: Path, fields: list[str], display_filter: str | None = None,
                  prefs: list[str] = TSHARK_PREFS) -> list[dict[str, str]]:
    """One dict per frame with the requested tshark fields ('' when absent; multiple values joined by ',')."""
    cmd = [need_tshark(), "-r", str(capture), *prefs, "-T", "fields", "-E", "separator=\t",
           "-E", "occurrence=a", "-E", "aggregator=,"]
    if display_filter:
        cmd += ["-Y", display_filter]
    for f in fields:
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout
    return [dict(zip(fields, line.split("\t"))) for line in out.splitlines()]


def write_pcap(path: Path, packets: list[bytes | tuple[bytes, int]], linktype: int = 1, snaplen: int = 262144,
               nanos: bool = False, times_us: list[int] | None = None) -> Path:
    """A classic pcap file; a packet may be (bytes, wirelen) to record an original length > caplen.

    Timestamps: packet i at 1_700_000_000 + i s (+ i ms), or ``times_us[i]`` microseconds after 1_700_000_000 s."""
    magic = 0xA1B23C4D if nanos else 0xA1B2C3D4
    out = [struct.pack("<IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype)]
    for i, p in enumerate(packets):
        data, wl = (p, len(p)) if isinstance(p, bytes) else p
        if times_us is None:
            sec, frac = 1_700_000_000 + i, 1000 * i
        else:
            sec, frac = 1_700_000_000 + times_us[i] // 1_000_000, times_us[i] % 1_000_000 * (1000 if nanos else 1)
        out.append(struct.pack("<IIII", sec, frac, len(data), wl) + data)
    path.write_bytes(b"".join(out))
    return path


def _pad4(b: bytes) -> bytes:
    return b + b"\x00" * (-len(b) % 4)


def pcapng_block(btype: int, body: bytes, e: str = "<") -> bytes:
    body = _pad4(body)
    n = 12 + len(body)
    return struct.pack(e + "II", btype, n) + body + struct.pack(e + "I", n)


def pcapng_shb(e: str = "<") -> bytes:
    return pcapng_block(0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1), e)


def pcapng_idb(linktype: int, snaplen: int = 0, tsresol: int | None = None, tsoffset: int | None = None,
               e: str = "<") -> bytes:
    opts = b""
    if tsresol is not None:
        opts += struct.pack(e + "HH", 9, 1) + _pad4(bytes([tsresol]))
    if tsoffset is not None:
        opts += struct.pack(e + "HHq", 14, 8, tsoffset)
    if opts:
        opts += struct.pack(e + "HH", 0, 0)
    return pcapng_block(1, struct.pack(e + "HHI", linktype, 0, snaplen) + opts, e)


def pcapng_epb(if_id: int, ts_units: int, data: bytes, wirelen: int | None = None, e: str = "<") -> bytes:
    wl = len(data) if wirelen is None else wirelen
    return pcapng_block(6, struct.pack(e + "IIIII", if_id, ts_units >> 32, ts_units & 0xFFFFFFFF, len(data), wl)
                        + data, e)


def pcapng_spb(data: bytes, wirelen: int | None = None, e: str = "<") -> bytes:
    return pcapng_block(3, struct.pack(e + "I", len(data) if wirelen is None else wirelen) + data, e)


def pcapng_pb(if_id: int, ts_units: int, data: bytes, e: str = "<") -> bytes:
    return pcapng_block(2, struct.pack(e + "HHIIII", if_id, 0, ts_units >> 32, ts_units & 0xFFFFFFFF, len(data),
                                       len(data)) + data, e)


def read_pcap_records(path: Path) -> list[tuple[bytes, int]]:
    """(data, wirelen) of each record of a little-endian classic pcap (test input preparation only)."""
    raw = path.read_bytes()
    out, p = [], 24
    while p + 16 <= len(raw):
        _, _, incl, orig = struct.unpack("<IIII", raw[p:p + 16])
        out.append((raw[p + 16:p + 16 + incl], orig))
        p += 16 + incl
    return out
