"""Poll evidence from the capture itself: which data segments the other side ACKed exactly at their end.

gro-spec 7.1: the NAPI poll boundaries are what a capture does not record, and the timestamp gap rule only
guesses them. But a capture that holds both directions (a sender's own interface, a mirror port) shows the
receiver's ACKs, and an ACK can only acknowledge up to the end of a packet the receiving stack was handed:
with GRO on, the end of a super-packet. So a data segment whose end (seq + payload, mod 2**32) comes back as
an acknowledgment number marks the end of a super-packet. When no GRO rule ended the super-packet there, the
NAPI poll did: the engine ends the poll after that segment (``rules.acked_end_ends_poll``), and the rows it
completes are marked ``poll_end = ack`` (evidenced) instead of ``gap`` (guessed).

``AckEvidence`` is a streaming stage with one batch of lookahead: a batch's flags are decided once the next
batch (or the end of the capture) has been seen, since the ACK for a segment near the end of a batch comes in
the next one. Only ACKs that follow the segment count (an older ACK with the same number, before a
retransmission, says nothing about this copy). Sans-IO: batches in, flagged batches out, one batch held.
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
           "u64[:, ::1], u64[::1], i64[::1], b1[::1], bool"))
def ack_scan(ver, proto, l4_off, plen, flags, seq, ack, sport, dport, src, dst, K, V, out, check):
    """Backwards over one batch. Every ACK's (reverse flow, ack number) key goes into the set (K/V: the flow
    table's open-addressing map, at most half full); with ``check``, a data segment whose (flow, end) key is in
    the set already, i.e. ACKed by a later packet, gets ``out[i] = True``. A packet's own ACK is added after its
    check, so it never counts for itself. Flow directions are digested as the flow table digests its keys."""
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
            if _hm_find(K, V, k, k) >= 0:  # (the key is a digest already: it is its own hash)
                out[i] = True
        if flags[i] & TH_ACK:
            k = _fmix(rev, np.uint64(ack[i]))
            if _hm_find(K, V, k, k) < 0:
                _hm_insert(K, V, k, k, np.int64(0))


def _scan(pb: PacketBatch, K: np.ndarray, V: np.ndarray, out: np.ndarray, check: bool) -> None:
    n = len(pb)
    src = np.ascontiguousarray(pb.src).view(np.uint64).reshape(n, 2)
    dst = np.ascontiguousarray(pb.dst).view(np.uint64).reshape(n, 2)
    ack_scan(pb.ip_version, pb.l4_proto, pb.l4_off, pb.tcp_payload_len, pb.tcp_flags, pb.tcp_seq, pb.tcp_ack,
             pb.sport, pb.dport, src, dst, K, V, out, check)


def acked_ends(pb: PacketBatch, lookahead: PacketBatch | None = None) -> np.ndarray:
    """bool per row of ``pb``: a later packet of the reverse direction (in ``pb`` or ``lookahead``) ACKs
    exactly this data segment's end (keys compared by their 64-bit digest)."""
    n2 = len(lookahead) if lookahead is not None else 0
    size = 1 << max(4, int(2 * (len(pb) + n2)).bit_length())
    K, V = np.empty(size, np.uint64), np.full(size, EMPTY, np.int64)
    out = np.zeros(len(pb), np.bool_)
    if n2:  # every ACK of the lookahead is later than every segment of pb
        _scan(lookahead, K, V, np.zeros(0, np.bool_), False)
    if len(pb):
        _scan(pb, K, V, out, True)
    return out


class AckEvidence:
    """Streaming ``acked_ends`` with one batch of lookahead: ``push`` returns the previous item with its flags."""

    def __init__(self) -> None:
        self._held: tuple[PacketBatch, Any] | None = None

    def push(self, pb: PacketBatch, extra: Any = None) -> tuple[PacketBatch, Any, np.ndarray] | None:
        """Take a batch (and anything to carry along with it); return the previous one, flagged, or None."""
        prev, self._held = self._held, (pb, extra)
        if prev is None:
            return None
        return prev[0], prev[1], acked_ends(prev[0], pb)

    def pending_flow_ids(self) -> np.ndarray | None:
        """The flow ids of the held batch (its ``extra`` is ``(flow_id, ...)``), or None."""
        if self._held is None:
            return None
        fid = np.asarray(self._held[1][0])
        return np.unique(fid[fid >= 0])

    def finish(self) -> tuple[PacketBatch, Any, np.ndarray] | None:
        """End of input: the held batch, flagged without lookahead."""
        prev, self._held = self._held, None
        if prev is None:
            return None
        return prev[0], prev[1], acked_ends(prev[0])
