"""Suggestions on a hand-built capture that holds every encoding (HBH jumbo TCP/UDP/ICMPv6, IPv6 payload_len 0,
IPv4 tot_len 0) next to plain packets: the audit's truth is tshark's, and tcpdump with the suggestion keeps
exactly the truth."""

from __future__ import annotations

import struct

import pytest

from bigtcp_pcap.audit import audit_capture
from bigtcp_pcap.audit.suggest import rewrite

from .conftest import (
    check_against_oracles,
    eth,
    hbh_jumbo,
    ipv4_hdr,
    ipv6_hdr,
    misjudged,
    needs_tcpdump,
    needs_tshark,
    tcp_hdr,
    udp_hdr,
    v4_tcp,
    v6_hbh_tcp,
    v6_plen0_tcp,
    v6_tcp,
    write_pcap,
)


def v6_hbh(nh: int, l4: bytes, payload: int, snap: int = 96):
    body = l4 + bytes(payload)
    fr = eth(0x86DD) + ipv6_hdr(0, 0) + hbh_jumbo(nh, 8 + len(body)) + body
    return fr[:snap], len(fr)


def v6_plain(nh: int, l4: bytes, payload: int):
    body = l4 + bytes(payload)
    fr = eth(0x86DD) + ipv6_hdr(len(body), nh) + body
    return fr, len(fr)


def v4_plain(proto: int, l4: bytes, payload: int):
    body = l4 + bytes(payload)
    fr = eth(0x0800) + ipv4_hdr(20 + len(body), proto) + body
    return fr, len(fr)


def icmp6_echo() -> bytes:
    return struct.pack("!BBHHH", 128, 0, 0, 1, 1)


def mld_report():
    """MLDv2 report: IPv6 + Hop-by-Hop Router Alert (not BIG TCP) + ICMPv6 143, as every Linux host sends."""
    hbh = bytes([58, 0, 5, 2, 0, 0, 1, 0])
    icmp = struct.pack("!BBHHH", 143, 0, 0, 0, 0)
    fr = eth(0x86DD) + ipv6_hdr(len(hbh) + len(icmp), 0) + hbh + icmp
    return fr, len(fr)


FRAMES = [
    v6_tcp(100, 40000, 5201),
    v6_hbh_tcp(70000, 40000, 5201, flags=0x18),
    v6_hbh_tcp(90000, 5201, 40000),
    v6_hbh_tcp(70000, 40000, 80),
    v6_tcp(0, 40001, 5201, flags=0x02),
    v6_hbh_tcp(66000, 5300, 5100, flags=0x02),
    v6_hbh(17, udp_hdr(40000, 53, 0), 70000),
    v6_plain(17, udp_hdr(40000, 53, 108), 100),
    v6_plen0_tcp(70000, 40000, 5201),
    v4_tcp(80000, 40000, 5202, totlen0=True),
    v4_tcp(1000, 40000, 5202),
    v4_plain(17, udp_hdr(40000, 53, 108), 100),
    v6_hbh(58, icmp6_echo(), 70000),
    v6_plain(58, icmp6_echo(), 50),
    mld_report(),
]

CASES = [
    ("tcp src port 40000", "tcp.srcport == 40000"),
    ("tcp dst port 5201", "tcp.dstport == 5201"),
    ("port 53", "tcp.port == 53 or udp.port == 53"),
    ("udp", "udp"),
    ("tcp portrange 5000-5300", "tcp.port in {5000..5300}"),
    ("tcp src portrange 5250-5400", "tcp.srcport in {5250..5400}"),
    ("not (tcp port 80 or udp)", "not (tcp.port == 80 or udp)"),
    ("ip6 proto 6", "ipv6 and tcp"),
    ("tcp[tcpflags] & tcp-syn != 0", "tcp.flags.syn == 1"),
    ("tcp[tcpflags] & tcp-push != 0 and dst port 5201", "tcp.flags.push == 1 and tcp.dstport == 5201"),
    ("ip[2:2] > 1500", "ip.len > 1500"),
    ("icmp6", "icmpv6"),
    ("tcp port 5201 or 5202", "tcp.port == 5201 or tcp.port == 5202"),
    ("udp port 53 and ip6", "udp.port == 53 and ipv6"),
    ("ip6 and not tcp", "ipv6 and not tcp"),
]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return write_pcap(tmp_path_factory.mktemp("audit") / "synthetic.pcap", FRAMES)


@needs_tshark
@needs_tcpdump
@pytest.mark.parametrize("expr,display_filter", CASES)
def test_suggestion_keeps_exactly_the_truth(synthetic, expr, display_filter):
    r, _, _ = check_against_oracles(synthetic, expr, display_filter)
    assert misjudged(r), "every case here should be affected by some encoding"


def test_router_alert_hbh_is_an_extension_header_reason(synthetic):
    r = audit_capture("icmp6", synthetic)
    assert r.reasons == {"ipv6_hbh_jumbo": 1, "ipv6_ext_header": 1}


def test_tcp_port_rewrite_is_the_documented_form():
    assert rewrite("tcp port 5201").text == ("(tcp port 5201 or (ip6[6]=0 and ip6[40]=6 and "
                                             "(ip6[48+ip6[41]*8:2]=5201 or ip6[50+ip6[41]*8:2]=5201)))")
    assert rewrite("tcp").text == "(tcp or (ip6[6]=0 and ip6[40]=6))"
    assert rewrite("not tcp").text == "not (tcp or (ip6[6]=0 and ip6[40]=6))"


