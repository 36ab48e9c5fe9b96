"""The flow table: one row per TCP flow direction, updated batch by batch, streamed out when the flow ends.

Everything per packet and per flow is compiled (no Python step per flow): one pass per batch finds each
packet's flow (an open-addressing table over the exact key: IP version, addresses, ports), creates new flows,
updates the counters, the payload-length histogram and the sequence bookkeeping (retransmissions,
out-of-order, capture gaps, at most ``MAX_HOLES`` open holes per flow).

A flow ends (its row is final and leaves memory) when its connection was idle for ``idle_timeout_ns`` (both
directions silent; nfstream's idle timeout, Zeek's inactivity timeout), or was closed (RST either way, or FIN
both ways) and then silent for ``close_timeout_ns`` (Zeek's tcp_close_delay: late ACKs and retransmitted
FINs still belong to it). A packet of the same 5-tuple after that starts a new flow: a new row with a new
``flow_id`` (ids are given in order of first appearance and never reused), as in Zeek's conn.log.
Ended flows are collected at batch ends by ``expire``; a flow whose GRO entry is still held is kept until the
GRO engine completes that entry by its own rules (the timeouts are seconds, GRO/NAPI timescales microseconds to
milliseconds, so in practice this only defers a row by one batch), so its super-packet columns are whole.

State per flow: a row of int64 fields, the key, the holes, and the histogram entries (payload lengths, and
rebuilt super-packet lengths) in a pooled table; free slots and entries are recycled, so memory follows the
flows alive at once, not the flows ever seen.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .._native import njit
from ..buffers import lazy_zeros, table_full
from ..decode.schema import BIGTCP_NONE, ST_TRUNC_L4, TH_FIN, TH_RST, TH_SYN, PacketBatch
from ..output.arrow import array

MAX_HOLES = 16
IDLE_TIMEOUT_NS = 120 * 10**9  # nfstream's default idle_timeout (Zeek's tcp_inactivity_timeout is 5 min)
CLOSE_TIMEOUT_NS = 5 * 10**9  # Zeek's tcp_close_delay

# --- per-slot int64 fields of F ---------------------------------------------------------------------------
# (what expire_kernel's pass over every slot reads comes first, so that pass touches one or two cache lines a slot)
(F_STATE, F_HOLD, F_LASTFRAME, F_TS1, F_FINRST, F_REV, F_FID, F_PACKETS, F_PAYLOAD, F_WIRE, F_BIG, F_MAXP,
 F_FIRST, F_TS0, F_MSS, F_INITED, F_MAXEND, F_NHOLES, F_GAP, F_RETRANS, F_OOO, F_HHEAD, F_HLAST, F_SHEAD,
 F_SLAST, F_CUT_EV, F_CUT_GU) = range(27)
NF = 27
FREE, ALIVE, ZOMBIE = 0, 1, 2  # ZOMBIE: ended, out of the key table, its row not yet written
# --- key words per slot (KY): version/ports word, src (2 words), dst (2 words), digest, capture point -------
# (the capture point, ``point``: 0 for a one-interface capture without Linux cooked headers)
NKY = 7
_P_IF, _P_DIR = np.uint64(34), np.uint64(32)  # the point word: interface from bit 34, direction in bits 32-33,
_P_IFX, _P_DIRS = np.uint64(0xFFFFFFFF), np.uint64(3)  # the ifindex below
# --- scalar state ST ------------------------------------------------------------------------------------------
(S_NEXT_ID, S_FREE_TOP, S_NZOMB, S_TAB_FILL, S_HFREE, S_HFREE_N, S_HTOP, S_HTAB_FILL, S_FM_FILL, S_ALIVE) = range(10)
NST = 10
# --- output row of an ended flow (R) ----------------------------------------------------------------------
(R_FID, R_VER, R_SPORT, R_DPORT, R_FIRST, R_TS0, R_TS1, R_PACKETS, R_PAYLOAD, R_WIRE, R_BIG, R_MAXP, R_MSS,
 R_P50, R_P99, R_SP, R_S50, R_S99, R_SMAX, R_RETRANS, R_OOO, R_GAP, R_FINRST, R_CUT_EV, R_CUT_GU, R_IFID,
 R_IFINDEX, R_DIR) = range(28)
NR = 28

FINRST = "_finrst"  # the rows' key for the FIN (1) / RST (2) bits seen in the flow's own direction
IFINDEX = "_ifindex"  # and for their ifindex with 0 for none (the summary's capture points: no Arrow nulls)

EMPTY, TOMB = np.int64(-1), np.int64(-2)
_SLOT = np.int64(0xFFFFFFFF)  # the index bits of a key table entry (_tagged)
_I64_MAX = np.int64((1 << 63) - 1)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SEED = np.uint64(0x6A09E667F3BCC908)
_SP_BIT = np.uint64(1) << np.uint64(63)


@njit(cache=True, inline="always")
def _fmix(h, x):
    h = (h ^ x) * _M1
    h ^= h >> np.uint64(31)
    h *= _M2
    return h ^ (h >> np.uint64(29))


@njit(cache=True)
def _unwrap(seq, ref):
    """64-bit sequence position of a 32-bit seq nearest to the 64-bit reference ``ref``."""
    d = np.int64(np.int32(np.uint32((np.int64(seq) - ref) & 0xFFFFFFFF)))
    return ref + d


# ============================================================================================================
# a uint64 -> int64 open-addressing map (values >= 0; EMPTY / TOMB slots), kept at most half full by the caller
# ============================================================================================================
@njit(cache=True, inline="always")
def _hm_find(K, V, key, h):
    """Index of ``key`` (digest ``h``) in (K, V), or -1."""
    m = V.shape[0] - 1
    j = np.int64(h & np.uint64(m))
    while True:
        v = V[j]
        if v == EMPTY:
            return np.int64(-1)
        if v >= 0 and K[j] == key:
            return j
        j = (j + 1) & m


@njit(cache=True, inline="always")
def _hm_insert(K, V, key, h, val):
    """Insert an absent key; returns 1 when it took an empty slot (the fill grows), 0 for a tombstone."""
    m = V.shape[0] - 1
    j = np.int64(h & np.uint64(m))
    while V[j] >= 0:
        j = (j + 1) & m
    grew = 1 if V[j] == EMPTY else 0
    K[j] = key
    V[j] = val
    return grew


@njit(cache=True, entry=True,
      sig="u64[::1], i64[::1], u64[::1], i64[::1]")
def rehash_map(K, V, K2, V2):
    """Insert the live entries of (K, V) into the empty map (K2, V2) (K, V may be a compact copy: every entry live)."""
    for j in range(V.shape[0]):
        if V[j] >= 0:
            _hm_insert(K2, V2, K[j], _fmix(_SEED, K[j]), V[j])


@njit(cache=True, entry=True,
      sig="i64[::1], u64[:, ::1], i64[::1]")
def rehash_keys(TAB, KY, TAB2):
    """Insert the live entries of the key table TAB (or a compact copy of them) into the empty TAB2 (digests in
    KY[:, 5])."""
    m = TAB2.shape[0] - 1
    for j in range(TAB.shape[0]):
        e = TAB[j]
        if e >= 0:
            i = np.int64(KY[e & _SLOT, 5] & np.uint64(m))
            while TAB2[i] >= 0:
                i = (i + 1) & m
            TAB2[i] = e


@njit(cache=True, inline="always")
def _tag(h):
    """The 31 high bits of digest h that a key-table entry carries (``_tagged``)."""
    return np.int64(h >> np.uint64(33))


@njit(cache=True, inline="always")
def _entry_tag(e):
    """The digest bits an entry carries: ``_tag(h)`` of its key's digest when the entry is live (e >= 0)."""
    return e >> np.int64(32)


