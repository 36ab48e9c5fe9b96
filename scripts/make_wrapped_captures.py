#!/usr/bin/env python3
"""Wrap kernel-made Ethernet frames in the link types and encapsulations this kernel cannot capture.

    .venv/bin/python scripts/make_wrapped_captures.py [--source tests/fixtures/kernel/mixed_185000.rcv.pcap]
                                                      [--out tests/fixtures/wrapped]

The VM's kernel has no PPP, GRE, ERSPAN, IPIP/SIT, MPLS routing or 802.11 devices, so these captures are made
from frames the kernel did make: the BIG TCP receiver capture ``mixed_185000.rcv.pcap`` (IPv6 HBH jumbo and
IPv4 ``tot_len`` 0 super-packets beside ordinary segments). The transform is fixed and documented here:

* a selection of the source frames (the first 30, the first 10 IPv6 jumbograms, the first 10 IPv4 ``tot_len``
  0 frames), their bytes as captured (snaplen 96) and their original lengths;
* each frame's Ethernet header is replaced by, or the whole frame put inside, the headers of one link type or
  encapsulation; the record keeps every captured byte and its original length grows by the bytes added, so
  every length field of an added header is computed from the original (wire) length;
* frames whose wrapped length does not fit a 16-bit outer length (IP tunnels, PPPoE) or an 802.3 length
  (LLC/SNAP) are left out of that file: a kernel would not send them that way either.

tshark is the oracle for every file (tests/test_encap_oracle.py). Addresses: 192.0.2.0/24 and 2001:db8::/32
(documentation ranges) for the outer headers, locally administered MACs.
"""

from __future__ import annotations

import argparse
import struct
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "kernel" / "mixed_185000.rcv.pcap"
OUT = ROOT / "tests" / "fixtures" / "wrapped"
SNAPLEN = 256
MAC_A, MAC_B = bytes.fromhex("02000000000a"), bytes.fromhex("02000000000b")
V4_A, V4_B = bytes([192, 0, 2, 1]), bytes([192, 0, 2, 2])
V6_A = bytes.fromhex("20010db8000000000000000000000001")
V6_B = bytes.fromhex("20010db8000000000000000000000002")

Frame = tuple[bytes, int]  # captured bytes, original length


def read_pcap(path: Path) -> list[Frame]:
    raw = path.read_bytes()
    out, p = [], 24
    while p + 16 <= len(raw):
        _, _, incl, orig = struct.unpack("<IIII", raw[p:p + 16])
        out.append((raw[p + 16:p + 16 + incl], orig))
        p += 16 + incl
    return out


def write_pcap(path: Path, frames: list[Frame], linktype: int) -> None:
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, SNAPLEN, linktype)]
    for i, (data, orig) in enumerate(frames):
        out.append(struct.pack("<IIII", 1_700_000_000, 1000 * i, len(data), orig) + data)
    path.write_bytes(b"".join(out))


def select(frames: list[Frame]) -> list[Frame]:
    """The first 30 frames, the first 10 IPv6 jumbograms and the first 10 IPv4 tot_len-0 frames."""
    keep = list(range(min(30, len(frames))))
    jumbo = [i for i, (d, _) in enumerate(frames) if d[12:14] == b"\x86\xdd" and d[20] == 0 and d[18:20] == b"\0\0"]
    v4big = [i for i, (d, _) in enumerate(frames) if d[12:14] == b"\x08\x00" and d[16:18] == b"\0\0"]
    for i in jumbo[:10] + v4big[:10]:
        if i not in keep:
            keep.append(i)
    return [frames[i] for i in sorted(keep)]


def ip_of(frame: Frame) -> tuple[int, bytes, int] | None:
    """(ethertype, IP bytes, IP original length) of an untagged IPv4/IPv6 Ethernet frame."""
    data, orig = frame
    et = struct.unpack(">H", data[12:14])[0]
    return (et, data[14:], orig - 14) if et in (0x0800, 0x86DD) else None


def ppp_proto(et: int) -> int:
    return 0x0021 if et == 0x0800 else 0x0057


def ipv4_hdr(payload_len: int, proto: int) -> bytes:
    h = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + payload_len, 0x1234, 0x4000, 64, proto, 0, V4_A, V4_B)
    s = sum(struct.unpack(">10H", h))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return h[:10] + struct.pack(">H", ~s & 0xFFFF) + h[12:]


def ipv6_hdr(payload_len: int, nh: int) -> bytes:
    return struct.pack(">IHBB", 6 << 28, payload_len, nh, 64) + V6_A + V6_B


def eth(et: int) -> bytes:
    return MAC_B + MAC_A + struct.pack(">H", et)


# ---- wrappers: Frame -> (prefix bytes, or None to leave the frame out); IP-level ones take the IP packet -------

