"""CompiledGroEngine: the reference GroEngine's per-packet loop compiled with numba, identical output.

Same public interface as ``engine.GroEngine`` (``feed(PacketBatch, flow_id, poll_start=None)``, ``flush()``,
``held``, ``config``) and the same rows, column by column and in the same order, for every config, every way
the input is split into batches and any poll-start marks (tests/gro/test_compiled.py checks this against the
reference engine).

What stays in Python, per batch (vectorized, or per *new* flow key only):

* ``prepare.prepare`` (shared with the reference; its distinct-key step is skipped): kinds, flush marks,
  packed comparison words, flow hash and the 9 flow-key columns;
* the static facts of new flow keys (queue, bucket, ports, SYN-MSS direction ids via a dict), growing arrays.

What is compiled (``@njit(cache=True)``, flat int64 state, no Python objects): the flow key -> gid lookup (an
open-addressing hash table over the exact keys), the whole per-packet loop of ``GroEngine._run`` and its
bookkeeping (``_complete``, ``_flush_all``, ``_flush_old``, ``_complete_poll``, ``_timers``, row output), and
``flush()``. Every rule decision is a function of ``rules.py``, inlined here and called as Python by the
reference engine: no rule is written twice.

State layout (struct of arrays, grown in Python between batches):

* ``_S[g, field]``: one row per flow key (gid): its static facts (queue, bucket, IP version, ports, the ids
  of its SYN-MSS directions, R2 fallback limit, largest plain segment) and ``G_HELD``, its held entry p's slot
  + 1 (0: none; a key holds at most one entry at a time, the reference's ``_held[g]``).
* ``_H[e, field]``: the held entries (``E_*`` fields, struct napi_gro_cb), one slot each, taken from and given
  back to the free stack ``_FR`` (``_FR[0]`` free slots, then the stack). Only the keys with a held entry need
  these fields: a table per key would carry them for every key in memory. The stack is last-in first-out, so
  only as many slots are ever written (mapped) as entries are held at once; before each feed there is a free
  slot per packet (``max_gro_skbs = inf`` needs no cap).
* bucket lists (oldest -> newest) are doubly linked lists through ``G_PREV``/``G_NEXT`` with head, tail and
  length per (queue, bucket) in ``_B``: append, unlink from the middle (R16/R17 completions) and pop the
  oldest (R18, R21.4) are O(1).
* ``_Q[q, field]``: per NAPI instance the poll state (last arrival, work, held count, R21.5 timer).
* ``_D[did]``: SYN MSS option per flow direction (address/port 4-tuple without L2 keys), 0 = none seen.

Reference fallback: configurations whose arithmetic could exceed int64 in the compiled time/jiffy computation
(``hz`` > 10**6, or ``|jiffy_phase_ns|``, ``gro_flush_timeout_ns``, ``napi_weight``, ``napi_defer_hard_irqs``
or ``fallback_mtu`` > 2**61; the reference uses Python integers) are delegated to the reference ``GroEngine``
as a whole (``self.compiled`` is False then). Every other config, including ``gro_flush_timeout_ns`` > 0 with
``napi_defer_hard_irqs``, several RX queues and ``max_gro_skbs = inf``, runs compiled.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .._native import njit
from ..buffers import lazy_zeros, table_full
from ..decode.schema import ST_IP_FRAGMENT, TH_PSH, TH_SYN, PacketBatch
from ..flows.table import _SLOT, _entry_tag, _tag, _tagged
from . import reasons as R
from . import rules
from .config import GroConfig
from .engine import GroEngine, _busy_times, _poll_marks, _receivers, cap_next
from .prepare import FRAGMENT_OTHER, KIND_ALONE, KIND_OTHER, KIND_TCP, NO_GRO_STATUS, Prepared, flow_hash_of, prepare
from .rules import (
    ACK_NEXT_ROWS,
    BUSY_SLACK_NS,
    M32,
    MERGE,
    acked_end_ends_poll,
    acked_end_poll_waits,
    acked_flow_returns,
    acked_row_poll_end,
    busy_poll_continues,
    merge_verdict,
    nic_window_closed,
    r2_gso_segs,
    r2_gso_size,
    r2_plain_limit,
    r2_syn_mss,
    r7_r11_flushmark,
    r8_r11_l3_word,
    r12_header_pulls,
    r14_2_flag_word,
    r16_completes,
    r16_ored_flags,
    r16_reason,
    r17_alone_reason,
    r17_goes_alone,
    r20_completed,
    r20_observed,
    r21_2_end_cause,
    r21_2_poll_ended,
    r21_3_budget_used,
    r21_4_jiffy,
    r21_5_poll_end,
)
from .superpacket import COLUMN_TYPES, SuperPacketBatch

BIG = 1 << 62  # max_gro_skbs = inf, poll_gap_us = inf
RECYCLE_MIN = 1 << 16  # recycle() looks at the keys once there are this many (and twice as many as last time)
FEED_ROOM = 1 << 16  # new keys a feed may add past the recycle point without growing the tables (a batch's rows)
NS = 1_000_000_000
MAX_HZ = 10**6
MAX_PHASE = 1 << 61

# --- per-gid row of _S: static facts of the flow key, then the slot of its held entry p -----------------------
G_Q, G_B, G_V4, G_SPORT, G_DPORT, G_DID, G_RDID, G_GMAX, G_HELD, G_PREV, G_NEXT = range(11)
G_FIDL = 11  # flow id of the key's last packet (recycle: the key's state goes when that flow has ended)
G_FBL = 12  # rules.r2_fallback_limit of the key (static: fallback_mtu and its IP version)
NSF = 13
# --- per-slot row of _H: a held entry p (struct napi_gro_cb) -------------------------------------------------
(E_Q, E_FID, E_L2, E_HDR, E_SEQ0, E_NXT, E_ACK, E_FWM, E_OPT, E_L3W, E_ID0, E_FIXED, E_MSS, E_GSO, E_COUNT,
 E_NPK, E_PLEN, E_LIMIT, E_FLAGS, E_AGE, E_F0, E_F1, E_T0, E_T1) = range(24)
NHF = 24
# --- per-queue row of _Q (NAPI instance) --------------------------------------------------------------------
Q_LAST, Q_HASLAST, Q_N, Q_HELD, Q_DL, Q_HASDL, Q_MASKED, Q_DEFER, Q_CAUSE, Q_WS, Q_WN, Q_BUSY, Q_PUSH, Q_WAIT = range(14)
NQF = 14  # Q_PUSH: the poll's last packet was a TCP segment with PSH (R21.2b); Q_WAIT: 1 + the flow key whose
# ACKed end left the poll's end waiting (rules.acked_end_poll_waits), 0: none
# --- per-(queue, bucket) row of _B ----------------------------------------------------------------------------
B_HEAD, B_TAIL, B_LEN = range(3)
# --- config vector _C ------------------------------------------------------------------------------------------
(C_LIM4, C_LIM6, C_GAP, C_CWR, C_GSO_AUTO, C_NEEDS_DF, C_MAXSKBS, C_HZ, C_PHASE, C_FLUSH_OLD_FULL, C_TMO,
 C_WEIGHT, C_DEFER, C_HBH, C_NB, C_NQ, C_RXU, C_RXF, C_PGAP) = range(19)
NCF = 19

_OUT_TYPES = tuple(COLUMN_TYPES.values())
_NO_MARKS = np.zeros(0, np.uint8)  # feed without poll_start: the gap rule cuts polls
_NO_BUSY = np.zeros(0, np.int64)  # feed without busy evidence
_NO_NEXT = np.zeros(0, np.int64)


# ============================================================================================================
# compiled helpers
# ============================================================================================================
@njit(cache=True, inline="always")  # hot: inlined, no call/refcount overhead
def _emit(O, k, fid, ver, sport, dport, seq0, plen, nseg, l3, frame_len, big, f0, f1, t0, t1, reason, source,
          flags, ack, gso, rx, pe):
    """Write output row k: O is int64 (21, capacity), one row per column in superpacket.ROW_FIELDS order.

    A row past the capacity is dropped (the caller raises): never write out of bounds."""
    if k >= O.shape[1]:
        return
    O[0, k] = fid
    O[1, k] = ver
    O[2, k] = sport
    O[3, k] = dport
    O[4, k] = seq0
    O[5, k] = plen
    O[6, k] = nseg
    O[7, k] = l3
    O[8, k] = frame_len
    O[9, k] = big
    O[10, k] = f0
    O[11, k] = f1
    O[12, k] = t0
    O[13, k] = t1
    O[14, k] = reason
    O[15, k] = source
    O[16, k] = flags
    O[17, k] = ack
    O[18, k] = gso
    O[19, k] = rx
    O[20, k] = pe


@njit(cache=True, inline="always")  # hot: inlined, no call/refcount overhead
def _row(S, H, Q, C, O, K, g, reason):
    """R20: what the receiver sees for a completed p (appended to the output, R23)."""
    e = S[g, G_HELD] - 1
    l3 = H[e, E_PLEN]
    v4 = S[g, G_V4] != 0
    frame_len, big, gso = r20_completed(H[e, E_L2], l3, H[e, E_COUNT], H[e, E_MSS], v4, C[C_HBH] != 0)
    source = r20_observed(H[e, E_GSO] != 0, H[e, E_NPK])
    k = K[0]
    q = H[e, E_Q]
    pe = acked_row_poll_end(Q[q, Q_CAUSE], Q[q, Q_WAIT] - 1, g) if (reason == R.NAPI_POLL or reason == R.END_OF_CAPTURE) \
        else R.PE_NONE
    _emit(O, k, H[e, E_FID], 4 if v4 else 6, S[g, G_SPORT], S[g, G_DPORT], H[e, E_SEQ0], l3 - H[e, E_HDR],
          H[e, E_COUNT], l3, frame_len, big, H[e, E_F0], H[e, E_F1], H[e, E_T0], H[e, E_T1], reason, source,
          H[e, E_FLAGS], H[e, E_ACK], gso, q // C[C_NQ], pe)
    K[0] = k + 1


@njit(cache=True, inline="always")  # hot: inlined, no call/refcount overhead
def _unlink(S, H, B, g):
    """Take p out of its bucket list (kept oldest -> newest)."""
    q = H[S[g, G_HELD] - 1, E_Q]
    b = S[g, G_B]
    p = S[g, G_PREV]
    nx = S[g, G_NEXT]
    if p >= 0:
        S[p, G_NEXT] = nx
    else:
        B[q, b, B_HEAD] = nx
    if nx >= 0:
        S[nx, G_PREV] = p
    else:
        B[q, b, B_TAIL] = p
    B[q, b, B_LEN] -= 1


@njit(cache=True, inline="always")  # hot: inlined, no call/refcount overhead
def _take_slot(S, FR, g):
    """A free slot of _H for g's new held entry (the caller made room: one per packet of the feed)."""
    n = FR[0] - 1
    FR[0] = n
    e = FR[1 + n]
    S[g, G_HELD] = e + 1
    return e


