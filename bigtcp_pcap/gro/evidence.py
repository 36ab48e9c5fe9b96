"""Poll evidence from the capture itself: which data segments the other side ACKed exactly at their end.

gro-spec 7.1: the NAPI poll boundaries are what a capture does not record, and the timestamp gap rule only
guesses them. But a capture that holds both directions (a sender's own interface, a mirror port) shows the
receiver's ACKs, and an ACK can only acknowledge up to the end of a packet the receiving stack was handed:
with GRO on, the end of a super-packet. So a data segment whose end (seq + payload, mod 2**32) comes back as
an acknowledgment number marks the end of a super-packet. When no GRO rule ended the super-packet there, the
NAPI poll did: the engine ends the poll after that segment (``rules.acked_end_ends_poll``; before the flow's next
segment when other flows' packets come between, ``rules.acked_end_poll_waits``), and the rows it completes are
marked ``poll_end = ack`` (evidenced) instead of ``gap`` (guessed).

``AckEvidence`` is a streaming stage with a lookahead of ``WINDOW`` rows: a batch's flags are decided once
that many later rows (or the end of the capture) have been seen, since the ACK for a segment near the end of
a batch comes in a later one. Only ACKs that follow the segment, by at most ``WINDOW`` rows, count (an older ACK
with the same number, before a retransmission, says nothing about this copy), so the flags do not depend on
where batches begin.

The same ACK stream shows when the receiver was still busy: an ACK that does not yet cover a data segment, sent
after the next packet of the receiver's queue had arrived, means the stack had not been handed that segment
then, so the NAPI poll that took it was still running and an idle gap before the next packet did not end it
(``rules.busy_poll_continues``). ``evidence_scan`` gives each data segment the time of the latest such ACK, less
the shortest ACK lag its flow direction has shown, which bounds the round trip between the capture point and
the receiver (``busy``: when the receiver sent that ACK at the latest; 0 when none). Such ACKs are of the
reverse direction, advance the acknowledged number, carry no SACK block (a SACK or duplicate ACK says a segment
is missing, not that the receiver is busy), come at most ``WINDOW`` rows and ``BUSY_MAX_NS`` after the segment
and do not cover its end. Retransmitted or reordered segments (an end not after the flow's last one) get none.
Between two such ACKs the receiver's backlog is estimated where both show it well behind: with each ACK's delay
(its time, less the shortest lag, less the arrival of the last segment it covers), the wait is the smaller delay
less ``BEHIND_MARGIN_NS`` (the ACK's own way, the stack's processing); when that is more than ``BEHIND_NS``, the
two delays agree within a factor of two and the ACKs are at most ``BEHIND_SPAN_NS`` apart, each segment the
second one covers is taken to have waited that long after it arrived, and its busy time is at least that (never
past the second ACK). A receiver that is behind runs full polls back to back across the sender's gaps, and one
flow's ACKs come every few hundred microseconds there (README, "What the mixed pairs' misses are").
The receiver's SACKs also show segments that reached it after later data (``move``: fed where it got them) and
segments that never reached it (``LOST``: sent again after the SACKs showed the hole; left out of the rebuild).
Sans-IO: batches in, flagged batches out, the window held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._native import njit, prefetch
from ..buffers import lazy_zeros
from ..decode.schema import TH_ACK, PacketBatch
from ..flows.table import EMPTY, _digest, _fmix, point, reverse_point

_U32 = np.uint64(0xFFFFFFFF)
_NO_KEY = np.uint64(0)  # no ACK key is known absent (an ACK key whose digest is 0 is then not looked up: 2**-64)

# a slot of the acked-ends table T: TW int64 in a row (one cache line for a probe), the key (its 64-bit digest,
# bit for bit), the latest row with that key (EMPTY: a free slot), the latest row already judged, padding
T_KEY, T_ROW, T_JUDGED, TW = 0, 1, 2, 4

@njit(cache=True, inline="always")
def _find(T, k, base, tmask):
    """Index of key ``k`` (its own hash) in the table at ``base`` (``tmask + 1`` slots) of T, or ``-2 - s``
    where ``s`` is the empty slot that ended the search (where it would go)."""
    j = np.int64(k & np.uint64(tmask))
    kk = np.int64(k)
    while True:
        v = T[(base + j) * TW + T_ROW]
        if v == EMPTY:
            return -2 - (base + j)
        if T[(base + j) * TW + T_KEY] == kk:
            return base + j
        j = (j + 1) & tmask


@njit(cache=True, inline="always")
def _directions(v, s0, s1, d0, d1, sp, dp, p):
    """The digests of a packet's flow direction and of the reverse one at capture point ``p`` (as the flow table
    digests its keys: the reverse direction's ACKs count where they were captured, beside the data)."""
    vw = np.uint64(v) << np.uint64(32)
    return (_digest(vw | (np.uint64(sp) << np.uint64(16)) | np.uint64(dp), s0, s1, d0, d1, p),
            _digest(vw | (np.uint64(dp) << np.uint64(16)) | np.uint64(sp), d0, d1, s0, s1, reverse_point(p)))