def l2(fn: Callable[[int, int], bytes]) -> Callable[[Frame, int], Frame | None]:
    """A wrapper that replaces the Ethernet header by fn(ethertype, frame index)."""
    def wrap(frame: Frame, k: int) -> Frame | None:
        ip = ip_of(frame)
        if ip is None:
            return None
        et, data, orig = ip
        pre = fn(et, k)
        return pre + data, len(pre) + orig
    return wrap


def whole(fn: Callable[[int, int], bytes]) -> Callable[[Frame, int], Frame | None]:
    """A wrapper that puts the whole Ethernet frame behind fn(original length, frame index)."""
    def wrap(frame: Frame, k: int) -> Frame | None:
        data, orig = frame
        pre = fn(orig, k)
        return pre + data, len(pre) + orig
    return wrap


def tunnel(outer: int, build: Callable[[int, bytes, int, int], bytes | None]) -> Callable[[Frame, int], Frame | None]:
    """Ethernet + outer IPv4/IPv6 (protocol from build) around build(ethertype, frame, length, k) bytes."""
    def wrap(frame: Frame, k: int) -> Frame | None:
        ip = ip_of(frame)
        if ip is None:
            return None
        et, _, _ = ip
        res = build(et, frame[0], frame[1], k)
        if res is None:
            return None
        proto, hdr, inner_len, inner = res
        plen = len(hdr) + inner_len
        if plen + 40 > 65535:
            return None
        oh = ipv4_hdr(plen, proto) if outer == 4 else ipv6_hdr(plen, proto)
        pre = eth(0x0800 if outer == 4 else 0x86DD) + oh + hdr
        return pre + inner, len(pre) + inner_len
    return wrap


def _inner_ip(frame: bytes, orig: int) -> tuple[bytes, int]:
    return frame[14:], orig - 14


def gre(et_field: int | None = None, flags: int = 0, extra: Callable[[int], bytes] | None = None,
        teb: bool = False):
    def build(et, data, orig, k):
        inner, ilen = (data, orig) if teb else _inner_ip(data, orig)
        pt = 0x6558 if teb else (et_field or et)
        hdr = struct.pack(">HH", flags, pt)
        if flags & 0x2000:
            hdr += struct.pack(">I", 0x01020304)
        if flags & 0x1000:
            hdr += struct.pack(">I", k)
        if extra:
            hdr += extra(k)
        return 47, hdr, ilen, inner
    return build


def erspan(version: int, subheader: bool = False):
    def build(et, data, orig, k):
        if version == 1:  # type I: GRE without a sequence number, Ethernet at once
            return 47, struct.pack(">HH", 0, 0x88BE), orig, data
        if version == 2:  # type II: sequence number, 8-byte header (ver 1, vlan 0, session 5, index 0)
            hdr = struct.pack(">HHI", 0x1000, 0x88BE, k) + struct.pack(">HHI", 0x1000, 5, 0)
            return 47, hdr, orig, data
        # type III: ver 2, session 6, timestamp, sgt 0, ft 0 (Ethernet), hw id 1, gra 0, O bit
        w2 = (0 << 16) | (0 << 15) | (0 << 10) | (1 << 4) | (1 if subheader else 0)
        hdr = struct.pack(">HHI", 0x1000, 0x22EB, k) + struct.pack(">HHII", 0x2000, 6, k * 1000, w2)
        if subheader:
            hdr += struct.pack(">II", 0x00000001, 0)  # platform-specific subheader, platform id 0
        return 47, hdr, orig, data
    return build


def ipip(inner_ver: int):
    def build(et, data, orig, k):
        if (et == 0x0800) != (inner_ver == 4):
            return None
        inner, ilen = _inner_ip(data, orig)
        return (4 if inner_ver == 4 else 41), b"", ilen, inner
    return build


def pppoe_wrap(frame: Frame, k: int) -> Frame | None:
    ip = ip_of(frame)
    if ip is None:
        return None
    et, data, orig = ip
    if orig + 2 > 65535:
        return None
    pre = eth(0x8864) + struct.pack(">BBHHH", 0x11, 0, 0x0042, orig + 2, ppp_proto(et))
    return pre + data, len(pre) + orig


def llc_snap_wrap(frame: Frame, k: int) -> Frame | None:
    """802.3 (a length, not an ethertype) with LLC/SNAP; only frames an 802.3 length can describe (<= 1500)."""
    ip = ip_of(frame)
    if ip is None or ip[2] + 8 > 1500:
        return None
    et, data, orig = ip
    pre = MAC_B + MAC_A + struct.pack(">H", orig + 8) + b"\xaa\xaa\x03\x00\x00\x00" + struct.pack(">H", et)
    return pre + data, len(pre) + orig


