"""Records longer than the file's snaplen: libpcap (tcpdump -r) cuts them to the snaplen before a filter runs, so
the audit judges the filter on what libpcap reads, against the whole frame's truth (what tshark reads).

The captures are kernel captures (tests/fixtures/kernel) with the header's snaplen rewritten below the records'
length, as a tool that writes a smaller snaplen than it captures leaves them. Expected numbers come from the
oracles on the same files: tshark for the truth, tcpdump on the cut file for what the filter keeps, and tcpdump on
the original file for which misses the cut causes. (A cut never makes a false match: a load past the cut ends
the program with "reject", so 'not tcp port P' drops the cut frame as well.)
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from bigtcp_pcap.audit import audit_capture
from bigtcp_pcap.audit.cbpf import FALSE_MATCH, MISSED
from bigtcp_pcap.audit.judge import R_SNAPLEN, REASON_NAMES
from bigtcp_pcap.capture.reader import read_batches

from .conftest import kernel_capture, needs_tcpdump, needs_tshark, tcpdump_frames, tshark_frames


def with_snaplen(src, dest, snaplen: int):
    """``src`` (a pcap file) with its header's snaplen set to ``snaplen``."""
    data = bytearray(src.read_bytes())
    endian = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    struct.pack_into(endian + "I", data, 16, snaplen)
    dest.write_bytes(bytes(data))
    return dest


CASES = [  # (capture, header snaplen, libpcap expression, tshark display filter)
    ("v6_185000.rcv.pcap", 56, "tcp port 5201", "tcp.port == 5201"),  # IPv6 ports at 54-57: the dst port cut
    ("v6_185000.snd.pcap", 57, "tcp dst port 5201", "tcp.dstport == 5201"),  # a sender capture, no HBH
    ("v4_185000.rcv.pcap", 36, "tcp dst port 5202", "tcp.dstport == 5202"),  # IPv4 ports at 34-37
    ("mixed_185000.rcv.pcap", 56, "tcp port 5201", "tcp.port == 5201"),  # HBH frames: missed cut or whole
]


@needs_tshark
@needs_tcpdump
@pytest.mark.parametrize("name,snaplen,expr,display_filter", CASES)
def test_cut_records_are_judged_as_tcpdump_reads_them(tmp_path, name, snaplen, expr, display_filter):
    src = kernel_capture(name)
    cap = with_snaplen(src, tmp_path / "cut.pcap", snaplen)
    truth = tshark_frames(cap, display_filter)  # tshark reads every record whole
    kept = tcpdump_frames(cap, expr)  # what tcpdump -r keeps of the cut records
    kept_whole = tcpdump_frames(src, expr)  # the same filter on the records whole
    assert kept != kept_whole, "the case should have frames the cut judges differently"

    r = audit_capture(expr, cap)
    frames = r.frame.astype(np.int64)
    assert r.truth == len(truth)
    assert r.matched == len(kept)
    assert set(frames[r.verdict == MISSED].tolist()) == truth - kept
    assert set(frames[r.verdict == FALSE_MATCH].tolist()) == kept - truth
    # the misses and false matches the cut causes, and only those, have its reason
    cut_reason = set(frames[r.reason == R_SNAPLEN].tolist())
    assert cut_reason == ((truth - kept) | (kept - truth)) & (kept ^ kept_whole)
    assert r.frames_cut_changed == len(kept ^ kept_whole)
    longer = sum(int((rb.caplen > snaplen).sum()) for rb in read_batches(cap))
    assert r.frames_cut == longer > 0
    assert any(f"cut to {snaplen} bytes by libpcap" in n for n in r.notes)
    assert REASON_NAMES[R_SNAPLEN] in r.reasons or not cut_reason


@needs_tcpdump
def test_a_snaplen_libpcap_does_not_reach_cuts_nothing(tmp_path):
    """A header snaplen at or above every record (or 0: libpcap's maximum) leaves the audit as on the original."""
    src = kernel_capture("v6_185000.rcv.pcap")
    ref = audit_capture("tcp port 5201", src)
    for snap in (0, 96):
        r = audit_capture("tcp port 5201", with_snaplen(src, tmp_path / f"s{snap}.pcap", snap))
        assert r.frames_cut == 0 and not any("by libpcap" in n for n in r.notes)
        assert (r.matched, r.truth, r.missed, r.false_matches) == (ref.matched, ref.truth, ref.missed,
                                                                   ref.false_matches)
        assert r.matched == len(tcpdump_frames(tmp_path / f"s{snap}.pcap", "tcp port 5201"))