@njit(cache=True, inline="always")
def _tagged(h, s):
    """An entry of a key table (this one, slot -> flow slot; the GRO engine's, slot -> gid): index s under 31
    high bits of its key's digest h, so that a probe passing another key's entry tells it apart without reading
    that key's row (a cache miss on many flows). EMPTY and TOMB stay < 0; ``e & _SLOT`` is the index."""
    return (_tag(h) << np.int64(32)) | np.int64(s)


@njit(cache=True, inline="always")
def _tab_remove(TAB, KY, s):
    m = TAB.shape[0] - 1
    j = np.int64(KY[s, 5] & np.uint64(m))
    e = _tagged(KY[s, 5], s)
    while TAB[j] != e:
        j = (j + 1) & m
    TAB[j] = TOMB


# ============================================================================================================
# per-packet steps
# ============================================================================================================
@njit(cache=True, inline="always")
def _deadline(F, s, idle, close):
    """The time after which slot s's connection has ended: its last packet (either direction) plus the idle
    timeout, or plus the close timeout (when shorter) once it is closed (RST, or FIN both ways)."""
    last = F[s, F_TS1]
    fr = F[s, F_FINRST]
    frr = np.int64(0)
    r = F[s, F_REV]
    if r >= 0:
        last = max(last, F[r, F_TS1])
        frr = F[r, F_FINRST]
    closed = ((fr | frr) & 2) != 0 or ((fr & 1) != 0 and (frr & 1) != 0)
    to = min(idle, close) if closed else idle
    if last > _I64_MAX - to:  # saturated: past the last representable nanosecond (a pcapng can come that close,
        return _I64_MAX  # and the sum wrapped to a deadline long gone)
    return last + to


@njit(cache=True, inline="always")
def _ended(F, s, t, idle, close):
    """Has slot s's connection ended by time t (idle, or closed and then quiet)?"""
    m = min(idle, close)
    ts1 = F[s, F_TS1]
    if ts1 > _I64_MAX - m or t <= ts1 + m:  # its own last packet is recent: the deadline is at least that late,
        return False  # whatever the reverse direction's row says (not read: on many flows, a cache miss a packet)
    return t > _deadline(F, s, idle, close)


@njit(cache=True, inline="always")
def _hist_add(F, s, kind, ln, cnt, headcol, lastcol, HK, HV, EL, EC, EN, ST):
    """Add ``cnt`` sightings of length ``ln`` to slot s's histogram ``kind`` (0 payload, 1 super-packets)."""
    e = F[s, lastcol]
    if e >= 0 and EL[e] == ln:
        EC[e] += cnt
        return
    hkey = (np.uint64(s) << np.uint64(32)) | np.uint64(ln)
    if kind:
        hkey |= _SP_BIT
    h = _fmix(_SEED, hkey)
    j = _hm_find(HK, HV, hkey, h)
    if j >= 0:
        e = HV[j]
        EC[e] += cnt
    else:
        if ST[S_HFREE_N] > 0:
            e = ST[S_HFREE]
            ST[S_HFREE] = EN[e]
            ST[S_HFREE_N] -= 1
        else:
            e = ST[S_HTOP]
            ST[S_HTOP] += 1
        EL[e] = ln
        EC[e] = cnt
        EN[e] = F[s, headcol]
        F[s, headcol] = e
        ST[S_HTAB_FILL] += _hm_insert(HK, HV, hkey, h, e)
    F[s, lastcol] = e


@njit(cache=True, inline="always")
def _seq_step(F, H, f, seq, ln, flags):
    """Track the flow's highest sequence end and its holes; count retransmissions and out-of-order data."""
    if flags & TH_SYN:
        ln += 1
    if flags & TH_FIN:
        ln += 1
    if not F[f, F_INITED]:
        F[f, F_INITED] = 1
        F[f, F_MAXEND] = np.int64(seq) + ln
        return
    if ln == 0:
        return
    mx = F[f, F_MAXEND]
    s = _unwrap(seq, mx)
    e = s + ln
    if s > mx:
        # a hole: sequence space the capture has not shown (yet)
        nh = F[f, F_NHOLES]
        if nh == MAX_HOLES:  # forget the oldest hole; it stays counted as a gap
            for j in range(MAX_HOLES - 1):
                H[f, j, 0] = H[f, j + 1, 0]
                H[f, j, 1] = H[f, j + 1, 1]
            nh -= 1
        H[f, nh, 0] = mx
        H[f, nh, 1] = s
        F[f, F_NHOLES] = nh + 1
        F[f, F_GAP] += s - mx
        F[f, F_MAXEND] = e
    elif e <= mx or s < mx:
        filled = np.int64(0)
        j = 0
        while j < F[f, F_NHOLES]:
            hs = H[f, j, 0]
            he = H[f, j, 1]
            a = max(hs, s)
            b = min(he, e)
            if a < b:
                filled += b - a
                # shrink or split the hole
                if a == hs and b == he:
                    for m in range(j, F[f, F_NHOLES] - 1):
                        H[f, m, 0] = H[f, m + 1, 0]
                        H[f, m, 1] = H[f, m + 1, 1]
                    F[f, F_NHOLES] -= 1
                    continue
                elif a == hs:
                    H[f, j, 0] = b
                elif b == he:
                    H[f, j, 1] = a
                elif F[f, F_NHOLES] < MAX_HOLES:
                    for m in range(F[f, F_NHOLES], j + 1, -1):
                        H[f, m, 0] = H[f, m - 1, 0]
                        H[f, m, 1] = H[f, m - 1, 1]
                    H[f, j, 1] = a
                    H[f, j + 1, 0] = b
                    H[f, j + 1, 1] = he
                    F[f, F_NHOLES] += 1
                    j += 1
            j += 1
        F[f, F_GAP] -= filled
        if filled > 0:
            F[f, F_OOO] += 1
        else:
            F[f, F_RETRANS] += 1
        F[f, F_MAXEND] = max(mx, e)
    else:
        F[f, F_MAXEND] = e


