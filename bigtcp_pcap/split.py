"""Cutting one capture at idle gaps, so that its parts can be analysed in parallel and merged exactly.

The rule (gro-spec section 7): a NAPI poll ends at an idle gap longer than ``poll_gap_us`` and, with
``gro_flush_timeout_ns``, the timer flushes every held packet once that timeout has passed without a packet. So
after a gap of the WHOLE capture (no frame of any receiver, in either direction) longer than
``max(poll_gap_us, gro_flush_timeout_ns)`` every GRO table and every poll budget of every receiver is empty,
and what follows does not depend on what came before. Two more pieces of state cross a gap, and the rule covers
them too:

* the ACK evidence (``gro/evidence.py``) looks one batch ahead for an ACK that acknowledges a data segment
  exactly at its end. An ACK after the gap could mark a segment before it. The gap must therefore also be
  longer than ``ack_delay_ns`` (default 200 ms, Linux's ``TCP_DELACK_MAX``; an ACK later than that for data
  before the gap is not accepted as evidence by a split run);
* the flow table's sequence state (retransmissions, out-of-order, capture gaps) and the flows' percentiles.
  These are not cut at all: the parts are analysed with their packets table and ``merge`` re-runs the
  compiled sequence kernel and the nearest-rank percentiles over the rows of every flow seen in more than one
  part (exact, no sketch).

The gap is measured against the largest timestamp so far (a frame stamped earlier than its predecessor never
opens a gap). The first pass is the reader's compiled record walk (``capture/walk.py``) over a memory map of the file:
it reads only the record headers' timestamps and offsets, no decoding. Only uncompressed pcap files are cut (a part
is then the file header plus a byte range of records, read in place); pcapng and compressed captures run whole.
"""

from __future__ import annotations

import io
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .capture import walk
from .capture.reader import MAX_CAPLEN, PCAP_MAGICS

DEFAULT_ACK_DELAY_NS = 200_000_000


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


def find_parts(path: str | os.PathLike, parts: int, min_gap_ns: int) -> list[Part]:
    """Cut ``path`` into at most ``parts`` parts of similar size, only at idle gaps longer than ``min_gap_ns``.

    Returns one part (the whole file) when it cannot or need not be cut.
    """
    path = str(path)
    size = os.path.getsize(path)
    whole = [Part(path, 0, 0, size, 0, -1)]
    if parts < 2 or not splittable(path):
        return whole
    got = record_times(path)
    if got is None:  # a damaged capture runs whole: its error is reported by the analysis itself
        return whole
    t, off = got
    n = t.shape[0]
    if n == 0:
        return whole
    gap = t[1:] - np.maximum.accumulate(t)[:-1]
    cand = np.flatnonzero(gap > min_gap_ns) + 1  # record index that starts a new part
    if cand.shape[0] == 0:
        return whole
    # choose the candidates nearest to equal byte targets
    targets = size * np.arange(1, parts) / parts
    chosen = sorted({int(cand[np.argmin(np.abs(off[cand] - x))]) for x in targets})
    bounds = [0, *chosen, n]
    out = []
    for k in range(len(bounds) - 1):
        a, b = bounds[k], bounds[k + 1]
        start = int(off[a]) if a else 24
        stop = int(off[b]) if b < n else size
        out.append(Part(path, k, start, stop, a, b - a, int(t[a]), int(t[b - 1])))
    return out


def record_times(path: str | os.PathLike, chunk: int = 1 << 20) -> tuple[np.ndarray, np.ndarray] | None:
    """Every record's timestamp (ns) and header offset in the pcap file ``path``, by the reader's compiled
    record walk over a memory map (no batches, no copies of the records); None when a record header is damaged
    (a caplen beyond ``MAX_CAPLEN``). A truncated last record ends the list."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= 24:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: a writable view, never written
        except (OSError, ValueError):  # not a regular file: it runs whole
            return None
    try:
        got = _walk_records(np.frombuffer(mm, np.uint8), size, chunk)
    finally:
        mm.close()
    return got


def _walk_records(data: np.ndarray, size: int, chunk: int) -> tuple[np.ndarray, np.ndarray] | None:
    be, ts_mul = PCAP_MAGICS[int.from_bytes(data[:4].tobytes(), "little")]
    off = np.empty(chunk, np.int64)
    caplen, wirelen = np.empty(chunk, np.uint32), np.empty(chunk, np.uint32)
    ts, rec = np.empty(chunk, np.int64), np.empty(chunk, np.int64)
    t_out, o_out, pos = [], [], np.int64(24)
    while True:
        n, pos, status, _ = walk.walk_pcap(data, pos, np.int64(size), be, np.int64(ts_mul), np.int64(MAX_CAPLEN),
                                           off, caplen, wirelen, ts, rec)
        t_out.append(ts[:n].copy())
        o_out.append(rec[:n].copy())
        if status == walk.BAD_CAPLEN:
            return None
        if status != walk.FULL:
            break
    return np.concatenate(t_out), np.concatenate(o_out)


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