def dot11(et: int, k: int, qos: bool) -> bytes:
    """An unprotected 802.11 data frame header (ToDS, or QoS data on odd frames) and LLC/SNAP."""
    fc0 = 0x88 if qos else 0x08
    hdr = struct.pack("<BBH", fc0, 0x01, 0) + MAC_B + MAC_A + MAC_B + struct.pack("<H", (k & 0xFFF) << 4)
    if qos:
        hdr += struct.pack("<H", 0)
    return hdr + b"\xaa\xaa\x03\x00\x00\x00" + struct.pack(">H", et)


def radiotap(k: int) -> bytes:
    """Radiotap with TSFT and Flags present (Flags after the 8-aligned TSFT: the alignment rule is exercised)."""
    return struct.pack("<BBHI", 0, 0, 17, 0x00000003) + struct.pack("<Q", k) + b"\x00"


def pktap(k: int) -> bytes:
    """A 108-byte PKTAP header: length, record type 1 (packet), DLT 1 (Ethernet), interface name en0."""
    h = struct.pack("<III", 108, 1, 1) + b"en0".ljust(24, b"\0") + struct.pack("<IIII", 0, 2, 0, 0)
    h += struct.pack("<I", 100 + k) + b"iperf3".ljust(20, b"\0") + struct.pack("<IHHI", 0, 6, 0, 0) + b"".ljust(20, b"\0")
    assert len(h) == 108
    return h


def ipoib(et: int, k: int) -> bytes:
    """LINKTYPE_IPOIB: 20 bytes of source/pseudo header, the 20-byte destination address, type, reserved."""
    return b"\0" * 20 + struct.pack(">I", 0x00000550) + bytes.fromhex("fe80000000000000001000010000abcd") \
        + struct.pack(">HH", et, 0)


WRAPS: dict[str, tuple[int, Callable[[Frame, int], Frame | None]]] = {
    "ppp.pcap": (9, l2(lambda et, k: (b"\xff\x03" if k % 2 == 0 else b"") + struct.pack(">H", ppp_proto(et)))),
    "ppp_hdlc.pcap": (50, l2(lambda et, k: b"\xff\x03" + struct.pack(">H", ppp_proto(et)) if k % 2 == 0
                             else b"\x0f\x00" + struct.pack(">H", et))),
    "ppp_with_dir.pcap": (204, l2(lambda et, k: bytes([k % 2]) + b"\xff\x03" + struct.pack(">H", ppp_proto(et)))),
    "c_hdlc.pcap": (104, l2(lambda et, k: bytes([0x0F if k % 2 else 0x8F, 0]) + struct.pack(">H", et))),
    "fddi.pcap": (10, l2(lambda et, k: b"\x50" + MAC_B + MAC_A + b"\xaa\xaa\x03\x00\x00\x00" + struct.pack(">H", et))),
    "ieee802_11.pcap": (105, l2(lambda et, k: dot11(et, k, k % 2 == 1))),
    "radiotap.pcap": (127, l2(lambda et, k: radiotap(k) + dot11(et, k, k % 2 == 1))),
    "ppi.pcap": (192, l2(lambda et, k: struct.pack("<BBHI", 0, 0, 8, 105) + dot11(et, k, False))),
    "ipoib.pcap": (242, l2(ipoib)),
    "pktap.pcap": (258, whole(lambda orig, k: pktap(k))),
    "eth_llc_snap.pcap": (1, llc_snap_wrap),
    "mpls.pcap": (1, l2(lambda et, k: eth(0x8847) + struct.pack(">II", (100 << 12) | 64, (200 << 12) | 0x100 | 64))),
    "pppoe.pcap": (1, pppoe_wrap),
    "gre_ip.pcap": (1, tunnel(4, gre())),
    "gre_key_seq_ip.pcap": (1, tunnel(4, gre(flags=0x3000))),
    "gre_teb.pcap": (1, tunnel(6, gre(teb=True, flags=0x2000))),
    "erspan1.pcap": (1, tunnel(4, erspan(1))),
    "erspan2.pcap": (1, tunnel(4, erspan(2))),
    "erspan3.pcap": (1, tunnel(4, erspan(3, subheader=True))),
    "ipip.pcap": (1, tunnel(4, ipip(4))),
    "sit.pcap": (1, tunnel(4, ipip(6))),
    "ip6ip6.pcap": (1, tunnel(6, ipip(6))),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=SOURCE)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    frames = select(read_pcap(a.source))
    a.out.mkdir(parents=True, exist_ok=True)
    for name, (lt, fn) in WRAPS.items():
        wrapped = [w for k, f in enumerate(frames) if (w := fn(f, k)) is not None]
        write_pcap(a.out / name, wrapped, lt)
        print(f"{name:24s} linktype {lt:3d}  {len(wrapped)} frames")
    return 0


if __name__ == "__main__":
    sys.exit(main())
