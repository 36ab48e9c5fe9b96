"""pcapng Interface Statistics Blocks: the drops the capturing system counted become a ``capture.dropped`` finding.

dumpcap writes an ISB per interface when it stops, with isb_ifrecv (4) and isb_ifdrop (5); a helper's kernel
capture with a small buffer (``dumpcap -i A -i B -B 1``) recorded 48 and 180 drops there, and the summary only
showed an unexplained sequence gap. Built files here (the spec's layout; values chosen): two sections, so the
interface is numbered across them; an ISB with a short option and one with none are read without complaint, as
tshark reads the file (its frame count is the oracle that nothing else changed).
"""

from __future__ import annotations

import struct

import craft as C
from oracle import pcapng_block, pcapng_epb, pcapng_idb, pcapng_shb, tshark_fields

from bigtcp_pcap.api import analyze


def _isb(if_id: int, opts: list[tuple[int, bytes]], e: str = "<") -> bytes:
    body = struct.pack(e + "III", if_id, 0, 0)
    for code, val in opts:
        body += struct.pack(e + "HH", code, len(val)) + val + b"\0" * (-len(val) % 4)
    return pcapng_block(5, body + struct.pack(e + "HH", 0, 0), e)


def test_isb_drops_are_a_finding(tmp_path):
    t = C.tcp() + b"x" * 10
    frame = C.eth(0x0800) + C.ipv4(len(t)) + t
    q = lambda v: struct.pack("<Q", v)
    parts = [pcapng_shb(), pcapng_idb(1), pcapng_idb(1),
             pcapng_epb(0, 1, frame), pcapng_epb(1, 2, frame),
             _isb(0, [(4, q(100)), (5, q(7))]), _isb(1, [(4, q(10))]),  # interface 1: none dropped
             _isb(0, [(4, q(200)), (5, q(40)), (7, q(2))]),  # the later block of an interface holds the totals
             pcapng_shb(), pcapng_idb(1), pcapng_epb(0, 3, frame),
             _isb(0, [(5, b"\1\2")]),  # a bad option length: ignored
             _isb(0, [(5, q(5))])]
    cap = tmp_path / "isb.pcapng"
    cap.write_bytes(b"".join(parts))
    assert len(tshark_fields(cap, ["frame.number"])) == 3
    res = analyze(cap, outdir=tmp_path / "o", audit=False)
    f = res.findings
    f = f[f.code == "capture.dropped"]
    assert f.frame.tolist() == [0, 0]
    assert [m.split("dropped ")[1].split(" ")[0] for m in f.message] == ["42", "5"]
    assert [m.rsplit("(interface ", 1)[1] for m in f.message] == ["0)", "2)"]
    assert res.summary["capture"]["packets"] == 3
