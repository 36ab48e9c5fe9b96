"""Hand-built frames for rule tests: Ethernet / IPv4 / IPv6 (+ extension headers) / TCP, built with struct."""

from __future__ import annotations

import struct

MAC = bytes.fromhex("020000000002") + bytes.fromhex("020000000001")
SRC6 = bytes.fromhex("fd00b100000000000000000000000001")
DST6 = bytes.fromhex("fd00b100000000000000000000000002")


def tcp(sport=40000, dport=5201, seq=1000, ack=1, flags=0x10, win=500, options=b"") -> bytes:
    options += b"\x00" * (-len(options) % 4)
    doff = (20 + len(options)) // 4
    return struct.pack(">HHIIBBHHH", sport, dport, seq, ack, doff << 4, flags, win, 0, 0) + options


def eth(ethertype: int) -> bytes:
    return MAC + struct.pack(">H", ethertype)


def ipv4(payload_len: int, proto=6, tot_len=None, ident=1, ttl=64, df=True) -> bytes:
    tl = 20 + payload_len if tot_len is None else tot_len
    return struct.pack(">BBHHHBBH4s4s", 0x45, 0, tl, ident, 0x4000 if df else 0, ttl, proto, 0,
                       bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]))


def ipv6(plen: int, nh: int, hlim=64, flow=0x12345) -> bytes:
    return struct.pack(">IHBB", (6 << 28) | flow, plen, nh, hlim) + SRC6 + DST6


def hbh(nh: int, options: bytes) -> bytes:
    """A Hop-by-Hop or Destination Options header; options are padded with PadN to a multiple of 8."""
    body = options
    pad = -(2 + len(body)) % 8
    if pad == 1:
        body += b"\x00"
    elif pad:
        body += bytes([1, pad - 2]) + b"\x00" * (pad - 2)
    return bytes([nh, (2 + len(body)) // 8 - 1]) + body


def jumbo_opt(value: int) -> bytes:
    return struct.pack(">BBI", 0xC2, 4, value)


def frag(nh: int, offset=0, more=False, ident=7) -> bytes:
    return struct.pack(">BBHI", nh, 0, (offset << 3) | int(more), ident)