@njit(cache=True, inline="always")  # hot: inlined, no call/refcount overhead
def _give_slot(S, FR, g):
    """g's held entry is gone: its slot goes back on the free stack."""
    n = FR[0]
    FR[1 + n] = S[g, G_HELD] - 1
    FR[0] = n + 1
    S[g, G_HELD] = 0


@njit(cache=True, inline="always")  # hot: inlined, no call/refcount overhead
def _complete(S, H, FR, Q, B, C, O, K, g, reason):
    """Complete p (R20) and append its row (R23: delivery order = completion order)."""
    _unlink(S, H, B, g)
    Q[H[S[g, G_HELD] - 1, E_Q], Q_HELD] -= 1
    _row(S, H, Q, C, O, K, g, reason)
    _give_slot(S, FR, g)


@njit(cache=True)
def _flush_all(S, H, FR, Q, B, C, O, K, q, reason):
    """R21.2/R21.4: every bucket in ascending order, each oldest to newest."""
    for b in range(B.shape[1]):
        g = B[q, b, B_HEAD]
        if g < 0:
            continue
        while g >= 0:
            _row(S, H, Q, C, O, K, g, reason)
            _give_slot(S, FR, g)
            g = S[g, G_NEXT]
        Q[q, Q_HELD] -= B[q, b, B_LEN]
        B[q, b, B_HEAD] = -1
        B[q, b, B_TAIL] = -1
        B[q, b, B_LEN] = 0


@njit(cache=True)
def _flush_old(S, H, FR, Q, B, C, O, K, q, now):
    """R21.4 flush_old: per bucket (ascending) oldest to newest, stopping at the first entry of this jiffy."""
    jiffy = r21_4_jiffy(now, C[C_PHASE], C[C_HZ])
    for b in range(B.shape[1]):
        while B[q, b, B_HEAD] >= 0 and H[S[B[q, b, B_HEAD], G_HELD] - 1, E_AGE] != jiffy:
            _complete(S, H, FR, Q, B, C, O, K, B[q, b, B_HEAD], R.NAPI_POLL)


@njit(cache=True)
def _complete_poll(S, H, FR, Q, B, C, O, K, q, tnow, work):
    """R21.2/R21.5 napi_complete_done(work) at time tnow: flush all, or only old entries + arm the timer."""
    timeout, masked, defer = r21_5_poll_end(work, Q[q, Q_HELD], C[C_TMO], C[C_DEFER], Q[q, Q_DEFER])
    Q[q, Q_DEFER] = defer
    if Q[q, Q_HELD]:
        if timeout:
            _flush_old(S, H, FR, Q, B, C, O, K, q, tnow)  # R21.5: only old entries, young ones wait for the timer
        else:
            _flush_all(S, H, FR, Q, B, C, O, K, q, R.NAPI_POLL)  # R21.2: short poll flushes everything
    if timeout:
        Q[q, Q_DL] = tnow + timeout
        Q[q, Q_HASDL] = 1
    else:
        Q[q, Q_HASDL] = 0
    Q[q, Q_MASKED] = 1 if masked else 0
    Q[q, Q_N] = 0
    Q[q, Q_HASLAST] = 0
    Q[q, Q_WN] = 0
    Q[q, Q_BUSY] = 0
    Q[q, Q_WAIT] = 0


@njit(cache=True)
def _timers(S, H, FR, Q, B, C, O, K, q, t, marks, mark):
    """R21.5 (gro_flush_timeout > 0): run the poll ends and timer polls due before a packet at t.

    ``marks``: poll starts are given (``mark``: this packet starts a poll) instead of the gap rule.
    Returns the time the packet is processed: t, or the pending timer poll while IRQs are masked."""
    while True:
        if Q[q, Q_MASKED]:
            dl = Q[q, Q_DL]
            if t <= dl:
                return dl  # R21.5: IRQs masked, the packet waits for the timer poll at dl
            Q[q, Q_CAUSE] = R.PE_TIMER
            _complete_poll(S, H, FR, Q, B, C, O, K, q, dl, Q[q, Q_N])
            continue
        if r21_2_poll_ended(Q[q, Q_HASLAST] != 0, t, Q[q, Q_LAST], C[C_GAP], marks, mark, Q[q, Q_PUSH] != 0,
                            C[C_PGAP]) and not busy_poll_continues(Q[q, Q_BUSY], t, BUSY_SLACK_NS):
            Q[q, Q_CAUSE] = r21_2_end_cause(marks, t - Q[q, Q_LAST], C[C_GAP])
            _complete_poll(S, H, FR, Q, B, C, O, K, q, Q[q, Q_LAST], Q[q, Q_N])  # R21.2: idle gap (or mark) ended it
            continue
        if nic_window_closed(Q[q, Q_WN], t, Q[q, Q_WS], C[C_RXU], C[C_RXF]):
            Q[q, Q_CAUSE] = R.PE_COALESCE
            _complete_poll(S, H, FR, Q, B, C, O, K, q, Q[q, Q_LAST], Q[q, Q_N])  # the NIC's IRQ window closed
            continue
        if Q[q, Q_HASDL] and t >= Q[q, Q_DL]:
            Q[q, Q_CAUSE] = R.PE_TIMER
            _complete_poll(S, H, FR, Q, B, C, O, K, q, Q[q, Q_DL], 0)  # R21.5: the timer poll fired, no work
            continue
        return t


