"""ICMP errors about a packet too big for a hop (decode/kernel.py ``_icmp_too_big``), checked against tshark.

A Linux router forwarding IPv6 BIG TCP made by GRO answered each HBH-Jumbo super-packet with an ICMPv6 Packet
Too Big (kernel capture tests/fixtures/kernel/any/router_v46.pcap, Linux 6.18): the finding names the MTU and
says the quoted packet was a BIG TCP one. Crafted frames cover the other cases: ICMPv4 Fragmentation Needed
quoting an IPv4 TCP packet with total length 0 (BIG TCP) and with a true length, an ICMPv6 Packet Too Big
quoting an ordinary IPv6 packet, and ICMP messages that are not about size.
"""

from __future__ import annotations

import json
import struct
import subprocess

import craft as C
from oracle import KERNEL, need_tshark, write_pcap

from bigtcp_pcap.api import analyze

TOO_BIG = "(icmpv6.type == 2) || (icmp.type == 3 && icmp.code == 4)"


def _walk(d: dict, fields: dict[str, list]) -> None:
    """The fields we read, in dissection order (outer header first, then the quoted one)."""
    for k, v in d.items():
        if isinstance(v, dict):
            _walk(v, fields)
        elif k in ("frame.number", "icmpv6.mtu", "icmp.mtu", "ipv6.plen_raw", "ip.len_raw", "ip.proto_raw"):
            fields.setdefault(k, []).append(v)


def _tshark(cap) -> dict[int, tuple[int, bool]]:
    """frame -> (MTU, the quoted packet is BIG TCP: its IPv6 payload length field, or its IPv4 total length field
    with protocol TCP, is 0). The quoted header's fields as tshark found their bytes (``-T json -x``: tshark shows a
    quoted IPv4 total length of 0 as the length it presumes)."""
    out = {}
    cmd = [need_tshark(), "-r", str(cap), "-Y", TOO_BIG, "-T", "json", "-x"]
    for pkt in json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout):
        fields: dict[str, list] = {}
        _walk(pkt["_source"]["layers"], fields)
        mtu = int((fields.get("icmpv6.mtu") or fields.get("icmp.mtu"))[0])
        if "icmpv6.mtu" in fields:
            plens = fields.get("ipv6.plen_raw", [])
            big = len(plens) > 1 and int(plens[1][0], 16) == 0  # the second IPv6 header: the quoted one
        else:
            lens, protos = fields.get("ip.len_raw", []), fields.get("ip.proto_raw", [])
            big = len(lens) > 1 and int(lens[1][0], 16) == 0 and int(protos[1][0], 16) in (6, 17)
        out[int(fields["frame.number"][0])] = (mtu, big)
    return out


def _ours(res) -> dict[int, tuple[int, bool]]:
    f = res.findings
    f = f[f.code.str.startswith("icmp.too_big")]
    return {int(r.frame): (int(r.message.split("MTU ")[1].split(")")[0]),
                           r.code == "icmp.too_big.bigtcp") for r in f.itertuples()}


def test_router_answers_bigtcp_with_packet_too_big(tmp_path):
    cap = KERNEL / "any" / "router_v46.pcap"
    want = _tshark(cap)
    assert len(want) == 9 and all(big and mtu == 1500 for mtu, big in want.values())
    res = analyze(cap, outdir=tmp_path / "o", audit=False)
    assert _ours(res) == want
    assert res.summary["findings"]["icmp.too_big.bigtcp"] == 9


def _icmp4(typ: int, code: int, rest: bytes, quoted: bytes) -> bytes:
    body = struct.pack("!BBH", typ, code, 0) + rest + quoted
    return C.eth(0x0800) + C.ipv4(len(body), proto=1) + body


def _icmp6(typ: int, rest: bytes, quoted: bytes) -> bytes:
    body = struct.pack("!BBH", typ, 0, 0) + rest + quoted
    return C.eth(0x86DD) + C.ipv6(len(body), 58) + body


def test_crafted_too_big_messages_match_tshark(tmp_path):
    seg = C.tcp() + b"x" * 40
    frames = [
        _icmp4(3, 4, struct.pack("!HH", 0, 1400), C.ipv4(len(seg), tot_len=0) + seg),  # BIG TCP IPv4 quoted
        _icmp4(3, 4, struct.pack("!HH", 0, 1280), C.ipv4(len(seg)) + seg),  # an ordinary packet
        _icmp4(3, 1, struct.pack("!HH", 0, 0), C.ipv4(len(seg)) + seg),  # host unreachable: not about size
        _icmp6(2, struct.pack("!I", 1480), C.ipv6(len(seg), 6) + seg),  # IPv6, ordinary
        _icmp6(2, struct.pack("!I", 9000), C.ipv6(0, 0) + C.hbh(6, C.jumbo_opt(70000)) + seg),  # HBH Jumbo
        _icmp6(1, struct.pack("!I", 0), C.ipv6(len(seg), 6) + seg),  # destination unreachable
        # an IPv4 length that ends after the ICMP header, a trailer that looks like a quoted BIG TCP header: not
        # a quoted header (tshark: no quoted packet), so a plain too-big note
        _icmp4(3, 4, struct.pack("!HH", 0, 1400), b"") + C.ipv4(len(seg), tot_len=0) + seg,
    ]
    cap = write_pcap(tmp_path / "icmp.pcap", frames)
    want = _tshark(cap)
    assert want == {1: (1400, True), 2: (1280, False), 4: (1480, False), 5: (9000, True), 7: (1400, False)}
    assert _ours(analyze(cap, outdir=tmp_path / "o", audit=False)) == want
