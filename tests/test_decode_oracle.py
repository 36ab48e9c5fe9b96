"""Every frame of real captures decodes to the lengths, ports and sequence numbers tshark reports.

tshark runs with ipv6.tso_support and ip.tso_support on, the way the issue and ecosystem.md prescribe.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from oracle import EXTERNAL, KERNEL, tshark_fields

from bigtcp_pcap.capture import CaptureReader
from bigtcp_pcap.decode import PacketBatch, decode

CAPTURES = sorted(EXTERNAL.glob("*.pcap")) + sorted(KERNEL.glob("*.pcap"))
FIELDS = ["frame.number", "frame.len", "ip.len", "ipv6.plen", "ipv6.opt.jumbo", "tcp.srcport", "tcp.dstport",
          "tcp.seq_raw", "tcp.len", "ip.proto", "ipv6.nxt", "ip.hdr_len", "tcp.hdr_len"]


def _decode_all(path) -> PacketBatch:
    return PacketBatch.concat([decode(rb)[0] for rb in CaptureReader(path)])


def _last(v: str) -> str:
    """The innermost value when tshark reports one per layer (tunnels)."""
    return v.split(",")[-1] if v else v


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_every_frame_matches_tshark(capture):
    pb = _decode_all(capture)
    rows = tshark_fields(capture, FIELDS)
    assert len(rows) == len(pb) > 0
    checked_tcp = 0
    for i, r in enumerate(rows):
        assert int(r["frame.number"]) == int(pb.frame[i])
        assert int(r["frame.len"]) == int(pb.wirelen[i])
        if r["ipv6.opt.jumbo"]:
            assert pb.has_jumbo[i] and int(pb.jumbo_len[i]) == int(_last(r["ipv6.opt.jumbo"]))
        else:
            assert not pb.has_jumbo[i]
        if r["ip.len"] and not r["ipv6.plen"]:
            assert pb.ip_version[i] == 4
            ip_len = int(_last(r["ip.len"]))
            if ip_len == 0 and r["tcp.len"]:
                # tot_len 0 (IPv4 BIG TCP): tshark presumes TSO and takes the segment from the frame; the true L3
                # length is then its IP header + TCP header + TCP payload as tshark computed them
                ip_len = int(_last(r["ip.hdr_len"])) + int(_last(r["tcp.hdr_len"])) + int(_last(r["tcp.len"]))
            assert ip_len > 0, f"frame {i + 1}: no length to compare"
            assert int(pb.ip_len[i]) == ip_len, f"frame {i + 1}"
        if r["tcp.len"]:
            checked_tcp += 1
            assert pb.l4_proto[i] == 6
            assert int(pb.sport[i]) == int(_last(r["tcp.srcport"]))
            assert int(pb.dport[i]) == int(_last(r["tcp.dstport"]))
            assert int(pb.tcp_seq[i]) == int(_last(r["tcp.seq_raw"]))
            assert int(pb.tcp_payload_len[i]) == int(_last(r["tcp.len"])), f"frame {i + 1}"
    assert checked_tcp == int(((pb.l4_proto == 6) & (pb.l4_off >= 0)).sum())


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_bigtcp_encoding_counts_match_tshark(capture):
    pb = _decode_all(capture)
    n_jumbo = len(tshark_fields(capture, ["frame.number"], "ipv6.opt.jumbo"))
    assert int((pb.bigtcp == 1).sum()) == n_jumbo
    # IPv4 tot_len 0: with ip.tso_support off, tshark's ip.len is the field as found
    n_v4zero = len(tshark_fields(capture, ["frame.number"], "ip.len == 0",
                                 prefs=["-o", "ipv6.tso_support:TRUE", "-o", "ip.tso_support:FALSE"]))
    assert int((pb.bigtcp == 3).sum()) == n_v4zero


GOLDEN_LEN = re.compile(r"length (\d+)(?::|$|,|\s)")


@pytest.mark.parametrize("capture", sorted(EXTERNAL.glob("*.pcap")), ids=lambda p: p.name)
def test_tcpdump_golden_text_lengths(capture):
    """tcpdump master's .out text: the IP length and the TCP payload length it prints."""
    golden = capture.with_suffix(".out").read_text()
    pb = _decode_all(capture)
    m = re.search(r"(?:\[real length (\d+)|length (\d+) \[was 0|jumbo: (\d+))", golden)
    if pb.ip_version[0] == 4:
        m4 = re.search(r"proto \w+ \(\d+\), length (\d+)", golden)
        assert int(pb.ip_len[0]) == int(m4.group(1))
    elif m and m.group(3):
        assert int(pb.jumbo_len[0]) == int(m.group(3))
    elif m and m.group(1):
        assert int(pb.ip_len[0]) == int(m.group(1))
    tcp_len = re.findall(r"Flags \[[^\]]*\].*?, length (\d+)", golden)
    if tcp_len:
        assert int(pb.tcp_payload_len[0]) == int(tcp_len[0])
    else:
        assert pb.l4_proto[0] != 6


def test_lengths_never_come_from_caplen():
    """The snaplen-96 kernel captures: true lengths far beyond what was captured."""
    pb = _decode_all(KERNEL / "v6_185000.rcv.pcap")
    big = pb.bigtcp == 1
    assert big.any()
    assert (pb.caplen[big] <= 96).all()
    assert (pb.ip_len[big].astype(np.int64) == pb.wirelen[big].astype(np.int64) - 14).all()
    assert (pb.ip_len[big] > 65535 + 40).all()


SACK_CAPTURES = sorted((KERNEL / "lost").glob("*.pcap")) + sorted((KERNEL / "late").glob("*.pcap"))


@pytest.mark.parametrize("capture", SACK_CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_first_sack_block_matches_tshark(capture):
    """The first SACK block's raw edges (the GRO evidence reads both) are tshark's first sack_le / sack_re."""
    pb = _decode_all(capture)
    rows = tshark_fields(capture, ["frame.number", "tcp.options.sack_le", "tcp.options.sack_re"], "tcp.options.sack_le",
                         prefs=["-o", "tcp.relative_sequence_numbers:FALSE"])
    assert rows, "the fixture holds SACK blocks"
    want = {int(r["frame.number"]): (int(r["tcp.options.sack_le"].split(",")[0]),
                                     int(r["tcp.options.sack_re"].split(",")[0])) for r in rows}
    got = {int(f): (int(le), int(re_)) for f, n, le, re_ in
           zip(pb.frame, pb.tcp_sack_blocks, pb.tcp_sack_left, pb.tcp_sack_right) if n}
    assert got == want