@njit(cache=True, inline="always")  # hot: inlined, no call/refcount overhead
def _plain_limit(S, D, C, g):
    """R2 detection for flow g (rules.r2_plain_limit on its SYN MSS)."""
    return r2_plain_limit(C[C_GSO_AUTO] != 0, r2_syn_mss(D[S[g, G_RDID]], D[S[g, G_DID]]), S[g, G_FBL])


@njit(cache=True, inline="always")
def _would_merge(S, H, D, C, g, j, fm_a, fl_a, fwm_a, ack_a, opt_a, l3w_a, seq_a, pl_a, thl_a, ipid_a):
    """Would row j (a later segment of flow g) merge into g's held entry as it stands? (R2, R14/R15)."""
    e = S[g, G_HELD] - 1
    ln = np.int64(pl_a[j])
    plim = _plain_limit(S, D, C, g)
    gsz = np.int64(0)
    if ln > plim:
        gsz = r2_gso_size(r2_syn_mss(D[S[g, G_RDID]], D[S[g, G_DID]]), S[g, G_GMAX], plim, np.int64(thl_a[j]))
    why, _ = merge_verdict(fm_a[j], np.int64(fl_a[j]), C[C_CWR], fwm_a[j], np.int64(ack_a[j]), np.int64(opt_a[j]),
                           l3w_a[j], np.int64(seq_a[j]), ln, gsz, np.int64(ipid_a[j]), C[C_NEEDS_DF] != 0,
                           S[g, G_V4] != 0, H[e, E_FWM], H[e, E_ACK], H[e, E_OPT], H[e, E_L3W], H[e, E_NXT],
                           H[e, E_MSS], H[e, E_PLEN], H[e, E_LIMIT], H[e, E_ID0], H[e, E_COUNT], H[e, E_FIXED] != 0)
    return why == MERGE


# ============================================================================================================
# the loop
# ============================================================================================================
@njit(cache=True, entry=True,
      sig=("(i8[::1], i64[::1], b1[::1], i64[::1], i64[::1], u32[::1], u16[::1], u32[::1], u32[::1], "
          "u64[::1], u16[::1], u64[::1], i64[::1], u16[::1], i64[::1], u8[::1], u16[::1], u8[::1], "
          "u16[::1], u16[::1], u32[::1], u32[::1], u8[::1]), i64[::1], i64[::1], u8[::1], u8[::1], i64[::1], "
          "i64[::1], i64[:, ::1], i64[:, ::1], i64[::1], i64[::1], i64[:, ::1], i64[:, :, ::1], i64[::1], "
          "i64[:, ::1], i64[::1]"))