@njit(cache=True, inline="always")
def _seq_after(a, b):
    """a comes after b in 32-bit sequence space (RFC 1982 style: a != b and a - b < 2**31)."""
    d = (a - b) & np.int64(0xFFFFFFFF)
    return d != 0 and d < np.int64(0x80000000)


@njit(cache=True, inline="always")
def _conn(CK, CU, CI, CS, BST, k, here, other, tmask, insert):
    """Row of CS of direction key ``k`` in this generation (its table at ``here``), moved over from the
    previous generation's (at ``other``) when only that one has it, or a new one (``insert``); -1 when absent.
    A row last used before the capture's latest long silence (``RESET_GAP_NS``; its epoch, BST[ST_EPOCH]) is as
    absent: -1, or (``insert``) it starts afresh.

    CS rows are dense per generation (the next free one: BST[1 + parity]; the table slot's CI names it), so
    a generation writes as many rows as it has directions, not rows spread over the whole table."""
    j = np.int64(k & np.uint64(tmask))
    while CU[here + j] != 0:
        if CK[here + j] == k:
            e = CI[here + j]
            if CS[e, CS_EPOCH] != BST[ST_EPOCH]:
                if not insert:
                    return -1
                _fresh(CS, e, BST[ST_EPOCH])
            return e
        j = (j + 1) & tmask
    slot = here + j
    o = np.int64(k & np.uint64(tmask))
    while CU[other + o] != 0:
        if CK[other + o] == k:
            if not insert and CS[CI[other + o], CS_EPOCH] != BST[ST_EPOCH]:
                return -1
            e = _new_row(CK, CU, CI, BST, slot, k, here)
            for c in range(CS.shape[1]):
                CS[e, c] = CS[CI[other + o], c]
            if CS[e, CS_EPOCH] != BST[ST_EPOCH]:
                _fresh(CS, e, BST[ST_EPOCH])
            return e
        o = (o + 1) & tmask
    if not insert:
        return -1
    e = _new_row(CK, CU, CI, BST, slot, k, here)
    _fresh(CS, e, BST[ST_EPOCH])
    return e


@njit(cache=True, inline="always")
def _fresh(CS, e, epoch):
    """CS row e as a direction with no history (of epoch ``epoch``): its waiting segments, if any, are forgotten
    (a pending late mark reads as none when its row is taken, a lost one stays lost)."""
    for c in range(CS.shape[1]):
        CS[e, c] = -1
    CS[e, CS_NMISS] = 0
    CS[e, CS_NLOST] = 0
    CS[e, CS_EPOCH] = epoch


@njit(cache=True, inline="always")
def _new_row(CK, CU, CI, BST, slot, k, here):
    """Key k goes in table slot ``slot`` of the generation at ``here`` with the generation's next CS row."""
    p = np.int64(1) if here else np.int64(0)
    e = here + BST[1 + p]
    BST[1 + p] += 1
    CK[slot], CU[slot], CI[slot] = k, 1, e
    return e


# the busy evidence's per-direction state (columns of CS): the waiting segments' first and last row, the last
# acknowledgment number taken, the last segment taken (its end and row), how many waiting segments a SACK
# marked missing, the shortest ACK lag seen (-1: none yet), the time of the direction's last segment, how many
# waiting segments are marked lost, and of the last advancing ACK without SACK (``_backlog``): when the receiver
# sent it, the arrival and the row of the last segment it covered
CS_HEAD, CS_TAIL, CS_ACK, CS_END, CS_ROW, CS_NMISS, CS_LAG, CS_LAST_T, CS_NLOST, CS_PT, CS_PA, CS_PR, CS_EPOCH = \
    range(13)
NCS = CS_EPOCH + 1  # CS's columns
# the scan's state (ST): the generation of the last row, the CS rows each parity's generation has used, the
# latest timestamp so far, the first row and the number of the current epoch (rows after the latest silence of
# the whole capture longer than RESET_GAP_NS)
ST_GEN, ST_USED0, ST_USED1, ST_TMAX, ST_EROW, ST_EPOCH = range(6)
RESET_GAP_NS = 200_000_000
"""A silence of the whole capture longer than this (Linux's TCP_DELACK_MAX, the longest an ACK waits) ends every
piece of evidence: an ACK after it is no evidence for data before it, and each direction's state starts afresh.
So what the evidence says after such a gap does not depend on what came before it, and a capture cut there
(``split.py``) gives each part the serial run's evidence."""
BEHIND_NS = 50_000
"""The backlog estimate's threshold: the wait both ACKs show is more than this (``_backlog``)."""
BEHIND_MARGIN_NS = 30_000
"""Taken off the smaller of the two delays: the part of an ACK's delay that is not the receiver's backlog (its
way back, the stack's processing; an ACK's delay measured 95 us where the receiver capture showed 62)."""
BEHIND_SPAN_NS = 1_000_000
"""The two ACKs at most this far apart (a receiver can catch up and fall behind again between ACKs further
apart)."""
PENDING = np.int64(-2)  # MOVE of a segment marked missing whose ACK has not come yet
LOST = np.int64(-3)  # MOVE of a segment marked missing and then sent again: it never reached the receiver
NLQ = 64  # the recent lost rows kept for a D-SACK to find (LQ: their rows and, at NLQ, how many were kept)


