"""Cutting one capture at idle gaps, so that its parts can be analysed in parallel and merged exactly.

The rule (gro-spec section 7): a NAPI poll ends at an idle gap longer than ``poll_gap_us`` and, with
``gro_flush_timeout_ns``, the timer flushes every held packet once that timeout has passed without a packet. So
after a gap of the WHOLE capture (no frame of any receiver, in either direction) longer than
``max(poll_gap_us, gro_flush_timeout_ns)`` every GRO table and every poll budget of every receiver is empty,
and what follows does not depend on what came before. Two more pieces of state cross a gap, and the rule covers
them too:

* the ACK evidence (``gro/evidence.py``) looks ``evidence.WINDOW`` rows ahead for an ACK that acknowledges a
  data segment exactly at its end, and keeps per-direction state (the busy and loss evidence). After a silence
  of the whole capture longer than ``evidence.RESET_GAP_NS`` (200 ms, Linux's ``TCP_DELACK_MAX``) a serial run
  takes no ACK as evidence for data before it and starts every direction afresh, so the gap must also be longer
  than ``ack_delay_ns`` (default that same 200 ms). A shorter ``ack_delay_ns`` cuts at gaps the serial run's
  evidence reaches across: an ACK across such a cut is then lost to the split run alone;
* the flow table's sequence state (retransmissions, out-of-order, capture gaps) and the flows' percentiles.
  These are not cut at all: the parts are analysed with their packets table and ``merge`` re-runs the
  compiled sequence kernel and the nearest-rank percentiles over the rows of every flow seen in more than one
  part (exact, no sketch).

The gap is measured against the largest timestamp so far (a frame stamped earlier than its predecessor never
opens a gap). The first pass is the reader's compiled record walk (``capture/walk.py``) over a memory map of the file, one
window at a time: it reads only the record headers' timestamps and offsets, no decoding, and keeps only the
best cut so far per part. Only uncompressed pcap files are cut (a part
is then the file header plus a byte range of records, read in place); pcapng and compressed captures run whole.
"""

from __future__ import annotations

import io
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .capture import walk
from .capture.reader import MAX_CAPLEN, PCAP_MAGICS
from .gro.evidence import RESET_GAP_NS

DEFAULT_ACK_DELAY_NS = RESET_GAP_NS  # (the evidence's own reset: the parts then see the serial run's)
WINDOW = 16 << 20  # bytes of the capture mapped at a time by the cut finder


@dataclass(frozen=True)
class Part:
    """Records ``[first_record, first_record + records)`` of a capture, at bytes ``[start, stop)``."""

    path: str
    index: int
    start: int
    stop: int
    first_record: int
    records: int
    ts_first_ns: int = 0
    ts_last_ns: int = 0


def idle_gap_ns(poll_gap_us: float = 20.0, gro_flush_timeout_ns: int = 0,
                ack_delay_ns: int = DEFAULT_ACK_DELAY_NS) -> int:
    """The shortest whole-capture idle gap after which every receiver's GRO state is empty (see the module)."""
    return int(max(poll_gap_us * 1000.0, gro_flush_timeout_ns, ack_delay_ns))


