"""The normalized copy of a frame: what the packet would look like without the BIG TCP / extension-header
encoding, so that a fixed-offset capture filter classifies it the way the user means.

Rules (ecosystem.md section 1, "Audit method"):

* IPv6: every extension header between the fixed header and L4 is removed (the Hop-by-Hop header carrying the
  RFC 2675 Jumbo Payload option, and any other: libpcap's ``tcp``/``port`` look at the fixed next-header byte,
  tshark walks the chain); the fixed header's next-header byte becomes the protocol reached at the end of the
  chain; payload_len becomes ``min(true payload, 65535)`` where true payload = true L3 length - 40 - ext bytes.
  The frame's original length shrinks by the bytes removed.
* IPv6 payload_len 0 without extension headers (the 2026 kernels' format): payload_len = min(true, 65535).
* IPv4 tot_len 0 (BIG TCP / TSO): tot_len = min(true L3 length, 65535). The header checksum is left as is
  (cBPF filters do not verify it; tcpdump shows the original as "bad cksum" anyway).
* The frame's original length (what ``len``/``less``/``greater`` test) stays the wire length: BIG TCP does not
  change how long the frame on the wire is, and removing an extension header is our rewrite, not the packet's.
* VXLAN/Geneve: the rules above apply to the inner IP header (the decoder's ``l3_off``), and the outer IPv4
  total length / IPv6 payload length and the outer UDP length are made consistent: 0 becomes the length the
  frame gives (at most 65535), and any other value shrinks by the inner extension-header bytes removed.

Not normalized (returned unchanged, and ``why_not`` says why): frames without IP, IP fragments (an IPv6 Fragment
header or IPv4 MF/offset: removing the header would make libpcap read a non-first fragment's data as ports),
tunnels whose outer header is not plain IPv4/IPv6 + UDP (an outer extension header), and frames whose
extension-header chain is cut by the snaplen.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .._native import njit
from ..decode.schema import (
    ST_IP_FRAGMENT,
    ST_NOT_IP,
    ST_TRUNC_L2,
    ST_TRUNC_L3,
    ST_UNKNOWN_LINKTYPE,
    TUNNEL_NONE,
    PacketBatch,
)

IPV6_HDR = 40
MAX_16 = 0xFFFF

# reasons a frame is left as captured
SKIP_NOT_IP = "not_ip"
SKIP_TUNNEL = "tunnel_not_normalized"
SKIP_FRAGMENT = "ip_fragment"
SKIP_TRUNCATED = "truncated_header"


@dataclass(frozen=True)
class L3Fields:
    """The decoded fields normalization needs (one frame's values of the PacketBatch columns of that name)."""

    l3_off: int
    ip_version: int
    ip_hdr_len: int  # IPv4 IHL*4, IPv6 40 + ext_len
    ext_len: int  # bytes of IPv6 extension headers
    l4_proto: int  # protocol at the end of the header chain
    ip_len: int  # true L3 length (jumbo option or wire length when the field is 0)
    status: int = 0
    tunnel: int = TUNNEL_NONE
    l2_len: int = 0  # the outer IP header's offset in a tunnel frame

    @classmethod
    def from_batch(cls, pb: PacketBatch, i: int) -> L3Fields:
        return cls(int(pb.l3_off[i]), int(pb.ip_version[i]), int(pb.ip_hdr_len[i]), int(pb.ext_len[i]),
                   int(pb.l4_proto[i]), int(pb.ip_len[i]), int(pb.status[i]), int(pb.tunnel[i]), int(pb.l2_len[i]))


def inner_ip(f: L3Fields) -> bool:
    """A tunnel frame whose decoded IP header is the inner one (VXLAN/Geneve around ARP, say, leaves the
    decoder's IP header at the outer one: then the frame is normalized as a plain one)."""
    return f.tunnel != TUNNEL_NONE and f.l3_off > f.l2_len


def outer_headers(data: bytes | memoryview, f: L3Fields) -> tuple[int, int] | None:
    """(outer IP version, offset of the outer UDP header) of a tunnel frame, None when the outer header is not
    plain IPv4 or IPv6 followed by UDP within the captured bytes."""
    o = f.l2_len
    if len(data) < o + 20:
        return None
    ver = data[o] >> 4
    if ver == 4:
        u = o + (data[o] & 0xF) * 4
        ok = data[o + 9] == 17
    elif ver == 6:
        u = o + IPV6_HDR
        ok = len(data) >= u and data[o + 6] == 17
    else:
        return None
    return (ver, u) if ok and len(data) >= u + 8 and u + 8 <= f.l3_off else None


def _outer_zero(data: bytes | memoryview, f: L3Fields) -> bool:
    """A tunnel frame whose outer IP or UDP length field is 0 (BIG TCP / GSO over the tunnel)."""
    oh = outer_headers(data, f)
    if oh is None:
        return False
    ver, u = oh
    o = f.l2_len + (2 if ver == 4 else 4)
    return data[o:o + 2] == b"\x00\x00" or data[u + 4:u + 6] == b"\x00\x00"


def why_not(f: L3Fields, data: bytes | memoryview) -> str | None:
    """Why this frame (its captured bytes) cannot be normalized (None when it can)."""
    caplen = len(data)
    if f.ip_version not in (4, 6) or f.l3_off < 0 or f.status & (ST_NOT_IP | ST_UNKNOWN_LINKTYPE | ST_TRUNC_L2):
        return SKIP_NOT_IP
    if inner_ip(f) and outer_headers(data, f) is None:
        return SKIP_TUNNEL
    if f.status & ST_IP_FRAGMENT:
        return SKIP_FRAGMENT
    if f.status & ST_TRUNC_L3 or caplen < f.l3_off + (f.ip_hdr_len if f.ip_version == 6 else 20):
        return SKIP_TRUNCATED
    return None


def needs_normalizing(f: L3Fields, data: bytes | memoryview) -> bool:
    """True when the normalized copy would differ from the frame (cheap test on the length fields)."""
    if inner_ip(f) and _outer_zero(data, f):
        return True
    if f.ip_version == 6:
        return f.ext_len > 0 or (data[f.l3_off + 4] == 0 and data[f.l3_off + 5] == 0 and f.ip_len > IPV6_HDR)
    if f.ip_version == 4:
        return data[f.l3_off + 2] == 0 and data[f.l3_off + 3] == 0
    return False


def normalize_frame(data: bytes | memoryview, wirelen: int, f: L3Fields) -> tuple[bytes, int]:
    """The normalized copy of one frame (``data`` is the captured bytes) and its new original length.

    The caller checks ``why_not`` first; a frame that cannot be normalized is returned unchanged.
    """
    data = bytes(data)
    if why_not(f, data) is not None:
        return data, wirelen
    o = f.l3_off
    e = f.ext_len if f.ip_version == 6 else 0
    if f.ip_version == 4:
        if data[o + 2:o + 4] == b"\x00\x00":
            data = data[:o + 2] + struct.pack("!H", min(f.ip_len, MAX_16)) + data[o + 4:]
    else:
        plen_field = struct.unpack_from("!H", data, o + 4)[0]
        if plen_field == 0:  # jumbogram (HBH) or BIG TCP without HBH: the true length comes from the decoder
            plen = min(f.ip_len - IPV6_HDR - e, MAX_16)
        else:
            plen = plen_field - e
        plen = max(plen, 0)
        head = data[o:o + 4] + struct.pack("!HB", plen, f.l4_proto if e else data[o + 6]) + data[o + 7:o + 40]
        data = data[:o] + head + data[o + IPV6_HDR + e:]
    if inner_ip(f):
        ver, u = outer_headers(data, f)
        ip_field = f.l2_len + (2 if ver == 4 else 4)
        for pos, total in ((ip_field, wirelen - f.l2_len - (0 if ver == 4 else IPV6_HDR)), (u + 4, wirelen - u)):
            v = struct.unpack_from("!H", data, pos)[0]
            v = min(total - e, MAX_16) if v == 0 else v - e
            data = data[:pos] + struct.pack("!H", max(v, 0)) + data[pos + 2:]
    return data, wirelen


# ---- the same rules for a whole batch (the audit's hot path); the functions above stay the reference -------
SKIP_ORDER = (SKIP_NOT_IP, SKIP_TUNNEL, SKIP_FRAGMENT, SKIP_TRUNCATED)


def outer_udp_batch(pb: PacketBatch, buf: np.ndarray, off: np.ndarray, caplen: np.ndarray,
                    rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``outer_headers`` for rows ``rows``: (outer IP version, outer UDP offset), version 0 when there is no
    plain outer IP + UDP header (or the frame is no tunnel)."""
    rows = np.asarray(rows, np.int64)
    n = rows.size
    ver_out, udp_out = np.zeros(n, np.int64), np.zeros(n, np.int64)
    t = np.flatnonzero((pb.tunnel[rows] != TUNNEL_NONE) & (pb.l3_off[rows].astype(np.int64) > pb.l2_len[rows]))
    if t.size == 0:
        return ver_out, udp_out
    r = rows[t]
    base = np.asarray(off, np.int64)[r]
    cap = np.asarray(caplen, np.int64)[r]
    o = pb.l2_len[r].astype(np.int64)
    l3 = pb.l3_off[r].astype(np.int64)
    have = cap >= o + 20
    at = (lambda k: np.where(have, buf[np.where(have, base + np.minimum(k, cap - 1), 0)], 0).astype(np.int64))
    b0 = at(o)
    ver = b0 >> 4
    u = np.where(ver == 4, o + (b0 & 0xF) * 4, o + IPV6_HDR)
    proto = np.where(ver == 4, at(o + 9), at(o + 6))
    ok = have & ((ver == 4) | (ver == 6)) & (proto == 17) & (cap >= u + 8) & (u + 8 <= l3)
    ver_out[t] = np.where(ok, ver, 0)
    udp_out[t] = np.where(ok, u, 0)
    return ver_out, udp_out


def why_not_batch(pb: PacketBatch, rows: np.ndarray, caplen: np.ndarray, outer_ver: np.ndarray) -> np.ndarray:
    """``why_not`` for rows ``rows`` of ``pb``: 0 when the frame can be normalized, else 1 + its index in
    SKIP_ORDER (the first reason that applies, in ``why_not``'s order). ``outer_ver``: from
    ``outer_udp_batch`` for the same rows."""
    ver, l3, st = pb.ip_version[rows], pb.l3_off[rows].astype(np.int64), pb.status[rows]
    hdr = np.where(ver == 6, pb.ip_hdr_len[rows].astype(np.int64), 20)
    conds = [((ver != 4) & (ver != 6)) | (l3 < 0) | ((st & (ST_NOT_IP | ST_UNKNOWN_LINKTYPE | ST_TRUNC_L2)) != 0),
             (pb.tunnel[rows] != TUNNEL_NONE) & (pb.l3_off[rows].astype(np.int64) > pb.l2_len[rows]) & (outer_ver == 0),
             (st & ST_IP_FRAGMENT) != 0,
             ((st & ST_TRUNC_L3) != 0) | (np.asarray(caplen, np.int64)[rows] < l3 + hdr)]
    return np.select(conds, np.arange(1, len(conds) + 1, dtype=np.int8), 0).astype(np.int8)


def plain_outer_batch(pb: PacketBatch, buf: np.ndarray, off: np.ndarray, cap: np.ndarray,
                      rows: np.ndarray) -> np.ndarray:
    """For tunnel rows: is the outer IP header plain (IPv4 with a non-zero total length, or IPv6 with a non-zero
    payload length and GRE, IPIP or IPv6 right after it)? Such a frame needs no normalizing when its inner packet
    needs none, whatever the tunnel (GRE, ERSPAN, IPIP, 6in4)."""
    rows = np.asarray(rows, np.int64)
    o = np.asarray(off, np.int64)[rows] + pb.l2_len[rows].astype(np.int64)
    room = np.asarray(cap, np.int64)[rows] - pb.l2_len[rows].astype(np.int64)
    ok = np.zeros(rows.size, bool)
    has = room >= 40
    v4 = np.zeros(rows.size, bool)
    v6 = np.zeros(rows.size, bool)
    h = o[room >= 20]
    v4[room >= 20] = (buf[h] >> 4) == 4
    v6[has] = (buf[o[has]] >> 4) == 6
    ok[v4] = (buf[o[v4] + 2] | buf[o[v4] + 3]) != 0
    ok[v6] = ((buf[o[v6] + 4] | buf[o[v6] + 5]) != 0) & np.isin(buf[o[v6] + 6], (4, 41, 47))
    return ok


def needs_normalizing_batch(pb: PacketBatch, rows: np.ndarray, buf: np.ndarray | None = None,
                            off: np.ndarray | None = None, outer_ver: np.ndarray | None = None,
                            outer_udp: np.ndarray | None = None) -> np.ndarray:
    """``needs_normalizing`` for rows ``rows`` (from the decoded length fields instead of the bytes; a tunnel
    frame's outer length fields are read from ``buf`` at the ``outer_udp_batch`` offsets)."""
    ver, field = pb.ip_version[rows], pb.ip_len_field[rows]
    v6 = (ver == 6) & ((pb.ext_len[rows] > 0) | ((field == 0) & (pb.ip_len[rows] > IPV6_HDR)))
    need = v6 | ((ver == 4) & (field == 0))
    if outer_ver is not None and (outer_ver != 0).any():
        t = np.flatnonzero(outer_ver != 0)
        base = np.asarray(off, np.int64)[np.asarray(rows, np.int64)[t]]
        o = pb.l2_len[np.asarray(rows, np.int64)[t]].astype(np.int64) + np.where(outer_ver[t] == 4, 2, 4)
        u = outer_udp[t] + 4
        zero = lambda p: (buf[base + p] == 0) & (buf[base + p + 1] == 0)
        need[t] |= zero(o) | zero(u)
    return need


@njit(cache=True, entry=True,
      sig=("u8[::1], i64[::1], i64[::1], i64[::1], i64[::1], i32[::1], u8[::1], u16[::1], u8[::1], u32[::1], "
          "u32[::1], u16[::1], i64[::1], i64[::1], u8[::1], i64[::1], i64[::1], i64[::1]"))
def normalize_kernel(buf, off, cap, wire, rows, l3_off, ver, ext_len, l4_proto, ip_len, ip_len_field, l2_len,
                     outer_ver, outer_udp, nbuf, n_off, n_cap, n_wire):
    """``normalize_frame`` for each frame ``rows[j]`` (known normalizable and needing it), written back to back
    into nbuf; returns the bytes written. ``outer_ver[j]``/``outer_udp[j]``: the tunnel's outer header
    (``outer_udp_batch``), version 0 for a frame without a tunnel."""
    pos = np.int64(0)
    for j in range(rows.shape[0]):
        i = rows[j]
        p = np.int64(off[i])
        c = np.int64(cap[i])
        o = np.int64(l3_off[i])
        e = np.int64(ext_len[i]) if ver[i] == 6 else np.int64(0)
        keep = o + IPV6_HDR if e > 0 else c  # bytes copied before the removed extension headers
        for b in range(keep):
            nbuf[np.uint64(pos + b)] = buf[np.uint64(p + b)]
        for b in range(keep + e, c):
            nbuf[np.uint64(pos + b - e)] = buf[np.uint64(p + b)]
        if ver[i] == 4:
            tot = min(np.int64(ip_len[i]), MAX_16)
            nbuf[np.uint64(pos + o + 2)] = tot >> 8
            nbuf[np.uint64(pos + o + 3)] = tot & 0xFF
        else:
            field = np.int64(ip_len_field[i])
            plen = min(np.int64(ip_len[i]) - IPV6_HDR - e, MAX_16) if field == 0 else field - e
            plen = max(plen, 0)
            nbuf[np.uint64(pos + o + 4)] = plen >> 8
            nbuf[np.uint64(pos + o + 5)] = plen & 0xFF
            if e > 0:
                nbuf[np.uint64(pos + o + 6)] = l4_proto[i]
        if outer_ver[j] != 0:  # the outer IP length and UDP length of a tunnel
            ol3 = np.int64(l2_len[i])
            for q in range(2):
                if q == 0:
                    fpos = ol3 + (2 if outer_ver[j] == 4 else 4)
                    total = np.int64(wire[i]) - ol3 - (0 if outer_ver[j] == 4 else IPV6_HDR)
                else:
                    fpos = np.int64(outer_udp[j]) + 4
                    total = np.int64(wire[i]) - np.int64(outer_udp[j])
                v = (np.int64(nbuf[np.uint64(pos + fpos)]) << 8) | np.int64(nbuf[np.uint64(pos + fpos + 1)])
                v = min(total - e, MAX_16) if v == 0 else v - e
                v = max(v, 0)
                nbuf[np.uint64(pos + fpos)] = v >> 8
                nbuf[np.uint64(pos + fpos + 1)] = v & 0xFF
        n_off[j] = pos
        n_cap[j] = c - e
        n_wire[j] = np.int64(wire[i])  # the wire length is what len/less/greater test; BIG TCP leaves it
        pos += c - e
    return pos


def normalize_batch(pb: PacketBatch, buf: np.ndarray, off: np.ndarray, cap: np.ndarray, wire: np.ndarray,
                    rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, Counter]:
    """Normalized copies of rows ``rows`` of a batch (int64 off/cap/wire columns over ``buf``).

    Returns (rows that have a copy, nbuf, n_off, n_cap, n_wire, frames not normalized by reason): the same as
    running ``why_not``, ``needs_normalizing`` and ``normalize_frame`` on each frame, in one compiled pass."""
    todo, skipped = normalizable_rows(pb, buf, off, cap, rows)
    return normalize_rows(pb, buf, off, cap, wire, todo) + (skipped,)


def normalizable_rows(pb: PacketBatch, buf: np.ndarray, off: np.ndarray, cap: np.ndarray,
                      rows: np.ndarray) -> tuple[np.ndarray, Counter]:
    """The rows of ``rows`` that can be normalized and need it, and the others' ``why_not`` counts."""
    rows = np.asarray(rows, np.int64)
    ov, ou = outer_udp_batch(pb, buf, off, cap, rows)
    why = why_not_batch(pb, rows, cap, ov)
    skipped = Counter({SKIP_ORDER[k - 1]: int(v) for k, v in enumerate(np.bincount(why, minlength=5)) if k and v})
    ok = why == 0
    need = needs_normalizing_batch(pb, rows[ok], buf, off, ov[ok], ou[ok])
    return rows[ok][need], skipped


def normalize_rows(pb: PacketBatch, buf: np.ndarray, off: np.ndarray, cap: np.ndarray, wire: np.ndarray,
                   todo: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Normalized copies of rows ``todo`` (normalizable and needing it): (todo, nbuf, n_off, n_cap, n_wire)."""
    todo = np.asarray(todo, np.int64)
    n = todo.size
    nbuf = np.empty(int(cap[todo].sum()), np.uint8)
    n_off, n_cap, n_wire = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    if n:
        ov, ou = outer_udp_batch(pb, buf, off, cap, todo)
        normalize_kernel(buf, off, cap, wire, todo, pb.l3_off, pb.ip_version, pb.ext_len, pb.l4_proto, pb.ip_len,
                         pb.ip_len_field, pb.l2_len, ov, ou, nbuf, n_off, n_cap, n_wire)
    return todo, nbuf, n_off, n_cap, n_wire


# ---- expressions that read what normalization changes ---------------------------------------------------------
# IPv6 extension headers the normalized copy removes (the decoder's chain: HBH, routing, fragment, AH,
# destination options, mobility, HIP, shim6, experimental)
REMOVED_HEADERS = {0: "hop-by-hop", 43: "routing", 44: "fragment", 51: "AH", 60: "destination options",
                   135: "mobility", 139: "HIP", 140: "shim6", 253: "experimental", 254: "experimental"}
_LINK_LOADS = frozenset({"ether", "link", "ppp", "slip", "fddi", "tr", "wlan", "radio"})
_MIN_LINK_HDR = 14  # a link-relative load past the Ethernet header reads IP bytes


def raw_header_reads(expr: str) -> list[str]:
    """What in ``expr`` tests a header field the normalized copy rewrites (empty when nothing does).

    Such a test asks about the frame as captured (``ip[2:2] = 0`` selects the IPv4 BIG TCP frames, ``ip6 proto
    51`` the packets whose first extension header is AH), so its truth is the raw frame's verdict. The fields:
    the IPv4 total length (bytes 2-3), the IPv6 payload length and next header (bytes 4-6) and anything past the
    fixed IPv6 header (extension headers are removed, so the bytes move), link-layer loads that reach into the
    IP header, a load at a computed offset into the IP header, and ``proto``/``protochain`` of an extension
    header the copy no longer has."""
    from .expr import ExprSyntaxError, const_value, parse, primitives, relations

    try:
        tree = parse(expr)
    except ExprSyntaxError:
        return []
    out: list[str] = []
    for r in relations(tree):
        for ld in r.loads():
            k = const_value(ld.index)
            span = None if k is None else (k, k + ld.size)
            what = None
            if ld.proto == "ip":
                if span is None or (span[0] < 4 and span[1] > 2):
                    what = "the IPv4 total length"
            elif ld.proto == "ip6":
                if span is None:
                    what = "IPv6 header bytes at a computed offset"
                elif span[0] < 6 and span[1] > 4:
                    what = "the IPv6 payload length"
                elif span[0] <= 6 < span[1]:
                    what = "the IPv6 next header"
                elif span[1] > IPV6_HDR:
                    what = "bytes past the fixed IPv6 header"
            elif ld.proto in _LINK_LOADS and (span is None or span[1] > _MIN_LINK_HDR):
                what = "IP header bytes through a link-layer offset"
            if what:
                out.append(f"{r.text} reads {what}")
    for p in primitives(tree):
        nh = None
        if p.kind in ("proto", "protochain") and p.proto in (None, "ip6") and len(p.ids) == 1:
            name = p.ids[0].lstrip("\\")
            try:
                nh = {"ah": 51}.get(name, None) if not name[0].isdigit() else int(name, 0)
            except ValueError:
                nh = None
        elif p.proto == "ah" and p.kind is None and not p.ids:
            nh = 51
        if nh in REMOVED_HEADERS:
            out.append(f"{p.explicit()} tests the IPv6 {REMOVED_HEADERS[nh]} header")
    return list(dict.fromkeys(out))

