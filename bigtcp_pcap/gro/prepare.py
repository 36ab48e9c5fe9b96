"""Vectorized per-batch preparation for the GRO engine: everything that depends on one packet only.

The engine's loop then only compares and updates state. Per row this computes which path the packet takes
(``kind``), whether GRO flush-marks it (R2/R7/R11), the packed comparison words of R14 and the flow keys of
R4/R6/R10/R13 with their flow hash (bucket and RX queue).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._native import python_twin
from ..decode.schema import (
    ST_IP_FRAGMENT,
    ST_L4_UNKNOWN,
    ST_MALFORMED,
    ST_NOT_IP,
    ST_TRUNC_L2,
    ST_TRUNC_L3,
    ST_UNKNOWN_LINKTYPE,
    PacketBatch,
)
from . import rules
from .config import GroConfig

KIND_OTHER = 0  # no TCP GRO: delivered alone, held entries untouched, no row (non-IP, UDP, fragments, ...)
KIND_ALONE = 1  # a TCP segment GRO gives up on (R5/R9/R12, R19): delivered alone, untouched, row if payload
KIND_TCP = 2  # goes through tcp_gro_receive

ETH_MIN_FRAME = rules.ETH_MIN_FRAME
_py = python_twin("bigtcp_pcap.gro.rules")  # the same rule source, as Python (it also takes numpy arrays)
_flushmark, _flag_word, _l3_word = _py.r7_r11_flushmark, _py.r14_2_flag_word, _py.r8_r11_l3_word

NO_GRO_STATUS = ST_NOT_IP | ST_UNKNOWN_LINKTYPE | ST_MALFORMED | ST_IP_FRAGMENT | ST_L4_UNKNOWN | ST_TRUNC_L2 | ST_TRUNC_L3
FRAGMENT_OTHER = NO_GRO_STATUS & ~ST_IP_FRAGMENT
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@dataclass
class Prepared:
    """Per-row derived columns (numpy) of one batch."""

    kind: np.ndarray  # int8, KIND_*
    flushmark: np.ndarray  # bool: R2/R7/R11 (only meaningful for KIND_TCP)
    flagword: np.ndarray  # int64: R14.2 (doff << 28 | flags << 16 | window) with the ignored bits cleared
    l3word: np.ndarray  # int64: R8/R11 (ttl << 16 | tos << 8 | df)
    hdr_len: np.ndarray  # int64: IP header (incl. ext headers) + TCP header
    flow_hash: np.ndarray | None  # uint64: stand-in for skb->hash (bucket and RX queue); None if not asked for
    key_rows: np.ndarray  # int64 indexes of KIND_TCP rows
    key_first: np.ndarray  # int64: for each distinct flow key, its first row in ``keys``
    key_inverse: np.ndarray  # int64: for each KIND_TCP row, its distinct-key number
    keys: np.ndarray  # uint64 (n_tcp, 9): the exact flow keys of the KIND_TCP rows
    key_cols: tuple[np.ndarray, ...] = ()  # the 9 uint64 key columns for every row (``keys`` = their KIND_TCP rows)


def _mix(h: np.ndarray, x: np.ndarray) -> np.ndarray:
    """One splitmix64-style round: fold x into h (uint64, wrapping)."""
    h = (h ^ x) * _M1
    h ^= h >> np.uint64(31)
    h *= _M2
    h ^= h >> np.uint64(29)
    return h


def flow_hash_of(ver: np.ndarray, key_cols: tuple[np.ndarray, ...]) -> np.ndarray:
    """Flow hash (skb->hash stand-in, gro-spec section 6) of rows given by their IP version and ``key_cols``:
    addresses, ports, protocol and the IPv6 flow label, as the kernel's software flow dissector hash does."""
    h = np.full(ver.shape[0], 0x6A09E667F3BCC908, dtype=np.uint64)
    for col in key_cols[2:8]:  # src (2 words), dst (2 words), version/protocol/ports, flow label
        h = _mix(h, col)
    return np.where((ver == 4) | (ver == 6), h, np.uint64(0))


