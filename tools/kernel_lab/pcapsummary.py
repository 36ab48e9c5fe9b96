"""A stdlib-only classic pcap reader and the capture summary written into each scenario's JSON.

``summarize_pcap`` decodes every frame down to TCP (Ethernet with stacked VLAN tags, LINUX_SLL/SLL2, RAW,
NULL/LOOP; one level of VXLAN/Geneve followed into the inner frame) and reports, per data flow, the segment-count
histogram, the largest frame and IP packet, the BIG TCP markers (HBH jumbo, IPv4 tot_len 0), sequence holes and
retransmissions and the bursts of back-to-back packets. It is independent of the bigtcp_pcap package on purpose:
the tests compare the two (and both with tshark).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import socket
import struct
from collections import Counter
from collections.abc import Iterator
from typing import Any

from .scenarios import GENEVE_PORT, LINKTYPE_NAMES, VXLAN_PORT

BURST_GAP_S = 20e-6  # gro-spec 7.1 poll_gap_us


PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1e-6),
    b"\xa1\xb2\xc3\xd4": (">", 1e-6),
    b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
    b"\xa1\xb2\x3c\x4d": (">", 1e-9),
}


def pcap_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The global header of a classic pcap file: byte order, timestamp unit, snaplen, linktype."""
    with open(path, "rb") as f:
        hdr = f.read(24)
    if len(hdr) < 24 or hdr[:4] not in PCAP_MAGICS:
        raise ValueError(f"{path}: not a classic pcap file")
    endian, frac = PCAP_MAGICS[hdr[:4]]
    snaplen, linktype = struct.unpack(endian + "II", hdr[16:24])
    return {"endian": endian, "frac": frac, "snaplen": snaplen, "linktype": linktype}


def read_pcap(
    path: str | os.PathLike[str], linktypes: tuple[int, ...] | None = (1,)
) -> Iterator[tuple[float, int, bytes]]:
    """Yield ``(ts_seconds_float, orig_len, data)`` for each record of a classic pcap file.

    Raises ValueError unless the file's linktype is in ``linktypes`` (None: any; see pcap_header()).
    """
    h0 = pcap_header(path)
    endian, frac, linktype = h0["endian"], h0["frac"], h0["linktype"]
    if linktypes is not None and linktype not in linktypes:
        raise ValueError(f"{path}: linktype {linktype}, expected {' or '.join(map(str, linktypes))}")
    with open(path, "rb") as f:
        f.seek(24)
        rec = struct.Struct(endian + "IIII")
        while True:
            h = f.read(16)
            if len(h) < 16:
                return
            sec, sub, incl, orig = rec.unpack(h)
            yield sec + sub * frac, orig, f.read(incl)


@dataclasses.dataclass
class TcpPacket:
    """The fields of one captured TCP/IP frame that the summaries need."""

    ts: float
    frame_len: int
    family: int
    src: str
    dst: str
    sport: int
    dport: int
    seq: int
    flags: int
    payload: int  # TCP payload length derived from the IP length fields (or frame length)
    l3_len: int  # IP packet length (IPv6: 40 + payload incl. extension headers)
    mss_opt: int | None
    hbh_jumbo: int | None  # RFC 2675 jumbo payload length, if an HBH jumbo option is present
    ipv4_totlen0: bool
    ipv6_plen0: bool
    syn_ts_opt: bool = False  # a SYN carrying the timestamp option (data segments then carry 12 option bytes)
    tunnel: str | None = None  # "vxlan" / "geneve": the TCP fields are the inner frame's
    vlans: tuple[int, ...] = ()  # VLAN ids of the (outer) link header, outermost first
    linktype: int = 1


def _ether_payload(d: bytes, off: int) -> tuple[int, int, tuple[int, ...]]:
    """(L3 offset, ethertype, VLAN ids) of the Ethernet header at ``off``, 802.1Q/802.1ad tags skipped."""
    etype = struct.unpack_from("!H", d, off + 12)[0]
    off += 14
    vlans = []
    while etype in (0x8100, 0x88A8):
        vlans.append(struct.unpack_from("!H", d, off)[0] & 0xFFF)
        etype = struct.unpack_from("!H", d, off + 2)[0]
        off += 4
    return off, etype, tuple(vlans)


def _link_payload(d: bytes, linktype: int) -> tuple[int, int, tuple[int, ...]] | None:
    """(L3 offset, ethertype, VLAN ids) after the link header of ``linktype``; None if not IPv4/IPv6."""
    if linktype == 1:
        return _ether_payload(d, 0)
    if linktype == 113:  # LINUX_SLL: 16 bytes, protocol at 14
        return 16, struct.unpack_from("!H", d, 14)[0], ()
    if linktype == 276:  # LINUX_SLL2: 20 bytes, protocol at 0
        return 20, struct.unpack_from("!H", d, 0)[0], ()
    if linktype in (12, 101):  # RAW: the IP version nibble says which
        ver = d[0] >> 4 if d else 0
        return 0, {4: 0x0800, 6: 0x86DD}.get(ver, -1), ()
    if linktype in (0, 108):  # NULL (host order) / LOOP (network order) 4-byte address family
        le, be = struct.unpack_from("<I", d, 0)[0], struct.unpack_from(">I", d, 0)[0]
        fam = be if linktype == 108 else (le if le < 256 else be)
        return 4, 0x0800 if fam == 2 else (0x86DD if fam in (10, 24, 28, 30) else -1), ()
    return None