@njit(cache=True, entry=True, sig="i64[::1], u32[::1], u32[::1], u16[::1], i64[:, ::1], i64[:, :, ::1]")
def seq_kernel(fid, seq, plen, flags, F, H):
    """The sequence bookkeeping of ``flow_kernel`` alone, over packets already in frame order with compact flow
    ids (rows of ``F``/``H``): used to recompute the history-dependent columns of a flow seen in several parts."""
    for i in range(fid.shape[0]):
        _seq_step(F, H, fid[i], seq[i], np.int64(plen[i]), np.int64(flags[i]))


@njit(cache=True, inline="always")
def _find(TAB, KY, w, s0, s1, d0, d1, p, h):
    """Slot of the exact key, or -1."""
    m = TAB.shape[0] - 1
    j = np.int64(h & np.uint64(m))
    tag = _tag(h)
    while True:
        e = TAB[j]
        if e == EMPTY:
            return np.int64(-1)
        if e >= 0 and _entry_tag(e) == tag:
            g = e & _SLOT
            if KY[g, 5] == h and KY[g, 0] == w and KY[g, 1] == s0 and KY[g, 2] == s1 and KY[g, 3] == d0 \
                    and KY[g, 4] == d1 and KY[g, 6] == p:
                return g
        j = (j + 1) & m


@njit(cache=True, inline="always")
def _digest(w, s0, s1, d0, d1, p):
    """The 64-bit digest of a flow key; ``p`` the capture point (``point``), mixed in only where it is not 0."""
    h = _fmix(_fmix(_fmix(_fmix(_fmix(_SEED, w), s0), s1), d0), d1)
    return _fmix(h, p) if p else h


@njit(cache=True, inline="always")
def point(if_id, ifindex, direction):
    """The capture point of a packet as one key word: the pcapng interface (bits 34 on), whether the capturing host
    received or sent it (bits 32-33: a Linux cooked header's packet type, 0 when unknown) and the interface index
    a Linux cooked v2 header names (tcpdump -i any). The same packet seen at two points is two flows' packet, not
    a copy: a forwarded packet is received on one interface and sent on another (Linux cooked v1, which names no
    interface, still tells the two copies apart by the direction)."""
    return (np.uint64(if_id) << _P_IF) | (np.uint64(direction) << _P_DIR) | np.uint64(ifindex)


@njit(cache=True, inline="always")
def reverse_point(p):
    """The point where the reverse direction of a flow at ``p`` is seen: the same interface, the other way (a
    packet the host received is answered by one it sends there)."""
    d = (p >> _P_DIR) & _P_DIRS
    return p ^ (_P_DIRS << _P_DIR) if d == 1 or d == 2 else p


@njit(cache=True, inline="always")
def _retire(F, TAB, KY, ZL, ST, s):
    """An ended flow leaves the key table; its row is written by ``expire_kernel``."""
    _tab_remove(TAB, KY, s)
    F[s, F_STATE] = ZOMBIE
    ZL[ST[S_NZOMB]] = s
    ST[S_NZOMB] += 1
    ST[S_ALIVE] -= 1


@njit(cache=True, entry=True,
      sig=("u8[::1], u64[:, ::1], u64[:, ::1], u16[::1], u16[::1], b1[::1], u32[::1], u32[::1], u8[::1], "
          "i64[::1], u64[::1], u16[::1], u16[::1], u32[::1], u32[::1], u32[::1], u8[::1], i64[::1], i64[:, ::1], "
          "u64[:, ::1], i64[:, :, ::1], i64[::1], u64[::1], i64[::1], u64[::1], i64[::1], i64[::1], i64[::1], "
          "i64[::1], i64[::1], i64[::1], i64[::1], i64[::1], i64, i64"))
def flow_kernel(ver, src, dst, sport, dport, mask, plen, wirelen, bigtcp, ts, frame, flags, mss, seq, if_id, ifindex,
                direction, TO, F, KY, H, TAB, FK, FV, HK, HV, EL, EC, EN, FREE_, ZL, ST, fid, start, room):
    """One pass over rows ``start..`` of a batch: flow_id of each ``mask`` row (-1 elsewhere), new flows,
    counters, histogram, sequence bookkeeping. The caller guarantees room for ``room`` new flows and one
    histogram entry per row; the pass stops before the row that would need flow ``room + 1`` and returns its
    index (the caller makes room and goes on from there), or the batch length when it is done."""
    idle = TO[0]
    close = TO[1]
    pw = pp = np.uint64(0)
    ps0 = ps1 = pd0 = pd1 = np.uint64(0)
    prev = np.int64(-1)
    made = np.int64(0)
    for i in range(start, mask.shape[0]):
        if not mask[i]:
            fid[i] = -1
            continue
        t = ts[i]
        w = (np.uint64(ver[i]) << np.uint64(32)) | (np.uint64(sport[i]) << np.uint64(16)) | np.uint64(dport[i])
        s0, s1, d0, d1 = src[i, 0], src[i, 1], dst[i, 0], dst[i, 1]
        p = point(if_id[i], ifindex[i], direction[i])
        if prev >= 0 and w == pw and s0 == ps0 and s1 == ps1 and d0 == pd0 and d1 == pd1 and p == pp \
                and F[prev, F_STATE] == ALIVE:
            f = prev  # bursts of one flow skip the digest and the table
        else:
            h = _digest(w, s0, s1, d0, d1, p)
            f = _find(TAB, KY, w, s0, s1, d0, d1, p, h)
            if f < 0:
                f = np.int64(-2)
            pw, ps0, ps1, pd0, pd1, pp = w, s0, s1, d0, d1, p
        if f >= 0 and _ended(F, f, t, idle, close):
            _retire(F, TAB, KY, ZL, ST, f)
            f = np.int64(-2)
        if f < 0:
            if made == room:
                return np.int64(i)  # out of room; a retire above is redone as a miss on the way back
            made += 1
            h = _digest(w, s0, s1, d0, d1, p)
            ST[S_FREE_TOP] -= 1
            f = FREE_[ST[S_FREE_TOP]]
            for c in range(NF):
                F[f, c] = 0
            g = ST[S_NEXT_ID]
            ST[S_NEXT_ID] = g + 1
            F[f, F_FID] = g
            F[f, F_STATE] = ALIVE
            F[f, F_HHEAD] = -1
            F[f, F_HLAST] = -1
            F[f, F_SHEAD] = -1
            F[f, F_SLAST] = -1
            F[f, F_REV] = -1
            KY[f, 0], KY[f, 1], KY[f, 2], KY[f, 3], KY[f, 4], KY[f, 5], KY[f, 6] = w, s0, s1, d0, d1, h, p
            m = TAB.shape[0] - 1
            j = np.int64(h & np.uint64(m))
            while TAB[j] >= 0:
                j = (j + 1) & m
            if TAB[j] == EMPTY:
                ST[S_TAB_FILL] += 1
            TAB[j] = _tagged(h, f)
            ST[S_ALIVE] += 1
            fk = np.uint64(g)
            ST[S_FM_FILL] += _hm_insert(FK, FV, fk, _fmix(_SEED, fk), f)
            # the reverse direction, when alive and not ended: both directions end together
            rw = (np.uint64(ver[i]) << np.uint64(32)) | (np.uint64(dport[i]) << np.uint64(16)) | np.uint64(sport[i])
            rp = reverse_point(p)
            r = _find(TAB, KY, rw, d0, d1, s0, s1, rp, _digest(rw, d0, d1, s0, s1, rp))
            if r >= 0:
                if _ended(F, r, t, idle, close):
                    _retire(F, TAB, KY, ZL, ST, r)
                else:
                    F[f, F_REV] = r
                    F[r, F_REV] = f
        prev = f
        fid[i] = F[f, F_FID]
        # counters
        if F[f, F_PACKETS] == 0:
            F[f, F_FIRST] = np.int64(frame[i])
            F[f, F_TS0] = t
        elif t < F[f, F_TS0]:  # a clock that steps back: the flow spans its earliest to its latest time
            F[f, F_TS0] = t
        F[f, F_PACKETS] += 1
        pl = np.int64(plen[i])
        F[f, F_PAYLOAD] += pl
        F[f, F_WIRE] += np.int64(wirelen[i])
        if bigtcp[i] != BIGTCP_NONE:
            F[f, F_BIG] += 1
        if pl > F[f, F_MAXP]:  # noqa: PLR1730 - no store in the common case
            F[f, F_MAXP] = pl
        if t > F[f, F_TS1] or F[f, F_PACKETS] == 1:
            F[f, F_TS1] = t
        F[f, F_LASTFRAME] = np.int64(frame[i])
        fl = np.int64(flags[i])
        if (fl & TH_SYN) and mss[i] > 0:
            F[f, F_MSS] = np.int64(mss[i])
        if fl & TH_FIN:
            F[f, F_FINRST] |= 1
        if fl & TH_RST:
            F[f, F_FINRST] |= 2
        if pl > 0:
            _hist_add(F, f, 0, pl, 1, F_HHEAD, F_HLAST, HK, HV, EL, EC, EN, ST)
        _seq_step(F, H, f, seq[i], pl, fl)
    return np.int64(mask.shape[0])


