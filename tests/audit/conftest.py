"""Oracles and builders for the filter-audit tests.

The oracles are the real tools, run as subprocesses: tshark (with both TSO preferences on) says which frames
*should* match; tcpdump (the same libpcap, but its own program, reading the file itself) says which frames the
filter *does* match. Frames are identified across files by (timestamp, bytes), read back with the project's
reader, so no frame numbering of tcpdump is relied on.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from bigtcp_pcap.capture import read_batches

REPO = Path(__file__).resolve().parents[2]
KERNEL_DIR = REPO / "tests" / "fixtures" / "kernel"
EXTERNAL_DIR = Path(os.environ.get("BIGTCP_EXTERNAL_FIXTURES", REPO / "tests" / "fixtures" / "external"))
TSHARK = shutil.which("tshark")
TCPDUMP = shutil.which("tcpdump")
TSO = ["-o", "ipv6.tso_support:TRUE", "-o", "ip.tso_support:TRUE"]

needs_tshark = pytest.mark.skipif(TSHARK is None, reason="tshark is not installed (apt-get install tshark)")
needs_tcpdump = pytest.mark.skipif(TCPDUMP is None, reason="tcpdump is not installed (apt-get install tcpdump)")


def kernel_capture(name: str) -> Path:
    p = KERNEL_DIR / name
    if not p.exists():
        pytest.skip(f"kernel capture {p} is not there (scripts/make_kernel_captures.py makes it)")
    return p


def external_capture(name: str) -> Path:
    p = EXTERNAL_DIR / name
    if not p.exists():
        pytest.skip(f"external capture {p} is not there")
    return p


@pytest.fixture
def no_libpcap(monkeypatch):
    """Make loading libpcap fail as on a machine without it (the loader only; nothing else is faked)."""
    from bigtcp_pcap.audit import libpcap

    def no_lib(name, *a, **kw):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(libpcap, "_lib", None)
    monkeypatch.setattr(libpcap.ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(libpcap.ctypes, "CDLL", no_lib)


# --- oracles ----------------------------------------------------------------------------------------------------
def tshark_frames(capture: Path, display_filter: str) -> set[int]:
    """Frame numbers tshark's display filter selects (the truth)."""
    if TSHARK is None:
        pytest.skip("tshark is not installed (apt-get install tshark)")
    out = subprocess.run([TSHARK, "-r", str(capture), *TSO, "-Y", display_filter, "-T", "fields", "-e",
                          "frame.number"], capture_output=True, text=True, timeout=300, check=True).stdout
    return {int(x) for x in out.split()}


def _frame_keys(capture: Path | bytes) -> list[tuple[int, bytes]]:
    import io

    src = io.BytesIO(capture) if isinstance(capture, bytes) else capture
    keys = []
    for rb in read_batches(src):
        cut = rb.libpcap_snap or None  # what libpcap reads of a record (and tcpdump -w writes of it)
        for i in range(len(rb)):
            keys.append((int(rb.ts_ns[i]), rb.packet(i)[:cut]))
    return keys


def _is_nano(capture: Path) -> bool:
    return capture.read_bytes()[:4] in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")


def tcpdump_frames(capture: Path, expr: str) -> set[int]:
    """Frame numbers (in ``capture``) of the packets ``tcpdump -r capture -w - EXPR`` keeps."""
    if TCPDUMP is None:
        pytest.skip("tcpdump is not installed (apt-get install tcpdump)")
    prec = ["--time-stamp-precision=nano"] if _is_nano(capture) else []
    out = subprocess.run([TCPDUMP, *prec, "-r", str(capture), "-w", "-", expr], capture_output=True,
                         timeout=300, check=True).stdout
    index: dict[tuple[int, bytes], list[int]] = {}
    for n, key in enumerate(_frame_keys(capture), start=1):
        index.setdefault(key, []).append(n)
    frames = set()
    for key in _frame_keys(out):
        frames.add(index[key].pop(0))
    return frames