def parse_frame(ts: float, orig: int, d: bytes, linktype: int = 1) -> TcpPacket | None:
    """Decode a captured frame down to TCP (snaplen-truncated is fine); None if not TCP.

    ``linktype``: Ethernet (stacked 802.1Q/802.1ad tags skipped), LINUX_SLL, LINUX_SLL2, RAW, NULL or LOOP.
    A VXLAN (UDP 4789) or Geneve (UDP 6081) datagram is followed into its inner frame; the TCP fields are
    then the inner ones, ``tunnel`` names the tunnel and ``frame_len`` stays the outer frame's length.
    """
    link = _link_payload(d, linktype)
    if link is None:
        return None
    off, etype, vlans = link
    pkt = _parse_ip(ts, orig, d, off, etype, orig, None)
    if pkt is not None:
        pkt.vlans, pkt.linktype = vlans, linktype
    return pkt


def _parse_ip(
    ts: float, orig: int, d: bytes, off: int, etype: int, wire_end: int, tunnel: str | None
) -> TcpPacket | None:
    """The IP/TCP part of parse_frame(); ``wire_end``: where this layer ends on the wire (offset in ``d``)."""
    jumbo, tl0, pl0 = None, False, False
    if etype == 0x0800:
        ihl = (d[off] & 0x0F) * 4
        totlen = struct.unpack_from("!H", d, off + 2)[0]
        proto = d[off + 9]
        if proto != 6 and not (proto == 17 and tunnel is None):
            return None
        src, dst = (
            socket.inet_ntop(socket.AF_INET, d[off + 12 : off + 16]),
            socket.inet_ntop(socket.AF_INET, d[off + 16 : off + 20]),
        )
        tl0 = totlen == 0
        l3 = totlen if totlen else wire_end - off
        tcp = off + ihl
        fam = 4
    elif etype == 0x86DD:
        plen = struct.unpack_from("!H", d, off + 4)[0]
        nh = d[off + 6]
        src = socket.inet_ntop(socket.AF_INET6, d[off + 8 : off + 24])
        dst = socket.inet_ntop(socket.AF_INET6, d[off + 24 : off + 40])
        p = off + 40
        while nh in (0, 43, 60):  # HBH, routing, destination options
            enh, elen = d[p], (d[p + 1] + 1) * 8
            if nh == 0:
                q = p + 2
                while q < p + elen:
                    if d[q] == 0:  # Pad1
                        q += 1
                        continue
                    if d[q] == 0xC2 and d[q + 1] == 4:
                        jumbo = struct.unpack_from("!I", d, q + 2)[0]
                    q += 2 + d[q + 1]
            nh, p = enh, p + elen
        proto = nh
        if proto != 6 and not (proto == 17 and tunnel is None):
            return None
        pl0 = plen == 0
        l3 = 40 + (plen if plen else (jumbo if jumbo is not None else wire_end - off - 40))
        tcp = p
        fam = 6
    else:
        return None
    if proto == 17:  # UDP: follow a VXLAN / Geneve tunnel into its inner frame (one level)
        _sport, dport, ulen = struct.unpack_from("!HHH", d, tcp)
        ulen = ulen or l3 - (tcp - off)
        u = tcp + 8
        if dport == VXLAN_PORT:
            inner_off, inner_etype, _ = _ether_payload(d, u + 8)
            kind = "vxlan"
        elif dport == GENEVE_PORT:
            g = u + 8 + (d[u] & 0x3F) * 4
            ptype = struct.unpack_from("!H", d, u + 2)[0]
            inner_off, inner_etype, _ = _ether_payload(d, g) if ptype == 0x6558 else (g, ptype, ())
            kind = "geneve"
        else:
            return None
        inner = _parse_ip(ts, orig, d, inner_off, inner_etype, tcp + ulen, kind)
        if inner is not None:
            inner.tunnel = kind
        return inner
    sport, dport, seq = struct.unpack_from("!HHI", d, tcp)
    doff = (d[tcp + 12] >> 4) * 4
    flags = d[tcp + 13]
    mss, syn_ts = None, False
    if flags & 0x02:  # SYN: look for the MSS and timestamp options
        q = tcp + 20
        while q < min(tcp + doff, len(d)):
            kind = d[q]
            if kind == 0:
                break
            if kind == 1:
                q += 1
                continue
            if kind == 2 and q + 4 <= len(d):
                mss = struct.unpack_from("!H", d, q + 2)[0]
            if kind == 8:
                syn_ts = True
            q += max(d[q + 1], 2)
    payload = l3 - (tcp - off) - doff
    return TcpPacket(ts, orig, fam, src, dst, sport, dport, seq, flags, payload, l3, mss, jumbo, tl0, pl0, syn_ts,
                     tunnel)


