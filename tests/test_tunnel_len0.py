"""An outer IP length of 0 around a tunnel (decode/kernel.py ``_gso_proto``), checked against tshark.

Linux writes an IPv4 total length (or, from 7.0, an IPv6 payload length) of 0 for any skb past 64 KiB, so a
GRE, ERSPAN or ip6gre device with raised GSO limits around BIG TCP sends an outer header with length 0 and
protocol 47 (and IP-in-IP with 4 or 41). Those are presumed GSO super-packets like TCP and UDP ones: their length
comes from the frame's original length, and the inner packet is decoded whole. Before, only TCP and UDP were,
so the outer length stayed at the header (``ipv4.totlen0.not_tcp_udp``) and the inner bytes were lost. This
VM's kernel has no gre/ip_gre module, so the frames are built here; tshark (TSO support on: it presumes a length
of 0 is TSO) is the oracle. An ESP packet with length 0 stays a finding.
"""

from __future__ import annotations

import struct

import craft as C
from oracle import tshark_fields, write_pcap

from bigtcp_pcap.api import analyze

P = 100_000  # inner TCP payload


def _gre(proto: int) -> bytes:
    return struct.pack("!HH", 0, proto)


def _frames() -> list[tuple[bytes, int]]:
    t = C.tcp()
    v6_jumbo = C.ipv6(0, 0) + C.hbh(6, C.jumbo_opt(8 + len(t) + P)) + t  # IPv6 BIG TCP (HBH Jumbo)
    v4_big = C.ipv4(0, proto=6, tot_len=0) + t  # IPv4 BIG TCP
    heads = [
        C.eth(0x0800) + C.ipv4(0, proto=47, tot_len=0) + _gre(0x86DD) + v6_jumbo,  # GRE in IPv4
        C.eth(0x86DD) + C.ipv6(0, 47) + _gre(0x0800) + v4_big,  # ip6gre, IPv6 payload length 0
        C.eth(0x0800) + C.ipv4(0, proto=4, tot_len=0) + v4_big,  # IP-in-IP
        C.eth(0x86DD) + C.ipv6(0, 41) + v6_jumbo,  # IPv6-in-IPv6
    ]
    frames = [(h, len(h) + P) for h in heads]
    esp = C.eth(0x0800) + C.ipv4(0, proto=50, tot_len=0) + b"\x00" * 16
    return frames + [(esp, len(esp) + 1000)]


def test_vxlan_super_packet_udp_length_mod_2_16(tmp_path):
    """A VXLAN super-packet past 64 KiB (outer IPv4 total length 0) carries its UDP length modulo 2**16, as the
    kernel writes it: not a bad UDP length, and the inner BIG TCP packet is whole: its TCP length is what tshark
    reads in the inner Jumbo Payload option less the HBH and TCP headers. (tshark bounds the inner packet by the UDP length
    field and so shows a TCP length 2**16 short.)"""
    t = C.tcp()
    inner = C.eth(0x86DD) + C.ipv6(0, 0) + C.hbh(6, C.jumbo_opt(8 + len(t) + P)) + t
    udp_len = 8 + 8 + len(inner) + P
    head = (C.eth(0x0800) + C.ipv4(0, proto=17, tot_len=0) + struct.pack("!HHHH", 40000, 4789, udp_len & 0xFFFF, 0)
            + struct.pack("!II", 0x08000000, 42 << 8) + inner)
    cap = write_pcap(tmp_path / "vx.pcap", [(head, len(head) + P)], snaplen=256)
    ts = tshark_fields(cap, ["ipv6.opt.jumbo", "tcp.hdr_len", "tcp.len"])
    want = [int(r["ipv6.opt.jumbo"]) - 8 - int(r["tcp.hdr_len"]) for r in ts]  # (less the 8-byte HBH header)
    res = analyze(cap, outdir=tmp_path / "o", audit=False, packets=True)
    assert want == [P] and res.packets.tcp_payload_len.tolist() == want
    assert [int(r["tcp.len"]) for r in ts] == [P % 2**16]
    assert res.findings.empty  # (no udp.bad_length: the column describes the innermost packet, TCP here)


def test_tunnel_with_outer_length_0_matches_tshark(tmp_path):
    cap = write_pcap(tmp_path / "len0.pcap", _frames(), snaplen=256)
    want = [int(r["tcp.len"]) if r["tcp.len"] else None for r in tshark_fields(cap, ["tcp.len"])]
    assert want == [P, P, P, P, None]
    res = analyze(cap, outdir=tmp_path / "o", audit=False, packets=True)
    got = [None if v is None else int(v) for v in res.packets.tcp_payload_len.astype(object).where(
        res.packets.tcp_payload_len.notna(), None)]
    assert got == want
    f = res.findings
    assert f.frame.tolist() == [5] and f.code.tolist() == ["ipv4.totlen0.not_tcp_udp"]