def tcpdump_count(capture: Path, expr: str) -> int:
    """``tcpdump -r CAPTURE 'EXPR' | wc -l`` (quiet output: one line per packet)."""
    if TCPDUMP is None:
        pytest.skip("tcpdump is not installed (apt-get install tcpdump)")
    out = subprocess.run([TCPDUMP, "-n", "-q", "-r", str(capture), expr], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    return len(out.splitlines())


def tcpdump_error(expr: str) -> str:
    """libpcap's message for a bad expression, as tcpdump prints it (without the 'tcpdump: ' prefix)."""
    if TCPDUMP is None:
        pytest.skip("tcpdump is not installed (apt-get install tcpdump)")
    r = subprocess.run([TCPDUMP, "-d", expr], check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    line = r.stderr.strip().splitlines()[-1]
    return line.removeprefix("tcpdump: ")


def misjudged(r) -> bool:
    """The audit found frames the filter gets wrong: mis-classified, or (judged on the raw frame) frames the
    normalized copy judges differently."""
    n = r.normalized or {}
    return not r.clean or bool(n.get("missed") or n.get("false_matches"))


def check_against_oracles(capture: Path, expr: str, display_filter: str):
    """Audit ``expr`` on ``capture`` and check every number and every mis-classified frame against tshark's
    ``display_filter`` (truth) and tcpdump (kept frames); re-run any suggestion with tcpdump."""
    import numpy as np

    from bigtcp_pcap.audit import audit_capture
    from bigtcp_pcap.audit.cbpf import FALSE_MATCH, MISSED

    truth = tshark_frames(capture, display_filter)
    kept = tcpdump_frames(capture, expr)
    r = audit_capture(expr, capture)
    frames = r.frame.astype(np.int64)
    assert r.not_audited_frames == 0, r.not_audited
    if r.judged_on == "raw":  # judged on the raw frame: tshark's truth is the normalized view, side by side
        assert r.clean and r.truth == r.matched == len(kept)
        assert r.normalized == {"truth": len(truth), "missed": len(truth - kept), "false_matches": len(kept - truth)}
        if truth != kept:
            assert r.suggestion_verified is True, r.notes
            assert tcpdump_frames(capture, r.suggestion) == truth
        return r, truth, kept
    assert r.truth == len(truth)
    assert r.matched == len(kept)
    assert set(frames[r.verdict == MISSED].tolist()) == truth - kept
    assert set(frames[r.verdict == FALSE_MATCH].tolist()) == kept - truth
    assert r.missed == len(truth - kept) and r.false_matches == len(kept - truth)
    if not r.clean:
        assert r.suggestion_verified is True, r.notes
        assert tcpdump_frames(capture, r.suggestion) == truth
        assert tcpdump_count(capture, r.suggestion) == len(truth)
    else:
        assert r.suggestion is None
    return r, truth, kept


# --- frame builders (struct only) -------------------------------------------------------------------------------
MACS = bytes.fromhex("020000000002" "020000000001")
SRC6 = bytes.fromhex("fd00b100000000000000000000000001")
DST6 = bytes.fromhex("fd00b100000000000000000000000002")


def eth(ethertype: int) -> bytes:
    return MACS + struct.pack("!H", ethertype)


def tcp_hdr(sport: int = 40000, dport: int = 5201, flags: int = 0x10, seq: int = 1) -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, seq, 1, 5 << 4, flags, 500, 0, 0)


def udp_hdr(sport: int = 40000, dport: int = 53, length: int = 8) -> bytes:
    return struct.pack("!HHHH", sport, dport, length, 0)


def ipv6_hdr(plen: int, nh: int) -> bytes:
    return struct.pack("!IHBB", 6 << 28, plen, nh, 64) + SRC6 + DST6


def hbh_jumbo(nh: int, jumbo: int) -> bytes:
    """RFC 2675 Hop-by-Hop header as Linux BIG TCP writes it: nh, len 0, Jumbo option (0xC2, 4, value)."""
    return struct.pack("!BBBBI", nh, 0, 0xC2, 4, jumbo)


def ipv4_hdr(tot_len: int, proto: int = 6) -> bytes:
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, tot_len, 1, 0x4000, 64, proto, 0, bytes([10, 0, 0, 1]),
                       bytes([10, 0, 0, 2]))


def v6_tcp(payload: int, sport: int = 40000, dport: int = 5201, flags: int = 0x10, snap: int | None = None):
    """Ethernet/IPv6/TCP: (captured bytes, wirelen)."""
    seg = tcp_hdr(sport, dport, flags) + bytes(payload)
    frame = eth(0x86DD) + ipv6_hdr(len(seg), 6) + seg
    return frame[:snap], len(frame)


def v6_hbh_tcp(payload: int, sport: int = 40000, dport: int = 5201, flags: int = 0x10, snap: int | None = 96):
    """Ethernet/IPv6/HBH jumbo/TCP with payload_len 0: (captured bytes, wirelen)."""
    seg = tcp_hdr(sport, dport, flags) + bytes(payload)
    frame = eth(0x86DD) + ipv6_hdr(0, 0) + hbh_jumbo(6, 8 + len(seg)) + seg
    return frame[:snap], len(frame)


def v6_plen0_tcp(payload: int, sport: int = 40000, dport: int = 5201, snap: int | None = 96):
    """Ethernet/IPv6 payload_len 0 without HBH (2026 kernels)/TCP."""
    seg = tcp_hdr(sport, dport) + bytes(payload)
    frame = eth(0x86DD) + ipv6_hdr(0, 6) + seg
    return frame[:snap], len(frame)


def v4_tcp(payload: int, sport: int = 40000, dport: int = 5202, totlen0: bool = False, snap: int | None = 96):
    seg = tcp_hdr(sport, dport) + bytes(payload)
    frame = eth(0x0800) + ipv4_hdr(0 if totlen0 else 20 + len(seg)) + seg
    return frame[:snap], len(frame)


def write_pcap(path: Path, packets: list[tuple[bytes, int]], linktype: int = 1, snaplen: int = 262144) -> Path:
    """A classic microsecond pcap; each packet is (captured bytes, original length)."""
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, snaplen, linktype)]
    for i, (data, wirelen) in enumerate(packets):
        out.append(struct.pack("<IIII", 1_700_000_000 + i, i, len(data), wirelen) + data)
    path.write_bytes(b"".join(out))
    return path


def decode_packets(path: Path, packets: list[tuple[bytes, int]], linktype: int = 1):
    """Write ``packets`` to a pcap at ``path`` and return (RecordBatch, PacketBatch) from the project's reader
    and decoder (one batch)."""
    from bigtcp_pcap.decode import decode

    write_pcap(path, packets, linktype)
    (rb,) = list(read_batches(path))
    pb, _ = decode(rb)
    return rb, pb
