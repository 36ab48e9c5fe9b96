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

from ..decode.schema import TH_ACK, PacketBatch

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(h: np.ndarray, x: np.ndarray) -> np.ndarray:
    h = (h ^ x) * _M1
    h ^= h >> np.uint64(31)
    h *= _M2
    return h ^ (h >> np.uint64(29))


def _flow_digest(pb: PacketBatch, reverse: bool) -> np.ndarray:
    """64-bit digest of (version, src, dst, sport, dport); ``reverse`` swaps the ends (the ACK's view)."""
    n = len(pb)
    src = np.ascontiguousarray(pb.src).view(np.uint64).reshape(n, 2)
    dst = np.ascontiguousarray(pb.dst).view(np.uint64).reshape(n, 2)
    a, b = (dst, src) if reverse else (src, dst)
    sp, dp = (pb.dport, pb.sport) if reverse else (pb.sport, pb.dport)
    h = np.full(n, 0x243F6A8885A308D3, np.uint64)
    for col in (a[:, 0], a[:, 1], b[:, 0], b[:, 1],
                (pb.ip_version.astype(np.uint64) << np.uint64(32)) | (sp.astype(np.uint64) << np.uint64(16))
                | dp.astype(np.uint64)):
        h = _mix(h, col)
    return h


def _keys(pb: PacketBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(data rows, their (flow, end) keys, ACK rows, their (reverse flow, ack number) keys)."""
    tcp = (pb.l4_proto == 6) & ((pb.ip_version == 4) | (pb.ip_version == 6)) & (pb.l4_off >= 0)
    data = np.flatnonzero(tcp & (pb.tcp_payload_len > 0))
    acks = np.flatnonzero(tcp & ((pb.tcp_flags & TH_ACK) != 0))
    end = (pb.tcp_seq[data].astype(np.uint64) + pb.tcp_payload_len[data].astype(np.uint64)) & np.uint64(0xFFFFFFFF)
    dk = _mix(_flow_digest(pb.take(data), False), end)
    ak = _mix(_flow_digest(pb.take(acks), True), pb.tcp_ack[acks].astype(np.uint64))
    return data, dk, acks, ak


def acked_ends(pb: PacketBatch, lookahead: PacketBatch | None = None) -> np.ndarray:
    """bool per row of ``pb``: a later packet of the reverse direction (in ``pb`` or ``lookahead``) ACKs
    exactly this data segment's end."""
    data, dk, acks, ak = _keys(pb)
    pos = acks
    if lookahead is not None and len(lookahead):
        _, _, acks2, ak2 = _keys(lookahead)
        ak = np.concatenate([ak, ak2])
        pos = np.concatenate([acks, acks2 + len(pb)])
    out = np.zeros(len(pb), bool)
    if not len(data) or not len(ak):
        return out
    # the latest position of each ACK key, then: is there an ACK with the segment's key after the segment?
    order = np.lexsort((pos, ak))
    k_sorted, p_sorted = ak[order], pos[order]
    last = np.r_[k_sorted[1:] != k_sorted[:-1], True]
    uk, up = k_sorted[last], p_sorted[last]
    j = np.searchsorted(uk, dk)
    j = np.minimum(j, len(uk) - 1)
    out[data] = (uk[j] == dk) & (up[j] > data)
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