def mss_from_syn(pkts: list[TcpPacket]) -> dict[int, int]:
    """family -> data-segment MSS from the SYNs: smallest MSS option, minus 12 when the SYN has timestamps."""
    out: dict[int, int] = {}
    for p in pkts:
        if p.mss_opt:
            m = p.mss_opt - (12 if p.syn_ts_opt else 0)
            out[p.family] = min(out.get(p.family, m), m)
    return out


def summarize_pcap(path: str | os.PathLike[str], mss: dict[int, int] | None = None) -> dict[str, Any]:
    """Summarise a capture: per data flow, segment-count histogram, largest frame, BIG TCP markers.

    ``mss`` maps family -> MSS used for the segment count (``ceil(payload / mss)``); by default the
    largest payload seen for that family in this capture (right for a sender-side capture).
    """
    lt = pcap_header(path)["linktype"]
    pkts = [p for r in read_pcap(path, None) if (p := parse_frame(*r, lt)) is not None]
    flows: dict[tuple[str, int, str, int], list[TcpPacket]] = {}
    for p in pkts:
        flows.setdefault((p.src, p.sport, p.dst, p.dport), []).append(p)
    out: dict[str, Any] = {
        "packets": sum(1 for _ in read_pcap(path, None)),
        "linktype": lt,
        "linktype_name": LINKTYPE_NAMES.get(lt, "?"),
        "tcp_packets": len(pkts),
        "tunneled_tcp_packets": dict(Counter(p.tunnel for p in pkts if p.tunnel)),
        "vlan_tagged_tcp_packets": {
            "/".join(map(str, k)): v for k, v in Counter(p.vlans for p in pkts if p.vlans).items()
        },
        "largest_frame": max((p.frame_len for p in pkts), default=0),
        "ipv6_hbh_jumbo": sum(p.hbh_jumbo is not None for p in pkts),
        "ipv6_payload_len_0": sum(p.ipv6_plen0 for p in pkts),
        "ipv4_tot_len_0": sum(p.ipv4_totlen0 for p in pkts),
        "l3_over_65535": sum(p.l3_len > 65535 for p in pkts),
        "syn_mss_options": sorted({p.mss_opt for p in pkts if p.mss_opt}),
        "mss_from_syn": mss_from_syn(pkts),
        "flows": [],
    }
    for (src, sport, dst, dport), fp in flows.items():
        data = [p for p in fp if p.payload > 0]
        total = sum(p.payload for p in data)
        if total < 100_000:  # iperf3 control connection / ACK directions
            continue
        fam = fp[0].family
        m = (mss or {}).get(fam) or max(p.payload for p in data)
        hist = Counter(math.ceil(p.payload / m) for p in data)
        high, retrans, holes = None, 0, 0
        for p in data:
            end = (p.seq + p.payload) & 0xFFFFFFFF
            if high is not None and ((end - high) & 0xFFFFFFFF) >= 0x80000000:
                retrans += 1
                continue
            if high is not None and p.seq != high:
                holes += 1
            high = end
        bursts, cur = Counter(), 1  # runs of data packets closer than BURST_GAP_S (gro-spec 7.1)
        for a, b in itertools.pairwise(data):
            if b.ts - a.ts > BURST_GAP_S:
                bursts[cur] += 1
                cur = 1
            else:
                cur += 1
        bursts[cur] += 1
        rst = [q for q in flows.get((dst, dport, src, sport), []) if q.flags & 0x04]
        out["flows"].append(
            {
                "flow": f"{src}.{sport} > {dst}.{dport}",
                "family": fam,
                "data_packets": len(data),
                "payload_bytes": total,
                "mss_for_segment_count": m,
                "max_payload": max(p.payload for p in data),
                "packets_payload_gt_mss": sum(p.payload > m for p in data),
                "segments_histogram": {str(k): v for k, v in sorted(hist.items())},
                "max_segments": max(hist),
                "largest_frame": max(p.frame_len for p in data),
                "largest_l3": max(p.l3_len for p in data),  # the inner IP packet for tunneled flows
                "hbh_jumbo": sum(p.hbh_jumbo is not None for p in data),
                "ipv4_tot_len_0": sum(p.ipv4_totlen0 for p in data),
                "out_of_order_or_retransmitted": retrans,
                "sequence_holes": holes,
                "bursts_gap_20us_histogram": {str(k): v for k, v in sorted(bursts.items())},
                "reverse_direction_rst": len(rst),
            }
        )
    return out
