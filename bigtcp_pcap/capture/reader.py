"""The capture reader: pcap (all four magics) and pcapng (sections, interfaces, EPB/SPB/PB), streaming.

``read_batches(source)`` yields ``RecordBatch`` objects: column arrays over one buffer of file bytes. Memory is
one buffer (``chunk_size``, grown only for a single record that is larger) however large the capture is.
On a fault it first yields every complete record before the fault, then raises ``CaptureError`` naming the
frame and byte offset; callers keep what they got and mark their output partial.

What a readable file holds is read whole, as Wireshark does: records of any link type are handed on (the
decoder says which it decodes), a record longer than its snaplen is kept whole, a pcapng packet block naming an
interface no IDB defined is skipped, and a timestamp that does not fit int64 nanoseconds is ``TS_UNKNOWN``.
Each of these is counted in ``info.notes`` (one finding row per condition at the end, not one per frame).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from .. import findings as F
from .. import linktypes
from ..errors import CaptureError
from . import walk
from .notes import CaptureNotes
from .source import Source

# A record larger than this is corrupt, whatever the header says. libpcap (sf-pcap.c) refuses a caplen above
# max_snaplen_for_dlt() (262144, MAXIMUM_SNAPLEN) and tshark above its per-encapsulation maximum (262144 for
# Ethernet): measured on an Ethernet record of 300014 bytes, tcpdump 4.99.3 stops with "invalid packet capture
# length 300014, bigger than snaplen of 262144" and tshark 4.0.17 with "appears to have been cut short". Both would
# refuse BIG TCP frames of 256-512 KiB, which the kernel does write. 256 MiB keeps every real frame and still
# stops a corrupt length before it allocates gigabytes.
MAX_CAPLEN = 256 << 20
TS_UNKNOWN = int(walk.TS_UNKNOWN)
# libpcap's TPACKET_V2 ring (tcpdump --immediate-mode) on an Ethernet device with offloads on sizes its frames
# for MAX(mtu, 65535) + 18 bytes (pcap-linux.c create_ring), and the kernel cuts a longer (BIG TCP) frame to what
# its ring slot holds: that size plus the slot's 16-byte alignment slack, plus 4 when libpcap re-inserts a VLAN
# tag. Measured (scripts/capture_tpacket_clamp.sh, libpcap 1.10.3, Linux 6.18): caplen 65562 of 184306.
TPACKET_V2_CLAMP = (65535 + 18, 65535 + 18 + 15 + 4)  # caplen range, both ends included
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
    epb_flags: np.ndarray | None = None  # uint32, the pcapng epb_flags option (0 when absent or pcap)
    libpcap_snap: int = 0  # the bytes of a record libpcap hands on (tcpdump -r): ``libpcap_snapshot``; 0 = all
    if_base: int = 0  # pcapng: the interfaces of the sections before this batch's (a batch is in one section)

    def __post_init__(self) -> None:
        if self.epb_flags is None:
            self.epb_flags = np.zeros(self.off.shape[0], np.uint32)

    def __len__(self) -> int:
        return int(self.off.shape[0])

    @property
    def if_gid(self) -> np.ndarray:
        """The interface numbered across pcapng sections (``if_id`` is the section's own number, as tshark's
        frame.interface_id): a file of several sections (``cat a.pcapng b.pcapng``) holds several captures."""
        return self.if_id if not self.if_base else self.if_id + np.uint32(self.if_base)

    def packet(self, i: int) -> bytes:
        o = int(self.off[i])
        return self.buf[o:o + int(self.caplen[i])].tobytes()


def libpcap_snapshot(snaplen: int, linktype: int) -> int:
    """How much of a record of a pcap file libpcap hands on (sf-pcap.c, libpcap 1.10): the header's snaplen, or
    the link type's maximum when it is 0 or larger (pcap_adjust_snapshot). A longer record is cut to it before
    a filter runs (``tcpdump -r FILE EXPR`` judges the cut frame; measured with tcpdump 4.99.3: a header snaplen
    of 30 and a 54-byte TCP record, 'tcp port P' does not match it). A pcapng file is different: there libpcap
    stops at an Enhanced Packet Block longer than the interface's snaplen ("invalid packet capture length")."""
    top = linktypes.libpcap_max_snaplen(linktype)
    return top if snaplen == 0 or snaplen > top else snaplen


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
    frame_blocks: int = 0  # pcapng blocks that hold no packet but are frames to Wireshark (``walk.FRAME_BLOCK``)
    # pcapng Interface Statistics Blocks: per interface (numbered across sections), the packets the capturing
    # system says it dropped (isb_ifdrop + isb_osdrop; the last block of an interface: the counters are totals)
    dropped: dict[int, int] = field(default_factory=dict)
    first_ts_ns: int | None = None
    last_ts_ns: int | None = None
    min_ts_ns: int | None = None  # the earliest and latest timestamps (records need not be in time order:
    max_ts_ns: int | None = None  # mergecap -a, several pcapng sections, a clock step)
    sha256: str | None = None  # of the file as stored, when the reader was asked for it
    error: CaptureError | None = None
    notes: CaptureNotes = field(default_factory=CaptureNotes)  # counted capture-level findings

    @property
    def partial(self) -> bool:
        return self.error is not None

    @property
    def last_frame(self) -> int:
        """The number of the last frame read (Wireshark's numbering: pcapng blocks that are frames count)."""
        return self.packets + self.frame_blocks


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
        self._if_base = 0  # pcapng: interfaces of the sections before the current one
        self._stream_error: tuple[str, int] | None = None
        self._const_linktype: int | None = None  # pcap: the one linktype of every record
        self._snaplen_by_if = np.zeros(0, np.int64)  # pcapng: each interface's snaplen (0: none)

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
            if have >= need and self.src.live and self.src.idle():
                break  # a live input that has paused: hand out what came (a buffer's worth may take long)
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
                # a 0-byte file: tshark reads it as a capture of no packets (tcpdump refuses it); a note, no error
                self.info.format = "empty"
                self.info.notes.count(F.CAPTURE_EMPTY, 0, np.zeros(1, np.int64))
                return
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
        else:
            if self.info.packets == 0 and self.info.format != "empty":  # a header and no records: the same note
                self.info.notes.count(F.CAPTURE_EMPTY, self._base + self._buf.shape[0], np.zeros(1, np.int64))
            self.src.drain()  # read to the end: the SHA-256 covers the whole file
            self.info.sha256 = self.src.sha256_hex()
        finally:  # also when the caller stops early (an interrupt closes the generator): no hash, no drain
            self.src.close()

    def _arrays(self):
        n = self.batch_size
        return (np.empty(n, np.int64), np.empty(n, np.uint32), np.empty(n, np.uint32), np.empty(n, np.int64),
                np.empty(n, np.int64))

    def _emit(self, n, off, caplen, wirelen, ts_ns, rec_pos, linktype, if_id, flags=None,
              snaplen: int | np.ndarray = 0, libpcap_snap: int = 0) -> RecordBatch | None:
        """The first n walked records as a batch; counts the capture-level notes. ``snaplen``: the file's, or
        one per interface (indexed by if_id); 0 means none."""
        if n == 0:
            return None
        frames = np.arange(self._frame, self._frame + n, dtype=np.uint64)
        batch = RecordBatch(self._buf, off[:n].copy(), caplen[:n].copy(), wirelen[:n].copy(), ts_ns[:n].copy(),
                            linktype[:n].copy(), if_id[:n].copy(), frames, rec_pos[:n] + self._base,
                            None if flags is None else flags[:n].copy(), libpcap_snap, self._if_base)
        self._frame += n
        self.info.packets += n
        const = self._const_linktype
        if const is None:
            self.info.linktypes.update(np.flatnonzero(np.bincount(batch.linktype)).tolist())
        else:
            self.info.linktypes.add(const)
        self._note(batch, snaplen)
        known = batch.ts_ns[batch.ts_ns != TS_UNKNOWN]
        if known.shape[0]:
            lo, hi = int(known.min()), int(known.max())
            if self.info.first_ts_ns is None:
                self.info.first_ts_ns, self.info.min_ts_ns, self.info.max_ts_ns = int(known[0]), lo, hi
            self.info.last_ts_ns = int(known[-1])
            self.info.min_ts_ns = min(self.info.min_ts_ns, lo)
            self.info.max_ts_ns = max(self.info.max_ts_ns, hi)
        return batch

    def _note(self, b: RecordBatch, snaplen: int | np.ndarray) -> None:
        """Count what the frames of a batch say about the capture (one finding per condition at the end)."""
        notes = self.info.notes
        snap = snaplen[b.if_id] if isinstance(snaplen, np.ndarray) else snaplen
        over = (b.caplen > snap) & (snap > 0)
        if over.any():
            notes.count_by_value(F.SNAPLEN_EXCEEDED, np.broadcast_to(snap, over.shape)[over], b.frame[over])
        lo, hi = TPACKET_V2_CLAMP
        clamp = (b.caplen >= lo) & (b.caplen <= hi) & (b.wirelen > b.caplen) & (b.linktype == 1)
        if isinstance(snap, int) and 0 < snap <= hi:  # cut by the file's own snaplen, not by the ring
            clamp[:] = False
        elif not isinstance(snap, int):
            clamp &= (snap == 0) | (snap > hi)
        if clamp.any():
            notes.count_by_value(F.TPACKET_V2_CLAMP, b.caplen[clamp], b.frame[clamp])
        bad_ts = b.ts_ns == TS_UNKNOWN
        if bad_ts.any():
            notes.count_by_value(F.TS_OUT_OF_RANGE, b.if_id[bad_ts], b.frame[bad_ts])

    def _iter_pcap(self, be: bool, ts_mul: int) -> Iterator[RecordBatch]:
        if not self._fill(0, 24):
            raise self._err("truncated pcap file header", self._buf.shape[0])
        hdr = self._buf[:24].tobytes()
        e = ">" if be else "<"
        _, _vmaj, _vmin, _, _, snaplen, lt = struct.unpack(e + "IHHiIII", hdr)
        linktype_val = lt & 0x0FFFFFFF & 0xFFFF  # upper bits carry FCS length flags
        self.info.snaplens.add(snaplen)
        off, caplen, wirelen, ts_ns, rec_pos = self._arrays()
        linktype = np.full(self.batch_size, linktype_val, np.uint16)
        self._const_linktype = linktype_val
        lp_snap = libpcap_snapshot(snaplen, linktype_val)
        if_id = np.zeros(self.batch_size, np.uint32)
        pos = 24
        while True:
            n, pos, status, need = walk.walk_pcap(self._buf, pos, self._buf.shape[0], be, ts_mul, MAX_CAPLEN,
                                                  off, caplen, wirelen, ts_ns, rec_pos)
            rec = pos  # the record the walk stopped at
            batch = self._emit(n, off, caplen, wirelen, ts_ns, rec_pos, linktype, if_id, snaplen=snaplen,
                               libpcap_snap=lp_snap)
            if batch is not None:
                yield batch
            if status == walk.FULL:
                continue
            if status == walk.BAD_CAPLEN:
                raise self._err(f"record caplen {need} exceeds {MAX_CAPLEN} bytes: corrupt record header",
                                self._base + rec)
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
        flags = np.zeros(self.batch_size, np.uint32)
        stats = np.zeros(3, np.int64)
        ifs = _Interfaces()
        be = False
        pos = 0
        while True:
            n, pos, status, need = walk.walk_pcapng(
                self._buf, pos, self._buf.shape[0], be, *ifs.arrays(), MAX_CAPLEN,
                off, caplen, wirelen, ts_ns, rec_pos, linktype, if_id, flags, stats)
            rec = pos
            batch = self._emit(n, off, caplen, wirelen, ts_ns, rec_pos, linktype, if_id, flags, ifs.snaplen[:ifs.n])
            if batch is not None:
                yield batch
            self._note_undefined_interfaces(stats)
            at = self._base + rec
            if status == walk.FULL:
                continue
            if status == walk.FRAME_BLOCK:  # no packet, but a frame in Wireshark: frame numbers stay Wireshark's
                self._frame += 1
                self.info.frame_blocks += 1
                continue
            if status == walk.STOP_BLOCK:
                # SHB or IDB: parse it where it lies (refilling only when it is not wholly buffered: a refill
                # per block made 20,000 IDBs quadratic)
                if self._buf.shape[0] - rec < 12:
                    if not self._fill(rec, 12):
                        raise self._err("truncated pcapng block header", at)
                    rec = 0
                btype = int.from_bytes(self._buf[rec:rec + 4].tobytes(), "big" if be else "little")
                if btype == walk.PCAPNG_SHB:
                    bom = self._buf[rec + 8:rec + 12].tobytes()
                    if bom == PCAPNG_BOM.to_bytes(4, "little"):
                        be = False
                    elif bom == PCAPNG_BOM.to_bytes(4, "big"):
                        be = True
                    else:
                        raise self._err(f"bad pcapng byte-order magic {bom.hex()}", at + 8)
                    self._if_base += ifs.n  # (the next section's interfaces are numbered after these)
                    ifs = _Interfaces()
                blen = int.from_bytes(self._buf[rec + 4:rec + 8].tobytes(), "big" if be else "little")
                if blen < 12 or blen % 4:
                    raise self._err(f"pcapng block length {blen} is invalid", at + 4)
                if blen > MAX_CAPLEN + 4096:
                    raise self._err(f"pcapng block length {blen} exceeds {MAX_CAPLEN + 4096}: corrupt block", at + 4)
                if self._buf.shape[0] - rec < blen:
                    if not self._fill(rec, blen):
                        self._raise_stream_error()
                        raise self._err(f"truncated pcapng block: {self._buf.shape[0]} of {blen} bytes", at)
                    rec = 0
                block = self._buf[rec:rec + blen].tobytes()
                e = ">" if be else "<"
                if struct.unpack(e + "I", block[-4:])[0] != blen:
                    raise self._err("pcapng block lengths disagree (leading vs trailing)", at)
                if btype == walk.PCAPNG_IDB:
                    ifs.add(*self._parse_idb(block, e, at))
                elif btype == walk.PCAPNG_ISB:
                    self._parse_isb(block, e)
                pos = rec + blen
                continue
            if status == walk.NEED:
                avail = self._buf.shape[0] - rec
                if avail == 0 and self._eof:
                    self._raise_stream_error()
                    return
                if need > MAX_CAPLEN + 4096:
                    raise self._err(f"pcapng block length {need} exceeds {MAX_CAPLEN + 4096}: corrupt block", at)
                if not self._fill(rec, int(need)):
                    self._raise_stream_error()
                    raise self._err(f"truncated pcapng block: {self._buf.shape[0]} of {int(need)} bytes present "
                                    "at end of file", self._base)
                pos = 0
                continue
            msgs = {walk.BAD_BLOCK_LEN: f"pcapng block length {need} is invalid",
                    walk.BAD_TRAILER: "pcapng block lengths disagree (leading vs trailing)",
                    walk.BAD_EPB_LEN: f"packet block of {need} bytes cannot hold its captured length",
                    walk.BAD_CAPLEN: f"record caplen {need} exceeds {MAX_CAPLEN} bytes: corrupt block"}
            raise self._err(msgs.get(status, f"pcapng walk status {status}"), at)

    def _note_undefined_interfaces(self, stats: np.ndarray) -> None:
        """Packet blocks the walk skipped because no IDB defines their interface: one note, first at its offset."""
        if stats[walk.STAT_UNDEF_IF]:
            k = int(stats[walk.STAT_UNDEF_IF])
            notes = self.info.notes
            key = (F.UNDEFINED_INTERFACE, int(stats[walk.STAT_UNDEF_IF_ID]))
            if key not in notes.notes:
                notes.count(key[0], key[1], np.array([self._frame], np.uint64))
                k -= 1
            notes.notes[key].count += k
            stats[walk.STAT_UNDEF_IF] = 0

    def _ensure(self, start: int, need: int) -> bool:
        """Make _buf start at ``start`` (relative) and hold at least ``need`` bytes."""
        if start == 0 and self._buf.shape[0] >= need:
            return True
        return self._fill(start, need)

    def _parse_isb(self, block: bytes, e: str) -> None:
        """An Interface Statistics Block's drop counters into ``info.dropped`` (isb_ifdrop 5: dropped by the
        interface or the capture buffer; isb_osdrop 7: by the operating system). A block too short or with a bad
        option is ignored, as tshark reads the file all the same."""
        if len(block) < 24:
            return
        iid = struct.unpack(e + "I", block[8:12])[0]
        drops, seen = 0, False
        p, end = 20, len(block) - 4
        while p + 4 <= end:
            code, olen = struct.unpack(e + "HH", block[p:p + 4])
            if code == 0 or p + 4 + olen > end:
                break
            if code in (5, 7) and olen == 8:
                drops += struct.unpack(e + "Q", block[p + 4:p + 12])[0]
                seen = True
            p += 4 + olen + (-olen % 4)
        if seen:
            self.info.dropped[self._if_base + iid] = drops

    def _parse_idb(self, block: bytes, e: str, at: int) -> tuple[int, int, int, int, int, int]:
        """(linktype, snaplen, mul, div, shift, offset seconds) of an IDB: see ``ts_resolution``."""
        if len(block) < 20:
            raise self._err("interface description block too short", at)
        lt, _, snaplen = struct.unpack(e + "HHI", block[8:16])
        self.info.snaplens.add(snaplen)
        resol, off_s = 6, 0  # default resolution: microseconds
        p = 16
        end = len(block) - 4
        while p + 4 <= end:
            code, olen = struct.unpack(e + "HH", block[p:p + 4])
            val = block[p + 4:min(p + 4 + olen, end)]
            if code == 0:
                break
            if code == 9 and len(val) >= 1:  # if_tsresol
                resol = val[0]
            elif code == 14 and len(val) >= 8:  # if_tsoffset, seconds (signed 64 bits)
                off_s = struct.unpack(e + "q", val[:8])[0]
            p += 4 + olen + (-olen % 4)
        return (lt, snaplen, *ts_resolution(resol), off_s)


