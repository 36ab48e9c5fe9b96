"""TCP options cut by the snaplen (gro/rules.py r12_header_pulls).

With TCP timestamps on, ``tcpdump -s 64`` (IPv4 over Ethernet), ``-s 80`` (IPv6) or ``-i any -s 68`` (IPv4) cuts
every segment inside its options (the fixed 20 bytes are there). The kernel had the whole header, so such a
segment is no reason for GRO to give up: the rebuild compares the options as far as they were captured. It gave up
on every one of them (2,132 segments of a kernel sender capture delivered alone, no super-packet rebuilt). The
oracle: the same kernel capture uncut, cut by editcap (Wireshark's) at the end of the fixed header and 6 bytes
into the options.
"""

from __future__ import annotations

import subprocess

import pytest
from oracle import KERNEL, need_tshark, tshark_fields

from bigtcp_pcap.api import analyze
from bigtcp_pcap.decode.schema import ST_TRUNC_L4

COLS = ["first_frame", "last_frame", "seq_first", "payload_len", "n_segments", "receiver", "flush_reason"]
FIXED = {"v6_185000": 14 + 40 + 20, "v4_185000": 14 + 20 + 20, "v4_65536": 14 + 20 + 20}


@pytest.mark.parametrize("into_options", [0, 6])
@pytest.mark.parametrize("name", sorted(FIXED))
def test_options_cut_by_the_snaplen_rebuild_the_uncut_superpackets(name, into_options, tmp_path):
    need_tshark()
    cap = KERNEL / f"{name}.snd.pcap"
    cut = tmp_path / "cut.pcap"
    subprocess.run(["editcap", "-s", str(FIXED[name] + into_options), str(cap), str(cut)], check=True,
                   capture_output=True, timeout=120)
    whole = analyze(cap, outdir=tmp_path / "whole", gro_max_size=185000, packets=True)
    part = analyze(cut, outdir=tmp_path / "cut", gro_max_size=185000, packets=True)
    pk = part.packets
    data = pk[pk.tcp_payload_len > 0]
    assert len(data) > 1000 and ((data.status & ST_TRUNC_L4) != 0).all()  # every data segment's options are cut
    a, b = whole.superpackets, part.superpackets
    assert (a.n_segments > 1).sum() > 50
    assert b[COLS].reset_index(drop=True).equals(a[COLS].reset_index(drop=True))
    assert part.flows[["packets", "payload_bytes"]].equals(whole.flows[["packets", "payload_bytes"]])
    # the summary counts the frames whose options alone were cut as tshark sees them (header length past the cut)
    rows = tshark_fields(cut, ["frame.cap_len", "ip.hdr_len", "tcp.hdr_len"], display_filter="tcp")
    want = sum(int(r["frame.cap_len"]) < 14 + (int(r["ip.hdr_len"]) if r["ip.hdr_len"] else 40)
               + int(r["tcp.hdr_len"]) for r in rows)
    assert part.summary["tcp_options_cut"] == want and want >= len(data)
    assert whole.summary["tcp_options_cut"] == 0