@njit(cache=True, entry=True,
      sig="i64[::1], i64[::1], u8[::1], i64[:, ::1], u64[::1], i64[::1], i64[::1], i64[::1], i64[::1], i64[::1]")
def superpackets_kernel(slots, lens, cut, F, HK, HV, EL, EC, EN, ST):
    """Add rebuilt super-packet lengths to their flows' histograms (rows whose flow is in slot ``slots[i]``; -1:
    not in memory, skipped), and count the rows whose end was an evidenced (cut 1) or a guessed (cut 2) NAPI
    poll end (the caller guarantees room)."""
    for i in range(slots.shape[0]):
        s = slots[i]
        if s < 0:
            continue
        _hist_add(F, s, 1, np.int64(lens[i]), 1, F_SHEAD, F_SLAST, HK, HV, EL, EC, EN, ST)
        if cut[i] == 1:
            F[s, F_CUT_EV] += 1
        elif cut[i] == 2:
            F[s, F_CUT_GU] += 1


@njit(cache=True, entry=True,
      sig="i64[::1], u64[::1], i64[::1], i64[::1]")
def slots_kernel(fids, FK, FV, out):
    """Slot of each flow id (-1: not in memory); a run of one id is looked up once."""
    pf = np.int64(-1)
    ps = np.int64(-1)
    for i in range(fids.shape[0]):
        f = fids[i]
        if f != pf:  # (the start values are the answer for id -1)
            pf = f
            ps = -1
            if f >= 0:
                fk = np.uint64(f)
                j = _hm_find(FK, FV, fk, _fmix(_SEED, fk))
                if j >= 0:
                    ps = FV[j]
        out[i] = ps


