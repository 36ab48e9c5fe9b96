"""Sums per int64 key, added batch by batch in one compiled pass (the diagnosis tallies, ``diagnose.py``).

``KeyedSums`` keeps, per key ``flow << shift | code``, int64 sums of ``width`` columns and a first-seen ordinal
(kept by min). Rows go into dense arrays through an open-addressing table (at most half full), so adding a batch
costs one probe per row, not a sort of everything added since the last merge. When the dense rows have grown by
half since the last time, keys whose flow ``keep`` rejects (a flow that has left memory and is not among the top
flows) are dropped: memory follows the flows alive at once, not the capture. The sorted view (``keys``,
``sums``, ``first``, ascending key) is made when it is read, and kept until the next add.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._native import njit
from .buffers import table_full

ROOM_STEP = 1 << 12  # new keys made room for at a time (at least; half those held when more)
PRUNE_MIN = 1 << 16  # keys held before the first pruning (then 1.5 times the keys kept by the last one)
_MIX = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, inline="always")
def _home(k, mask):
    """Table slot a key's probe starts at (Fibonacci hashing of the 64-bit key, high bits first)."""
    h = np.uint64(k) * _MIX
    return np.int64((h ^ (h >> np.uint64(29))) & np.uint64(mask))


@njit(cache=True, entry=True,
      sig="i64[::1], i64[:, ::1], i64[::1], i64, i64[::1], i64[::1], i64[:, ::1], i64[::1], i64[::1]")
def keyed_add(keys, sums, first, start, T, K, S, F, ST):
    """Add rows ``start..`` of (``keys``, ``sums``, ``first``) to the dense sums K, S, F (ST[0] rows used)
    through the table T (dense row per slot, -1 empty). Returns the row it stopped at: len(keys) when done, less
    when a new key finds the dense arrays full or the table half full (the caller makes room and goes on)."""
    mask = T.shape[0] - 1
    w = S.shape[1]
    n = ST[0]
    limit = min(K.shape[0], T.shape[0] >> 1)
    for i in range(start, keys.shape[0]):
        k = keys[i]
        j = _home(k, mask)
        while True:
            e = T[j]
            if e < 0:
                if n == limit:
                    ST[0] = n
                    return i
                T[j] = n
                K[n] = k
                for c in range(w):
                    S[n, c] = sums[i, c]
                F[n] = first[i]
                n += 1
                break
            if K[e] == k:
                for c in range(w):
                    S[e, c] += sums[i, c]
                if first[i] < F[e]:  # noqa: PLR1730 - no store in the common case
                    F[e] = first[i]
                break
            j = (j + 1) & mask
    ST[0] = n
    return keys.shape[0]


@njit(cache=True, entry=True, sig="i64[::1], i64[::1], i64")
def keyed_rehash(T, K, n):
    """Insert dense rows 0..n-1 (keys K) into the empty table T."""
    mask = T.shape[0] - 1
    for e in range(n):
        j = _home(K[e], mask)
        while T[j] >= 0:
            j = (j + 1) & mask
        T[j] = e


