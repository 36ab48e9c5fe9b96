"""One crafted packet per RFC 2675 rule yields exactly its finding code; valid jumbograms yield none."""

from __future__ import annotations

import pytest
from craft import eth, frag, hbh, ipv6, jumbo_opt, tcp
from oracle import write_pcap

from bigtcp_pcap import findings as F
from bigtcp_pcap.capture import CaptureReader
from bigtcp_pcap.decode import decode

PAYLOAD = 70000
T = tcp()


def _frame(l3: bytes, l4_and_payload_len: int) -> tuple[bytes, int]:
    """(captured bytes cut at 128, wirelen) for an Ethernet frame whose L3 header bytes are l3."""
    data = eth(0x86DD) + l3 + T
    return data[:128], 14 + len(l3) + l4_and_payload_len


def _jumbo_packet(ext: bytes, first_nh: int, plen: int = 0, extra_wire: int = 0) -> tuple[bytes, int]:
    return _frame(ipv6(plen, first_nh) + ext, len(T) + PAYLOAD + extra_wire)


J = len(T) + PAYLOAD  # TCP header + payload

CASES = {
    "valid": (_jumbo_packet(hbh(6, jumbo_opt(8 + J)), 0), set()),
    "valid_min_65536": (_frame(ipv6(0, 0) + hbh(6, jumbo_opt(65536)), 65536 - 8), set()),
    "ipv6.jumbo.too_small": (_frame(ipv6(0, 0) + hbh(6, jumbo_opt(8 + 1000)), 1000), {"ipv6.jumbo.too_small"}),
    "ipv6.jumbo.plen_nonzero": (_frame(ipv6(8 + 100, 0) + hbh(6, jumbo_opt(8 + J)), 100),
                                {"ipv6.jumbo.plen_nonzero"}),
    "ipv6.jumbo.with_fragment": (_jumbo_packet(hbh(44, jumbo_opt(16 + J)) + frag(6), 0),
                                 {"ipv6.jumbo.with_fragment"}),
    "ipv6.jumbo.misaligned": (_jumbo_packet(hbh(6, b"\x00" + jumbo_opt(8 + J)), 0), {"ipv6.jumbo.misaligned"}),
    "ipv6.jumbo.not_hbh": (_jumbo_packet(hbh(6, jumbo_opt(8 + J)), 60), {"ipv6.jumbo.not_hbh"}),
    "ipv6.jumbo.missing": (_jumbo_packet(hbh(6, b""), 0), {"ipv6.jumbo.missing"}),
    "ipv6.jumbo.duplicate": (_jumbo_packet(hbh(6, jumbo_opt(16 + J) + b"\x01\x00" + jumbo_opt(16 + J)), 0),
                             {"ipv6.jumbo.duplicate"}),
    "ipv6.jumbo.exceeds_frame": (_jumbo_packet(hbh(6, jumbo_opt(8 + J)), 0, extra_wire=-5000),
                                 {"ipv6.jumbo.exceeds_frame"}),
    "ipv6.hbh.not_first": (_jumbo_packet(hbh(0, b"") + hbh(6, jumbo_opt(16 + J)), 60), {"ipv6.hbh.not_first"}),
    "ipv6.jumbo.bad_length": (_jumbo_packet(hbh(6, bytes([0xC2, 2, 0, 0])), 0), {"ipv6.jumbo.bad_length"}),
}


def _findings(tmp_path, pkt) -> tuple[set[str], object]:
    path = write_pcap(tmp_path / "x.pcap", [pkt], snaplen=128)
    (rb,) = list(CaptureReader(path))
    pb, fr = decode(rb)
    return {F.BY_ID[c].code for c in fr.code.tolist()}, pb


@pytest.mark.parametrize("name", list(CASES))
def test_rule_yields_exactly_its_code(tmp_path, name):
    pkt, expected = CASES[name]
    got, pb = _findings(tmp_path, pkt)
    assert got == expected
    assert pb.l4_proto[0] == 6 and pb.sport[0] == 40000 and pb.dport[0] == 5201


def test_valid_jumbogram_lengths(tmp_path):
    _, pb = _findings(tmp_path, CASES["valid"][0])
    assert pb.bigtcp[0] == 1 and pb.jumbo_len[0] == 8 + J
    assert pb.ip_len[0] == 40 + 8 + J and pb.tcp_payload_len[0] == PAYLOAD


def test_plen0_without_hbh_is_bigtcp_for_tcp_only(tmp_path):
    _, pb = _findings(tmp_path, _frame(ipv6(0, 6), J))
    assert pb.bigtcp[0] == 2 and pb.tcp_payload_len[0] == PAYLOAD
    got, pb = _findings(tmp_path, (eth(0x86DD) + ipv6(0, 58) + b"\x80\x00" + b"\x00" * 62, 14 + 40 + 70000))
    assert got == {"ipv6.plen0.not_tcp_udp"} and pb.bigtcp[0] == 0 and pb.ip_len[0] == 40