@njit(cache=True, inline="always")
def _heapsort(a, b, n):
    """Sort a[:n] ascending, carrying b[:n] along."""
    for start in range(n // 2 - 1, -1, -1):
        _sift(a, b, start, n)
    for end in range(n - 1, 0, -1):
        a[0], a[end] = a[end], a[0]
        b[0], b[end] = b[end], b[0]
        _sift(a, b, 0, end)


@njit(cache=True, inline="always")
def _sift(a, b, root, n):
    while True:
        c = 2 * root + 1
        if c >= n:
            return
        if c + 1 < n and a[c + 1] > a[c]:
            c += 1
        if a[root] >= a[c]:
            return
        a[root], a[c] = a[c], a[root]
        b[root], b[c] = b[c], b[root]
        root = c


@njit(cache=True, inline="always")
def _hist_final(F, s, kind, headcol, HK, HV, EL, EC, EN, ST, WL, WC):
    """(p50, p99, max, total) of a histogram (nearest rank; -1 when empty), then free its entries."""
    n = 0
    e = F[s, headcol]
    while e >= 0:
        WL[n] = EL[e]
        WC[n] = EC[e]
        n += 1
        hkey = (np.uint64(s) << np.uint64(32)) | np.uint64(EL[e])
        if kind:
            hkey |= _SP_BIT
        j = _hm_find(HK, HV, hkey, _fmix(_SEED, hkey))
        HV[j] = TOMB
        nx = EN[e]
        EN[e] = ST[S_HFREE]
        ST[S_HFREE] = e
        ST[S_HFREE_N] += 1
        e = nx
    F[s, headcol] = -1
    if n == 0:
        return np.int64(-1), np.int64(-1), np.int64(-1), np.int64(0)
    _heapsort(WL, WC, n)
    total = np.int64(0)
    for q in range(n):
        total += WC[q]
    r50 = max(np.int64(1), np.int64(np.ceil(0.50 * total)))
    r99 = max(np.int64(1), np.int64(np.ceil(0.99 * total)))
    p50 = p99 = np.int64(-1)
    acc = np.int64(0)
    for q in range(n):
        acc += WC[q]
        if p50 < 0 and acc >= r50:
            p50 = WL[q]
        if acc >= r99:
            p99 = WL[q]
            break
    return p50, p99, WL[n - 1], total


@njit(cache=True, inline="always")
def _set_hold(F, FK, FV, held, value):
    """F_HOLD of the slots of the flow ids ``held`` (ids no longer in the table are skipped)."""
    for i in range(held.shape[0]):
        fk = np.uint64(held[i])
        j = _hm_find(FK, FV, fk, _fmix(_SEED, fk))
        if j >= 0:
            F[FV[j], F_HOLD] = value


@njit(cache=True, entry=True,
      sig=("i64, bool, bool, i64[::1], i64, i64[::1], i64[:, ::1], u64[:, ::1], i64[::1], u64[::1], i64[::1], "
           "u64[::1], i64[::1], i64[::1], i64[::1], i64[::1], i64[::1], i64[::1], i64[::1], i64[::1], i64[::1], "
           "i64[:, ::1], u64[:, ::1]"))
def expire_kernel(now, everything, full, held, hold_from, TO, F, KY, TAB, FK, FV, HK, HV, EL, EC, EN, FREE_, ZL, ST,
                  WL, WC, R, RK):
    """Write the rows of ended flows into R / RK (keys) and free their state; returns the number of rows.

    Ended: retired during the batch (ZL), or alive and ended by ``now``; ``everything``: every flow (end of the
    capture). Flows whose id is in ``held`` (GRO entries still held), and flows with a packet at frame
    ``hold_from`` or later (rows a later stage has not fed yet), wait for a later call. With ``full`` every slot
    is judged and ``TO[2]`` becomes the earliest deadline of the flows left alive (or an earlier one, which only
    brings the next full pass sooner); without, only the retired ones are (the caller knows no alive flow's
    deadline has passed: ``FlowTable.expire``)."""
    idle = TO[0]
    close = TO[1]
    cap = F.shape[0]
    _set_hold(F, FK, FV, held, 1)
    # mark first, free after: both directions of a connection are judged on the same facts
    k = 0
    nheld = 0  # the held zombies, kept at ZL[cap:]
    dmin = np.int64(_I64_MAX)  # with full: the earliest deadline of the flows left alive (or earlier)
    if full:
        for s in range(cap):
            st = F[s, F_STATE]
            if st == FREE:
                continue
            if F[s, F_HOLD] or F[s, F_LASTFRAME] >= hold_from:
                if st == ZOMBIE:
                    ZL[cap + nheld] = s
                    nheld += 1
                else:
                    dmin = min(dmin, _deadline(F, s, idle, close))
            elif st == ZOMBIE or everything:
                ZL[k] = s
                k += 1
            else:
                d = _deadline(F, s, idle, close)
                if now > d:
                    ZL[k] = s
                    k += 1
                elif d < dmin:
                    dmin = d
    else:
        for q in range(ST[S_NZOMB]):
            s = ZL[q]
            if F[s, F_HOLD] or F[s, F_LASTFRAME] >= hold_from:
                ZL[cap + nheld] = s
                nheld += 1
            else:
                ZL[k] = s  # (k <= q: the list is compacted in place)
                k += 1
    rows = 0
    for q in range(k):
        s = ZL[q]
        p50, p99, _, _ = _hist_final(F, s, 0, F_HHEAD, HK, HV, EL, EC, EN, ST, WL, WC)
        s50, s99, smax, spn = _hist_final(F, s, 1, F_SHEAD, HK, HV, EL, EC, EN, ST, WL, WC)
        R[rows, R_FID] = F[s, F_FID]
        R[rows, R_VER] = np.int64(KY[s, 0] >> np.uint64(32))
        R[rows, R_SPORT] = np.int64((KY[s, 0] >> np.uint64(16)) & np.uint64(0xFFFF))
        R[rows, R_DPORT] = np.int64(KY[s, 0] & np.uint64(0xFFFF))
        R[rows, R_FIRST] = F[s, F_FIRST]
        R[rows, R_TS0] = F[s, F_TS0]
        R[rows, R_TS1] = F[s, F_TS1]
        R[rows, R_PACKETS] = F[s, F_PACKETS]
        R[rows, R_PAYLOAD] = F[s, F_PAYLOAD]
        R[rows, R_WIRE] = F[s, F_WIRE]
        R[rows, R_BIG] = F[s, F_BIG]
        R[rows, R_MAXP] = F[s, F_MAXP]
        R[rows, R_MSS] = F[s, F_MSS]
        R[rows, R_P50] = p50
        R[rows, R_P99] = p99
        R[rows, R_SP] = spn
        R[rows, R_S50] = s50
        R[rows, R_S99] = s99
        R[rows, R_SMAX] = smax
        R[rows, R_RETRANS] = F[s, F_RETRANS]
        R[rows, R_OOO] = F[s, F_OOO]
        R[rows, R_GAP] = F[s, F_GAP]
        R[rows, R_FINRST] = F[s, F_FINRST]
        R[rows, R_CUT_EV] = F[s, F_CUT_EV]
        R[rows, R_CUT_GU] = F[s, F_CUT_GU]
        R[rows, R_IFID] = np.int64(KY[s, 6] >> _P_IF)
        R[rows, R_DIR] = np.int64((KY[s, 6] >> _P_DIR) & _P_DIRS)
        R[rows, R_IFINDEX] = np.int64(KY[s, 6] & _P_IFX)
        for c in range(5):
            RK[rows, c] = KY[s, c]
        rows += 1
        fk = np.uint64(F[s, F_FID])
        j = _hm_find(FK, FV, fk, _fmix(_SEED, fk))
        FV[j] = TOMB
        if F[s, F_STATE] == ALIVE:
            _tab_remove(TAB, KY, s)
            ST[S_ALIVE] -= 1
    for q in range(k):  # unlink and free only now: a reverse direction may be among them
        s = ZL[q]
        r = F[s, F_REV]
        if r >= 0 and F[r, F_REV] == s:
            F[r, F_REV] = -1
            if full and F[r, F_STATE] == ALIVE:  # its deadline is its own now (the one above stays: dmin is
                dmin = min(dmin, _deadline(F, r, idle, close))  # then early, which only brings a full pass sooner)
        F[s, F_STATE] = FREE
        FREE_[ST[S_FREE_TOP]] = s
        ST[S_FREE_TOP] += 1
    if full:
        TO[2] = dmin
    # zombies that were held: list them again
    for q in range(nheld):
        ZL[q] = ZL[cap + q]
    _set_hold(F, FK, FV, held, 0)
    ST[S_NZOMB] = nheld
    return rows


@njit(cache=True, entry=True,
      sig="i64[::1], u8[:, ::1], u8[::1], i32[::1]")
def format_addresses(ver, A, out, offs):
    """Text of each address (IPv4 dotted quad, IPv6 as Python's ``ipaddress`` writes it: RFC 5952, lower-case
    hex, the first longest run of 2+ zero groups as ``::``) into ``out`` (bytes), ``offs`` (n + 1 offsets)."""
    p = 0
    offs[0] = 0
    for i in range(ver.shape[0]):
        if ver[i] == 4:
            for b in range(4):
                v = np.int64(A[i, b])
                if b:
                    out[p] = 46  # '.'
                    p += 1
                if v >= 100:
                    out[p] = 48 + v // 100
                    p += 1
                if v >= 10:
                    out[p] = 48 + (v // 10) % 10
                    p += 1
                out[p] = 48 + v % 10
                p += 1
        else:
            best, blen, cur, clen = -1, 0, -1, 0
            for g in range(8):
                if A[i, 2 * g] == 0 and A[i, 2 * g + 1] == 0:
                    if cur < 0:
                        cur = g
                    clen += 1
                    if clen > blen:
                        best, blen = cur, clen
                else:
                    cur, clen = -1, 0
            if blen < 2:
                best = -1
            g = 0
            while g < 8:
                if g == best:
                    out[p] = 58
                    out[p + 1] = 58
                    p += 2
                    g += blen
                    continue
                if g and g != best + blen or (g and best < 0):
                    out[p] = 58  # ':'
                    p += 1
                v = (np.int64(A[i, 2 * g]) << 8) | np.int64(A[i, 2 * g + 1])
                started = False
                for sh in (12, 8, 4, 0):
                    d = (v >> sh) & 15
                    if d or started or sh == 0:
                        out[p] = 48 + d if d < 10 else 87 + d
                        p += 1
                        started = True
                g += 1
        offs[i + 1] = p


@njit(cache=True, inline="always")
def _address_index(TAB, U, u, v, w0, w1):
    """Index of address (v, w0, w1) among the distinct ones in U (added as index ``u`` when new)."""
    m = TAB.shape[0] - 1
    j = np.int64(_fmix(_fmix(_fmix(_SEED, v), w0), w1) & np.uint64(m))
    while True:
        e = TAB[j]
        if e < 0:
            TAB[j] = u
            U[u, 0], U[u, 1], U[u, 2] = v, w0, w1
            return u
        if U[e, 1] == w0 and U[e, 2] == w1 and U[e, 0] == v:
            return e
        j = (j + 1) & m


@njit(cache=True, entry=True, sig="i64[::1], u64[:, ::1], i64[::1], i32[::1], i32[::1], u64[:, ::1]")
def address_rows(slots, KY, TAB, SI, DI, U):
    """Per row, its flow's source and destination address (the flow in slot ``slots[i]``; -1: not in memory) as
    an index into the distinct addresses of the rows (U: version, two words; first appearance first), -1 where
    the flow is not in memory. TAB: scratch, a power of two >= 4 rows. Returns how many distinct addresses U
    holds. One pass, no sort (``row_addresses``)."""
    TAB[:] = -1
    u = np.int64(0)
    pslot = np.int64(-1)
    ps = pd = np.int32(-1)
    for i in range(slots.shape[0]):
        s = slots[i]
        if s != pslot:  # (the start values are the answer for slot -1)
            pslot = s
            ps = pd = np.int32(-1)
            if s >= 0:
                v = KY[s, 0] >> np.uint64(32)
                a = _address_index(TAB, U, u, v, KY[s, 1], KY[s, 2])
                if a == u:
                    u += 1
                b = _address_index(TAB, U, u, v, KY[s, 3], KY[s, 4])
                if b == u:
                    u += 1
                ps, pd = np.int32(a), np.int32(b)
        SI[i] = ps
        DI[i] = pd
    return u


def address_strings(ver: np.ndarray, words: np.ndarray) -> pa.Array:
    """Arrow string array of addresses from versions and (n, 2) uint64 address words (the decoder's bytes)."""
    n = int(ver.shape[0])
    A = np.ascontiguousarray(words, np.uint64).view(np.uint8).reshape(n, 16)
    out = np.empty(max(n, 1) * 40, np.uint8)
    offs = np.empty(n + 1, np.int32)
    format_addresses(np.ascontiguousarray(ver, np.int64), A, out, offs)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offs), pa.py_buffer(out[: int(offs[-1])].copy()))