def _run(I, gids, qrow, ps, ak, bz, nxt, S, H, FR, D, Q, B, C, O, K):
    """GroEngine._run over one batch. I: the batch/prepared columns (see CompiledGroEngine._inputs).

    ps: uint8 poll-start mark per packet, or empty (no marks: the gap rule cuts polls). ak: uint8 "the other side
    ACKed this segment's end" per packet, or empty (no evidence); bz: int64 busy time per packet
    (evidence.evidence_scan, 0: none), or empty; nxt: the next row of the same flow key (-1: none in this batch)."""
    (kind, ts, fm_a, fwm_a, l3w_a, pl_a, fl_a, seq_a, ack_a, opt_a, ipid_a, frame_a, fid_a, l2_a, hdr_a, thl_a,
     tmss_a, ver_a, sport_a, dport_a, iplen_a, wire_a, big_a) = I
    n = K[1]  # the rows to process; the rows after them are lookahead, read only as a flow's next segment
    tmo = C[C_TMO] > 0
    weight = C[C_WEIGHT]
    gap = C[C_GAP]
    pgap = C[C_PGAP]
    cwr = C[C_CWR]
    needs_df = C[C_NEEDS_DF] != 0
    maxskbs = C[C_MAXSKBS]
    hz = C[C_HZ]
    phase = C[C_PHASE]
    flush_old_full = C[C_FLUSH_OLD_FULL] != 0
    lim4 = C[C_LIM4]
    lim6 = C[C_LIM6]
    marks = ps.shape[0] > 0
    evidence = ak.shape[0] > 0
    busy = bz.shape[0] > 0
    nq = C[C_NQ]
    nic = C[C_RXU] > 0 or C[C_RXF] > 0
    for i in range(n):
        t = ts[i]
        q = qrow[i]
        mark = marks and ps[i] != 0
        # R21.2/R21.5 (section 7.1): a gap longer than poll_gap_us (or, given marks, a marked packet) ended
        # the previous poll
        if tmo:
            now = _timers(S, H, FR, Q, B, C, O, K, q, t, marks, mark)
        else:
            if r21_2_poll_ended(Q[q, Q_HASLAST] != 0, t, Q[q, Q_LAST], gap, marks, mark, Q[q, Q_PUSH] != 0,
                                pgap) and not busy_poll_continues(Q[q, Q_BUSY], t, BUSY_SLACK_NS):
                Q[q, Q_CAUSE] = r21_2_end_cause(marks, t - Q[q, Q_LAST], gap)
                _complete_poll(S, H, FR, Q, B, C, O, K, q, Q[q, Q_LAST], Q[q, Q_N])
            elif nic and nic_window_closed(Q[q, Q_WN], t, Q[q, Q_WS], C[C_RXU], C[C_RXF]):
                Q[q, Q_CAUSE] = R.PE_COALESCE
                _complete_poll(S, H, FR, Q, B, C, O, K, q, Q[q, Q_LAST], Q[q, Q_N])
            elif acked_flow_returns(Q[q, Q_WAIT] - 1, gids[i]):
                Q[q, Q_CAUSE] = R.PE_ACK
                _complete_poll(S, H, FR, Q, B, C, O, K, q, Q[q, Q_LAST], Q[q, Q_N])
            now = t
        if Q[q, Q_HASLAST] == 0 or t > Q[q, Q_LAST]:  # the poll's clock: a late segment fed out of capture order
            Q[q, Q_LAST] = t  # (or a capture clock that steps back) does not move it back
        Q[q, Q_HASLAST] = 1
        Q[q, Q_PUSH] = 1 if kind[i] != KIND_OTHER and (fl_a[i] & TH_PSH) != 0 else 0
        if busy and bz[i] > Q[q, Q_BUSY]:
            Q[q, Q_BUSY] = bz[i]
        if nic:
            if Q[q, Q_WN] == 0:  # this packet found NAPI idle: it opens the NIC's coalescing window
                Q[q, Q_WS] = t
            Q[q, Q_WN] += 1

        k = kind[i]
        if k == KIND_TCP:
            g = gids[i]
            S[g, G_FIDL] = fid_a[i]
            ln = np.int64(pl_a[i])
            f = np.int64(fl_a[i])
            fm = fm_a[i]
            plim = _plain_limit(S, D, C, g)
            if ln > plim:
                # R2: already aggregated input, a GSO skb of gso_segs segments
                gsz = r2_gso_size(r2_syn_mss(D[S[g, G_RDID]], D[S[g, G_DID]]), S[g, G_GMAX], plim,
                                  np.int64(thl_a[i]))
                cnt = r2_gso_segs(ln, gsz)
            else:
                gsz = np.int64(0)
                cnt = np.int64(1)
                if ln > S[g, G_GMAX]:  # noqa: PLR1730 - no store in the common case
                    S[g, G_GMAX] = ln
            fwm = fwm_a[i]
            ack = np.int64(ack_a[i])
            opt = np.int64(opt_a[i])
            l3w = l3w_a[i]
            seq = np.int64(seq_a[i])
            merged = False
            e = S[g, G_HELD] - 1
            if e >= 0:
                # R14 (all against p's first segment), R15a, R15c
                why, fixed = merge_verdict(fm, f, cwr, fwm, ack, opt, l3w, seq, ln, gsz, np.int64(ipid_a[i]),
                                           needs_df, S[g, G_V4] != 0, H[e, E_FWM], H[e, E_ACK], H[e, E_OPT],
                                           H[e, E_L3W], H[e, E_NXT], H[e, E_MSS], H[e, E_PLEN], H[e, E_LIMIT],
                                           H[e, E_ID0], H[e, E_COUNT], H[e, E_FIXED] != 0)
                if why == MERGE:
                    # R15: merge; count += gso_segs, p->len += len
                    if fixed:  # (a merge never leaves the fixed-ID mode: nothing to store otherwise)
                        H[e, E_FIXED] = 1
                    H[e, E_PLEN] += ln
                    H[e, E_COUNT] += cnt
                    H[e, E_NPK] += 1
                    H[e, E_NXT] = (H[e, E_NXT] + ln) & M32
                    H[e, E_FLAGS] |= r16_ored_flags(f)
                    H[e, E_F1] = np.int64(frame_a[i])
                    H[e, E_T1] = t
                    merged = True
                    if r16_completes(ln, cnt, gsz, H[e, E_MSS], f):
                        _complete(S, H, FR, Q, B, C, O, K, g, r16_reason(f))
                else:
                    _complete(S, H, FR, Q, B, C, O, K, g, why)  # R17: no merge -> p is flushed now
            if not merged:
                # R17: deliver alone (flush-marked, no payload, URG/PSH/RST/SYN/FIN) or hold as a new p
                if r17_goes_alone(fm, f, ln, cnt, gsz):
                    if f & TH_SYN:
                        mss = np.int64(tmss_a[i])
                        if mss > 0:
                            D[S[g, G_DID]] = mss  # R2: the SYN's MSS option bounds plain segments
                    if ln:
                        fr = np.int64(frame_a[i])
                        _emit(O, K[0], fid_a[i], ver_a[i], sport_a[i], dport_a[i], seq, ln, cnt, iplen_a[i],
                              wire_a[i], big_a[i], fr, fr, t, t, r17_alone_reason(fm, f),
                              r20_observed(gsz != 0, 1), f, ack, gsz, q // nq, R.PE_NONE)
                        K[0] += 1
                else:
                    bk = S[g, G_B]
                    if B[q, bk, B_LEN] >= maxskbs:
                        _complete(S, H, FR, Q, B, C, O, K, B[q, bk, B_HEAD], R.BUCKET_EVICT)  # R18: bucket full, oldest
                    v4 = S[g, G_V4] != 0
                    h = hdr_a[i]
                    fr = np.int64(frame_a[i])
                    e = _take_slot(S, FR, g)
                    H[e, E_Q] = q
                    H[e, E_FID] = fid_a[i]
                    H[e, E_L2] = l2_a[i]
                    H[e, E_HDR] = h
                    H[e, E_SEQ0] = seq
                    H[e, E_NXT] = (seq + ln) & M32
                    H[e, E_ACK] = ack
                    H[e, E_FWM] = fwm
                    H[e, E_OPT] = opt
                    H[e, E_L3W] = l3w
                    H[e, E_ID0] = ipid_a[i]
                    H[e, E_FIXED] = 0
                    H[e, E_MSS] = gsz if gsz else ln  # R17: mss = the first segment's payload (GSO: gso_size)
                    H[e, E_GSO] = 1 if gsz else 0
                    H[e, E_COUNT] = cnt
                    H[e, E_NPK] = 1
                    H[e, E_PLEN] = h + ln  # p->len: L3 length
                    H[e, E_LIMIT] = lim4 if v4 else lim6  # R15a: netif_get_gro_max_size by protocol
                    H[e, E_FLAGS] = f
                    H[e, E_AGE] = r21_4_jiffy(now, phase, hz)  # R21.4: age = jiffies when held
                    H[e, E_F0] = fr
                    H[e, E_F1] = fr
                    H[e, E_T0] = t
                    H[e, E_T1] = t
                    # append to the bucket list (newest at the tail)
                    tail = B[q, bk, B_TAIL]
                    S[g, G_PREV] = tail
                    S[g, G_NEXT] = -1
                    if tail >= 0:
                        S[tail, G_NEXT] = g
                    else:
                        B[q, bk, B_HEAD] = g
                    B[q, bk, B_TAIL] = g
                    B[q, bk, B_LEN] += 1
                    Q[q, Q_HELD] += 1
        elif k == KIND_ALONE and pl_a[i]:
            # R5/R9/R12/R19: GRO gives up; delivered alone, held entries untouched (may overtake them)
            fr = np.int64(frame_a[i])
            _emit(O, K[0], fid_a[i], ver_a[i], sport_a[i], dport_a[i], seq_a[i], pl_a[i], 1, iplen_a[i],
                  wire_a[i], big_a[i], fr, fr, t, t, R.NOT_MERGEABLE_ALONE, r20_observed(False, 1), fl_a[i],
                  ack_a[i], 0, q // nq, R.PE_NONE)
            K[0] += 1

        # R21.3: a poll that used its whole budget (napi_weight packets of this queue)
        c = Q[q, Q_N] + 1
        if r21_3_budget_used(c, weight):
            c = 0
            if Q[q, Q_HELD]:
                Q[q, Q_CAUSE] = R.PE_BUDGET
                if flush_old_full:
                    _flush_old(S, H, FR, Q, B, C, O, K, q, now)  # R21.3/R21.4: HZ >= 1000 keeps this jiffy's entries
                else:
                    _flush_all(S, H, FR, Q, B, C, O, K, q, R.NAPI_POLL)  # R21.3: HZ < 1000 flushes everything
            Q[q, Q_WAIT] = 0
        Q[q, Q_N] = c
        # evidence (gro-spec 7.1): the receiver ACKed this segment's end, no rule ended its super-packet
        if evidence and k == KIND_TCP and ak[i] != 0 and S[gids[i], G_HELD] != 0:
            j = nxt[i]
            merges = j < 0 or _would_merge(S, H, D, C, gids[i], j, fm_a, fl_a, fwm_a, ack_a, opt_a, l3w_a, seq_a, pl_a,
                                           thl_a, ipid_a)
            if acked_end_ends_poll(True, True, merges):
                if acked_end_poll_waits(tmo or flush_old_full, c, Q[q, Q_WAIT] - 1):
                    Q[q, Q_WAIT] = gids[i] + 1  # the other flows' packets before this flow's next one come in it
                else:
                    Q[q, Q_CAUSE] = R.PE_ACK
                    _complete_poll(S, H, FR, Q, B, C, O, K, q, t, c)


@njit(cache=True, entry=True,
      sig="i64[:, ::1], i64[:, ::1], i64[::1], i64[:, ::1], i64[:, :, ::1], i64[::1], i64[:, ::1], i64[::1], i64")
def _flush_end(S, H, FR, Q, B, C, O, K, nq):
    """End of input (section 3 step 7): complete every held entry, reset the poll state of every queue."""
    for q in range(nq):
        if Q[q, Q_HELD]:
            Q[q, Q_CAUSE] = R.PE_END
            _flush_all(S, H, FR, Q, B, C, O, K, q, R.END_OF_CAPTURE)
        Q[q, Q_HASLAST] = 0
        Q[q, Q_WN] = 0
        Q[q, Q_N] = 0
        Q[q, Q_BUSY] = 0
        Q[q, Q_HASDL] = 0
        Q[q, Q_MASKED] = 0
        Q[q, Q_DEFER] = 0
        Q[q, Q_WAIT] = 0


# ============================================================================================================
# flow key -> gid: an open-addressing hash table over the exact 9-word keys of prepare (R4, R6/R10, R13)
# ============================================================================================================
NKEY = 9
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_K0, _K1, _K2, _K3, _K4, _K5, _K6, _K7 = (np.uint64(c) for c in (
    0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93, 0xFF51AFD7ED558CCD,
    0xC4CEB9FE1A85EC53, 0x87C37B91114253D5, 0x4CF5AD432745937F))


@njit(cache=True, inline="always")
def _mix(h, x):
    h = (h ^ x) * _M1
    h ^= h >> np.uint64(31)
    h *= _M2
    return h ^ (h >> np.uint64(29))


@njit(cache=True, entry=True, sig="i64[::1], i64[::1], i64[::1]")
def _next_same(gids, last, out):
    """``engine.next_same`` in one backward pass (no sort): ``last[g]`` is the row of gid g seen last."""
    for i in range(gids.shape[0] - 1, -1, -1):
        g = gids[i]
        if g < 0:
            out[i] = -1
        else:
            out[i] = last[g]
            last[g] = i


def next_same_compiled(gids: np.ndarray) -> np.ndarray:
    """For each row, the next row with the same gid (-1 for the last one, and for rows with gid -1): the
    compiled twin of ``engine.next_same``."""
    g = np.ascontiguousarray(gids, np.int64)
    out = np.empty(g.shape[0], np.int64)
    if g.shape[0]:
        _next_same(g, np.full(max(int(g.max()), 0) + 1, -1, np.int64), out)
    return out


@njit(cache=True, entry=True,
      sig="i64[:, ::1], u64[:, ::1], i64, i64, u64[:, ::1], i64[::1], i64[::1]")
def _dir_ids(S, keys, g0, g1, DK, DTAB, DST):
    """G_DID / G_RDID of gids g0..g1-1: ids of the direction keys (version|ports, src, dst words), new ids for
    unseen ones (the caller reserved room: DK rows, DTAB at most half full)."""
    m = DTAB.shape[0] - 1
    for g in range(g0, g1):
        v = np.uint64(4 if S[g, G_V4] else 6)
        sp = np.uint64(S[g, G_SPORT])
        dp = np.uint64(S[g, G_DPORT])
        for rev in range(2):
            if rev:
                w = (v << np.uint64(32)) | (dp << np.uint64(16)) | sp
                a0, a1, b0, b1 = keys[g, 4], keys[g, 5], keys[g, 2], keys[g, 3]
            else:
                w = (v << np.uint64(32)) | (sp << np.uint64(16)) | dp
                a0, a1, b0, b1 = keys[g, 2], keys[g, 3], keys[g, 4], keys[g, 5]
            h = _mix(_mix(_mix(_mix(_mix(_M2, w), a0), a1), b0), b1)
            j = np.int64(h & np.uint64(m))
            while True:
                d = DTAB[j]
                if d < 0:
                    d = DST[0]
                    DST[0] = d + 1
                    DK[d, 0], DK[d, 1], DK[d, 2], DK[d, 3], DK[d, 4] = w, a0, a1, b0, b1
                    DTAB[j] = d
                    break
                if DK[d, 0] == w and DK[d, 1] == a0 and DK[d, 2] == a1 and DK[d, 3] == b0 and DK[d, 4] == b1:
                    break
                j = (j + 1) & m
            S[g, G_RDID if rev else G_DID] = d


@njit(cache=True, entry=True,
      sig="u64[:, ::1], i64, i64[::1]")
def _dir_rehash(DK, n, DTAB):
    """Re-insert direction ids 0..n-1 into the empty table DTAB."""
    m = DTAB.shape[0] - 1
    for d in range(n):
        h = _mix(_mix(_mix(_mix(_mix(_M2, DK[d, 0]), DK[d, 1]), DK[d, 2]), DK[d, 3]), DK[d, 4])
        j = np.int64(h & np.uint64(m))
        while DTAB[j] >= 0:
            j = (j + 1) & m
        DTAB[j] = d


@njit(cache=True, entry=True,
      sig="i64[:, ::1], u64[:, ::1], u64[::1], i64[::1]")
def _compact(S, keys, khash, old):
    """Row old[i] of S, keys and khash moves to row i, in place (old ascending, so old[i] >= i)."""
    for i in range(old.shape[0]):
        o = old[i]
        if o != i:
            for c in range(S.shape[1]):
                S[i, c] = S[o, c]
            for c in range(keys.shape[1]):
                keys[i, c] = keys[o, c]
            khash[i] = khash[o]


@njit(cache=True, entry=True,
      sig="i64[::1], u64[::1], i64")
def _rehash(tab, khash, ngid):
    """Re-insert gids 0..ngid-1 (table digests ``khash``) into the empty table ``tab`` (size a power of 2)."""
    mask = np.uint64(tab.shape[0] - 1)
    for g in range(ngid):
        j = np.int64(khash[g] & mask)
        while tab[j] >= 0:
            j = (j + 1) & (tab.shape[0] - 1)
        tab[j] = _tagged(khash[g], g)


@njit(cache=True, entry=True,
      sig=("i8[::1], (u64[::1], u64[::1], u64[:], u64[:], u64[:], u64[:], u64[::1], u64[::1], u64[::1]), "
          "i64, i64[::1], i64[::1], u64[:, ::1], u64[::1], i64[::1], i64[::1]"))
def _lookup_gids(kind, KC, start, gids, tab, keys, khash, ST, new_rows):
    """gid of each KIND_TCP row from ``start`` on (-1 elsewhere); unseen keys get the next gid, their first
    row goes to ``new_rows``. ST = [ngid, nnew]. Returns the row where it stopped: len(kind) when done, less when
    ``keys`` or ``tab`` (kept at most half full) must grow first.

    The table digest is a multiply-add of the 9 words (independent multiplies, one final mix); the full key is
    always compared, so the digest only has to spread keys over the table."""
    c0, c1, c2, c3, c4, c5, c6, c7, c8 = KC
    n = kind.shape[0]
    size = tab.shape[0]
    mask = np.uint64(size - 1)
    ngid = ST[0]
    nnew = ST[1]
    pg = -1  # previous TCP row's gid: bursts of one flow skip the hash
    for i in range(start, n):
        if kind[i] != KIND_TCP:
            gids[i] = -1
            continue
        k0, k1, k2, k3, k4 = c0[i], c1[i], c2[i], c3[i], c4[i]
        k5, k6, k7, k8 = c5[i], c6[i], c7[i], c8[i]
        if pg >= 0 and keys[pg, 6] == k6 and keys[pg, 2] == k2 and keys[pg, 3] == k3 and keys[pg, 4] == k4 \
                and keys[pg, 5] == k5 and keys[pg, 0] == k0 and keys[pg, 1] == k1 and keys[pg, 7] == k7 \
                and keys[pg, 8] == k8:
            gids[i] = pg
            continue
        h = _mix(k0 * _K0 + k1 * _K1 + k2 * _K2 + k3 * _K3 + k4 * _K4 + k5 * _K5 + k6 * _K6 + k7 * _K7 + k8, _M1)
        j = np.int64(h & mask)
        tag = _tag(h)
        while True:
            te = tab[j]
            if te < 0:
                if ngid >= keys.shape[0] or 2 * (ngid + 1) > size:
                    ST[0] = ngid
                    ST[1] = nnew
                    return i  # grow first
                g = ngid
                ngid += 1
                keys[g, 0], keys[g, 1], keys[g, 2], keys[g, 3], keys[g, 4] = k0, k1, k2, k3, k4
                keys[g, 5], keys[g, 6], keys[g, 7], keys[g, 8] = k5, k6, k7, k8
                tab[j] = _tagged(h, g)
                khash[g] = h
                new_rows[nnew] = i
                nnew += 1
                break
            g = te & _SLOT
            if _entry_tag(te) == tag and keys[g, 6] == k6 and keys[g, 2] == k2 and keys[g, 3] == k3 \
                    and keys[g, 4] == k4 and keys[g, 5] == k5 and keys[g, 0] == k0 and keys[g, 1] == k1 \
                    and keys[g, 7] == k7 and keys[g, 8] == k8:
                break
            j = (j + 1) & (size - 1)
        gids[i] = g
        pg = g
    ST[0] = ngid
    ST[1] = nnew
    return n


@njit(cache=True, entry=True,
      sig=("u8[::1], u8[::1], i32[::1], i64[::1], u16[::1], u16[::1], u8[::1], u32[::1], u32[::1], i32[::1], "
          "u8[::1], u8[::1], u16[::1], u16[::1], u8[::1], u8[::1], u8[::1], u64[::1], u16[::1], u32[::1], "
          "u64[:, ::1], u64[:, ::1], u16[::1], u16[::1], u32[::1], u64[::1], i64[::1], i8[::1], b1[::1], "
          "i64[::1], i64[::1], i64[::1], u64[::1], u64[::1], u64[::1]"))
def _prepare_kernel(ver, l4_proto, l4_off, fid, status, ip_hdr_len, tunnel, ip_len_field, wirelen, l3_off, ip_evil,
                    tcp_hdr_len, tcp_flags, tcp_win, ttl, tos, df, l2_hash, vlan, if_id, src, dst, sport, dport,
                    flow_label, ext_hash, cfg, kind, flushmark, flagword, l3word, hdr_len, c1, c6, c7):
    """``prepare.prepare`` (dedupe=False, row_hash=False) in one pass: the same columns, computed per row.
    cfg = [flag bits kept, treat_padding_as_flush]. Key columns 0, 2-5 and 8 are the batch's own arrays."""
    keep = cfg[0]
    pad_flush = cfg[1] != 0
    for i in range(ver.shape[0]):
        v = ver[i]
        v4 = v == 4
        v6 = v == 6
        st = np.int64(status[i])
        tcp = (v4 or v6) and l4_proto[i] == 6 and fid[i] >= 0 and (st & NO_GRO_STATUS) == 0
        if tcp:
            giveup = (v4 and ip_hdr_len[i] != 20) or not r12_header_pulls(np.int64(tcp_hdr_len[i])) or tunnel[i] != 0
        else:
            # R5/R9: a first fragment whose TCP header was read is delivered alone (a row), held entries
            # untouched (never a ``tcp`` row: ST_IP_FRAGMENT is in NO_GRO_STATUS, so only tested on the others)
            giveup = ((st & ST_IP_FRAGMENT) != 0 and (st & FRAGMENT_OTHER) == 0 and (v4 or v6)
                      and l4_proto[i] == 6 and fid[i] >= 0 and l4_off[i] >= 0)
        kind[i] = KIND_ALONE if giveup else (KIND_TCP if tcp else KIND_OTHER)
        declared = np.int64(ip_len_field[i]) + (40 if v6 else 0)
        l3o = np.int64(l3_off[i])
        flushmark[i] = r7_r11_flushmark(declared, np.int64(wirelen[i]) - l3o, l3o, pad_flush, v4, ip_evil[i])
        flagword[i] = r14_2_flag_word(np.int64(tcp_hdr_len[i]), np.int64(tcp_flags[i]), np.int64(tcp_win[i]), keep)
        l3word[i] = r8_r11_l3_word(np.int64(ttl[i]), np.int64(tos[i]), np.int64(df[i]) if v4 else np.int64(0))
        hdr_len[i] = np.int64(ip_hdr_len[i]) + np.int64(tcp_hdr_len[i])
        c1[i] = (np.uint64(vlan[i]) << np.uint64(32)) | np.uint64(if_id[i])
        c6[i] = (np.uint64(v) << np.uint64(48)) | (np.uint64(l4_proto[i]) << np.uint64(32)) \
            | (np.uint64(sport[i]) << np.uint64(16)) | np.uint64(dport[i])
        c7[i] = np.uint64(flow_label[i]) if v6 else np.uint64(0)


def prepare_compiled(b: PacketBatch, fid: np.ndarray, cfg: GroConfig) -> Prepared:
    """``prepare(b, fid, cfg, dedupe=False, row_hash=False)`` computed by one compiled pass (the compiled engine's
    input; tests/gro/test_compiled.py checks it equals the vectorized original on every kernel capture)."""
    n = len(b)
    kind = np.empty(n, np.int8)
    flushmark = np.empty(n, np.bool_)
    flagword, l3word, hdr_len = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    c1, c6, c7 = np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty(n, np.uint64)
    src = np.ascontiguousarray(b.src).view(np.uint64).reshape(n, 2)
    dst = np.ascontiguousarray(b.dst).view(np.uint64).reshape(n, 2)
    c = np.array([rules.r14_2_kept_flags(cfg), int(cfg.treat_padding_as_flush)], np.int64)
    _prepare_kernel(b.ip_version, b.l4_proto, b.l4_off, fid, b.status, b.ip_hdr_len, b.tunnel, b.ip_len_field, b.wirelen,
                    b.l3_off, b.ip_evil, b.tcp_hdr_len, b.tcp_flags, b.tcp_win, b.ttl, b.tos, b.df, b.l2_hash, b.vlan,
                    b.if_gid, src, dst, b.sport, b.dport, b.flow_label, b.ext_hash, c, kind, flushmark, flagword,
                    l3word, hdr_len, c1, c6, c7)
    z = np.zeros(0, np.int64)
    key_cols = (b.l2_hash, c1, src[:, 0], src[:, 1], dst[:, 0], dst[:, 1], c6, c7, b.ext_hash)
    return Prepared(kind, flushmark, flagword, l3word, hdr_len, None, z, z, z, np.zeros((0, 9), np.uint64), key_cols)


# ============================================================================================================
# the engine
# ============================================================================================================
class CompiledGroEngine:
    """GroEngine with its per-packet loop compiled (numba); identical rows. See the module docstring."""

    def __init__(self, config: GroConfig | None = None) -> None:
        cfg = config if config is not None else GroConfig()
        self.config = cfg
        self.next_window: int | None = ACK_NEXT_ROWS  # see ``engine.next_same``
        self._ref: GroEngine | None = None
        if cfg.hz > MAX_HZ or max(abs(cfg.jiffy_phase_ns), cfg.gro_flush_timeout_ns, cfg.napi_weight,
                                  cfg.napi_defer_hard_irqs, cfg.mtu) > MAX_PHASE:
            self._ref = GroEngine(cfg)  # int64 time/jiffy arithmetic could overflow: run the reference engine
            return
        lim4, lim6 = rules.r15_limits(cfg)
        gap = float(cfg.poll_gap_us) * 1000.0  # the reference compares int > float; for ints, > floor(gap)
        gap_i = BIG if (math.isinf(gap) or gap >= BIG) else math.floor(gap)
        pgap = rules.r21_2_push_gap_ns(cfg)
        pgap_i = BIG if (math.isinf(pgap) or pgap >= BIG) else math.floor(pgap)
        C = np.zeros(NCF, np.int64)
        C[C_LIM4] = lim4
        C[C_LIM6] = lim6
        C[C_GAP] = gap_i
        C[C_CWR] = rules.r14_1_cwr_mask(cfg)
        C[C_GSO_AUTO] = cfg.input_is_gso is not False
        C[C_NEEDS_DF] = cfg.fixedid_needs_df
        C[C_MAXSKBS] = min(BIG, cfg.max_gro_skbs)  # a bucket never holds 2**62 entries: BIG == inf
        C[C_HZ] = cfg.hz
        C[C_PHASE] = cfg.jiffy_phase_ns
        C[C_FLUSH_OLD_FULL] = rules.r21_3_flush_old_on_full_budget(cfg)
        C[C_TMO] = cfg.gro_flush_timeout_ns
        C[C_WEIGHT] = cfg.napi_weight
        C[C_DEFER] = cfg.napi_defer_hard_irqs
        C[C_HBH] = cfg.ipv6_hbh
        C[C_NB] = cfg.gro_hash_buckets
        C[C_NQ] = cfg.rx_queues
        C[C_RXU] = cfg.rx_usecs * 1000
        C[C_RXF] = cfg.rx_frames
        C[C_PGAP] = pgap_i
        self._C = C
        self._nb = cfg.gro_hash_buckets
        # per flow key (gid)
        self._ngid = 0
        self._S = np.zeros((0, NSF), np.int64)
        self._H = np.zeros((0, NHF), np.int64)  # held entries by slot, and the free slots (a stack)
        self._FR = np.zeros(1, np.int64)
        self._keys = np.zeros((64, NKEY), np.uint64)  # exact flow key per gid
        self._khash = np.zeros(64, np.uint64)  # its table digest
        self._tab = np.full(256, -1, np.int64)  # hash table: slot -> tagged gid (_tagged), at most half full
        # per flow direction (SYN MSS): direction key -> did in a compiled open-addressing table
        self._D = np.zeros(16, np.int64)
        self._DK = np.zeros((16, 5), np.uint64)
        self._DTAB = np.full(64, -1, np.int64)
        self._DST = np.zeros(1, np.int64)
        self._recycle_at = RECYCLE_MIN
        # per NAPI instance
        self._nq = 0
        self._Q = np.zeros((0, NQF), np.int64)
        self._B = np.zeros((0, self._nb, 3), np.int64)
        self._ensure_queues(cfg.rx_queues)
        self._K = np.zeros(2, np.int64)  # rows written, rows to process
        self._obuf = np.empty((len(_OUT_TYPES), 0), np.int64)

    @property
    def compiled(self) -> bool:
        """False when this config runs on the reference engine (see the module docstring)."""
        return self._ref is None

    # --- public API ---------------------------------------------------------------------------------------
    def feed(self, batch: PacketBatch, flow_id: np.ndarray, poll_start: np.ndarray | None = None,
             acked: np.ndarray | None = None, receiver: np.ndarray | None = None,
             busy: np.ndarray | None = None, upto: int | None = None) -> SuperPacketBatch:
        """Process the next packets (capture order); return the rows completed meanwhile, in delivery order.

        ``poll_start``, ``acked``, ``receiver``, ``busy``, ``upto``: see ``GroEngine.feed``."""
        if self._ref is not None:
            self._ref.next_window = self.next_window
            return self._ref.feed(batch, flow_id, poll_start, acked, receiver, busy, upto)
        flow_id = np.asarray(flow_id)
        if flow_id.shape != (len(batch),):
            raise ValueError(f"flow_id must have one entry per packet: shape {flow_id.shape}, {len(batch)} packets")
        marks = _poll_marks(poll_start, len(batch))
        ps = _NO_MARKS if marks is None else marks
        ak = _poll_marks(acked, len(batch)) if acked is not None else _NO_MARKS
        bz = _busy_times(busy, len(batch)) if busy is not None and marks is None else _NO_BUSY
        rx = _receivers(receiver, batch)
        n = len(batch)
        if not n:
            return SuperPacketBatch.empty(0)
        fid = flow_id.astype(np.int64, copy=False)
        nqc = self.config.rx_queues
        # the per-row flow hash only picks the RX queue; with one queue, new keys are hashed in _new_gids
        prep = prepare(batch, fid, self.config, dedupe=False, row_hash=True) if nqc > 1 \
            else prepare_compiled(batch, fid, self.config)
        qrow = rx
        if nqc > 1:  # RX queue per packet: per receiver, (flow hash >> 32) % rx_queues (RSS stand-in)
            qrow = qrow * nqc + ((prep.flow_hash >> np.uint64(32)) % np.uint64(nqc)).astype(np.int64)
        self._ensure_queues(int(qrow.max()) + 1)
        gids = self._assign_gids(batch, prep, rx)
        O = self._out(n + self.held)
        self._K[0] = 0
        self._K[1] = n if upto is None else upto
        nxt = cap_next(next_same_compiled(gids), self.next_window) if len(ak) else _NO_NEXT
        self._slots(n)
        _run(self._inputs(batch, prep, fid), gids, qrow, ps, ak, bz, nxt, self._S, self._H, self._FR, self._D, self._Q,
             self._B, self._C, O, self._K)
        return self._take(O)

    def flush(self) -> SuperPacketBatch:
        """End of input: complete every held entry (reason end_of_capture) and reset the poll state."""
        if self._ref is not None:
            return self._ref.flush()
        O = self._out(self.held)
        self._K[0] = 0
        _flush_end(self._S, self._H, self._FR, self._Q, self._B, self._C, O, self._K, self._nq)
        return self._take(O)

    @property
    def held(self) -> int:
        """Number of super-packets currently held (all queues)."""
        if self._ref is not None:
            return self._ref.held
        return int(self._Q[: self._nq, Q_HELD].sum())

    def held_flow_ids(self) -> np.ndarray:
        """Flow ids of the entries currently held (their rows are still to come)."""
        if self._ref is not None:
            return self._ref.held_flow_ids()
        slot = self._S[: self._ngid, G_HELD]
        return self._H[slot[slot != 0] - 1, E_FID]

    # --- helpers --------------------------------------------------------------------------------------------
    @staticmethod
    def _inputs(b: PacketBatch, p: Prepared, fid: np.ndarray) -> tuple:
        return (p.kind, b.ts_ns, p.flushmark, p.flagword, p.l3word, b.tcp_payload_len, b.tcp_flags, b.tcp_seq,
                b.tcp_ack, b.tcp_opt_hash, b.ip_id, b.frame, fid, b.l2_len, p.hdr_len, b.tcp_hdr_len, b.tcp_mss,
                b.ip_version, b.sport, b.dport, b.ip_len, b.wirelen, b.bigtcp)

    def _slots(self, room: int) -> None:
        """At least ``room`` free slots in ``_H`` (a feed holds at most one new entry per packet). New slots go
        under the free ones on the stack, lowest on top, and only the slots in use are copied: rows never used
        stay unmapped."""
        free = int(self._FR[0])
        if free >= room:
            return
        cap = self._H.shape[0]
        new = max(2 * cap, cap + room - free)
        H = lazy_zeros((new, NHF), np.int64)
        slot = self._S[: self._ngid, G_HELD]
        used = slot[slot != 0] - 1
        H[used] = self._H[used]
        FR = np.empty(new + 1, np.int64)
        add = new - cap
        FR[1: 1 + add] = np.arange(new - 1, cap - 1, -1)
        FR[1 + add: 1 + add + free] = self._FR[1: 1 + free]
        FR[0] = add + free
        self._H, self._FR = H, FR

    def _out(self, cap: int) -> np.ndarray:
        """Row buffer for at most ``cap`` rows (each packet gives at most one row, each held entry one more).

        One int64 array (every array argument costs atomic refcounting on each compiled call), reused across
        feeds: ``_take`` copies the rows out."""
        if self._obuf.shape[1] < cap:  # (resident only as far as rows are written: a feed's rows, not its cap)
            self._obuf = lazy_zeros((len(_OUT_TYPES), max(cap, 2 * self._obuf.shape[1])), np.int64)
        return self._obuf

    def _take(self, O: np.ndarray) -> SuperPacketBatch:
        k = int(self._K[0])
        if k > O.shape[1]:  # cannot happen: a feed completes at most (held + its packets) rows
            raise RuntimeError(f"GRO row buffer overflow: {k} rows, capacity {O.shape[1]}")
        return SuperPacketBatch(*(O[j, :k].astype(t) for j, t in enumerate(_OUT_TYPES)))

    def _ensure_queues(self, nq: int) -> None:
        if nq <= self._nq:
            return
        if nq > self._Q.shape[0]:
            cap = max(nq, 2 * self._Q.shape[0], 4)
            Q = np.zeros((cap, NQF), np.int64)
            Q[: self._Q.shape[0]] = self._Q
            B = np.full((cap, self._nb, 3), -1, np.int64)
            B[:, :, B_LEN] = 0
            B[: self._B.shape[0]] = self._B
            self._Q, self._B = Q, B
        self._nq = nq

    def _assign_gids(self, b: PacketBatch, prep: Prepared, rx: np.ndarray) -> np.ndarray:
        """Global id per KIND_TCP row (-1 elsewhere), creating per-key state for new keys."""
        n = len(b)
        gids = np.empty(n, np.int64)
        new_rows = np.empty(n, np.int64)
        st = np.array([self._ngid, 0], np.int64)
        g0 = self._ngid
        i = 0
        while True:
            i = _lookup_gids(prep.kind, prep.key_cols, i, gids, self._tab, self._keys, self._khash, st, new_rows)
            if i >= n:
                break
            if st[0] >= self._keys.shape[0]:
                keys = table_full((2 * self._keys.shape[0], NKEY), 0, np.uint64)
                keys[: self._keys.shape[0]] = self._keys
                khash = table_full(2 * self._keys.shape[0], 0, np.uint64)
                khash[: self._keys.shape[0]] = self._khash
                self._keys, self._khash = keys, khash
            if 2 * (st[0] + 1) > self._tab.shape[0]:
                self._tab = table_full(2 * self._tab.shape[0], -1, np.int64)
                _rehash(self._tab, self._khash, int(st[0]))
        self._ngid = int(st[0])
        if self._ngid > g0:
            self._new_gids(b, prep, g0, new_rows[: int(st[1])], rx)
        return gids

    def _new_gids(self, b: PacketBatch, prep: Prepared, g0: int, rows: np.ndarray, rx: np.ndarray) -> None:
        """Static per-gid facts of gids g0.. (first seen at ``rows``): queue, bucket, version, ports, SYN ids."""
        if self._ngid > self._S.shape[0]:
            S = np.zeros((max(64, self._ngid, 2 * self._S.shape[0]), NSF), np.int64)
            S[: self._S.shape[0]] = self._S
            self._S = S
        nq, nb = self.config.rx_queues, self._nb
        h = flow_hash_of(b.ip_version[rows], tuple(c[rows] for c in prep.key_cols))
        v4 = b.ip_version[rows] == 4
        sport = b.sport[rows].astype(np.int64)
        dport = b.dport[rows].astype(np.int64)
        s = self._S[g0: self._ngid]
        s[:, G_Q] = rx[rows] * nq + ((h >> np.uint64(32)) % np.uint64(nq)).astype(np.int64)
        s[:, G_B] = (h % np.uint64(nb)).astype(np.int64)  # R4: bucket = skb->hash & (GRO_HASH_BUCKETS - 1)
        s[:, G_V4] = v4
        mtu = self.config.mtu
        s[:, G_FBL] = np.where(v4, rules.r2_fallback_limit(mtu, True), rules.r2_fallback_limit(mtu, False))
        s[:, G_SPORT] = sport
        s[:, G_DPORT] = dport
        s[:, G_GMAX] = 0
        s[:, G_HELD] = 0
        s[:, G_PREV] = -1
        s[:, G_NEXT] = -1
        self._dids(g0, self._ngid)

    def _dids(self, g0: int, g1: int) -> None:
        """Direction ids (SYN MSS per direction: addresses and ports, not the L2 keys) of gids g0..g1-1."""
        m = g1 - g0
        need = int(self._DST[0]) + 2 * m
        if need > self._DK.shape[0]:
            cap = max(need, 2 * self._DK.shape[0])
            DK = table_full((cap, 5), 0, np.uint64)
            DK[: self._DK.shape[0]] = self._DK
            D = table_full(cap, 0, np.int64)
            D[: self._D.shape[0]] = self._D
            self._DK, self._D = DK, D
        if 2 * need > self._DTAB.shape[0]:
            size = self._DTAB.shape[0]
            while size < 4 * need:
                size *= 2
            self._DTAB = table_full(size, -1, np.int64)
            _dir_rehash(self._DK, int(self._DST[0]), self._DTAB)
        _dir_ids(self._S, self._keys, g0, g1, self._DK, self._DTAB, self._DST)

    def recycle(self, flow_in_memory: Callable[[np.ndarray], np.ndarray]) -> int:
        """Forget the state of flow keys with no held entry whose last flow has ended (``flow_in_memory(flow
        ids)`` is False), renumbering the others, so state follows the flows alive at once; a returning key
        starts afresh, as the flow table gives it a new flow. Runs only when the key count has doubled since
        the last time (amortised O(1) per key). Returns the number of keys forgotten."""
        if self._ref is not None or self._ngid < self._recycle_at:
            return 0
        n = self._ngid
        S = self._S[:n]
        keep = (S[:, G_HELD] != 0) | flow_in_memory(S[:, G_FIDL].copy())
        wait = self._Q[: self._nq, Q_WAIT]  # a key a poll's end waits for stays (its number moves with it)
        keep[wait[wait != 0] - 1] = True
        old = np.nonzero(keep)[0]
        k = int(old.shape[0])
        new_of = np.full(n + 1, -1, np.int64)  # new_of[-1] = -1: list ends stay -1
        new_of[old] = np.arange(k)
        # compacted in place (a new table beside the old one was the run's peak on many flows); room for the keys
        # until the next recycle (2k) and one feed's new keys past it, so the feed that reaches 2k does not double
        # the tables first (rows never written stay unmapped: np.zeros of a large table maps it)
        cap = 2 * k + FEED_ROOM
        _compact(self._S, self._keys, self._khash, old)  # the kept rows move down, one at a time (no copy of them)
        if self._S.shape[0] < cap or self._keys.shape[0] < cap:
            cap += cap // 4  # headroom: the next recycles of a steady key count find room here (no new tables)
            S2, keys = table_full((cap, NSF), 0, np.int64), table_full((cap, NKEY), 0, np.uint64)
            khash = table_full(cap, 0, np.uint64)
            S2[:k], keys[:k], khash[:k] = self._S[:k], self._keys[:k], self._khash[:k]
        else:
            S2, keys, khash = self._S, self._keys, self._khash
            S2[k:n], keys[k:n], khash[k:n] = 0, 0, 0  # new keys start from zeroed rows
        for c in (G_PREV, G_NEXT):
            S2[:k, c] = new_of[S2[:k, c]]
        for c in (B_HEAD, B_TAIL):
            self._B[:, :, c] = new_of[self._B[:, :, c]]
        wait[:] = new_of[wait - 1] + 1  # (0, none, maps through new_of[-1] = -1 back to 0)
        # The key and direction tables are rebuilt in the arrays they had when those are the right size: a steady
        # key count recycles every few batches, and new tables each time (a few MiB on the heap, or fresh maps
        # faulted in again) scattered the heap and stacked old and new tables at the run's peak
        size = 256
        while size < 2 * (k + 1):
            size *= 2
        self._tab = table_full(size, -1, np.int64, reuse=self._tab)
        _rehash(self._tab, khash, k)
        # directions: rebuilt for the kept keys, their SYN MSS carried over
        mss, rmss = self._D[S2[:k, G_DID]], self._D[S2[:k, G_RDID]]
        self._S, self._keys, self._khash, self._ngid = S2, keys, khash, k
        if self._DK.shape[0] >= 2 * cap:  # two direction ids per key at most
            self._D[: int(self._DST[0])] = 0  # (DK rows are written whole when an id is given; DTAB is cleared)
        else:
            self._D = table_full(2 * cap, 0, np.int64)
            self._DK = table_full((2 * cap, 5), 0, np.uint64)
        self._DTAB.fill(-1)
        self._DST[0] = 0
        if k:
            self._dids(0, k)
            self._D[S2[:k, G_DID]] = mss
            self._D[S2[:k, G_RDID]] = rmss
        self._recycle_at = max(RECYCLE_MIN, 2 * k)
        return n - k
