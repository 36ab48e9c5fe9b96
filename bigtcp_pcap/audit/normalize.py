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

Not normalized (returned unchanged, and ``why_not`` says why): frames without IP, IP fragments (an IPv6 Fragment
header or IPv4 MF/offset: removing the header would make libpcap read a non-first fragment's data as ports),
tunnels (VXLAN/Geneve: the decoder's ``l3_off`` is the *inner* IP header, and the outer IP/UDP length fields
would need the same treatment; left for later), and frames whose extension-header chain is cut by the snaplen.
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

    @classmethod
    def from_batch(cls, pb: PacketBatch, i: int) -> L3Fields:
        return cls(int(pb.l3_off[i]), int(pb.ip_version[i]), int(pb.ip_hdr_len[i]), int(pb.ext_len[i]),
                   int(pb.l4_proto[i]), int(pb.ip_len[i]), int(pb.status[i]), int(pb.tunnel[i]))


def why_not(f: L3Fields, caplen: int) -> str | None:
    """Why this frame cannot be normalized (None when it can)."""
    if f.ip_version not in (4, 6) or f.l3_off < 0 or f.status & (ST_NOT_IP | ST_UNKNOWN_LINKTYPE | ST_TRUNC_L2):
        return SKIP_NOT_IP
    if f.tunnel != TUNNEL_NONE:
        return SKIP_TUNNEL
    if f.status & ST_IP_FRAGMENT:
        return SKIP_FRAGMENT
    if f.status & ST_TRUNC_L3 or caplen < f.l3_off + (f.ip_hdr_len if f.ip_version == 6 else 20):
        return SKIP_TRUNCATED
    return None


def needs_normalizing(f: L3Fields, data: bytes | memoryview) -> bool:
    """True when the normalized copy would differ from the frame (cheap test on the length fields)."""
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
    if why_not(f, len(data)) is not None:
        return data, wirelen
    o = f.l3_off
    if f.ip_version == 4:
        if data[o + 2:o + 4] != b"\x00\x00":
            return data, wirelen
        return data[:o + 2] + struct.pack("!H", min(f.ip_len, MAX_16)) + data[o + 4:], wirelen
    plen_field = struct.unpack_from("!H", data, o + 4)[0]
    if plen_field == 0:  # jumbogram (HBH) or BIG TCP without HBH: the true length comes from the decoder
        plen = min(f.ip_len - IPV6_HDR - f.ext_len, MAX_16)
    else:
        plen = plen_field - f.ext_len
    plen = max(plen, 0)
    head = data[o:o + 4] + struct.pack("!HB", plen, f.l4_proto if f.ext_len else data[o + 6]) + data[o + 7:o + 40]
    return data[:o] + head + data[o + IPV6_HDR + f.ext_len:], wirelen - f.ext_len


# ---- the same rules for a whole batch (the audit's hot path); the functions above stay the reference -------
SKIP_ORDER = (SKIP_NOT_IP, SKIP_TUNNEL, SKIP_FRAGMENT, SKIP_TRUNCATED)


def why_not_batch(pb: PacketBatch, rows: np.ndarray, caplen: np.ndarray) -> np.ndarray:
    """``why_not`` for rows ``rows`` of ``pb``: 0 when the frame can be normalized, else 1 + its index in
    SKIP_ORDER (the first reason that applies, in ``why_not``'s order)."""
    ver, l3, st = pb.ip_version[rows], pb.l3_off[rows].astype(np.int64), pb.status[rows]
    hdr = np.where(ver == 6, pb.ip_hdr_len[rows].astype(np.int64), 20)
    conds = [((ver != 4) & (ver != 6)) | (l3 < 0) | ((st & (ST_NOT_IP | ST_UNKNOWN_LINKTYPE | ST_TRUNC_L2)) != 0),
             pb.tunnel[rows] != TUNNEL_NONE,
             (st & ST_IP_FRAGMENT) != 0,
             ((st & ST_TRUNC_L3) != 0) | (np.asarray(caplen, np.int64)[rows] < l3 + hdr)]
    return np.select(conds, np.arange(1, len(conds) + 1, dtype=np.int8), 0).astype(np.int8)


def needs_normalizing_batch(pb: PacketBatch, rows: np.ndarray) -> np.ndarray:
    """``needs_normalizing`` for rows ``rows`` (from the decoded length fields instead of the bytes)."""
    ver, field = pb.ip_version[rows], pb.ip_len_field[rows]
    v6 = (ver == 6) & ((pb.ext_len[rows] > 0) | ((field == 0) & (pb.ip_len[rows] > IPV6_HDR)))
    return v6 | ((ver == 4) & (field == 0))


@njit(cache=True, entry=True)
def normalize_kernel(buf, off, cap, wire, rows, l3_off, ver, ext_len, l4_proto, ip_len, ip_len_field, nbuf, n_off,
                     n_cap, n_wire):
    """``normalize_frame`` for each frame ``rows[j]`` (known normalizable and needing it), written back to back
    into nbuf; returns the bytes written."""
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
        n_off[j] = pos
        n_cap[j] = c - e
        n_wire[j] = np.int64(wire[i]) - e
        pos += c - e
    return pos


def normalize_batch(pb: PacketBatch, buf: np.ndarray, off: np.ndarray, cap: np.ndarray, wire: np.ndarray,
                    rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, Counter]:
    """Normalized copies of rows ``rows`` of a batch (int64 off/cap/wire columns over ``buf``).

    Returns (rows that have a copy, nbuf, n_off, n_cap, n_wire, frames not normalized by reason): the same as
    running ``why_not``, ``needs_normalizing`` and ``normalize_frame`` on each frame, in one compiled pass."""
    rows = np.asarray(rows, np.int64)
    why = why_not_batch(pb, rows, cap)
    skipped = Counter({SKIP_ORDER[k - 1]: int(v) for k, v in enumerate(np.bincount(why, minlength=5)) if k and v})
    todo = rows[why == 0]
    todo = todo[needs_normalizing_batch(pb, todo)]
    n = todo.size
    nbuf = np.empty(int(cap[todo].sum()), np.uint8)
    n_off, n_cap, n_wire = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    if n:
        normalize_kernel(buf, off, cap, wire, todo, pb.l3_off, pb.ip_version, pb.ext_len, pb.l4_proto, pb.ip_len,
                         pb.ip_len_field, nbuf, n_off, n_cap, n_wire)
    return todo, nbuf, n_off, n_cap, n_wire, skipped
