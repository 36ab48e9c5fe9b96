"""The capture reader: pcap (all four magics) and pcapng (sections, interfaces, EPB/SPB/PB), streaming.

``read_batches(source)`` yields ``RecordBatch`` objects: column arrays over one buffer of file bytes. Memory is
one buffer (``chunk_size``, grown only for a single record that is larger) however large the capture is.
On a fault it first yields every complete record before the fault, then raises ``CaptureError`` naming the
frame and byte offset; callers keep what they got and mark their output partial.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from .. import linktypes
from ..errors import CaptureError
from . import walk
from .source import Source

MAX_CAPLEN = 256 << 20  # a record larger than this is corrupt, whatever the header says
SUPPORTED_LINKTYPES = linktypes.NAMES  # the link-type table (bigtcp_pcap/linktypes.py): number -> name
PCAP_MAGICS = {  # magic as read little-endian -> (big endian file?, ts multiplier to ns)
    0xA1B2C3D4: (False, 1000), 0xA1B23C4D: (False, 1), 0xD4C3B2A1: (True, 1000), 0x4D3CB2A1: (True, 1)}
PCAPNG_BOM = 0x1A2B3C4D
DEFAULT_CHUNK = 4 << 20
DEFAULT_BATCH = 65536


@dataclass
class RecordBatch:
    """Raw records: packet i is ``buf[off[i] : off[i] + caplen[i]]``."""

    buf: np.ndarray  # uint8
    off: np.ndarray  # int64
    caplen: np.ndarray  # uint32
    wirelen: np.ndarray  # uint32
    ts_ns: np.ndarray  # int64
    linktype: np.ndarray  # uint16
    if_id: np.ndarray  # uint32
    frame: np.ndarray  # uint64, 1-based
    file_off: np.ndarray  # int64, byte offset of the record header in the uncompressed stream

    def __len__(self) -> int:
        return int(self.off.shape[0])

    def packet(self, i: int) -> bytes:
        o = int(self.off[i])
        return self.buf[o:o + int(self.caplen[i])].tobytes()


@dataclass
class CaptureInfo:
    """Facts about the capture gathered while reading (for provenance and the summary)."""

    name: str
    size: int | None = None
    format: str = ""
    compression: str | None = None
    snaplens: set[int] = field(default_factory=set)
    linktypes: set[int] = field(default_factory=set)
    packets: int = 0
    first_ts_ns: int | None = None
    last_ts_ns: int | None = None
    sha256: str | None = None  # of the file as stored, when the reader was asked for it
    error: CaptureError | None = None

    @property
    def partial(self) -> bool:
        return self.error is not None


class CaptureReader:
    """Iterate ``RecordBatch`` objects from a capture; ``info`` fills in as it goes."""

    def __init__(self, source: str | os.PathLike | BinaryIO, *, name: str | None = None,
                 chunk_size: int = DEFAULT_CHUNK, batch_size: int = DEFAULT_BATCH, sha256: bool = False):
        self.src = Source(source, name=name, sha256=sha256)
        self.info = CaptureInfo(name=self.src.name, size=self.src.size, compression=self.src.compression)
        self.chunk_size = chunk_size
        self.batch_size = batch_size
        self._eof = False
        self._buf = np.empty(0, np.uint8)
        self._base = 0  # stream offset of _buf[0]
        self._frame = 1
        self._stream_error: tuple[str, int] | None = None
        self._const_linktype: int | None = None  # pcap: one supported linktype for every record

    # --- buffer management --------------------------------------------------------------------------------
    def _fill(self, keep_from: int, need: int) -> bool:
        """Keep _buf[keep_from:], read so that at least ``need`` bytes are buffered. False at EOF."""
        rest = self._buf[keep_from:]
        size = max(self.chunk_size, need, rest.shape[0])
        new = np.empty(size, np.uint8)
        new[:rest.shape[0]] = rest
        have = rest.shape[0]
        mv = memoryview(new)
        # decompressors raise at a corrupt point and drop what they decoded in that call: read small steps
        step = 1 << 16 if self.src.compression else 0
        while have < size and not self._eof:
            try:
                got = self.src.stream.readinto(mv[have:have + step] if step else mv[have:])
            except self.src.stream_errors as e:  # corrupt or truncated compressed stream
                # keep what was decompressed; the walk uses it and raises this once it needs more
                self._stream_error = (f"{self.src.compression or 'stream'} error: {e}", self._base + keep_from + have)
                got = 0
            if not got:
                self._eof = True
                break
            have += got
        self._base += keep_from
        self._buf = new[:have]
        return have >= need

    def _raise_stream_error(self) -> None:
        if self._stream_error is not None:
            msg, offset = self._stream_error
            raise self._err(msg, offset)

    def _err(self, msg: str, offset: int) -> CaptureError:
        return CaptureError(self.info.name, msg, frame=self._frame, offset=offset)

    # --- iteration ----------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[RecordBatch]:
        try:
            if not self._fill(0, 4) and self._buf.shape[0] == 0:
                self._raise_stream_error()
                raise self._err("empty capture file", 0)
            if self._buf.shape[0] < 4:
                raise self._err("file too short to be a capture", 0)
            magic = int.from_bytes(self._buf[:4].tobytes(), "little")
            if magic in PCAP_MAGICS:
                self.info.format = "pcap"
                yield from self._iter_pcap(*PCAP_MAGICS[magic])
            elif magic == walk.PCAPNG_SHB:
                self.info.format = "pcapng"
                yield from self._iter_pcapng()
            else:
                raise self._err(f"not a pcap or pcapng capture (first bytes {self._buf[:4].tobytes().hex()})", 0)
        except CaptureError as e:
            self.info.error = e
            raise
        finally:
            if self.info.error is None:
                self.src.drain()
            self.info.sha256 = self.src.sha256_hex() if self.info.error is None else None
            self.src.close()

    def _arrays(self):
        n = self.batch_size
        return (np.empty(n, np.int64), np.empty(n, np.uint32), np.empty(n, np.uint32), np.empty(n, np.int64),
                np.empty(n, np.int64))

    def _emit(self, n, off, caplen, wirelen, ts_ns, rec_pos, linktype, if_id) -> RecordBatch | None:
        if n == 0:
            return None
        # an unsupported linktype is a fault at the first frame that has it
        fault = None
        const = self._const_linktype
        bad = None if const is not None else ~np.isin(linktype[:n], np.fromiter(SUPPORTED_LINKTYPES, np.uint16))
        if bad is not None and bad.any():
            k = int(np.argmax(bad))
            fault = CaptureError(self.info.name, f"linktype {int(linktype[k])} is not supported (supported: "
                                 + ", ".join(f"{v} {k2}" for k2, v in sorted(SUPPORTED_LINKTYPES.items())) + ")",
                                 frame=self._frame + k, offset=self._base + int(rec_pos[k]))
            n = k
        frames = np.arange(self._frame, self._frame + n, dtype=np.uint64)
        batch = RecordBatch(self._buf, off[:n].copy(), caplen[:n].copy(), wirelen[:n].copy(), ts_ns[:n].copy(),
                            linktype[:n].copy(), if_id[:n].copy(), frames, rec_pos[:n] + self._base)
        if n:
            self._frame += n
            self.info.packets += n
            if const is None:
                self.info.linktypes.update(np.flatnonzero(np.bincount(batch.linktype)).tolist())
            else:
                self.info.linktypes.add(const)
            if self.info.first_ts_ns is None:
                self.info.first_ts_ns = int(batch.ts_ns[0])
            self.info.last_ts_ns = int(batch.ts_ns[-1])
        if fault is not None:
            if n:
                self._pending_fault = fault
                return batch
            raise fault
        return batch

    def _iter_pcap(self, be: bool, ts_mul: int) -> Iterator[RecordBatch]:
        if not self._fill(0, 24):
            raise self._err("truncated pcap file header", self._buf.shape[0])
        hdr = self._buf[:24].tobytes()
        e = ">" if be else "<"
        _, _vmaj, _vmin, _, _, snaplen, lt = struct.unpack(e + "IHHiIII", hdr)
        linktype_val = lt & 0x0FFFFFFF & 0xFFFF  # upper bits carry FCS length flags
        self.info.snaplens.add(snaplen)
        max_caplen = min(MAX_CAPLEN, snaplen) if snaplen else MAX_CAPLEN
        off, caplen, wirelen, ts_ns, rec_pos = self._arrays()
        linktype = np.full(self.batch_size, linktype_val, np.uint16)
        if linktype_val in SUPPORTED_LINKTYPES:
            self._const_linktype = linktype_val
        if_id = np.zeros(self.batch_size, np.uint32)
        pos = 24
        self._pending_fault = None
        while True:
            n, pos, status, need = walk.walk_pcap(self._buf, pos, self._buf.shape[0], be, ts_mul, max_caplen,
                                                  off, caplen, wirelen, ts_ns, rec_pos)
            rec = pos  # the record the walk stopped at
            batch = self._emit(n, off, caplen, wirelen, ts_ns, rec_pos, linktype, if_id)
            if batch is not None:
                yield batch
            if self._pending_fault is not None:
                raise self._pending_fault
            if status == walk.FULL:
                continue
            if status == walk.BAD_CAPLEN:
                raise self._err(f"record caplen {need} exceeds the file's snaplen {snaplen} (or {MAX_CAPLEN}): "
                                "corrupt record header", self._base + rec)
            # NEED: refill keeping the partial record
            avail = self._buf.shape[0] - rec
            if avail == 0 and self._eof:
                self._raise_stream_error()
                return
            if not self._fill(rec, int(need)):
                self._raise_stream_error()
                have = self._buf.shape[0]
                if have == 0:
                    return
                raise self._err(f"truncated record: {have} of {int(need)} bytes present at end of file", self._base)
            pos = 0

    # --- pcapng -------------------------------------------------------------------------------------------
    def _iter_pcapng(self) -> Iterator[RecordBatch]:
        off, caplen, wirelen, ts_ns, rec_pos = self._arrays()
        linktype = np.empty(self.batch_size, np.uint16)
        if_id = np.empty(self.batch_size, np.uint32)
        ifs: list[tuple[int, int, int, int, int]] = []  # linktype, snaplen, mul, div, off_ns
        be = False
        pos = 0
        self._pending_fault = None
        while True:
            arr = np.array(ifs, dtype=np.int64).reshape(-1, 5)
            n, pos, status, need = walk.walk_pcapng(
                self._buf, pos, self._buf.shape[0], be, arr[:, 0].astype(np.uint16), arr[:, 1].copy(),
                arr[:, 2].astype(np.uint64), arr[:, 3].astype(np.uint64), arr[:, 4].copy(), len(ifs), MAX_CAPLEN,
                off, caplen, wirelen, ts_ns, rec_pos, linktype, if_id)
            rec = pos
            batch = self._emit(n, off, caplen, wirelen, ts_ns, rec_pos, linktype, if_id)
            if batch is not None:
                yield batch
            if self._pending_fault is not None:
                raise self._pending_fault
            at = self._base + rec
            if status == walk.FULL:
                continue
            if status == walk.STOP_BLOCK:
                # SHB or IDB: make sure the whole block is buffered, then parse it here
                if not self._ensure(rec, 12):
                    raise self._err("truncated pcapng block header", at)
                rec = 0
                btype = int.from_bytes(self._buf[0:4].tobytes(), "big" if be else "little")
                if btype == walk.PCAPNG_SHB:
                    if not self._ensure(0, 12):
                        raise self._err("truncated section header", at)
                    bom = self._buf[8:12].tobytes()
                    if bom == PCAPNG_BOM.to_bytes(4, "little"):
                        be = False
                    elif bom == PCAPNG_BOM.to_bytes(4, "big"):
                        be = True
                    else:
                        raise self._err(f"bad pcapng byte-order magic {bom.hex()}", at + 8)
                    ifs = []
                blen = int.from_bytes(self._buf[4:8].tobytes(), "big" if be else "little")
                if blen < 12 or blen % 4:
                    raise self._err(f"pcapng block length {blen} is invalid", at + 4)
                if not self._ensure(0, blen):
                    raise self._err(f"truncated pcapng block: {self._buf.shape[0]} of {blen} bytes", at)
                block = self._buf[:blen].tobytes()
                e = ">" if be else "<"
                if struct.unpack(e + "I", block[-4:])[0] != blen:
                    raise self._err("pcapng block lengths disagree (leading vs trailing)", at)
                if btype == walk.PCAPNG_IDB:
                    ifs.append(self._parse_idb(block, e, at))
                pos = blen
                continue
            if status == walk.NEED:
                avail = self._buf.shape[0] - rec
                if avail == 0 and self._eof:
                    self._raise_stream_error()
                    return
                if not self._fill(rec, int(need)):
                    self._raise_stream_error()
                    raise self._err(f"truncated pcapng block: {self._buf.shape[0]} of {int(need)} bytes present "
                                    "at end of file", self._base)
                pos = 0
                continue
            msgs = {walk.BAD_BLOCK_LEN: f"pcapng block length {need} is invalid",
                    walk.BAD_TRAILER: "pcapng block lengths disagree (leading vs trailing)",
                    walk.BAD_IF: f"packet refers to interface {need}, which no Interface Description Block defines",
                    walk.BAD_EPB_LEN: f"packet block of {need} bytes cannot hold its captured length",
                    walk.BAD_CAPLEN: f"record caplen {need} exceeds the interface snaplen (or {MAX_CAPLEN}): "
                    "corrupt block"}
            raise self._err(msgs.get(status, f"pcapng walk status {status}"), at)

    def _ensure(self, start: int, need: int) -> bool:
        """Make _buf start at ``start`` (relative) and hold at least ``need`` bytes."""
        if start == 0 and self._buf.shape[0] >= need:
            return True
        return self._fill(start, need)

    def _parse_idb(self, block: bytes, e: str, at: int) -> tuple[int, int, int, int, int]:
        if len(block) < 20:
            raise self._err("interface description block too short", at)
        lt, _, snaplen = struct.unpack(e + "HHI", block[8:16])
        self.info.snaplens.add(snaplen)
        mul, div, off_ns = 1000, 1, 0  # default resolution: microseconds
        p = 16
        end = len(block) - 4
        while p + 4 <= end:
            code, olen = struct.unpack(e + "HH", block[p:p + 4])
            val = block[p + 4:p + 4 + olen]
            if code == 0:
                break
            if code == 9 and olen >= 1:  # if_tsresol
                r = val[0]
                if r & 0x80:
                    mul, div = 1_000_000_000, 1 << (r & 0x7F)
                else:
                    exp = r & 0x7F
                    if exp <= 9:
                        mul, div = 10 ** (9 - exp), 1
                    else:
                        mul, div = 1, 10 ** (exp - 9)
            elif code == 14 and olen >= 8:  # if_tsoffset, seconds
                off_ns = struct.unpack(e + "q", val[:8])[0] * 1_000_000_000
            p += 4 + olen + (-olen % 4)
        return lt, snaplen, mul, div, off_ns


def read_batches(source: str | os.PathLike | BinaryIO, **kw) -> Iterator[RecordBatch]:
    """Convenience: iterate the record batches of a capture."""
    return iter(CaptureReader(source, **kw))