@njit(cache=True, inline="always")
def _drop(CS, MOVE, e, h, rmask):
    """A waiting segment leaves the direction's list uncovered by the evidence: a pending late mark lapses, a lost
    one stays lost."""
    if MOVE[h & rmask] == PENDING:
        MOVE[h & rmask] = -1
        CS[e, CS_NMISS] -= 1
    elif MOVE[h & rmask] == LOST:
        CS[e, CS_NLOST] -= 1


@njit(cache=True, inline="always")
def _expire(CS, NXT, MOVE, e, r, window, rmask):
    """Forget the direction's waiting segments more than ``window`` rows before row r."""
    if CS[e, CS_TAIL] >= 0 and r - CS[e, CS_TAIL] > window:
        CS[e, CS_HEAD] = -1  # all of them (their pending marks read as none when the rows are taken)
        CS[e, CS_TAIL] = -1
        CS[e, CS_NMISS] = 0
        CS[e, CS_NLOST] = 0
    h = CS[e, CS_HEAD]
    while h >= 0 and r - h > window:
        _drop(CS, MOVE, e, h, rmask)
        h = NXT[h & rmask]
    CS[e, CS_HEAD] = h
    if h < 0:
        CS[e, CS_TAIL] = -1


@njit(cache=True, inline="always")
def _backlog(CS, e, s2, newest, h0, NXT, TSR, BUSY, rmask):
    """An advancing ACK without SACK, sent at ``s2``, covers the waiting segments from ``h0`` to ``newest``. When
    it and the previous such ACK both show the receiver well behind (module doc), the segments after the previous
    one's last get busy times of their arrival plus the wait (the smaller delay less ``BEHIND_MARGIN_NS``), at
    most ``s2``. Then this ACK becomes the previous one."""
    s1 = CS[e, CS_PT]
    p1 = CS[e, CS_PR]
    d1 = s1 - CS[e, CS_PA]
    d2 = s2 - TSR[newest & rmask]
    lo = min(d1, d2)
    wait = lo - BEHIND_MARGIN_NS
    if s1 >= 0 and s2 > s1 and s2 - s1 <= BEHIND_SPAN_NS and newest > p1 and wait > BEHIND_NS \
            and 2 * lo >= max(d1, d2):
        x = h0
        while x >= 0:
            if x > p1:
                BUSY[x & rmask] = max(BUSY[x & rmask], min(TSR[x & rmask] + wait, s2))
            if x == newest:
                break
            x = NXT[x & rmask]
    CS[e, CS_PT] = s2
    CS[e, CS_PA] = TSR[newest & rmask]
    CS[e, CS_PR] = newest


@njit(cache=True, inline="always")
def _flag_chain(T, FLAG, PREV, k, here, size, tmask, r, window, rmask, erow):
    """An ACKed end's key ``k``: flag every row of its chains (this generation's table at ``here``, then the
    previous one's) not judged yet, at most ``window`` rows back and not before row ``erow`` (the epoch's first);
    mark them judged. True when either table held the key for such a row."""
    hit = False
    for base in (here, size - here):
        j = _find(T, k, base, tmask)
        if j >= 0 and T[j * TW + T_ROW] >= erow:
            hit = True
            x, stop, lo = T[j * TW + T_ROW], T[j * TW + T_JUDGED], max(r - window, erow)
            while x > stop and x >= lo:
                FLAG[x & rmask] = 1
                x = PREV[x & rmask]
            T[j * TW + T_JUDGED] = T[j * TW + T_ROW]
    return hit


AHEAD = 8  # rows between a row's digests and prefetches and its turn in ``evidence_scan`` (a ring of 16 in DG)