def test_truth_mode_only_extends_l4_indexing():
    assert rewrite("tcp port 80", "truth").text == "tcp port 80"
    assert rewrite("tcp[13] & 2 != 0", "truth").text == "(tcp[13] & 2 != 0 or (ip6[6]=6 and ip6[53] & 2 != 0))"


def test_unaffected_primitives_are_kept():
    for expr in ("host 10.0.0.1", "ip6 protochain 6", "ether host 02:00:00:00:00:01", "net 10.0.0.0/8"):
        rw = rewrite(expr)
        assert rw.text == expr and not rw.changed


def test_chain_of_two_extension_headers_gets_no_fixed_offset_suggestion(tmp_path):
    """HBH + Destination Options before TCP: the fixed-offset rewrite cannot reach TCP, so the audit must say
    no verified suggestion exists; the protochain form walks the chain and is offered as the alternative."""
    seg = tcp_hdr(40000, 5201) + bytes(70000)
    dst_opts = struct.pack("!BB6s", 6, 0, bytes([1, 4, 0, 0, 0, 0]))  # PadN
    fr = eth(0x86DD) + ipv6_hdr(0, 0) + hbh_jumbo(60, 16 + len(seg)) + dst_opts + seg
    cap = write_pcap(tmp_path / "chain.pcap", [(fr[:120], len(fr)), v6_tcp(10)])
    r = audit_capture("tcp", cap)
    assert r.missed == 1 and r.reasons == {"ipv6_hbh_jumbo": 1}
    assert r.suggestion is None and r.suggestion_verified is False
    assert any("no verified suggestion" in n for n in r.notes)
    assert r.alternative == "(tcp or ip6 protochain 6)"


def relink(frames, header_for):
    """The same frames with the Ethernet header replaced (header_for(ethertype) -> bytes)."""
    out = []
    for data, wirelen in frames:
        ethertype = struct.unpack_from("!H", data, 12)[0]
        hdr = header_for(ethertype)
        out.append((hdr + data[14:], wirelen - 14 + len(hdr)))
    return out


LINKTYPES = {
    276: lambda et: struct.pack("!HHIHBB8s", et, 0, 3, 1, 0, 6, bytes.fromhex("020000000001") + b"\0\0"),  # SLL2
    113: lambda et: struct.pack("!HHH8sH", 0, 1, 6, bytes.fromhex("020000000001") + b"\0\0", et),  # SLL
    101: lambda et: b"",  # RAW
}


@needs_tshark
@needs_tcpdump
@pytest.mark.parametrize("linktype", sorted(LINKTYPES))
@pytest.mark.parametrize("expr,display_filter", [("tcp port 5201", "tcp.port == 5201"),
                                                 ("ip[2:2] > 1500", "ip.len > 1500"),
                                                 ("not udp", "not udp")])
def test_other_linktypes(tmp_path, linktype, expr, display_filter):
    """Cooked captures (tcpdump -i any: SLL/SLL2) and raw IP: the program is compiled for the linktype, and
    length rewrites use that link header's length."""
    cap = write_pcap(tmp_path / f"lt{linktype}.pcap", relink(FRAMES, LINKTYPES[linktype]), linktype)
    r, _, _ = check_against_oracles(cap, expr, display_filter)
    assert r.linktypes == [linktype] and misjudged(r)


def write_pcapng(path, interfaces: list[int], packets: list[tuple[int, bytes, int]]):
    """A minimal pcapng: one IDB per linktype in ``interfaces``, EPBs (if_id, data, wirelen)."""
    def block(btype: int, body: bytes) -> bytes:
        body += b"\0" * (-len(body) % 4)
        n = 12 + len(body)
        return struct.pack("<II", btype, n) + body + struct.pack("<I", n)

    out = [block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))]
    out += [block(1, struct.pack("<HHI", lt, 0, 262144)) for lt in interfaces]
    for i, (if_id, data, wirelen) in enumerate(packets):
        ts = 1_700_000_000_000_000 + i
        out.append(block(6, struct.pack("<IIIII", if_id, ts >> 32, ts & 0xFFFFFFFF, len(data), wirelen) + data))
    path.write_bytes(b"".join(out))
    return path


@needs_tshark
def test_mixed_linktypes_get_one_verified_suggestion_per_linktype(tmp_path):
    """A length rewrite depends on the link header length, so an Ethernet + SLL2 pcapng (tcpdump cannot read
    it) gets one suggestion per linktype, each verified on its frames."""
    from .conftest import tshark_frames

    sll2 = relink(FRAMES, LINKTYPES[276])
    cap = write_pcapng(tmp_path / "mixed.pcapng", [1, 276],
                       [(0, d, w) for d, w in FRAMES] + [(1, d, w) for d, w in sll2])
    r = audit_capture("ip[2:2] > 1500", cap)
    assert r.judged_on == "raw" and r.clean
    assert r.normalized["truth"] == len(tshark_frames(cap, "ip.len > 1500")) and r.normalized["missed"] > 0
    assert r.suggestion is None and r.suggestion_verified is True and r.suggestion_mismatches == 0
    assert r.suggestions_by_linktype == {1: rewrite("ip[2:2] > 1500", link_len=14).text,
                                         276: rewrite("ip[2:2] > 1500", link_len=20).text}
    # 'tcp port' does not depend on the link header: one suggestion for both
    r = audit_capture("tcp port 5201", cap)
    assert r.truth == len(tshark_frames(cap, "tcp.port == 5201")) and r.suggestion_verified is True
    assert r.suggestion == rewrite("tcp port 5201").text
