"""``explode()``: rewrite a capture's super-packets into the wire-sized packets they stand for.

A super-packet is a TCP packet carrying more than one MSS: a sender's GSO/TSO skb on its TX tap, or a GRO
super-packet on a receiver. Each becomes the packets software segmentation would make of it (the egress
engine with TSO off: docs/gso-spec.md G4-G9), byte for byte as far as the capture holds bytes:

* headers copied from the super-packet, the 8-byte HBH jumbo header removed (IPv6 next header restored);
* IPv6 payload_len / IPv4 tot_len set to the segment's length, IPv4 IDs incremented and the IPv4 header
  checksum recomputed, TCP seq advanced, PSH/FIN only on the last, CWR only on the first segment;
* the payload bytes the capture has (snaplen) are cut at the same boundaries, and each segment is kept to
  the input's snaplen; the TCP checksum is recomputed when a segment is captured whole, else left as found
  (a TX capture's checksums are partial anyway: CHECKSUM_PARTIAL);
* segment k of n gets the super-packet's timestamp + k * step, step = min(1 us, gap to the next frame / n),
  so the segments keep the capture's order.

Everything else (plain packets, non-TCP, tunnelled super-packets, truncated headers) is copied unchanged. The
per-record work is numpy gathers and scatters over the whole batch; no per-packet Python.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..capture.reader import CaptureReader
from ..decode import decode
from ..decode.schema import BIGTCP_HBH_JUMBO
from ..errors import CaptureError, OutputError
from ..flows.table import FlowTable
from ..linktypes import LIBPCAP_MAXIMUM_SNAPLEN
from .config import EgressProfile, ProfileError
from .engine import ACTION_SEGMENTED, EgressBatch, EgressEngine

STEP_NS = 1000  # at most 1 us between the segments of one super-packet
MAX_SNAPLEN = LIBPCAP_MAXIMUM_SNAPLEN  # the largest header snaplen libpcap reads whole
CHUNK = 16384  # output records per gather


@dataclass
class ExplodeResult:
    """Counts of an explode run (``summary``) and the fault that ended reading, if any."""

    dest: Path
    summary: dict[str, Any]
    error: CaptureError | None = None
    _unused: Any = field(default=None, repr=False)


class _Writer:
    """pcap (nanosecond) or pcapng records from column arrays, written one batch at a time."""

    def __init__(self, f: BinaryIO, pcapng: bool) -> None:
        self.f, self.pcapng = f, pcapng
        self.linktype: int | None = None
        self.snaplen = MAX_SNAPLEN
        self.ifaces: dict[tuple[int, int], int] = {}  # (input if_id, linktype) -> output interface id (pcapng)
        if pcapng:
            body = struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1)
            self._block(0x0A0D0D0A, body)

    def _block(self, btype: int, body: bytes) -> None:
        body += b"\0" * (-len(body) % 4)
        n = 12 + len(body)
        self.f.write(struct.pack("<II", btype, n) + body + struct.pack("<I", n))

    def begin(self, linktype: np.ndarray, if_id: np.ndarray, snaplen: int) -> None:
        """Write what must precede these records: the pcap header, or an IDB per new interface."""
        if not self.pcapng:
            lts = set(np.unique(linktype).tolist())
            first = self.linktype if self.linktype is not None else int(linktype[0]) if len(linktype) else 1
            if lts - {first}:  # (checked before the header: a first batch that mixes them writes nothing)
                raise ProfileError(f"the capture mixes link types {sorted(lts | {first})}: a pcap file holds one; "
                                   "write pcapng instead (OUT ending in .pcapng, or --pcapng)")
            if self.linktype is None:
                self.linktype = first
                self.snaplen = snaplen
                self.f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, snaplen, self.linktype))
            return
        # interfaces by (id, link type): ids restart at 0 in each section of a multi-section pcapng
        for i, lt in sorted(set(zip(if_id.tolist(), linktype.tolist()))):
            if (i, lt) not in self.ifaces:
                self.ifaces[i, lt] = len(self.ifaces)
                opts = struct.pack("<HHB", 9, 1, 9) + b"\0" * 3 + struct.pack("<HH", 0, 0)  # if_tsresol 1e-9
                self._block(1, struct.pack("<HHI", lt, 0, snaplen) + opts)

    def records(self, buf: np.ndarray, pieces: tuple[np.ndarray, np.ndarray, np.ndarray], caplen: np.ndarray,
                wirelen: np.ndarray, ts: np.ndarray, if_id: np.ndarray,
                linktype: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Lay out one record per row; ``pieces`` = (row, src offset in buf, length), in row order, whose
        lengths sum to each row's caplen. Returns (out buffer, data offset of each row) for patching.

        Every byte of the output is one gather from a single source (buf, then the record headers, trailers and
        padding): the index is a running sum that jumps at each piece's start, so no per-byte repeat."""
        n = caplen.shape[0]
        cap = caplen.astype(np.int64)
        ts = ts.astype(np.int64)
        if self.pcapng:
            pad = (-cap) % 4
            head, tail = 28, 4
            ifmap = np.array([self.ifaces[k] for k in zip(if_id.tolist(), linktype.tolist())], np.uint32)
            rec = head + cap + pad + tail
            hdr = np.stack([np.full(n, 6, np.uint32), rec.astype(np.uint32), ifmap, (ts >> 32).astype(np.uint32),
                            (ts & 0xFFFFFFFF).astype(np.uint32), cap.astype(np.uint32), wirelen.astype(np.uint32)],
                           axis=1)
            trailer = rec.astype("<u4")
        else:
            pad = np.zeros(n, np.int64)
            head, tail = 16, 0
            rec = head + cap
            hdr = np.stack([(ts // 1_000_000_000).astype(np.uint32), (ts % 1_000_000_000).astype(np.uint32),
                            cap.astype(np.uint32), wirelen.astype(np.uint32)], axis=1)
            trailer = np.zeros(0, "<u4")
        hb = np.ascontiguousarray(hdr.astype("<u4")).view(np.uint8).ravel()
        tb = np.ascontiguousarray(trailer).view(np.uint8)
        src_all = np.concatenate([buf, hb, tb, np.zeros(4, np.uint8)])
        h0, t0, z0 = buf.shape[0], buf.shape[0] + hb.shape[0], buf.shape[0] + hb.shape[0] + tb.shape[0]
        row, src, ln = pieces
        rows = np.arange(n)
        # all pieces of the output in order: per row header, data pieces, padding, trailer
        prow = np.concatenate([rows, row, rows, rows[:n if tail else 0]])
        psrc = np.concatenate([h0 + rows * head, src, np.full(n, z0), t0 + rows[:n if tail else 0] * 4])
        plen = np.concatenate([np.full(n, head), ln, pad, np.full(n if tail else 0, tail)])
        order = np.argsort(prow, kind="stable")
        psrc, plen = psrc[order], plen[order]
        keep = plen > 0
        psrc, plen = psrc[keep], plen[keep]
        total = int(plen.sum())
        step = np.ones(total, np.int64)
        if total:
            starts = np.cumsum(plen) - plen
            step[0] = psrc[0]
            step[starts[1:]] = psrc[1:] - (psrc[:-1] + plen[:-1] - 1)
        out = src_all[np.cumsum(step)] if total else np.zeros(0, np.uint8)
        start = np.cumsum(rec) - rec
        return out, start + head

    def write(self, out: np.ndarray) -> None:
        self.f.write(out.tobytes())


def _put16(out: np.ndarray, at: np.ndarray, v: np.ndarray) -> None:
    out[at] = (v >> 8) & 0xFF
    out[at + 1] = v & 0xFF


def _put32(out: np.ndarray, at: np.ndarray, v: np.ndarray) -> None:
    for i in range(4):
        out[at + i] = (v >> (24 - 8 * i)) & 0xFF


def _sum16(out: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Ones'-complement-style sums (not folded) of big-endian 16-bit words of out[start : start + length]."""
    total = int(length.sum())
    sums = np.zeros(start.shape[0], np.int64)
    if total == 0:
        return sums
    rel = np.arange(total) - np.repeat(np.cumsum(length) - length, length)
    b = out[np.repeat(start, length) + rel].astype(np.int64) * np.where(rel & 1, 1, 256)
    nz = length > 0
    sums[nz] = np.add.reduceat(b, (np.cumsum(length) - length)[nz])
    return sums


def _fold(s: np.ndarray) -> np.ndarray:
    for _ in range(3):
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def explode(source: str | os.PathLike | BinaryIO, dest: str | os.PathLike, *, mss: int | None = None,
            mtu: int = 1500, pcapng: bool | None = None) -> ExplodeResult:
    """Write ``dest``: ``source`` with every super-packet replaced by its wire-sized segments.

    ``mss``: the segment size for every flow (default: the SYN MSS options less the option bytes, else from
    ``mtu``). ``pcapng``: the output format (default: pcapng when ``dest`` ends in .pcapng, else pcap with
    nanosecond timestamps). Returns the counts; a damaged input keeps everything before the fault
    (``result.error``).
    """
    dest = Path(dest)
    if pcapng is None:
        pcapng = dest.suffix.lower() == ".pcapng"
    prof = EgressProfile(tso=False, mtu=mtu, name="explode")  # G4: every GSO skb cut in software
    engine = EgressEngine(prof, mss=mss, strip_hbh=True)
    reader = CaptureReader(source)
    flows = FlowTable()  # flow ids: the engine resolves each flow's MSS once (G14)
    frames_in = frames_out = 0
    counts = [0, 0]  # super-packets cut, their segments written
    error: CaptureError | None = None
    # a regular file (or a symlink to one, or a new name) is written as OUT.part and renamed when complete; a
    # FIFO, a device or '-' (stdout) is written as it goes: a rename would replace the node itself
    tmp: Path | None = None
    try:
        if str(dest) == "-":
            f = os.fdopen(os.dup(sys.stdout.buffer.fileno()), "wb")
        else:
            real = Path(os.path.realpath(dest))
            if real.exists() and not real.is_file():
                f = open(real, "wb")  # noqa: SIM115 - closed below
            else:
                tmp = real.with_name(real.name + ".part")
                f = open(tmp, "wb")  # noqa: SIM115 - closed below
    except OSError as e:
        reader.src.close()
        raise OutputError.from_os(str(dest), e) from None
    try:
        with f:
            w = _Writer(f, pcapng)
            held = None  # a batch is written once the next one is read: its last segments' times need the
            try:  # next frame's time (the segments of a super-packet never pass the frame after it)
                for rb in reader:
                    pb, _ = decode(rb)
                    eb = engine.feed(pb, flows.assign(pb))
                    snap = max((s for s in reader.info.snaplens if s > 0), default=MAX_SNAPLEN)
                    if len(pb):  # records longer than the header's snaplen are read whole (tshark does too)
                        snap = max(snap, int(pb.caplen.max()))
                    if held is not None and len(pb):
                        frames_out += _write_held(*held, int(pb.ts_ns[0]), counts)
                        held = None
                    if len(pb):
                        held = (w, rb, pb, eb, snap)
                    frames_in += len(pb)
            except CaptureError as e:
                error = e
            if held is not None:
                frames_out += _write_held(*held, None, counts)
            if w.linktype is None and not pcapng:  # an empty capture still gets a valid file
                w.begin(np.ones(1, np.uint16), np.zeros(1, np.uint32), MAX_SNAPLEN)
        if tmp is not None:
            tmp.replace(tmp.with_name(tmp.name[:-len(".part")]))
    except BaseException as e:  # a usage error (mixed link types into pcap), a full disk, ^C: no stray .part file
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise OutputError.from_os(str(dest), e) from None
        raise
    summary = {"source": reader.info.name, "dest": str(dest), "format": "pcapng" if pcapng else "pcap",
               "frames_in": frames_in, "frames_out": frames_out, "super_packets": counts[0], "segments_out": counts[1],
               "partial": error is not None}
    return ExplodeResult(dest=dest, summary=summary, error=error)


def _write_held(w: _Writer, rb, pb, eb, snap: int, next_ts: int | None, counts: list[int]) -> int:
    """``_batch`` for a held batch; adds its super-packets and segments to ``counts``, returns its frames."""
    n_sp, n_seg, n_out = _batch(w, rb, pb, eb, snap, next_ts)
    counts[0] += n_sp
    counts[1] += n_seg
    return n_out


def _batch(w: _Writer, rb, pb, eb, snap: int, next_ts: int | None = None) -> tuple[int, int, int]:
    """Write the output records of one input batch; returns (super-packets, their segments, records written).
    ``next_ts``: the time of the frame after the batch (None: the capture ends with it)."""
    s = eb.source_index
    seg = eb.action == ACTION_SEGMENTED
    # what is segmented but cannot be cut here is copied unchanged, once: a tunnelled super-packet (its inner
    # headers are not rewritten), an IPv6 one whose Hop-by-Hop header holds more than the 8-byte jumbo option
    # (the kernel removes only that exact header: ipv6_hopopt_jumbo_remove)
    hbh_in = seg & (pb.bigtcp[s] == BIGTCP_HBH_JUMBO)
    long_hbh = np.zeros(len(eb), bool)
    if hbh_in.any():
        at = rb.off[s[hbh_in]].astype(np.int64) + pb.l3_off[s[hbh_in]].astype(np.int64) + 41
        long_hbh[hbh_in] = rb.buf[at] != 0
    # (and one whose TCP header the snaplen cut: the segments' headers would be bytes the capture does not hold)
    cut_hdr = pb.caplen[s].astype(np.int64) < pb.l4_off[s].astype(np.int64) + pb.tcp_hdr_len[s].astype(np.int64)
    whole = seg & ((pb.tunnel[s] != 0) | long_hbh | cut_hdr)
    if whole.any():
        keep = ~whole | (eb.out_index == 0)
        eb = EgressBatch(**{f.name: getattr(eb, f.name)[keep] for f in dataclasses.fields(eb)})
        whole = whole[keep]
        s = eb.source_index
    n = len(eb)
    split = (eb.action == ACTION_SEGMENTED) & ~whole
    w.begin(pb.linktype[s], pb.if_id[s], snap)
    if not w.pcapng:
        snap = w.snaplen  # the pcap header's, from the first batch
    off = rb.off[s].astype(np.int64)
    cap_in = pb.caplen[s].astype(np.int64)
    hbh = split & (pb.bigtcp[s] == BIGTCP_HBH_JUMBO)
    l3 = pb.l3_off[s].astype(np.int64)
    hdr_in = pb.l4_off[s].astype(np.int64) + pb.tcp_hdr_len[s].astype(np.int64)
    hdr_out = hdr_in - 8 * hbh
    # payload offset of each segment inside the super-packet: sum of the earlier segments' payloads
    pay = eb.payload_len.astype(np.int64)
    grp_start = np.cumsum(pay) - pay
    first_row = np.flatnonzero(eb.out_index == 0)
    base = np.repeat(grp_start[first_row], np.diff(np.r_[first_row, n]))
    p0 = grp_start - base
    room = np.maximum(0, np.minimum(snap, eb.frame_len.astype(np.int64)) - hdr_out)
    avail = np.clip(cap_in - hdr_in - p0, 0, None)
    take = np.minimum(np.minimum(avail, pay), room)
    caplen = np.where(split, hdr_out + take, cap_in)
    wirelen = np.where(split, eb.frame_len.astype(np.int64), pb.wirelen[s].astype(np.int64))
    # timestamps: spread the segments of one super-packet up to the next input frame
    ts_in = pb.ts_ns.astype(np.int64)
    last = ts_in[-1] + STEP_NS * 65536 if next_ts is None or next_ts < ts_in[-1] else next_ts
    nxt = np.r_[ts_in[1:], last] if len(ts_in) else ts_in
    n_out = np.bincount(s, minlength=len(pb))
    step = np.minimum(STEP_NS, (nxt - ts_in) // np.maximum(n_out, 1))
    ts = ts_in[s] + eb.out_index.astype(np.int64) * np.maximum(step[s], 0)
    # pieces: passed rows one (whole record); split rows: [head (up to the HBH)], [rest of the headers], payload
    a_len = np.where(split, np.where(hbh, l3 + 40, hdr_in), cap_in)
    b_src = off + l3 + 48
    b_len = np.where(hbh, hdr_in - l3 - 48, 0)
    c_src = off + hdr_in + p0
    c_len = np.where(split, take, 0)
    fields = {"l3_len": eb.l3_len, "ip_id": eb.ip_id, "seq": eb.seq, "flags": eb.tcp_flags, "frame_len": eb.frame_len,
              "v4": pb.ip_version[s] == 4, "thl": pb.tcp_hdr_len[s]}
    for a in range(0, n, CHUNK):  # bounded memory: the gather index is one int64 per output byte
        b = min(n, a + CHUNK)
        rows = np.arange(b - a)
        prow = np.concatenate([rows, rows, rows])
        psrc = np.concatenate([off[a:b], b_src[a:b], c_src[a:b]])
        plen = np.concatenate([a_len[a:b], b_len[a:b], c_len[a:b]])
        order = np.argsort(prow, kind="stable")
        out, data = w.records(rb.buf, (prow[order], psrc[order], plen[order]), caplen[a:b], wirelen[a:b], ts[a:b],
                              pb.if_id[s[a:b]], pb.linktype[s[a:b]])
        _patch(out, data, split[a:b], hbh[a:b], rb.buf, off[a:b], l3[a:b], hdr_out[a:b], caplen[a:b],
               {k: v[a:b] for k, v in fields.items()})
        w.write(out)
    return int((split & (eb.out_index == 0)).sum()), int(split.sum()), n


def _patch(out, data, split, hbh, buf, off, l3, hdr_out, caplen, f: dict) -> None:
    """Fix the headers of the segments in place (G6-G9) and their checksums."""
    r = np.flatnonzero(split)
    if r.size == 0:
        return
    d, l3r = data[r], l3[r]
    v4 = f["v4"][r]
    l3_len = f["l3_len"][r].astype(np.int64)
    # IPv6: payload length, and the next header that the removed HBH named
    r6, r4 = ~v4, v4
    _put16(out, (d + l3r + 4)[r6], l3_len[r6] - 40)
    h = r6 & hbh[r]
    out[(d + l3r + 6)[h]] = buf[(off[r] + l3r + 40)[h]]
    # IPv4: total length, ID, header checksum
    at = (d + l3r)[r4]
    _put16(out, at + 2, l3_len[r4])
    _put16(out, at + 4, f["ip_id"][r][r4].astype(np.int64))
    ihl = (out[at].astype(np.int64) & 0xF) * 4
    out[at + 10] = 0
    out[at + 11] = 0
    _put16(out, at + 10, _fold(_sum16(out, at, ihl)))
    # TCP: seq, flags (AE in byte 12 bit 0, the rest in byte 13)
    t = d + hdr_out[r] - f["thl"][r].astype(np.int64)
    _put32(out, t + 4, f["seq"][r].astype(np.int64))
    fl = f["flags"][r].astype(np.int64)
    out[t + 13] = fl & 0xFF
    out[t + 12] = (out[t + 12] & 0xFE) | ((fl >> 8) & 1)
    # TCP checksum, only for segments captured whole (else the payload is unknown)
    frame_len = f["frame_len"][r].astype(np.int64)
    whole = caplen[r] == frame_len
    if whole.any():
        tw, dw, l3w, v4w = t[whole], d[whole], l3r[whole], v4[whole]
        tcp_len = frame_len[whole] - (tw - dw)
        out[tw + 16] = 0
        out[tw + 17] = 0
        ssum = _sum16(out, tw, tcp_len)
        a_len = np.where(v4w, 4, 16)
        a_off = np.where(v4w, 12, 8)
        ps = _sum16(out, dw + l3w + a_off, 2 * a_len) + 6 + tcp_len
        _put16(out, tw + 16, _fold(ssum + ps))