@njit(cache=True, inline="always")
def _ahead(ia, ver, proto, l4_off, plen, flags, seq, ack, sport, dport, src, dst, ifid, ifx, pdir, row0, gshift,
           size, tmask, T, CK, CU, CI, DG):
    """Row ``ia``'s two direction digests into DG (ring slot ``ia & 15``: forward, reverse, 1 when it is a TCP
    row the scan looks at), and a prefetch of the table slots its turn will probe: the scan reaches it
    ``AHEAD`` rows later, and by then the cache misses of those random slots have overlapped the rows in
    between instead of stalling each one in turn (most of the scan's time was the miss on its segment-end slot).
    A run of one flow's rows takes the digests of the row before it (no mixing)."""
    q = ia & 15
    v = ver[ia]
    if proto[ia] != 6 or l4_off[ia] < 0 or (v != 4 and v != 6):
        DG[q, 2] = 0
        return
    p = (ia - 1) & 15
    if ia > 0 and DG[p, 2] != 0 and ver[ia - 1] == v and sport[ia - 1] == sport[ia] and dport[ia - 1] == dport[ia] \
            and src[ia - 1, 0] == src[ia, 0] and src[ia - 1, 1] == src[ia, 1] and dst[ia - 1, 0] == dst[ia, 0] \
            and dst[ia - 1, 1] == dst[ia, 1] and ifid[ia - 1] == ifid[ia] and ifx[ia - 1] == ifx[ia] \
            and pdir[ia - 1] == pdir[ia]:
        f, rv = DG[p, 0], DG[p, 1]
    else:
        f, rv = _directions(v, src[ia, 0], src[ia, 1], dst[ia, 0], dst[ia, 1], sport[ia], dport[ia],
                            point(ifid[ia], ifx[ia], pdir[ia]))
    DG[q, 0], DG[q, 1], DG[q, 2] = f, rv, 1
    ha = ((row0 + ia) >> gshift & 1) * size
    if plen[ia] > 0:
        j = ha + np.int64(_fmix(f, (np.uint64(seq[ia]) + np.uint64(plen[ia])) & _U32) & np.uint64(tmask))
        prefetch(T, j * TW)
        j = ha + np.int64(f & np.uint64(tmask))
        prefetch(CU, j)
        prefetch(CK, j)
        prefetch(CI, j)
    if flags[ia] & TH_ACK:
        j = ha + np.int64(rv & np.uint64(tmask))
        prefetch(CU, j)
        prefetch(CK, j)
        prefetch(CI, j)
        if plen[ia] == 0:  # (a data row's ACK is mostly of a one-way flow's: no lookup)
            j = np.int64(_fmix(rv, np.uint64(ack[ia])) & np.uint64(tmask))
            prefetch(T, (ha + j) * TW)
            prefetch(T, (size - ha + j) * TW)


@njit(cache=True, entry=True,
      sig=("u8[::1], u8[::1], i32[::1], u32[::1], u16[::1], u32[::1], u32[::1], u16[::1], u16[::1], u64[:, ::1], "
           "u64[:, ::1], u32[::1], u32[::1], u8[::1], u8[::1], u32[::1], u32[::1], i64[::1], i64, i64, i64, i64, "
           "i64[::1], u8[::1], i64[::1], u64[::1], u8[::1], i64[::1], i64[:, ::1], i64[::1], i64[::1], i64[::1], "
           "i64[::1], i64[::1], i64[::1], i64[::1], i64[::1], u64[::1], i64[::1], u64[:, ::1]"))
