"""Poll evidence from the capture itself: which data segments the other side ACKed exactly at their end.

gro-spec 7.1: the NAPI poll boundaries are what a capture does not record, and the timestamp gap rule only
guesses them. But a capture that holds both directions (a sender's own interface, a mirror port) shows the
receiver's ACKs, and an ACK can only acknowledge up to the end of a packet the receiving stack was handed:
with GRO on, the end of a super-packet. So a data segment whose end (seq + payload, mod 2**32) comes back as
an acknowledgment number marks the end of a super-packet. When no GRO rule ended the super-packet there, the
NAPI poll did: the engine ends the poll after that segment (``rules.acked_end_ends_poll``), and the rows it
completes are marked ``poll_end = ack`` (evidenced) instead of ``gap`` (guessed).

``AckEvidence`` is a streaming stage with a lookahead of ``WINDOW`` rows: a batch's flags are decided once
that many later rows (or the end of the capture) have been seen, since the ACK for a segment near the end of
a batch comes in a later one. Only ACKs that follow the segment, by at most ``WINDOW`` rows, count (an older ACK
with the same number, before a retransmission, says nothing about this copy), so the flags do not depend on
where batches begin. Sans-IO: batches in, flagged batches out, the window held.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._native import njit
from ..decode.schema import TH_ACK, PacketBatch
from ..flows.table import EMPTY, _digest, _fmix

_U32 = np.uint64(0xFFFFFFFF)
_NO_KEY = np.uint64(0)  # no ACK key is known absent (a digest of 0 would only be looked up twice)


@njit(cache=True, inline="always")
def _find(TK, TV, k, base, tmask):
    """Index of key ``k`` (its own hash) in the table at ``base`` (``tmask + 1`` slots) of TK/TV, or ``-2 - s``
    where ``s`` is the empty slot that ended the search (where it would go)."""
    j = np.int64(k & np.uint64(tmask))
    while True:
        v = TV[base + j]
        if v == EMPTY:
            return -2 - (base + j)
        if TK[base + j] == k:
            return base + j
        j = (j + 1) & tmask


@njit(cache=True, entry=True,
      sig=("u8[::1], u8[::1], i32[::1], u32[::1], u16[::1], u32[::1], u32[::1], u16[::1], u16[::1], u64[:, ::1], "
           "u64[:, ::1], i64, i64, i64, u64[::1], i64[::1], i64[::1], u8[::1], i64[::1], i64[::1]"))
def ack_scan(ver, proto, l4_off, plen, flags, seq, ack, sport, dport, src, dst, row0, window, gshift, TK, TV, TF,
             FLAG, PREV, ST):
    """One forward pass over a batch whose first row is row ``row0`` of the stream.

    A data segment's (flow, end) key goes into the table of its generation (rows ``g << gshift`` to
    ``(g + 1) << gshift``, at least ``window`` rows; two tables by parity, at ``(g & 1) * size`` of TK/TV/TF,
    each an open-addressing map at most half full: key TK, latest row with that key TV, latest row already
    judged TF), linked to the previous row with the same key in that generation (PREV). An ACK's (reverse flow,
    ack number) key is looked up in its generation's table and the previous one's: every row of those chains
    not judged yet and at most ``window`` rows back gets ``FLAG = 1``. A packet's ACK is looked up before its own
    segment goes in, so it never counts for itself. Entering a generation clears the table of the one two back,
    out of every window by then. FLAG/PREV are rings indexed by row (the caller keeps every row whose flags it
    has not taken). Flow directions are digested as the flow table digests its keys."""
    rmask = np.int64(FLAG.shape[0] - 1)
    size = np.int64(TV.shape[0] >> 1)
    tmask = size - 1
    gen = ST[0]
    pv = np.uint8(0)  # the previous TCP row's 5-tuple and its two digests: runs of one flow skip the mixing
    ps0 = ps1 = pd0 = pd1 = np.uint64(0)
    psp = pdp = np.uint16(0)
    fwd = rev = np.uint64(0)
    absent = _NO_KEY  # the last ACK key found in neither table (until a segment with that key goes in)
    for i in range(ver.shape[0]):
        r = row0 + i
        FLAG[r & rmask] = 0
        PREV[r & rmask] = -1
        g = r >> gshift
        if g != gen:  # a new generation: its table held the one two back
            base = (g & 1) * size
            for j in range(base, base + size):
                TV[j] = EMPTY
            gen = g
        v = ver[i]
        if proto[i] != 6 or l4_off[i] < 0 or (v != 4 and v != 6):
            continue
        s0, s1, d0, d1, sp, dp = src[i, 0], src[i, 1], dst[i, 0], dst[i, 1], sport[i], dport[i]
        if v != pv or s0 != ps0 or s1 != ps1 or d0 != pd0 or d1 != pd1 or sp != psp or dp != pdp:
            vw = np.uint64(v) << np.uint64(32)
            fwd = _digest(vw | (np.uint64(sp) << np.uint64(16)) | np.uint64(dp), s0, s1, d0, d1)
            rev = _digest(vw | (np.uint64(dp) << np.uint64(16)) | np.uint64(sp), d0, d1, s0, s1)
            pv, ps0, ps1, pd0, pd1, psp, pdp = v, s0, s1, d0, d1, sp, dp
        here = (g & 1) * size
        if flags[i] & TH_ACK:
            k = _fmix(rev, np.uint64(ack[i]))
            if k != absent:  # (one-way captures repeat an ACK number that is in neither table)
                hit = False
                for base in (here, size - here):  # this generation's chain, then the previous one's
                    j = _find(TK, TV, k, base, tmask)
                    if j >= 0:
                        hit = True
                        x, stop, lo = TV[j], TF[j], r - window
                        while x > stop and x >= lo:
                            FLAG[x & rmask] = 1
                            x = PREV[x & rmask]
                        TF[j] = TV[j]
                if not hit:
                    absent = k
        if plen[i] > 0:
            k = _fmix(fwd, (np.uint64(seq[i]) + np.uint64(plen[i])) & _U32)
            j = _find(TK, TV, k, here, tmask)
            if j >= 0:
                PREV[r & rmask] = TV[j]
                TV[j] = r
            else:
                j = -2 - j  # the empty slot that ended the search
                TK[j] = k
                TV[j] = r
                TF[j] = -1
                if k == absent:
                    absent = _NO_KEY
    ST[0] = gen


# How far after a segment its ACK may come and still count: a number of packets, not "the next batch", so the
# flags do not depend on where batches happen to begin (they begin elsewhere in each part of a split run, and
# wherever a read buffer ends). A delayed ACK comes within 40-200 ms; 65536 packets is more than that on a
# single flow at 10 Gbit/s of MSS segments.
WINDOW = 65536


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


class AckEvidence:
    """Streaming ``acked_ends``: a batch is scanned once as it comes (``ack_scan``) and flagged once ``WINDOW``
    rows after it have been seen (or the input ends). ``push`` returns the batches that became ready, oldest
    first, each ``(batch, extra, flags)``."""

    def __init__(self) -> None:
        self.window = int(WINDOW)
        self._gshift = max(4, (self.window - 1).bit_length())  # a generation: 2**gshift >= window rows
        size = 2 << self._gshift  # a generation's table: at most half full (one key per row at most)
        self._TK = np.zeros(2 * size, np.uint64)  # generation parity p: slots p * size to (p + 1) * size
        self._TV = np.full(2 * size, EMPTY, np.int64)
        self._TF = np.full(2 * size, -1, np.int64)
        self._ST = np.zeros(1, np.int64)  # the generation of the last row scanned
        self._FLAG = np.zeros(1 << 16, np.uint8)  # rings by row: every row not yet taken
        self._PREV = np.zeros(1 << 16, np.int64)
        self._rows = 0  # rows scanned
        self._held: list[tuple[PacketBatch, Any, int]] = []  # (batch, extra, its first row)
        self._ahead = 0  # rows held after the oldest batch

    def push(self, pb: PacketBatch, extra: Any = None) -> list[tuple[PacketBatch, Any, np.ndarray]]:
        """Take a batch (and anything to carry along with it); return the batches now flagged."""
        n = len(pb)
        self._ring(n)
        if n:
            src = np.ascontiguousarray(pb.src).view(np.uint64).reshape(n, 2)
            dst = np.ascontiguousarray(pb.dst).view(np.uint64).reshape(n, 2)
            ack_scan(pb.ip_version, pb.l4_proto, pb.l4_off, pb.tcp_payload_len, pb.tcp_flags, pb.tcp_seq,
                     pb.tcp_ack, pb.sport, pb.dport, src, dst, np.int64(self._rows), np.int64(self.window),
                     np.int64(self._gshift), self._TK, self._TV, self._TF, self._FLAG, self._PREV, self._ST)
        if self._held:
            self._ahead += n
        self._held.append((pb, extra, self._rows))
        self._rows += n
        ready = []
        while len(self._held) > 1 and self._ahead >= self.window:
            ready.append(self._pop())
        return ready

    def _ring(self, more: int) -> None:
        """Room in the rings for every held row and ``more`` new ones (grown, keeping the held rows)."""
        size = self._FLAG.shape[0]
        first = self._held[0][2] if self._held else self._rows
        rows = self._rows + more - first
        if rows <= size:
            return
        new = 1 << (2 * rows - 1).bit_length()
        idx = np.arange(first, self._rows, dtype=np.int64)
        flag, prev = np.zeros(new, np.uint8), np.zeros(new, np.int64)
        flag[idx & (new - 1)] = self._FLAG[idx & (size - 1)]
        prev[idx & (new - 1)] = self._PREV[idx & (size - 1)]
        self._FLAG, self._PREV = flag, prev

    def _pop(self) -> tuple[PacketBatch, Any, np.ndarray]:
        pb, extra, row0 = self._held.pop(0)
        self._ahead -= len(self._held[0][0]) if self._held else 0
        idx = np.arange(row0, row0 + len(pb), dtype=np.int64) & (self._FLAG.shape[0] - 1)
        return pb, extra, self._FLAG[idx].astype(np.bool_)

    def pending_from_frame(self) -> int | None:
        """The frame number of the first row held (rows are in frame order), or None when none is held."""
        for pb, _, _ in self._held:
            if len(pb):
                return int(pb.frame[0])
        return None

    def finish(self) -> list[tuple[PacketBatch, Any, np.ndarray]]:
        """End of input: every held batch, flagged with what follows it."""
        out = []
        while self._held:
            out.append(self._pop())
        return out
