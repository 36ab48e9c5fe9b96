"""The GRO stage of the pipeline: receivers routed, ACK evidence looked up, the engine fed.

``analyze`` and ``compare`` both use it, so a comparison measures exactly what ``analyze`` builds::

    stage = GroStage(GroConfig(gro_max_size=185000))
    for rb in reader:                       # RecordBatch (for the link-layer addresses) ...
        pb, _ = decode(rb)                  # ... and its decoded PacketBatch
        rows = stage.feed(rb, pb, flow_id)  # SuperPacketBatch completed meanwhile (may lag the evidence window)
    rows = stage.finish()                   # the rest, at the end of the capture

With ``ack_evidence`` a batch is fed to the engine once ``evidence.WINDOW`` later rows have been seen (the
lookahead of ``evidence.AckEvidence``); with ``split_receivers`` every frame goes to the NAPI model of the host
that receives it (``receivers.Receivers``, whose ``labels`` name the ``receiver`` index of each row).

A segment the receiver's SACKs show arriving after later data (``evidence.evidence_scan``'s ``move``; seen on veth
when two flows fill one ring: the last segment before a pause in sending enters the ring behind later ones,
``tests/fixtures/kernel/late/``) is fed to the engine after the segment it reached the receiver behind, possibly
in a later batch: the receiver's ring order, which is what its NAPI polls took. Its own timestamp stays; the
engine's poll clock does not go back for it. A segment the evidence finds lost (``evidence.LOST``: the SACKs
showed the hole, then it was sent again) is not fed at all: it never took a slot in the receiver's ring or its
NAPI budget; its copy is fed where it was sent (``lost_segments`` counts them).

The ACK-evidence rule (``rules.acked_end_ends_poll``) asks whether the flow's next segment, at most
``rules.ACK_NEXT_ROWS`` rows on, would merge into the super-packet an ACK ended. The engine is fed each batch with
the rows after it as lookahead (``feed(..., upto=)``: read as next segments, processed with the next batch), so
the answer, and the rows, do not depend on where the reader's batches end.

With ``fallback_mtu`` None the stage reads the link's MTU off the first batch (``rules.r2_capture_mtu``: a
jumbo-frame link; else 1500) before the engine sees a packet: ``config`` is then the configuration used, and
``mtu_from`` says where its MTU came from ("option", "capture" or "default"). A split run's parts are given the
whole capture's (``capture_mtu``), as their own first batches are elsewhere.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..capture.reader import RecordBatch
from ..decode.schema import PacketBatch
from . import rules
from .config import DEFAULT_FALLBACK_MTU, GroConfig
from .evidence import LOST, AckEvidence
from .receivers import Receivers, interface_labels
from .superpacket import SuperPacketBatch


def capture_mtu(pb: PacketBatch) -> int:
    """``rules.r2_capture_mtu`` of a batch, 0 for none."""
    return rules.r2_capture_mtu(pb.ip_len.astype(np.int64), pb.tcp_payload_len, pb.tcp_flags, pb.l4_proto) or 0


class GroStage:
    """Receivers + ACK evidence + a GRO engine (see the module docstring)."""

    def __init__(self, config: GroConfig, engine: str = "compiled", capture_mtu: int | None = None) -> None:
        from . import make_engine

        self.config = config
        self._engine_name = engine
        # where the fallback MTU comes from; None: not known before the first batch (``feed``: ``_set_mtu``)
        self.mtu_from: str | None = "option" if config.fallback_mtu is not None else None
        if self.mtu_from is None and capture_mtu is not None:  # (0: the whole capture gave none)
            self._resolve_mtu(capture_mtu)
        self.engine = make_engine(engine, self.config)
        self.receivers = Receivers()
        self._evidence = AckEvidence() if config.ack_evidence else None
        self.last_receivers: np.ndarray | None = None  # the receiver index of each packet of the last feed
        self._interfaces = 1  # without split_receivers: capture interfaces seen (the receiver is the interface)
        self._carry: list[tuple] = []  # late segments waiting for the batch that holds the row they go after,
        # each a one-row (key, PacketBatch, fid, rx, acked, busy) group (``_take``)
        self.late_segments = 0  # segments fed where the receiver got them (after later data), so far
        self.lost_segments = 0  # segments the receiver never got (sent again after its SACKs showed the hole)
        self._ahead: tuple | None = None  # where the rows after those being fed are (``_lookahead``'s arguments)

    @property
    def labels(self) -> list[str]:
        """Receiver names, indexed by a row's ``receiver``."""
        return self.receivers.labels if self.config.split_receivers else interface_labels(self._interfaces)

    def _resolve_mtu(self, mtu: int) -> None:
        """``config`` with the fallback MTU read off the capture (0: none, the default)."""
        self.mtu_from = "capture" if mtu else "default"
        self.config = replace(self.config, fallback_mtu=mtu or DEFAULT_FALLBACK_MTU)

    def _set_mtu(self, mtu: int) -> None:
        """``_resolve_mtu`` at the first batch: a new engine for it (it has seen no packet yet)."""
        from . import make_engine

        self._resolve_mtu(mtu)
        self.engine = make_engine(self._engine_name, self.config)

    def feed(self, rb: RecordBatch, pb: PacketBatch, flow_id: np.ndarray) -> SuperPacketBatch:
        if self.mtu_from is None and len(pb):
            self._set_mtu(capture_mtu(pb))
        rx = self.receivers.assign(rb, pb) if self.config.split_receivers else None
        if rx is None and len(pb):
            self._interfaces = max(self._interfaces, int(pb.if_gid.max()) + 1)
        self.last_receivers = rx
        if self._evidence is None:
            return self.engine.feed(pb, flow_id, receiver=rx)
        ready = self._evidence.push(pb, (flow_id, rx))
        return self._run(ready)

    def finish(self) -> SuperPacketBatch:
        """End of input: the held batches, then every held super-packet (end_of_capture)."""
        parts = [self._run(self._evidence.finish(), final=True)] if self._evidence is not None else []
        if self._carry:  # cannot happen (a late segment goes after a row that follows it); fed rather than lost
            parts.append(self._feed_carried(np.inf))
        parts.append(self.engine.flush())
        return SuperPacketBatch.concat(parts)

    def release(self) -> None:
        """After ``finish``: drop the engine's and the evidence's state (flow keys, tables, rings), which only
        further feeds would use, so that what runs after the stream (the summary, the what-if runs) does not
        stack its memory on top of it. ``labels`` and ``late_segments`` stay."""
        self.engine = None
        self._evidence = None
        self.last_receivers = None

    def held_flow_ids(self) -> np.ndarray:
        """Flow ids of the entries the engine holds (their super-packet rows are still to come; ids may repeat)."""
        return self.engine.held_flow_ids()

    def pending_from_frame(self) -> int | None:
        """The first frame the ACK lookahead holds and has not fed to the engine yet (None: none). A flow with a
        packet there or later still has rows to come: the flow table keeps it (it writes a flow only when its
        rows are out)."""
        if self._evidence is None:
            return None
        frames = [int(c[1].frame[0]) for c in self._carry]
        held = self._evidence.pending_from_frame()
        if held is not None:
            frames.append(held)
        return min(frames) if frames else None

    def recycle(self, flow_in_memory) -> int:
        """The engine forgets the keys of flows that have ended (``CompiledGroEngine.recycle``)."""
        return self.engine.recycle(flow_in_memory)

    def _run(self, ready: list, final: bool = False) -> SuperPacketBatch:
        """Feed the engine the batches the ACK evidence has flagged (oldest first), late segments in ring order."""
        out = []
        for k, (pb, (fid, rx), acked, ev) in enumerate(ready):
            self._ahead = ([(b, e, v) for b, e, _, v in ready[k + 1:]], ev.row0 + len(pb), final)
            out.append(self._feed(pb, fid, rx, acked, ev))
        self._ahead = None  # (no reference kept to the batches after the last)
        if not out:
            return SuperPacketBatch.empty(0)
        return out[0] if len(out) == 1 else SuperPacketBatch.concat(out)

    def _lookahead(self, later: list, row: int, final: bool) -> tuple | None:
        """The ``engine.next_window`` rows fed after stream row ``row``, in the order they will be fed, as
        (PacketBatch, flow ids, receivers), or None: what the engine reads as a flow's next segment beyond the rows
        it is fed. From the carried late segments, ``later`` (the other ready batches as (batch, (flow ids,
        receivers), RowEvidence): their late segments at the rows they go after, their lost ones left out, as
        ``_feed`` will feed them) and the batches the evidence still holds (in capture order: their evidence is
        not final yet). A late segment read in capture order would look like its flow's next segment and make the
        rows depend on where a batch ends."""
        want = self.engine.next_window
        if not want:
            return None
        hi = row + want  # no row keyed at or beyond this is among the next ``want`` fed
        parts = [(c[0], c[1], c[2], c[3]) for c in self._carry if c[0][0] < hi]
        end = row
        for b, (f, r), ev in later:
            if ev.row0 >= hi:
                break
            m = min(len(b), hi - ev.row0)
            key = _feed_keys(ev, m)
            keep = np.flatnonzero((ev.move[:m] != LOST) & (key < hi))
            parts.append((key[keep], b.take(keep), f[:m][keep], None if r is None else r[:m][keep]))
            end = ev.row0 + len(b)
        if not final and end < hi:
            for b, (f, r), r0 in self._evidence.held_batches(end, hi - end):
                lo, m = max(0, end - r0), min(len(b), hi - r0)
                if m > lo:
                    parts.append((np.arange(r0 + lo, r0 + m, dtype=np.float64), b.take(slice(lo, m)), f[lo:m],
                                  None if r is None else r[lo:m]))
        if not parts:
            return None
        if len(parts) == 1 and not np.any(np.diff(parts[0][0]) < 0):  # the usual case: the next held batch's
            k, b, f, r = parts[0]  # first rows as they are (views, no copy)
            m = min(len(k), want)
            return (b.take(slice(0, m)), f[:m], None if r is None else r[:m]) if m else None
        order = np.argsort(np.concatenate([p[0] for p in parts]), kind="stable")[:want]
        b = PacketBatch.concat([p[1] for p in parts]).take(order)
        f = np.concatenate([p[2] for p in parts])[order]
        r = None if parts[0][3] is None else np.concatenate([p[3] for p in parts])[order]
        return (b, f, r) if len(b) else None

    def _engine_feed(self, b: PacketBatch, f: np.ndarray, a: np.ndarray, r: np.ndarray | None,
                     z: np.ndarray) -> SuperPacketBatch:
        """``engine.feed`` of these rows, with the lookahead rows after them (read, not processed) when an ACKed
        row is within ``engine.next_window`` of the end. The rows up to that distance from the end go first, with
        the last ones as their lookahead (no copy), then the last ones with the lookahead rows (a short copy)."""
        w, n = self.engine.next_window or 0, len(b)
        la = self._lookahead(*self._ahead) if self._ahead is not None and n and a[max(0, n - w):].any() else None
        if la is None:
            return self.engine.feed(b, f, acked=a, receiver=r, busy=z)
        out = []
        cut = max(0, n - w)
        if cut:
            out.append(self.engine.feed(b, f, acked=a, receiver=r, busy=z, upto=cut))
        m = len(la[0])
        out.append(self.engine.feed(PacketBatch.concat([b.take(slice(cut, n)), la[0]]), np.concatenate([f[cut:], la[1]]),
                                    acked=np.concatenate([a[cut:], np.zeros(m, a.dtype)]),
                                    receiver=None if r is None else np.concatenate([r[cut:], la[2]]),
                                    busy=np.concatenate([z[cut:], np.zeros(m, z.dtype)]), upto=n - cut))
        return out[0] if len(out) == 1 else SuperPacketBatch.concat(out)

    def _feed(self, pb: PacketBatch, fid: np.ndarray, rx: np.ndarray | None, acked: np.ndarray, ev) -> SuperPacketBatch:
        moved = ev.move >= 0
        lost = ev.move == LOST
        if not moved.any() and not lost.any() and not self._carry:
            return self._engine_feed(pb, fid, acked, rx, ev.busy)
        self.late_segments += int(np.count_nonzero(moved))
        self.lost_segments += int(np.count_nonzero(lost))
        r1 = ev.row0 + len(pb)
        key = _feed_keys(ev, len(pb))
        later = key >= r1
        rows = (key, pb, fid, rx, acked, ev.busy)
        self._carry += [_take(rows, np.array([i])) for i in np.flatnonzero(later).tolist()]
        return self._feed_carried(r1, [_take(rows, ~later & ~lost)])

    def _feed_carried(self, upto: float, parts: list | None = None) -> SuperPacketBatch:
        """Feed ``parts`` and the carried late segments whose key is below ``upto``, in key order."""
        parts = (parts or []) + [c for c in self._carry if c[0][0] < upto]
        self._carry = [c for c in self._carry if c[0][0] >= upto]
        order = np.argsort(np.concatenate([c[0] for c in parts]), kind="stable")
        b = PacketBatch.concat([c[1] for c in parts]).take(order)
        f, a, z = (np.concatenate([c[j] for c in parts])[order] for j in (2, 4, 5))
        r = None if parts[0][3] is None else np.concatenate([c[3] for c in parts])[order]
        return self._engine_feed(b, f, a, r, z)


def _feed_keys(ev, n: int) -> np.ndarray:
    """Where the first ``n`` rows of a batch go in the order the engine is fed (``RowEvidence`` ``ev``): its stream
    row, or for a late segment the row it reached the receiver behind plus a half (lost rows are not fed at all:
    the callers leave them out)."""
    key = np.arange(ev.row0, ev.row0 + n, dtype=np.float64)
    mv = ev.move[:n]
    moved = mv >= 0
    key[moved] = mv[moved] + 0.5
    return key


def _take(rows: tuple, idx: np.ndarray) -> tuple:
    """Rows ``idx`` of a (key, PacketBatch, flow ids, receivers or None, acked, busy) group."""
    key, pb, fid, rx, acked, busy = rows
    return key[idx], pb.take(idx), fid[idx], None if rx is None else rx[idx], acked[idx], busy[idx]