class KeyedSums:
    """int64 sums (and a first-seen ordinal, kept by min) per int64 key ``flow << shift | code`` (module doc)."""

    def __init__(self, width: int, keep: Callable[[np.ndarray], np.ndarray] | None, shift: int = 7) -> None:
        self.keep = keep
        self.shift = shift  # key = flow << shift | code
        self.width = width
        self._K = np.zeros(0, np.int64)
        self._S = np.zeros((0, width), np.int64)
        self._F = np.zeros(0, np.int64)
        self._T = np.full(16, -1, np.int64)
        self._ST = np.zeros(1, np.int64)
        self._prune_at = PRUNE_MIN
        self._view: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        """Keys held (not yet pruned)."""
        return int(self._ST[0])

    def add(self, keys: np.ndarray, sums: np.ndarray, first: np.ndarray) -> None:
        m = len(keys)
        if not m:
            return
        keys, first = np.ascontiguousarray(keys, np.int64), np.ascontiguousarray(first, np.int64)
        sums = np.ascontiguousarray(sums, np.int64).reshape(m, self.width)
        i = 0
        while i < m:  # room for new keys in steps (most of a batch's keys are already held)
            self._room(min(m - i, max(ROOM_STEP, len(self) // 2)))
            i = int(keyed_add(keys, sums, first, np.int64(i), self._T, self._K, self._S, self._F, self._ST))
        self._view = None
        if self.keep is not None and len(self) >= self._prune_at:
            self._prune()

    def add_mapped(self, keys: np.ndarray, sums: np.ndarray, first: np.ndarray, fmap: np.ndarray) -> None:
        """``add`` a split run's part's keys, their flow ids mapped to the whole capture's by ``fmap``."""
        keys = keys.astype(np.int64)
        self.add((fmap[keys >> self.shift] << self.shift) | (keys & ((1 << self.shift) - 1)), sums, first)

    def _room(self, m: int) -> None:
        """Dense rows and table slots for ``m`` more keys (the table at most half full)."""
        n = len(self)
        if n + m > self._K.shape[0]:
            cap = max(n + m, self._K.shape[0] * 3 // 2, 64)
            K, S, F = (table_full(cap, 0, np.int64), table_full((cap, self.width), 0, np.int64),
                       table_full(cap, 0, np.int64))
            K[:n], S[:n], F[:n] = self._K[:n], self._S[:n], self._F[:n]
            self._K, self._S, self._F = K, S, F
        if 2 * (n + m) > self._T.shape[0]:
            size = self._T.shape[0]
            while size < 2 * (n + m):
                size *= 2
            self._rebuild(size)

    def _rebuild(self, size: int) -> None:
        self._T = table_full(size, -1, np.int64, reuse=self._T)  # (after a pruning: mostly the same table)
        keyed_rehash(self._T, self._K, np.int64(len(self)))

    def _prune(self) -> None:
        """Drop the keys of flows ``keep`` rejects; the next pruning comes when the keys have grown by half again."""
        n = len(self)
        live = np.flatnonzero(self.keep(self._K[:n] >> self.shift))
        k = int(live.shape[0])
        self._K[:k], self._S[:k], self._F[:k] = self._K[live], self._S[live], self._F[live]
        self._ST[0] = k
        size = 16
        while size < 2 * max(k, PRUNE_MIN):
            size *= 2
        self._rebuild(size)
        self._prune_at = max(PRUNE_MIN, k + k // 2)
        self._view = None

    def _sorted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._view is None:
            n = len(self)
            order = np.argsort(self._K[:n], kind="stable")
            self._view = (self._K[order], self._S[order], self._F[order])
        return self._view

    @property
    def keys(self) -> np.ndarray:
        """Every key held, ascending."""
        return self._sorted()[0]

    @property
    def sums(self) -> np.ndarray:
        """Their sums (rows in ``keys`` order, ``width`` columns)."""
        return self._sorted()[1]

    @property
    def first(self) -> np.ndarray:
        """Their first-seen ordinals (in ``keys`` order)."""
        return self._sorted()[2]

    def of_flow(self, flow: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(codes, sums, first) of one flow's keys, ascending code."""
        keys, sums, first = self._sorted()
        lo, hi = np.searchsorted(keys, [flow << self.shift, (flow + 1) << self.shift])
        return keys[lo:hi] & ((1 << self.shift) - 1), sums[lo:hi], first[lo:hi]


@njit(cache=True, entry=True,
      sig=("i64[::1], u8[::1], u32[::1], u32[::1], u32[::1], u8[::1], u8[::1], u16[::1], i64, i64[::1], i64[::1], "
           "i64[:, ::1], i64[::1], i64[::1], i64[::1], i64[:, ::1], i64[:, ::1], i64[::1]"))
def tally_keys(fid, ver, pay, nseg, l3, reason, source, flags, row0, P, TK, TS, TF, OK, OF, V, HIST, SC):
    """The keys of one batch of super-packet rows for the diagnosis tallies (``diagnose.SuperPacketTally.add`` and
    ``ObservedSizes``), in one pass instead of some forty whole-batch array operations.

    P: [napi weight, IPv4 limit, IPv6 limit, SIZE_LIMIT, OBSERVED (reason codes), SOURCE_OBSERVED, the tally's
    code shift, OBS_BITS, OBS_SHIFT, OBS_VALUE_MAX, the legacy 64 KiB size, TH_PSH, OBS_D, OBS_D_PSH,
    OBS_BUDGET, OBS_MSS, OBS_NSEG]. Writes the tally's keys, sums and first rows to TK/TS/TF (a row's key, and
    a second one for a row counted under size_limit: its engine reason + 64), the observed rows' three keys
    and rows to OK/OF, the observed rows' per-version aggregates into V (rows: IPv4, IPv6) and HIST, and
    SC[0..3] += observed rows, max segments, max l3_len, rows above 64 KiB. Returns tally keys + (observed
    keys << 32)."""
    weight, lim4, lim6, r_size, r_obs, s_obs, shift = P[0], P[1], P[2], P[3], P[4], P[5], P[6]
    bits, oshift, vmax, legacy, psh = P[7], P[8], P[9], P[10], P[11]
    k_d, k_dpsh, k_budget, k_mss, k_nseg = P[12], P[13], P[14], P[15], P[16]
    t = 0
    o = 0
    for i in range(fid.shape[0]):
        f = fid[i]
        rs = np.int64(reason[i])
        ns = np.int64(nseg[i])
        one = ns if ns > 1 else np.int64(1)
        p = np.int64(pay[i])
        seg = (p + one - 1) // one
        ln = np.int64(l3[i])
        v = ver[i]
        limit = lim4 if v == 4 else lim6
        r = row0 + i
        at_budget = np.int64(1) if ns == weight else np.int64(0)
        observed = np.int64(source[i]) == s_obs
        bound = (not observed and rs != r_size and rs != r_obs and ln + seg >= limit and p > 0)
        TK[t] = (f << shift) | (r_size if bound else rs)
        TS[t, 0] = 1
        TS[t, 1] = p
        TS[t, 2] = at_budget
        TF[t] = r
        t += 1
        if bound:  # the engine's own reason too
            TK[t] = (f << shift) | (64 + rs)
            TS[t, 0] = 1
            TS[t, 1] = p
            TS[t, 2] = at_budget
            TF[t] = r
            t += 1
        if not observed:
            continue
        SC[0] += 1
        SC[1] = max(SC[1], ns)
        SC[2] = max(SC[2], ln)
        if ln > legacy - 1:
            SC[3] += 1
        if v == 4 or v == 6:
            j = 0 if v == 4 else 1
            if ln > V[j, 1]:  # V_LMAX, V_SMAX: the first of the largest
                V[j, 1] = ln
                V[j, 2] = ns
            if ns > 0 and seg > V[j, 3]:  # V_MSS (rows with a segment count)
                V[j, 3] = seg
            if ns == weight:  # V_BUDGET
                V[j, 4] += 1
            V[j, 5] = max(V[j, 5], ns)  # V_NMAX
            V[j, 0] += 1  # V_COUNT
            if ln < legacy:
                HIST[j, ln] += 1
        base = f << oshift
        if ns == weight:
            OK[o] = base | (k_budget << bits)
        else:
            d = legacy - ln if ln < legacy else legacy + 1
            OK[o] = base | ((k_dpsh if np.int64(flags[i]) & psh else k_d) << bits) | d
        OK[o + 1] = base | (k_mss << bits) | min(seg, vmax)
        OK[o + 2] = base | (k_nseg << bits) | min(ns, vmax)
        OF[o] = OF[o + 1] = OF[o + 2] = r
        o += 3
    return t + (o << 32)