class _Interfaces:
    """The interfaces of one pcapng section as column arrays for the walk, grown by doubling (linear in IDBs)."""

    def __init__(self) -> None:
        self.n = 0
        self.linktype = np.zeros(4, np.uint16)
        self.snaplen = np.zeros(4, np.int64)
        self.mul = np.zeros(4, np.uint64)
        self.div = np.ones(4, np.uint64)
        self.shift = np.zeros(4, np.uint64)
        self.off_s = np.zeros(4, np.int64)

    def add(self, lt: int, snaplen: int, mul: int, div: int, shift: int, off_s: int) -> None:
        if self.n == self.linktype.shape[0]:
            for name in ("linktype", "snaplen", "mul", "div", "shift", "off_s"):
                a = getattr(self, name)
                setattr(self, name, np.concatenate([a, np.zeros_like(a)]))
        i = self.n
        self.linktype[i], self.snaplen[i], self.mul[i], self.div[i] = lt, snaplen, mul, div
        self.shift[i], self.off_s[i] = shift, off_s
        self.n += 1

    def arrays(self) -> tuple:
        """The walk's interface arguments: linktype, snaplen, mul, div, shift, off_s, count."""
        k = self.n
        return (self.linktype[:k], self.snaplen[:k], self.mul[:k], self.div[:k], self.shift[:k], self.off_s[:k], k)