def splittable(path: str | os.PathLike) -> bool:
    """True for an uncompressed pcap file (the only format cut into parts)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return len(head) == 4 and int.from_bytes(head, "little") in PCAP_MAGICS


def find_parts(path: str | os.PathLike, parts: int, min_gap_ns: int, window: int = WINDOW) -> list[Part]:
    """Cut ``path`` into at most ``parts`` parts of similar size, only at idle gaps longer than ``min_gap_ns``.

    Returns one part (the whole file) when it cannot or need not be cut. One pass over the record headers that
    keeps, per byte target, only the nearest idle gap so far: memory is bounded by ``parts`` and the mapped
    ``window``, not by the capture's length.
    """
    path = str(path)
    size = os.path.getsize(path)
    whole = [Part(path, 0, 0, size, 0, -1)]
    if parts < 2 or not splittable(path):
        return whole
    targets = size * np.arange(1, parts) / parts
    # per target: the best gap so far (distance in bytes, record index, header offset, its timestamp, the
    # timestamp of the record before it)
    best_d = np.full(parts - 1, np.inf)
    best = np.full((parts - 1, 4), -1, np.int64)
    n, run_max, last_ts, first_ts = 0, None, None, None
    try:
        for t, off in record_chunks(path, window=window):
            if t.size == 0:
                continue
            cmax = np.maximum.accumulate(t)
            if run_max is None:
                first_ts = int(t[0])
                prev_max = np.concatenate([t[:1], cmax[:-1]])  # record 0 never starts a part
                prev_t = np.concatenate([t[:1], t[:-1]])
            else:
                cmax = np.maximum(cmax, run_max)
                prev_max = np.concatenate([[run_max], cmax[:-1]])
                prev_t = np.concatenate([[last_ts], t[:-1]])
            cand = np.flatnonzero(t - prev_max > min_gap_ns)
            if run_max is None:
                cand = cand[cand > 0]
            if cand.size:
                co = off[cand]
                for k, x in enumerate(targets):
                    d = np.abs(co - x)
                    j = int(np.argmin(d))
                    if d[j] < best_d[k]:  # strictly nearer: the first of equally near gaps stays
                        best_d[k] = d[j]
                        best[k] = (n + cand[j], co[j], t[cand[j]], prev_t[cand[j]])
            run_max, last_ts = int(cmax[-1]), int(t[-1])
            n += t.size
    except _Damaged:  # a damaged capture runs whole: its error is reported by the analysis itself
        return whole
    except (OSError, ValueError):  # not a regular file (no memory map): it runs whole
        return whole
    if n == 0 or best[0, 0] < 0:
        return whole
    cut = {int(r[0]): r for r in best}
    bounds = [0, *sorted(cut), n]
    out = []
    for k in range(len(bounds) - 1):
        a, b = bounds[k], bounds[k + 1]
        start = int(cut[a][1]) if a else 24
        stop = int(cut[b][1]) if b < n else size
        t_first = int(cut[a][2]) if a else first_ts
        t_last = int(cut[b][3]) if b < n else last_ts
        out.append(Part(path, k, start, stop, a, b - a, t_first, t_last))
    return out



class _Damaged(Exception):
    """A record header with a caplen beyond ``MAX_CAPLEN``."""


def record_chunks(path: str | os.PathLike, chunk: int = 1 << 20,
                  window: int = WINDOW) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The timestamps (ns) and header offsets of the records of the pcap file ``path``, in file order, a chunk
    of at most ``chunk`` records at a time: the reader's compiled record walk over a memory map of one window
    of the file at a time (no batches, no copies of the records; the pages of a window leave this process when
    it is unmapped, so resident memory does not grow with the file). A truncated last record ends the walk;
    raises ``_Damaged`` at a damaged record header, OSError/ValueError when the file cannot be mapped."""
    off = np.empty(chunk, np.int64)
    caplen, wirelen = np.empty(chunk, np.uint32), np.empty(chunk, np.uint32)
    ts, rec = np.empty(chunk, np.int64), np.empty(chunk, np.int64)
    gran = mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= 24:
            return
        be, ts_mul = PCAP_MAGICS[int.from_bytes(f.read(4), "little")]
        pos, need = 24, 0  # the next record's absolute offset; bytes it needs from there (0: unknown)
        while pos < size:
            base = pos - pos % gran
            length = min(size - base, max(window, pos - base + need))
            mm = mmap.mmap(f.fileno(), length, access=mmap.ACCESS_COPY, offset=base)  # private, never written
            data = None
            try:
                if hasattr(mm, "madvise"):
                    mm.madvise(mmap.MADV_SEQUENTIAL)
                data = np.frombuffer(mm, np.uint8)
                rel = np.int64(pos - base)
                while True:
                    k, rel, status, need = walk.walk_pcap(data, rel, np.int64(length), be, np.int64(ts_mul),
                                                          np.int64(MAX_CAPLEN), off, caplen, wirelen, ts, rec)
                    if k:
                        yield ts[:k].copy(), rec[:k] + base
                    if status == walk.BAD_CAPLEN:
                        raise _Damaged
                    if status != walk.FULL:
                        break
            finally:
                data = None  # the view must go before the map can close
                mm.close()
            if base + length >= size:  # the walk needs more than the file has: the end, or a truncated record
                return
            pos, need = base + int(rel), int(need)


def record_times(path: str | os.PathLike, chunk: int = 1 << 20,
                 window: int = WINDOW) -> tuple[np.ndarray, np.ndarray] | None:
    """Every record's timestamp (ns) and header offset in the pcap file ``path`` (``record_chunks`` joined);
    None when a record header is damaged (a caplen beyond ``MAX_CAPLEN``)."""
    try:
        got = list(record_chunks(path, chunk, window))
    except _Damaged:
        return None
    except (OSError, ValueError):  # not a regular file: it runs whole
        return None
    if not got:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])


class PartReader(io.RawIOBase):
    """A pcap file's 24-byte header followed by the bytes ``[start, stop)``: one part, read in place."""

    def __init__(self, part: Part):
        self._f = open(part.path, "rb")  # noqa: SIM115 - closed in close()
        self._head = self._f.read(24)
        self._f.seek(part.start)
        self._left = part.stop - part.start
        self.name = part.path

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        mv = memoryview(b).cast("B")
        if self._head:
            n = min(len(mv), len(self._head))
            mv[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        if self._left <= 0:
            return 0
        n = self._f.readinto(mv[:min(len(mv), self._left)])
        self._left -= n or 0
        return n or 0

    def close(self) -> None:
        self._f.close()
        super().close()


def part_name(part: Part) -> str:
    """The deterministic directory name of a part (retries overwrite the same files)."""
    return f"part-{part.index:04d}"


def whole(path: str | os.PathLike) -> Part:
    """The whole capture as one part."""
    return Part(str(path), 0, 0, Path(path).stat().st_size if Path(path).exists() else 0, 0, -1)
