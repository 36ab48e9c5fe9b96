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
from ..flows.table import EMPTY, _digest, _fmix, _hm_find, _hm_insert

_U32 = np.uint64(0xFFFFFFFF)


@njit(cache=True, entry=True,
      sig=("u8[::1], u8[::1], i32[::1], u32[::1], u16[::1], u32[::1], u32[::1], u16[::1], u16[::1], u64[:, ::1], "
           "u64[:, ::1], u64[::1], i64[::1], b1[::1], bool, i64, i64"))
def ack_scan(ver, proto, l4_off, plen, flags, seq, ack, sport, dport, src, dst, K, V, out, check, row0, window):
    """Backwards over one batch whose first row is row ``row0`` of the scan. Every ACK's (reverse flow, ack
    number) key goes into the map (K/V: the flow table's open-addressing map, at most half full) with the row of
    its nearest later sighting; with ``check``, a data segment whose (flow, end) key is there, ACKed by a
    packet at most ``window`` rows later, gets ``out[i] = True``. A packet's own ACK is added after its check,
    so it never counts for itself. Flow directions are digested as the flow table digests its keys."""
    pv = np.uint8(0)  # the previous TCP row's 5-tuple and its two digests: runs of one flow skip the mixing
    ps0 = ps1 = pd0 = pd1 = np.uint64(0)
    psp = pdp = np.uint16(0)
    fwd = rev = np.uint64(0)
    for i in range(ver.shape[0] - 1, -1, -1):
        v = ver[i]
        if proto[i] != 6 or l4_off[i] < 0 or (v != 4 and v != 6):
            continue
        s0, s1, d0, d1, sp, dp = src[i, 0], src[i, 1], dst[i, 0], dst[i, 1], sport[i], dport[i]
        if v != pv or s0 != ps0 or s1 != ps1 or d0 != pd0 or d1 != pd1 or sp != psp or dp != pdp:
            vw = np.uint64(v) << np.uint64(32)
            fwd = _digest(vw | (np.uint64(sp) << np.uint64(16)) | np.uint64(dp), s0, s1, d0, d1)
            rev = _digest(vw | (np.uint64(dp) << np.uint64(16)) | np.uint64(sp), d0, d1, s0, s1)
            pv, ps0, ps1, pd0, pd1, psp, pdp = v, s0, s1, d0, d1, sp, dp
        if check and plen[i] > 0:
            k = _fmix(fwd, (np.uint64(seq[i]) + np.uint64(plen[i])) & _U32)
            j = _hm_find(K, V, k, k)  # (the key is a digest already: it is its own hash)
            if j >= 0 and V[j] - (row0 + i) <= window:
                out[i] = True
        if flags[i] & TH_ACK:
            k = _fmix(rev, np.uint64(ack[i]))
            j = _hm_find(K, V, k, k)
            if j < 0:
                _hm_insert(K, V, k, k, np.int64(row0 + i))
            else:
                V[j] = row0 + i  # the nearest later sighting


def _scan(pb: PacketBatch, K: np.ndarray, V: np.ndarray, out: np.ndarray, check: bool, row0: int) -> None:
    n = len(pb)
    src = np.ascontiguousarray(pb.src).view(np.uint64).reshape(n, 2)
    dst = np.ascontiguousarray(pb.dst).view(np.uint64).reshape(n, 2)
    ack_scan(pb.ip_version, pb.l4_proto, pb.l4_off, pb.tcp_payload_len, pb.tcp_flags, pb.tcp_seq, pb.tcp_ack,
             pb.sport, pb.dport, src, dst, K, V, out, check, np.int64(row0), np.int64(WINDOW))


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
    n2 = sum(len(b) for b in ahead)
    size = 1 << max(4, int(2 * (len(pb) + n2)).bit_length())
    K, V = np.empty(size, np.uint64), np.full(size, EMPTY, np.int64)
    out = np.zeros(len(pb), np.bool_)
    row = len(pb) + n2
    for b in reversed(ahead):  # every ACK of the lookahead is later than every segment of pb
        row -= len(b)
        _scan(b, K, V, np.zeros(0, np.bool_), False, row)
    if len(pb):
        _scan(pb, K, V, out, True, 0)
    return out


class AckEvidence:
    """Streaming ``acked_ends``: a batch is flagged once ``WINDOW`` rows after it have been seen (or the input
    ends). ``push`` returns the batches that became ready, oldest first, each ``(batch, extra, flags)``."""

    def __init__(self) -> None:
        self._held: list[tuple[PacketBatch, Any]] = []
        self._ahead = 0  # rows held after the oldest batch

    def push(self, pb: PacketBatch, extra: Any = None) -> list[tuple[PacketBatch, Any, np.ndarray]]:
        """Take a batch (and anything to carry along with it); return the batches now flagged."""
        if self._held:
            self._ahead += len(pb)
        self._held.append((pb, extra))
        ready = []
        while len(self._held) > 1 and self._ahead >= WINDOW:
            ready.append(self._pop())
        return ready

    def _pop(self) -> tuple[PacketBatch, Any, np.ndarray]:
        (pb, extra), rest = self._held[0], self._held[1:]
        ahead, rows = [], 0
        for b, _ in rest:  # the later batches that cover WINDOW rows
            if rows >= WINDOW:
                break
            ahead.append(b)
            rows += len(b)
        flags = acked_ends(pb, ahead)
        self._held = rest
        self._ahead -= len(rest[0][0]) if rest else 0
        return pb, extra, flags

    def pending_flow_ids(self) -> np.ndarray | None:
        """The flow ids of the held batches (their ``extra`` is ``(flow_id, ...)``), or None."""
        if not self._held:
            return None
        fid = np.concatenate([np.asarray(e[0]) for _, e in self._held])
        return np.unique(fid[fid >= 0])

    def finish(self) -> list[tuple[PacketBatch, Any, np.ndarray]]:
        """End of input: every held batch, flagged with what follows it."""
        out = []
        while self._held:
            out.append(self._pop())
        return out