def ts_resolution(resol: int) -> tuple[int, int, int]:
    """(mul, div, shift) for an if_tsresol byte, so that ns = (units >> shift) * mul / (div >> shift) fits 64 bits.

    Bit 7 clear: units of 10**-r s; set: 2**-(r & 0x7f) s (pcapng section 4.2). div 0 stands for 2**64. A
    resolution finer than a nanosecond loses only sub-nanosecond digits; mul 0 means every timestamp is below
    one nanosecond (plus the offset), which is exactly what such a resolution says.
    """
    r = resol & 0x7F
    if not resol & 0x80:
        if r <= 9:
            return 10 ** (9 - r), 1, 0
        if r - 9 <= 19:  # 10**19 < 2**64
            return 1, 10 ** (r - 9), 0
        return 0, 1, 0  # units of 10**-29 s or finer: 2**64 units are < 1 ns
    shift = max(0, r - 34)  # frac < 2**34 so frac * 10**9 < 2**64
    if shift >= 64:
        return 0, 1, 0
    return 1_000_000_000, (1 << r) if r < 64 else 0, shift


def read_batches(source: str | os.PathLike | BinaryIO, **kw) -> Iterator[RecordBatch]:
    """Convenience: iterate the record batches of a capture."""
    return iter(CaptureReader(source, **kw))