def prepare(b: PacketBatch, flow_id: np.ndarray, cfg: GroConfig, dedupe: bool = True,
            row_hash: bool = True) -> Prepared:
    """Derive the engine's per-row inputs from a PacketBatch (see ``Prepared``).

    ``dedupe=False`` skips the distinct-key step (``key_rows``/``key_first``/``key_inverse``/``keys`` are left
    empty) and ``row_hash=False`` the per-row flow hash (``flow_hash`` None), for a caller that maps
    ``key_cols`` to flow keys itself and hashes only new keys (the compiled engine, with one RX queue)."""
    n = len(b)
    ver = b.ip_version
    v4 = ver == 4
    v6 = ver == 6
    status = b.status.astype(np.int64)

    # R3/R5/R9/R12: which packets reach tcp_gro_receive at all.
    tcp = (v4 | v6) & (b.l4_proto == 6) & (flow_id >= 0) & ((status & NO_GRO_STATUS) == 0)
    # R5: IPv4 first byte must be 0x45 (no options); R12: the fixed TCP header must be in our data (options cut by
    # the snaplen are compared as captured); R19: tunnels are out of scope for this model -> treated as give-up
    # (delivered alone).
    giveup = tcp & ((v4 & (b.ip_hdr_len != 20)) | ~_py.r12_header_pulls(b.tcp_hdr_len.astype(np.int64))
                    | (b.tunnel != 0))
    # R5/R9: a first fragment whose TCP header the decoder read is delivered alone (a row), held entries untouched
    giveup |= (v4 | v6) & (b.l4_proto == 6) & (flow_id >= 0) & (b.l4_off >= 0) & ((status & ST_IP_FRAGMENT) != 0) \
        & ((status & FRAGMENT_OTHER) == 0)
    kind = np.where(tcp & ~giveup, KIND_TCP, np.where(giveup, KIND_ALONE, KIND_OTHER)).astype(np.int8)

    # R7/R11 (the length field against the frame's L3 bytes, the evil bit), R14.2 and R8/R11: the same rule
    # functions the compiled loop inlines, on whole columns
    declared = b.ip_len_field.astype(np.int64) + np.where(v6, 40, 0)
    l3o = b.l3_off.astype(np.int64)
    flushmark = _flushmark(declared, b.wirelen.astype(np.int64) - l3o, l3o, bool(cfg.treat_padding_as_flush), v4,
                           b.ip_evil)
    flagword = _flag_word(b.tcp_hdr_len.astype(np.int64), b.tcp_flags.astype(np.int64),
                          b.tcp_win.astype(np.int64), np.int64(rules.r14_2_kept_flags(cfg)))
    l3word = _l3_word(b.ttl.astype(np.int64), b.tos.astype(np.int64), np.where(v4, b.df, 0).astype(np.int64))
    hdr_len = b.ip_hdr_len.astype(np.int64) + b.tcp_hdr_len.astype(np.int64)

    src = np.ascontiguousarray(b.src).view(np.uint64).reshape(n, 2)
    dst = np.ascontiguousarray(b.dst).view(np.uint64).reshape(n, 2)
    label = np.where(v6, b.flow_label, 0).astype(np.uint64)
    proto_ports = (ver.astype(np.uint64) << np.uint64(48)) | (b.l4_proto.astype(np.uint64) << np.uint64(32)) \
        | (b.sport.astype(np.uint64) << np.uint64(16)) | b.dport.astype(np.uint64)
    # R4 (l2 header, VLAN, ingress interface), R6/R10 (addresses, protocol/nexthdr, flow label, ext headers),
    # R13 (ports): the exact key a held entry must share with a new packet.
    key_cols = (b.l2_hash, (b.vlan.astype(np.uint64) << np.uint64(32)) | b.if_gid.astype(np.uint64),
                src[:, 0], src[:, 1], dst[:, 0], dst[:, 1], proto_ports, label, b.ext_hash)
    flow_hash = flow_hash_of(ver, key_cols) if (row_hash or dedupe) else None
    if not dedupe:
        z = np.zeros(0, np.int64)
        return Prepared(kind, flushmark, flagword, l3word, hdr_len, flow_hash, z, z, z,
                        np.zeros((0, len(key_cols)), np.uint64), key_cols)
    key_rows = np.flatnonzero(kind == KIND_TCP)
    keys = np.stack([c[key_rows] for c in key_cols], axis=1)
    key_first, key_inverse = _distinct_rows(keys)
    return Prepared(kind, flushmark, flagword, l3word, hdr_len, flow_hash, key_rows, key_first, key_inverse, keys,
                    key_cols)


def _distinct_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of ``keys``: (first row of each, inverse). Deduplicated by a 64-bit digest, verified."""
    if keys.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    h = np.full(keys.shape[0], 0x3C6EF372FE94F82B, dtype=np.uint64)
    for j in range(keys.shape[1]):
        h = _mix(h, keys[:, j])
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not (keys == keys[first[inverse]]).all():  # a digest collision: deduplicate exactly instead
        _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    return first.astype(np.int64), inverse.astype(np.int64)
