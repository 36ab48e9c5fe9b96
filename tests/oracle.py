"""tshark as the decoding oracle (real tshark, run as a subprocess), and small capture-writing helpers."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
EXTERNAL = SHARED / "fixtures-external"
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
               nanos: bool = False) -> Path:
    """A classic pcap file; a packet may be (bytes, wirelen) to record an original length > caplen."""
    magic = 0xA1B23C4D if nanos else 0xA1B2C3D4
    out = [struct.pack("<IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype)]
    for i, p in enumerate(packets):
        data, wl = (p, len(p)) if isinstance(p, bytes) else p
        out.append(struct.pack("<IIII", 1_700_000_000 + i, 1000 * i, len(data), wl) + data)
    path.write_bytes(b"".join(out))
    return path