def evidence_scan(ver, proto, l4_off, plen, flags, seq, ack, sport, dport, src, dst, ifid, ifx, pdir, sack, sackl,
                  sackr, ts, row0, window, gshift, max_ns, T, FLAG, PREV, CK, CU, CI, CS, NXT, END, SEQR, TSR, BUSY,
                  MOVE, TGT, LQ, LQK, ST, DG):
    """One forward pass over a batch whose first row is row ``row0`` of the stream: the acked ends (FLAG) and
    the busy evidence (BUSY, MOVE) of its rows, each row's 5-tuple filtered and digested once for both.
    ST: the scan's state (ST_GEN ... ST_EPOCH). After a silence of the whole capture longer than ``RESET_GAP_NS``
    (a new epoch) no row before it is flagged or moved, and each direction's state starts afresh.

    Acked ends (``acked_ends``): a data segment's (flow, end) key goes into the table of its generation (rows
    ``g << gshift`` to ``(g + 1) << gshift``, at least ``window`` rows; two tables by parity, slots ``(g & 1) *
    size`` on of T, each an open-addressing map at most half full, its slots laid out as T_KEY/T_ROW/T_JUDGED say),
    linked to the previous row with the same key in that generation (PREV). An ACK's (reverse flow, ack
    number) key, and with a SACK block beyond the ACK number the (reverse flow, that first block's right edge) key,
    is looked up in its generation's table and the previous one's: every row of those chains not judged
    yet and at most ``window`` rows back gets ``FLAG = 1``. A packet's ACK is looked up before its own segment goes
    in, so it never counts for itself. Entering a generation clears the table of the one two back, out of every
    window by then. FLAG/PREV are rings indexed by row (the caller keeps every row whose flags it has not taken).
    Flow directions are digested as the flow table digests its keys.

    Busy times (module doc), per flow direction (tables CK/CU/CI by generation parity like T's, a key moved to the
    current generation's table when it is used; state CS, rows dense per generation): the segments not yet covered
    by an ACK, oldest first, linked through NXT. An ACK that advances the direction's acknowledgment number and has
    no SACK block drops the covered segments and those older than ``max_ns``, and sets the busy time of the rest to
    its own time less the shortest ACK lag the direction has shown (a segment to the first ACK covering it: at least
    the round trip between the capture point and the receiver, so an ACK that was only on its way back counts for
    nothing; no evidence before a first lag, and the lag is forgotten after the direction was silent for
    ``max_ns``). Any ACK that advances drops the covered ones. A segment is taken only when its end is after the
    last taken one's (that one at most ``window`` rows back).

    Late segments (``move``): a SACK block that begins at a waiting segment's end says the data right after
    that segment reached the receiver and the segment did not (the receiver would have merged the two into one
    block; a D-SACK, below the ACK number, names no waiting segment). The segment is marked (MOVE = PENDING).
    When an ACK then covers it, at most ``window`` rows and ``max_ns`` after it was sent, with no copy of it sent
    in between, it reached the stack after the data up to that ACK's number: MOVE of its row is the last segment
    ending there and not lost (-1 when none). A copy sent while it is marked, at most ``max_ns`` after it, makes it
    LOST (the receiver never got it: the GRO stage leaves it out; a copy sent later, after a timeout, says
    nothing either way and the mark lapses), unless the receiver then reports that data as received twice (a
    D-SACK: a SACK block below the ACK number beginning at its start): the first copy came after all, late, and
    is moved where the ACK that covered it says, as above (TGT; in place when that ACK named no row). Rings by
    row: NXT, END (segment end), SEQR (its start), TSR (its time), BUSY, MOVE, TGT. LQ/LQK: the last NLQ rows
    marked lost and their directions."""
    rmask = np.int64(FLAG.shape[0] - 1)  # (every ring has the same size)
    size = np.int64(T.shape[0] // (2 * TW))  # (both tables by parity have the same size)
    tmask = size - 1
    gen = ST[ST_GEN]
    n = ver.shape[0]
    absent = _NO_KEY  # the last ACK key found in neither table (until a segment with that key goes in)
    for ia in range(min(AHEAD, n)):
        _ahead(ia, ver, proto, l4_off, plen, flags, seq, ack, sport, dport, src, dst, ifid, ifx, pdir, row0, gshift,
               size, tmask, T, CK, CU, CI, DG)
    for i in range(n):
        if i + AHEAD < n:
            _ahead(i + AHEAD, ver, proto, l4_off, plen, flags, seq, ack, sport, dport, src, dst, ifid, ifx, pdir, row0,
                   gshift, size, tmask, T, CK, CU, CI, DG)
        r = row0 + i
        FLAG[r & rmask] = 0
        PREV[r & rmask] = -1
        BUSY[r & rmask] = 0
        MOVE[r & rmask] = -1
        tt = ts[i]
        if tt - ST[ST_TMAX] > RESET_GAP_NS:  # a silence of the whole capture: a new epoch (RESET_GAP_NS)
            ST[ST_EPOCH] += 1
            ST[ST_EROW] = r
        ST[ST_TMAX] = max(ST[ST_TMAX], tt)
        g = r >> gshift
        if g != gen:  # a new generation: its tables held the one two back
            base = (g & 1) * size
            for j in range(base, base + size):
                T[j * TW + T_ROW] = EMPTY
                CU[j] = 0
            ST[ST_USED0 + (g & 1)] = 0
            gen = g
        q = i & 15
        if DG[q, 2] == 0:  # not a TCP row the scan looks at
            continue
        fwd, rev = DG[q, 0], DG[q, 1]
        here = (g & 1) * size
        # the reverse direction's busy state: none when it sent no data in this generation or the previous one,
        # and then neither table holds a key of it either (one-way captures: every ACK lookup skipped). Keys are
        # 64-bit digests of (direction, end): only a digest collision with another direction's key could have
        # matched, and flagged a segment that was not ACKed
        e = np.int64(-1)
        if flags[i] & TH_ACK:
            e = _conn(CK, CU, CI, CS, ST, rev, here, size - here, tmask, False)
        # acked ends: the ACK number, and the right edge of the first SACK block (RFC 2018: the block holding
        # the data that triggered the ACK, so the end of what the receiver's stack was just handed, as an ACK
        # number is when nothing is missing; a D-SACK's block, at or below the ACK number, is left out)
        if e >= 0:
            k = _fmix(rev, np.uint64(ack[i]))
            # (k == absent: an ACK number repeated while it is in neither table)
            if k != absent and not _flag_chain(T, FLAG, PREV, k, here, size, tmask, r, window, rmask, ST[ST_EROW]):
                absent = k
            if sack[i] != 0 and _seq_after(np.int64(sackr[i]), np.int64(ack[i])) \
                    and _seq_after(np.int64(sackl[i]), np.int64(ack[i])):
                _flag_chain(T, FLAG, PREV, _fmix(rev, np.uint64(sackr[i])), here, size, tmask, r, window,
                            rmask, ST[ST_EROW])
        if plen[i] > 0:
            k = _fmix(fwd, (np.uint64(seq[i]) + np.uint64(plen[i])) & _U32)
            j = _find(T, k, here, tmask)
            if j >= 0:
                PREV[r & rmask] = T[j * TW + T_ROW]
                T[j * TW + T_ROW] = r
                if k == absent:  # (held only by rows before the epoch, it was absent for the ACKs)
                    absent = _NO_KEY
            else:
                j = -2 - j  # the empty slot that ended the search
                T[j * TW + T_KEY] = np.int64(k)
                T[j * TW + T_ROW] = r
                T[j * TW + T_JUDGED] = -1
                if k == absent:
                    absent = _NO_KEY
        # busy evidence and late segments
        if e >= 0:  # (e as found above: taking this row's segment into T changed no direction's state)
            a = np.int64(ack[i])
            t = ts[i]
            _expire(CS, NXT, MOVE, e, r, window, rmask)
            if CS[e, CS_ACK] < 0 or _seq_after(a, CS[e, CS_ACK]):
                CS[e, CS_ACK] = a
                h0 = CS[e, CS_HEAD]
                h = h0
                last = np.int64(-1)  # the last covered segment ending exactly at a
                newest = np.int64(-1)  # the last covered one
                while h >= 0 and not _seq_after(END[h & rmask], a):
                    if END[h & rmask] == a and MOVE[h & rmask] != LOST:  # (a lost one was never there)
                        last = h
                    newest = h
                    h = NXT[h & rmask]
                if newest >= 0:  # the way to the receiver and back, at most: the shortest lag seen
                    lag = t - TSR[newest & rmask]
                    if lag >= 0 and (CS[e, CS_LAG] < 0 or lag < CS[e, CS_LAG]):
                        CS[e, CS_LAG] = lag
                if CS[e, CS_NMISS] > 0 or CS[e, CS_NLOST] > 0:
                    x = h0
                    while x != h:
                        mv = MOVE[x & rmask]
                        if mv == PENDING or mv == LOST:  # a marked segment goes after `last`, if that is after it
                            to = last if last > x and t - TSR[x & rmask] <= max_ns else np.int64(-1)
                            if mv == PENDING:  # no copy sent: it came late
                                MOVE[x & rmask] = to
                                CS[e, CS_NMISS] -= 1
                            else:  # lost: where it goes should a D-SACK show it came after all
                                TGT[x & rmask] = to
                                CS[e, CS_NLOST] -= 1
                        x = NXT[x & rmask]
                if sack[i] == 0:
                    while h >= 0 and t - TSR[h & rmask] > max_ns:
                        _drop(CS, MOVE, e, h, rmask)  # too old for this and every later ACK
                        h = NXT[h & rmask]
                CS[e, CS_HEAD] = h
                if h < 0:
                    CS[e, CS_TAIL] = -1
                if sack[i] == 0 and CS[e, CS_LAG] >= 0:
                    sent = t - CS[e, CS_LAG]  # the receiver sent it no later than this
                    if newest >= 0:
                        _backlog(CS, e, sent, newest, h0, NXT, TSR, BUSY, rmask)
                    while h >= 0:
                        BUSY[h & rmask] = sent
                        h = NXT[h & rmask]
            if sack[i] != 0:
                edge = np.int64(sackl[i])
                if _seq_after(a, edge):  # a D-SACK: the receiver got the data at edge twice, so a lost mark
                    for j in range(min(LQ[NLQ], NLQ)):  # there was wrong: the first copy came, late
                        y = LQ[j]
                        if LQK[j] == rev and r - y <= window and y >= ST[ST_EROW] and MOVE[y & rmask] == LOST \
                                and SEQR[y & rmask] == edge:
                            MOVE[y & rmask] = TGT[y & rmask]
                h = CS[e, CS_HEAD]
                while h >= 0 and _seq_after(edge, END[h & rmask]):
                    h = NXT[h & rmask]
                # (not when the capturing host sent the SACK, pdir 2: the data was captured as received there, so
                # it reached the receiver this row's point models, whatever became of it after the capture)
                if h >= 0 and END[h & rmask] == edge and MOVE[h & rmask] == -1 and t - TSR[h & rmask] <= max_ns \
                        and pdir[i] != 2:
                    MOVE[h & rmask] = PENDING  # the data right after it came, it did not
                    CS[e, CS_NMISS] += 1
        if plen[i] > 0:
            e = _conn(CK, CU, CI, CS, ST, fwd, here, size - here, tmask, True)
            _expire(CS, NXT, MOVE, e, r, window, rmask)
            if CS[e, CS_LAST_T] >= 0 and ts[i] - CS[e, CS_LAST_T] > max_ns:
                CS[e, CS_LAG] = -1  # silent longer than the evidence lasts: the path may have changed
            CS[e, CS_LAST_T] = ts[i]
            end = (np.int64(seq[i]) + np.int64(plen[i])) & np.int64(0xFFFFFFFF)
            if CS[e, CS_ROW] < 0 or r - CS[e, CS_ROW] > window or _seq_after(end, CS[e, CS_END]):
                CS[e, CS_END] = end  # retransmitted and reordered segments are not taken: no evidence
                CS[e, CS_ROW] = r
                NXT[r & rmask] = -1
                END[r & rmask] = end
                SEQR[r & rmask] = seq[i]
                TSR[r & rmask] = ts[i]
                tl = CS[e, CS_TAIL]
                if tl >= 0:
                    NXT[tl & rmask] = r
                else:
                    CS[e, CS_HEAD] = r
                CS[e, CS_TAIL] = r
            elif CS[e, CS_NMISS] > 0:  # a copy of a waiting segment: if it was marked late, it was lost instead
                x = CS[e, CS_HEAD]
                while x >= 0:
                    if MOVE[x & rmask] == PENDING and SEQR[x & rmask] == np.int64(seq[i]):
                        CS[e, CS_NMISS] -= 1
                        if ts[i] - TSR[x & rmask] <= max_ns:
                            MOVE[x & rmask] = LOST
                            TGT[x & rmask] = -1
                            CS[e, CS_NLOST] += 1
                            w = LQ[NLQ] % NLQ  # the recent lost rows, for a D-SACK to find
                            LQ[w] = x
                            LQK[w] = fwd
                            LQ[NLQ] += 1
                        else:  # sent again much later (a timeout): no evidence, as for a mark whose ACK never came
                            MOVE[x & rmask] = -1
                        break
                    x = NXT[x & rmask]
    ST[ST_GEN] = gen


# How far after a segment its ACK may come and still count: a number of packets, not "the next batch", so the
# flags do not depend on where batches happen to begin (they begin elsewhere in each part of a split run, and
# wherever a read buffer ends). A delayed ACK comes within 40-200 ms; 65536 packets is more than that on a
# single flow at 10 Gbit/s of MSS segments.
WINDOW = 65536

BUSY_MAX_NS = 10_000_000
"""The latest an ACK may come after a segment and still count as busy evidence for it (10 ms: a receive backlog
far longer than any seen; below the 200 ms idle gap a split run cuts at, so parts see the same evidence)."""


def acked_ends(pb: PacketBatch, lookahead: PacketBatch | list[PacketBatch] | None = None) -> np.ndarray:
    """bool per row of ``pb``: a packet of the reverse direction at most ``WINDOW`` rows later (in ``pb`` or the
    following batches ``lookahead``) ACKs exactly this data segment's end (keys compared by their 64-bit
    digest)."""
    ahead = [] if lookahead is None else [lookahead] if isinstance(lookahead, PacketBatch) else list(lookahead)
    ev = AckEvidence()
    ready = []
    for b in [pb, *ahead]:
        ready += ev.push(b)
    ready += ev.finish()
    return ready[0][2]


@dataclass(frozen=True)
class RowEvidence:
    """What ``evidence_scan`` found for the rows of one batch: ``busy`` (int64 ns per row, 0: none), ``move`` (the
    stream row a late segment reached the receiver after, -1: none, ``LOST``: it never reached the receiver) and
    ``row0`` (the batch's first stream row, the numbering of ``move``)."""

    busy: np.ndarray
    move: np.ndarray
    row0: int


class AckEvidence:
    """Streaming ``acked_ends`` and busy times: a batch is scanned once as it comes (``evidence_scan``)
    and flagged once ``WINDOW`` rows after it have been seen (or the input ends). ``push`` returns the batches
    that became ready, oldest first, each ``(batch, extra, flags, RowEvidence)``."""

    def __init__(self) -> None:
        self.window = int(WINDOW)
        self._gshift = max(4, (self.window - 1).bit_length())  # a generation: 2**gshift >= window rows
        size = 2 << self._gshift  # a generation's table: at most half full (one key per row at most)
        self._T = lazy_zeros(2 * size * TW, np.int64)  # generation parity p: slots p * size to (p + 1) * size
        self._T[T_ROW::TW] = EMPTY
        self._T[T_JUDGED::TW] = -1
        self._ST = np.zeros(ST_EPOCH + 1, np.int64)  # the scan's state (ST_GEN ...)
        # busy evidence: per flow direction, then rings by row
        self._CK = lazy_zeros(2 * size, np.uint64)
        self._CU = lazy_zeros(2 * size, np.uint8)
        self._CI = lazy_zeros(2 * size, np.int64)
        self._CS = lazy_zeros((2 * size, NCS), np.int64)  # rows dense per generation: p * size on
        ring = 1 << max(16, (4 * self.window - 1).bit_length())  # a waiting segment is at most 2 windows back
        self._FLAG = lazy_zeros(ring, np.uint8)  # rings by row: every row not yet taken
        self._PREV = lazy_zeros(ring, np.int64)
        self._NXT = np.full(ring, -1, np.int64)
        self._END = lazy_zeros(ring, np.int64)
        self._SEQR = lazy_zeros(ring, np.int64)
        self._TSR = lazy_zeros(ring, np.int64)
        self._BUSY = lazy_zeros(ring, np.int64)
        self._MOVE = np.full(ring, -1, np.int64)
        self._TGT = lazy_zeros(ring, np.int64)  # where a segment marked lost goes should a D-SACK show it came
        self._LQ = np.zeros(NLQ + 1, np.int64)  # the recent lost rows and their directions, for a D-SACK to find
        self._LQK = np.zeros(NLQ, np.uint64)
        self._DG = np.zeros((16, 3), np.uint64)  # evidence_scan's digests of the rows ahead (_ahead)
        self._rows = 0  # rows scanned
        self._held: list[tuple[PacketBatch, Any, int]] = []  # (batch, extra, its first row)
        self._ahead = 0  # rows held after the oldest batch

    def push(self, pb: PacketBatch, extra: Any = None) -> list[tuple[PacketBatch, Any, np.ndarray, RowEvidence]]:
        """Take a batch (and anything to carry along with it); return the batches now flagged, each with what
        ``evidence_scan`` found for its rows (``RowEvidence``)."""
        n = len(pb)
        self._ring(n)
        if n:
            src = np.ascontiguousarray(pb.src).view(np.uint64).reshape(n, 2)
            dst = np.ascontiguousarray(pb.dst).view(np.uint64).reshape(n, 2)
            evidence_scan(pb.ip_version, pb.l4_proto, pb.l4_off, pb.tcp_payload_len, pb.tcp_flags, pb.tcp_seq,
                          pb.tcp_ack, pb.sport, pb.dport, src, dst, pb.if_gid, pb.ifindex, pb.direction,
                          pb.tcp_sack_blocks, pb.tcp_sack_left, pb.tcp_sack_right, pb.ts_ns,
                          np.int64(self._rows), np.int64(self.window), np.int64(self._gshift),
                          np.int64(BUSY_MAX_NS), self._T, self._FLAG, self._PREV, self._CK,
                          self._CU, self._CI, self._CS, self._NXT, self._END, self._SEQR, self._TSR, self._BUSY,
                          self._MOVE, self._TGT, self._LQ, self._LQK, self._ST, self._DG)
        if self._held:
            self._ahead += n
        self._held.append((pb, extra, self._rows))
        self._rows += n
        ready = []
        while len(self._held) > 1 and self._ahead >= self.window:
            ready.append(self._pop())
        return ready

    def _ring(self, more: int) -> None:
        """Room in the rings for every held row, every segment still waiting for its ACK (at most two windows
        back) and ``more`` new ones (grown, keeping those rows)."""
        size = self._FLAG.shape[0]
        first = min(self._held[0][2] if self._held else self._rows, max(0, self._rows - 2 * self.window))
        rows = self._rows + more - first
        if rows <= size:
            return
        new = 1 << (2 * rows - 1).bit_length()
        idx = np.arange(first, self._rows, dtype=np.int64)
        old, at = idx & (size - 1), idx & (new - 1)
        for name in ("_FLAG", "_PREV", "_NXT", "_END", "_SEQR", "_TSR", "_BUSY", "_MOVE", "_TGT"):
            a = getattr(self, name)
            b = np.zeros(new, a.dtype)
            b[at] = a[old]
            setattr(self, name, b)

    def _pop(self) -> tuple[PacketBatch, Any, np.ndarray, RowEvidence]:
        pb, extra, row0 = self._held.pop(0)
        self._ahead -= len(self._held[0][0]) if self._held else 0
        idx = np.arange(row0, row0 + len(pb), dtype=np.int64) & (self._FLAG.shape[0] - 1)
        mv = self._MOVE[idx]
        mv = np.where(mv == PENDING, np.int64(-1), mv)  # (a mark whose ACK never came: no evidence)
        return pb, extra, self._FLAG[idx].astype(np.bool_), RowEvidence(self._BUSY[idx], mv, row0)

    def held_batches(self, from_row: int, rows: int) -> list[tuple[PacketBatch, Any, int]]:
        """(batch, extra, first stream row) of each held batch with rows in ``from_row`` to ``from_row + rows``."""
        return [(pb, extra, r0) for pb, extra, r0 in self._held if r0 < from_row + rows and r0 + len(pb) > from_row]

    def pending_from_frame(self) -> int | None:
        """The frame number of the first row held (rows are in frame order), or None when none is held."""
        for pb, _, _ in self._held:
            if len(pb):
                return int(pb.frame[0])
        return None

    def finish(self) -> list[tuple[PacketBatch, Any, np.ndarray, RowEvidence]]:
        """End of input: every held batch, flagged with what follows it."""
        out = []
        while self._held:
            out.append(self._pop())
        return out
