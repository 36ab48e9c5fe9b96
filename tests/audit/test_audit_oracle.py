"""The audit against the tools: on real kernel captures and on tcpdump's own BIG TCP test captures, every count
and every mis-classified frame is checked against tshark (the truth) and tcpdump (what the filter keeps), and
every suggestion is re-run by tcpdump.

Expected numbers are never written down here: they come from the oracles on the same file.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigtcp_pcap.audit.cbpf import MISSED

from .conftest import (
    check_against_oracles,
    external_capture,
    kernel_capture,
    needs_tcpdump,
    needs_tshark,
    tshark_frames,
)

V6_RCV = ["v6_185000.rcv.pcap", "v6_80000.rcv.pcap", "v6_snd185000_rcv80000.rcv.pcap", "mixed_185000.rcv.pcap"]
V4_RCV = ["v4_185000.rcv.pcap", "mixed_185000.rcv.pcap"]
V6_FILTERS = [  # (libpcap expression, tshark display filter with the same meaning)
    ("tcp", "tcp"),
    ("tcp port 5201", "tcp.port == 5201"),
    ("not tcp", "not tcp"),
    ("ip6 and tcp", "ipv6 and tcp"),
    ("tcp[tcpflags] & tcp-syn != 0", "tcp.flags.syn == 1"),
    ("tcp dst port 5201 and tcp[tcpflags] & tcp-push != 0", "tcp.dstport == 5201 and tcp.flags.push == 1"),
]
V4_FILTERS = [
    ("ip[2:2] > 1500", "ip.len > 1500"),
    ("ip[2:2] <= 1500", "ip.len <= 1500"),
    ("tcp port 5202", "tcp.port == 5202"),
]
CASES = ([(c, e, y) for c in V6_RCV for e, y in V6_FILTERS] + [(c, e, y) for c in V4_RCV for e, y in V4_FILTERS]
         + [("v6_65536.rcv.pcap", "tcp port 5201", "tcp.port == 5201"),
            ("v6_185000.snd.pcap", "tcp port 5201", "tcp.port == 5201"),
            ("v4_65536.rcv.pcap", "ip[2:2] > 1500", "ip.len > 1500")])


@needs_tshark
@needs_tcpdump
@pytest.mark.parametrize("name,expr,display_filter", CASES)
def test_kernel_capture_counts_match_tshark_and_tcpdump(name, expr, display_filter):
    check_against_oracles(kernel_capture(name), expr, display_filter)


@needs_tshark
@needs_tcpdump
@pytest.mark.parametrize("name", V6_RCV)
def test_every_hbh_jumbo_packet_is_missed_by_tcp_port(name):
    """The headline: 'tcp port P' misses exactly the HBH jumbo packets (tshark ipv6.opt.jumbo) and no other."""
    cap = kernel_capture(name)
    jumbo = tshark_frames(cap, "ipv6.opt.jumbo")
    assert jumbo, "the receiver capture should hold HBH jumbo packets"
    r, _, _ = check_against_oracles(cap, "tcp port 5201", "tcp.port == 5201")
    frames = r.frame.astype(np.int64)
    assert set(frames[r.verdict == MISSED].tolist()) == jumbo
    assert r.reasons == {"ipv6_hbh_jumbo": len(jumbo)}
    assert sum(f.packets for f in r.flows) == len(jumbo)


@needs_tshark
@needs_tcpdump
@pytest.mark.parametrize("name", V4_RCV)
def test_ipv4_length_test_misses_the_tot_len_0_packets_on_the_normalized_copy(name):
    cap = kernel_capture(name)
    r, _, _ = check_against_oracles(cap, "ip[2:2] > 1500", "ip.len > 1500")
    totlen0 = tshark_frames(cap, "ip and frame.len > 65549")  # > 65535 + 14: only tot_len-0 frames
    # the relation reads the raw total length: judged on the raw frame, the true lengths side by side
    assert r.judged_on == "raw" and r.clean
    assert totlen0 and r.normalized["missed"] == len(totlen0) and r.normalized["false_matches"] == 0


@needs_tshark
@needs_tcpdump
def test_tcp_index_on_ipv6_is_its_own_reason():
    cap = kernel_capture("v6_185000.rcv.pcap")
    r, truth, _ = check_against_oracles(cap, "tcp[tcpflags] & tcp-syn != 0", "tcp.flags.syn == 1")
    assert truth and r.reasons == {"tcp_index_ipv4_only": len(truth)}


EXTERNAL_CASES = [
    ("bigtcp-ipv6-hbh.pcap", "tcp", "tcp"),
    ("bigtcp-ipv6-hbh.pcap", "tcp port 41851", "tcp.port == 41851"),
    ("bigtcp-ipv6-hbh.pcap", "not tcp", "not tcp"),
    ("bigtcp-ipv6.pcap", "tcp port 43267", "tcp.port == 43267"),
    ("bigtcp-ipv6.pcap", "ip6[4:2] > 1000", "ipv6.plen > 1000"),
    ("bigtcp-ipv4.pcap", "ip[2:2] > 1500", "ip.len > 1500"),
    ("bigtcp-ipv4.pcap", "tcp port 35871", "tcp.port == 35871"),
    ("ipv4_tcp_http_xml_tso.pcap", "ip[2:2] > 1500", "ip.len > 1500"),
    ("ipv6_jumbogram_1.pcap", "icmp6", "icmpv6"),
    ("ipv6_jumbogram_1.pcap", "icmp6[icmp6type] = icmp6-echo", "icmpv6.type == 128"),
    ("gso-ipv6.pcap", "tcp port 36539", "tcp.port == 36539"),
]


@needs_tshark
@needs_tcpdump
@pytest.mark.parametrize("name,expr,display_filter", EXTERNAL_CASES)
def test_external_capture_counts_match_tshark_and_tcpdump(name, expr, display_filter):
    check_against_oracles(external_capture(name), expr, display_filter)