class FlowTable:
    """Assigns ``flow_id`` to TCP packets, accumulates per-flow columns and hands out the rows of ended flows."""

    def __init__(self, idle_timeout_ns: int = IDLE_TIMEOUT_NS, close_timeout_ns: int = CLOSE_TIMEOUT_NS) -> None:
        if idle_timeout_ns <= 0 or close_timeout_ns <= 0:
            raise ValueError("flow timeouts must be > 0 ns")
        self.idle_timeout_ns = int(idle_timeout_ns)
        self.close_timeout_ns = int(close_timeout_ns)
        # idle and close timeouts, and (TO[2]) the earliest deadline of the flows alive at the last full judging
        self._TO = np.array([self.idle_timeout_ns, self.close_timeout_ns, -1], np.int64)
        self._tmin = None  # the earliest packet time since then (None: none)
        self.ST = np.zeros(NST, np.int64)
        self.F = np.zeros((0, NF), np.int64)
        self.KY = np.zeros((0, NKY), np.uint64)
        self.H = np.zeros((0, MAX_HOLES, 2), np.int64)
        self.FREE = np.zeros(0, np.int64)
        self.ZL = np.zeros(0, np.int64)
        self._grow_slots(1024)
        self.TAB = np.full(2048, -1, np.int64)
        self.FK, self.FV = np.zeros(2048, np.uint64), np.full(2048, -1, np.int64)
        self.HK, self.HV = np.zeros(4096, np.uint64), np.full(4096, -1, np.int64)
        self.EL = self.EC = self.EN = np.zeros(0, np.int64)
        self._grow_pool(2048)
        self._R = np.zeros((0, NR), np.int64)
        self._RK = np.zeros((0, 5), np.uint64)

    # --- capacity (Python, per batch; never per flow) ------------------------------------------------------
    def _grow_slots(self, cap: int) -> None:
        old = self.F.shape[0]
        if cap <= old:
            return
        F = table_full((cap, NF), 0, np.int64)
        F[:old] = self.F
        KY = table_full((cap, NKY), 0, np.uint64)
        KY[:old] = self.KY
        # holes are read only below a slot's F_NHOLES: only slots with holes are copied (the rest of the new
        # table stays unmapped until a flow there has a hole)
        H = lazy_zeros((cap, MAX_HOLES, 2), np.int64)
        with_holes = np.flatnonzero(self.F[:, F_NHOLES] > 0)
        H[with_holes] = self.H[with_holes]
        FREE_ = table_full(cap, 0, np.int64)
        top = int(self.ST[S_FREE_TOP])
        FREE_[:top] = self.FREE[:top]
        FREE_[top: top + cap - old] = np.arange(cap - 1, old - 1, -1)  # new slots, lowest popped first
        ZL = table_full(2 * cap, 0, np.int64)
        ZL[: self.ZL.shape[0]] = self.ZL
        self.F, self.KY, self.H, self.FREE, self.ZL = F, KY, H, FREE_, ZL
        self.ST[S_FREE_TOP] = top + cap - old

    def _grow_pool(self, cap: int) -> None:
        old = self.EL.shape[0]
        if cap <= old:
            return
        new = []
        for a in (self.EL, self.EC, self.EN):
            b = table_full(cap, 0, np.int64)
            b[:old] = a
            new.append(b)
        self.EL, self.EC, self.EN = new
        self._WL, self._WC = table_full(cap, 0, np.int64), table_full(cap, 0, np.int64)

    @staticmethod
    def _room(K: np.ndarray | None, V: np.ndarray, fill: int, live: int, more: int, KY: np.ndarray | None = None):
        """(K, V) with room for ``more`` inserts at most half full, rebuilt without tombstones when needed: at
        least 3 slots per live key and insert (a third full, so the half-full mark is at least half the live
        keys away: rebuilds stay amortised O(1), and the table is not twice the size that needs). ``K`` None: V
        is a key table (entries index ``KY``, whose digests place them).

        A table that only its tombstones filled (a steady flow count: every few batches) is rebuilt in place
        from a compact copy of its live entries: a new table beside the old one stacked both (the 512k-slot
        histogram map: 8 MiB) on top of the run's memory each time."""
        if 2 * (fill + more) <= V.shape[0]:
            return K, V, fill
        size = V.shape[0]
        while size < 3 * (live + more):
            size *= 2
        if size == V.shape[0]:
            keep = V >= 0
            Vc, Kc, K2 = V[keep], None if K is None else K[keep], K  # (K is read only where V is live)
        else:
            Kc, Vc = K, V
            K2 = None if K is None else table_full(size, 0, np.uint64)
        V2 = table_full(size, EMPTY, np.int64, reuse=V)
        if K is None:
            rehash_keys(Vc, KY, V2)
        else:
            rehash_map(Kc, Vc, K2, V2)
        return K2, V2, live

    def _reserve(self, flows: int, entries: int) -> None:
        ST = self.ST
        if ST[S_FREE_TOP] < flows:
            self._grow_slots(max(2 * self.F.shape[0], self.F.shape[0] + flows))
        live = self.F.shape[0] - int(ST[S_FREE_TOP])
        if 2 * (int(ST[S_TAB_FILL]) + flows) > self.TAB.shape[0]:
            _, self.TAB, _ = self._room(None, self.TAB, int(ST[S_TAB_FILL]), live, flows, self.KY)
            ST[S_TAB_FILL] = int(ST[S_ALIVE])
        self.FK, self.FV, ST[S_FM_FILL] = self._room(self.FK, self.FV, int(ST[S_FM_FILL]), live, flows)
        used = int(ST[S_HTOP]) - int(ST[S_HFREE_N])
        if self.EL.shape[0] - int(ST[S_HTOP]) + int(ST[S_HFREE_N]) < entries:
            self._grow_pool(max(2 * self.EL.shape[0], int(ST[S_HTOP]) + entries))
        self.HK, self.HV, ST[S_HTAB_FILL] = self._room(self.HK, self.HV, int(ST[S_HTAB_FILL]), used, entries)

    # --- the pipeline ------------------------------------------------------------------------------------------
    NEW_FLOWS_STEP = 4096  # new flows made room for at a time (at least; a quarter of those alive when more)

    def __len__(self) -> int:
        """Flows seen so far (rows written and alive)."""
        return int(self.ST[S_NEXT_ID])

    @property
    def alive(self) -> int:
        """Flows in memory (alive, or ended with their row not yet written)."""
        return self.F.shape[0] - int(self.ST[S_FREE_TOP])

    def assign(self, pb: PacketBatch) -> np.ndarray:
        """flow_id per row (int64), -1 for packets that are not TCP with readable ports, and every per-flow
        column updated. Ids are given in order of first appearance."""
        n = len(pb)
        fid = np.empty(n, np.int64)
        if n:
            t = int(pb.ts_ns.min())
            self._tmin = t if self._tmin is None else min(self._tmin, t)
        # a TCP header cut by the snaplen counts when its 20 fixed bytes are there (ports, sequence numbers, data
        # offset: the payload length): only options missing is a headers-only capture, not a lost packet
        tcp = (pb.l4_proto == 6) & (pb.l4_off >= 0) & (pb.ip_version > 0) & (
            ((pb.status & ST_TRUNC_L4) == 0) | (pb.caplen.astype(np.int64) >= pb.l4_off.astype(np.int64) + 20))
        src = np.ascontiguousarray(pb.src).view(np.uint64)  # (n, 2) words
        dst = np.ascontiguousarray(pb.dst).view(np.uint64)
        i = 0
        while i < n:  # room for new flows in steps (not one per row up front: memory follows the flows)
            room = min(n - i, max(self.NEW_FLOWS_STEP, self.alive // 4))
            self._reserve(room, n - i)
            i = int(flow_kernel(pb.ip_version, src, dst, pb.sport, pb.dport, tcp, pb.tcp_payload_len, pb.wirelen,
                                pb.bigtcp, pb.ts_ns, pb.frame, pb.tcp_flags, pb.tcp_mss, pb.tcp_seq, pb.if_gid,
                                pb.ifindex, pb.direction, self._TO, self.F,
                                self.KY, self.H, self.TAB, self.FK, self.FV, self.HK, self.HV, self.EL, self.EC,
                                self.EN, self.FREE, self.ZL, self.ST, fid, i, room))
        return fid

    def release(self) -> None:
        """After ``expire(everything=True)`` (every row written): shrink the emptied table to its starting size;
        ``len`` (the flows seen) stays."""
        seen = len(self)
        self.__init__(self.idle_timeout_ns, self.close_timeout_ns)
        self.ST[S_NEXT_ID] = seen

    def add_superpackets(self, flow_id: np.ndarray, payload_len: np.ndarray, poll_end: np.ndarray | None = None,
                         slots: np.ndarray | None = None) -> None:
        """Count rebuilt super-packets (GRO rows) toward their flows' super-packet columns; ``poll_end`` (the rows'
        codes, gro/reasons.py) counts those whose end was an evidenced or a guessed poll end. ``slots``: the rows'
        ``slots(flow_id)``, when the caller has them already."""
        from ..gro.reasons import POLL_END_CUT  # (the gro package imports this module)

        slots = self.slots(flow_id) if slots is None else slots
        cut = (POLL_END_CUT[np.asarray(poll_end, np.intp)] if poll_end is not None
               else np.zeros(slots.shape[0], np.uint8))
        self._reserve(0, slots.shape[0])
        superpackets_kernel(slots, np.ascontiguousarray(payload_len, np.int64), np.ascontiguousarray(cut, np.uint8),
                            self.F, self.HK, self.HV, self.EL, self.EC, self.EN, self.ST)

    def slots(self, flow_id: np.ndarray) -> np.ndarray:
        """Slot per flow id of flows still in memory, -1 for the others (valid until the next ``assign`` or
        ``expire``): what ``add_superpackets`` and ``row_addresses`` read, looked up once for both."""
        fids = np.ascontiguousarray(flow_id, np.int64)
        slots = np.empty(fids.shape[0], np.int64)
        slots_kernel(fids, self.FK, self.FV, slots)
        return slots

    def in_memory(self, flow_id: np.ndarray) -> np.ndarray:
        """Per flow id: is the flow still in memory (alive, or ended with its row not yet written)?"""
        return self.slots(flow_id) >= 0

    def _key_rows(self, flow_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(KY rows, known) per flow id: the key words of flows still in memory (row 0's for the others)."""
        slots = self.slots(flow_id)
        known = slots >= 0
        return self.KY[np.where(known, slots, 0)], known

    def row_addresses(self, flow_id: np.ndarray, slots: np.ndarray | None = None
                      ) -> tuple[pa.DictionaryArray, pa.DictionaryArray]:
        """Source and destination address per row (flow id) as dictionary columns: each distinct address of the
        rows written once as text, an int32 index per row; null where the flow is not in memory (or the id is
        -1). For per-row tables (superpackets, egress); the flows must still be in memory. ``slots``: the rows'
        ``slots(flow_id)``, when the caller has them already."""
        slots = self.slots(flow_id) if slots is None else slots
        n = slots.shape[0]
        si, di = np.empty(n, np.int32), np.empty(n, np.int32)
        u_rows = np.empty((2 * n, 3), np.uint64)
        tab = np.empty(1 << max(4, (4 * n).bit_length()), np.int64)
        u = int(address_rows(slots, self.KY, tab, si, di, u_rows))
        text = address_strings(u_rows[:u, 0].astype(np.int64), u_rows[:u, 1:3])
        return tuple(pa.DictionaryArray.from_arrays(array(x, pa.int32(), x < 0), text) for x in (si, di))

    def keys(self, flow_id: np.ndarray) -> list[tuple[str, str, int, int, int] | None]:
        """(src, dst, sport, dport, ip_version) per flow id of flows still in memory (None for the others); for
        summaries of a few flows, not for per-row columns."""
        ky, known = self._key_rows(flow_id)
        ver = (ky[:, 0] >> np.uint64(32)).astype(np.int64)
        src = address_strings(ver, ky[:, 1:3]).to_pylist()
        dst = address_strings(ver, ky[:, 3:5]).to_pylist()
        sport = ((ky[:, 0] >> np.uint64(16)) & np.uint64(0xFFFF)).astype(np.int64).tolist()
        dport = (ky[:, 0] & np.uint64(0xFFFF)).astype(np.int64).tolist()
        return [(src[i], dst[i], sport[i], dport[i], int(ver[i])) if known[i] else None for i in range(len(src))]

    def points(self, flow_id: np.ndarray) -> list[tuple[int, int, int] | None]:
        """(if_id, ifindex, direction) per flow id of flows still in memory (None for the others): the capture
        point of ``point``, for summaries of a few flows."""
        ky, known = self._key_rows(flow_id)
        p = ky[:, 6]
        if_id, ifindex, direction = (p >> _P_IF).tolist(), (p & _P_IFX).tolist(), ((p >> _P_DIR) & _P_DIRS).tolist()
        return [(if_id[i], ifindex[i], direction[i]) if known[i] else None for i in range(p.shape[0])]

    def expire(self, now_ns: int, held_flow_ids: np.ndarray | None = None, everything: bool = False,
               hold_from_frame: int | None = None) -> dict | None:
        """Columns (flows table) of the flows that ended by ``now_ns`` (all with ``everything``), sorted by
        flow_id, their state freed; None when there are none. ``held_flow_ids``: flows with a GRO entry still
        held, kept for a later call; ``hold_from_frame``: flows with a packet at this frame or later are kept
        too (their rows wait in a later stage: the ACK evidence's lookahead)."""
        cap = self.F.shape[0]
        if self._R.shape[0] < cap:  # sized for every flow ending at once; resident only as far as rows are written
            self._R = lazy_zeros((cap, NR), np.int64)
            self._RK = lazy_zeros((cap, 5), np.uint64)
        held = np.zeros(0, np.int64) if held_flow_ids is None else np.ascontiguousarray(held_flow_ids, np.int64)
        hold_from = np.int64(np.iinfo(np.int64).max if hold_from_frame is None else hold_from_frame)
        # Every alive slot is judged only when one may have ended: after the earliest deadline of the last full
        # judging, or of a packet since (its flow's deadline is at least its time plus the shorter timeout;
        # packet times may go backwards). Otherwise only the retired flows are written (no pass over every slot).
        soon = int(self._TO[2])
        if self._tmin is not None:
            soon = min(soon, self._tmin + min(self.idle_timeout_ns, self.close_timeout_ns))
        full = everything or soon < 0 or now_ns > soon
        if full:
            self._tmin = None
        k = expire_kernel(np.int64(now_ns), everything, full, held, hold_from, self._TO, self.F, self.KY,
                          self.TAB, self.FK, self.FV, self.HK, self.HV, self.EL, self.EC, self.EN, self.FREE,
                          self.ZL, self.ST, self._WL, self._WC, self._R, self._RK)
        if not k:
            return None
        order = np.argsort(self._R[:k, R_FID], kind="stable")
        R, RK = self._R[order], self._RK[order]
        ver = R[:, R_VER]

        def nullable(col: int, t: pa.DataType) -> pa.Array:
            v = R[:, col]
            return array(np.where(v < 0, 0, v), t, v < 0)

        return {
            "flow_id": R[:, R_FID], "ip_version": ver.astype(np.uint8),
            "src": address_strings(ver, RK[:, 1:3]), "dst": address_strings(ver, RK[:, 3:5]),
            "sport": R[:, R_SPORT].astype(np.uint16), "dport": R[:, R_DPORT].astype(np.uint16),
            "if_id": R[:, R_IFID].astype(np.uint32),
            "ifindex": array(R[:, R_IFINDEX].astype(np.uint32), pa.uint32(), R[:, R_IFINDEX] == 0),
            "direction": array(R[:, R_DIR].astype(np.uint8), pa.uint8(), R[:, R_DIR] == 0),
            "first_frame": R[:, R_FIRST].astype(np.uint64),
            "ts_first_ns": R[:, R_TS0].view("datetime64[ns]"), "ts_last_ns": R[:, R_TS1].view("datetime64[ns]"),
            "packets": R[:, R_PACKETS].astype(np.uint64), "payload_bytes": R[:, R_PAYLOAD].astype(np.uint64),
            "wire_bytes": R[:, R_WIRE].astype(np.uint64), "bigtcp_packets": R[:, R_BIG].astype(np.uint64),
            "max_payload_len": R[:, R_MAXP].astype(np.uint32),
            "mss": array(R[:, R_MSS].astype(np.uint16), pa.uint16(), R[:, R_MSS] == 0),
            "p50_payload_len": nullable(R_P50, pa.uint32()), "p99_payload_len": nullable(R_P99, pa.uint32()),
            "superpackets": R[:, R_SP].astype(np.uint64),
            "p50_superpacket_len": nullable(R_S50, pa.uint32()), "p99_superpacket_len": nullable(R_S99, pa.uint32()),
            "max_superpacket_len": nullable(R_SMAX, pa.uint32()),
            "retransmissions": R[:, R_RETRANS].astype(np.uint64), "out_of_order": R[:, R_OOO].astype(np.uint64),
            "capture_gap_bytes": R[:, R_GAP].astype(np.uint64),
            "poll_ends_evidenced": R[:, R_CUT_EV].astype(np.uint64),
            "poll_ends_guessed": R[:, R_CUT_GU].astype(np.uint64),
            FINRST: R[:, R_FINRST].astype(np.uint8),  # not a flows column: what a split run's merge needs
            IFINDEX: R[:, R_IFINDEX],
        }
