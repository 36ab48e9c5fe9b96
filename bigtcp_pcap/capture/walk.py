"""Compiled record walks over a buffer of pcap / pcapng bytes.

Each walk reads records from ``data[pos:end]`` into preallocated column arrays and stops at the first record
that is not wholly in the buffer (``NEED``, with the byte count it needs), at a fault (``BAD_*``), or, for
pcapng, at a Section Header or Interface Description block, which the Python side parses because they change
the walk's parameters. No Python object is made per record.
"""

from __future__ import annotations

import numpy as np

from .._native import njit

OK, NEED, STOP_BLOCK, BAD_CAPLEN, BAD_BLOCK_LEN, BAD_TRAILER, BAD_IF, BAD_EPB_LEN, FULL, FRAME_BLOCK = range(10)

PCAPNG_SHB, PCAPNG_IDB, PCAPNG_PB, PCAPNG_SPB, PCAPNG_EPB, PCAPNG_ISB = 0x0A0D0D0A, 1, 2, 3, 6, 5
# blocks that are no packet but that Wireshark shows as a frame of their own (frame.number counts them): the
# systemd Journal Export Block and the two Custom Blocks (copyable, not copyable)
PCAPNG_JOURNAL, PCAPNG_CB_COPY, PCAPNG_CB_NOCOPY = 9, 0x00000BAD, 0x40000BAD


# Reads use an unsigned index: numba wraps negative signed indices around, which costs a compare and select per
# byte read, and positions here are never negative.
@njit(cache=True, inline="always")
def rd16(d, p, be):
    u = np.uint64(p)
    a, b = np.uint32(d[u]), np.uint32(d[u + np.uint64(1)])
    if be:
        return (a << 8) | b
    return (b << 8) | a


@njit(cache=True, inline="always")
def rd32(d, p, be):
    u = np.uint64(p)
    a, b = np.uint32(d[u]), np.uint32(d[u + np.uint64(1)])
    c, e = np.uint32(d[u + np.uint64(2)]), np.uint32(d[u + np.uint64(3)])
    if be:
        return (a << 24) | (b << 16) | (c << 8) | e
    return (e << 24) | (c << 16) | (b << 8) | a


@njit(cache=True, entry=True,
      sig="u8[::1], i64, i64, bool, i64, i64, i64[::1], u32[::1], u32[::1], i64[::1], i64[::1]")
def walk_pcap(data, pos, end, be, ts_mul, max_caplen, off, caplen, wirelen, ts_ns, rec_pos):
    """Classic pcap records. ts_mul is 1000 for microsecond files and 1 for nanosecond files.

    Returns (n, pos, status, need): records read, where the next record starts, why it stopped, and (NEED)
    how many bytes from pos the next record occupies.
    """
    n = 0
    cap = off.shape[0]
    while True:
        if n == cap:
            return n, pos, FULL, 0
        if pos + 16 > end:
            return n, pos, NEED, 16
        sec = np.int64(rd32(data, pos, be))
        frac = np.int64(rd32(data, pos + 4, be))
        incl = rd32(data, pos + 8, be)
        orig = rd32(data, pos + 12, be)
        if incl > max_caplen:
            return n, pos, BAD_CAPLEN, np.int64(incl)
        if pos + 16 + np.int64(incl) > end:
            return n, pos, NEED, 16 + np.int64(incl)
        off[n] = pos + 16
        caplen[n] = incl
        wirelen[n] = orig
        ts_ns[n] = sec * 1_000_000_000 + frac * ts_mul
        rec_pos[n] = pos
        n += 1
        pos += 16 + np.int64(incl)


TS_UNKNOWN = np.int64(-(1 << 63))  # a timestamp that does not fit int64 nanoseconds since 1970 (years 1677-2262)
_I64_MAX = np.uint64((1 << 63) - 1)
_U64_MAX = np.uint64((1 << 64) - 1)
_OFF_S_MAX = np.int64(9_223_372_036)  # |if_tsoffset| beyond this many seconds cannot be int64 nanoseconds
EPB_FLAGS = 2  # the epb_flags option code (pcapng section 4.3.1)
# stats[] slots a pcapng walk adds to (the caller keeps them across calls)
STAT_UNDEF_IF, STAT_UNDEF_IF_OFF, STAT_UNDEF_IF_ID = 0, 1, 2


@njit(cache=True)
def _ts_to_ns(units, mul, div, shift, off_s):
    """units * mul / div (+ off_s seconds) in int64 ns without overflow; TS_UNKNOWN when it does not fit.

    div == 0 stands for 2**64 (a binary resolution finer than 2**-64 s); shift drops low bits of the fraction
    first so that ``frac * mul`` fits 64 bits (a binary resolution finer than 2**-34 s; below 1 ns either way).
    """
    u = np.uint64(units)
    if div == 0:  # 2**64: every units value is a fraction of a second; div >> shift is 2**34 (ts_resolution)
        whole = np.uint64(0)
        frac = u
        dd = np.uint64(1) << np.uint64(34)
    else:
        whole = u // div
        frac = u % div
        dd = div >> shift
    frac_ns = ((frac >> shift) * mul) // dd
    if mul != 0 and whole > (_U64_MAX - frac_ns) // mul:
        return TS_UNKNOWN
    base = whole * mul + frac_ns  # uint64: a negative offset may still bring it into range
    if off_s > _OFF_S_MAX or off_s < -_OFF_S_MAX:
        return TS_UNKNOWN
    if off_s >= 0:
        off_ns = np.uint64(off_s) * np.uint64(1_000_000_000)
        if base > _I64_MAX - off_ns:
            return TS_UNKNOWN
        return np.int64(base + off_ns)
    neg = np.uint64(-off_s) * np.uint64(1_000_000_000)
    if base >= neg:
        if base - neg > _I64_MAX:
            return TS_UNKNOWN
        return np.int64(base - neg)
    return -np.int64(neg - base)


@njit(cache=True)
def _epb_flags(data, opt, oend, be):
    """The epb_flags option value in the EPB options data[opt:oend], 0 when absent."""
    while opt + 4 <= oend:
        code = rd16(data, opt, be)
        olen = np.int64(rd16(data, opt + 2, be))
        if code == 0:
            return np.uint32(0)
        if code == EPB_FLAGS and olen >= 4 and opt + 8 <= oend:
            return rd32(data, opt + 4, be)
        opt += 4 + ((olen + 3) & ~np.int64(3))
    return np.uint32(0)


@njit(cache=True, entry=True,
      sig=("u8[::1], i64, i64, bool, u16[::1], i64[::1], u64[::1], u64[::1], u64[::1], i64[::1], i64, i64, "
          "i64[::1], u32[::1], u32[::1], i64[::1], i64[::1], u16[::1], u32[::1], u32[::1], i64[::1]"))
def walk_pcapng(data, pos, end, be, if_linktype, if_snaplen, if_mul, if_div, if_shift, if_off_s, n_if, max_caplen,
                off, caplen, wirelen, ts_ns, rec_pos, linktype, if_id, flags, stats):
    """pcapng packet blocks (EPB, SPB, obsolete PB); other unknown blocks are skipped.

    Stops with STOP_BLOCK at an SHB, IDB or ISB (the caller parses it and calls again), and with FRAME_BLOCK past a
    block Wireshark numbers as a frame though it holds no packet (journal export, custom blocks). Returns like walk_pcap.
    A caplen above the interface's snaplen is read whole (as Wireshark does; the caller notes it); only one
    above ``max_caplen`` is corrupt. A packet block naming an interface no IDB defined is skipped and counted
    in ``stats`` (one interface's problem does not stop the others). ``flags`` gets each EPB's epb_flags.
    """
    n = 0
    cap = off.shape[0]
    while True:
        if n == cap:
            return n, pos, FULL, 0
        if pos + 12 > end:
            return n, pos, NEED, 12
        btype = rd32(data, pos, be)
        if btype == PCAPNG_SHB:
            return n, pos, STOP_BLOCK, 0
        blen = np.int64(rd32(data, pos + 4, be))
        if blen < 12 or blen % 4 != 0:
            return n, pos, BAD_BLOCK_LEN, blen
        if btype == PCAPNG_IDB or btype == PCAPNG_ISB:
            return n, pos, STOP_BLOCK, blen
        if pos + blen > end:
            return n, pos, NEED, blen
        if np.int64(rd32(data, pos + blen - 4, be)) != blen:
            return n, pos, BAD_TRAILER, blen
        if btype == PCAPNG_JOURNAL or btype == PCAPNG_CB_COPY or btype == PCAPNG_CB_NOCOPY:
            return n, pos + blen, FRAME_BLOCK, 0  # (the caller numbers it as a frame, after the n packets)
        if btype == PCAPNG_EPB or btype == PCAPNG_PB:
            if blen < 32:
                return n, pos, BAD_EPB_LEN, blen
            if btype == PCAPNG_EPB:
                iid = np.int64(rd32(data, pos + 8, be))
            else:
                iid = np.int64(rd16(data, pos + 8, be))
            incl = rd32(data, pos + 20, be)
            if incl > max_caplen:
                return n, pos, BAD_CAPLEN, np.int64(incl)
            if 28 + np.int64(incl) + 4 > blen:
                return n, pos, BAD_EPB_LEN, blen
            if iid >= n_if:
                if stats[STAT_UNDEF_IF] == 0:
                    stats[STAT_UNDEF_IF_OFF] = pos
                    stats[STAT_UNDEF_IF_ID] = iid
                stats[STAT_UNDEF_IF] += 1
                pos += blen
                continue
            tsh = np.uint64(rd32(data, pos + 12, be))
            tsl = np.uint64(rd32(data, pos + 16, be))
            orig = rd32(data, pos + 24, be)
            off[n] = pos + 28
            caplen[n] = incl
            wirelen[n] = orig
            ts_ns[n] = _ts_to_ns((tsh << np.uint64(32)) | tsl, if_mul[iid], if_div[iid], if_shift[iid],
                                 if_off_s[iid])
            rec_pos[n] = pos
            linktype[n] = if_linktype[iid]
            if_id[n] = iid
            if btype == PCAPNG_EPB:
                flags[n] = _epb_flags(data, pos + 28 + ((np.int64(incl) + 3) & ~np.int64(3)), pos + blen - 4, be)
            else:
                flags[n] = 0
            n += 1
        elif btype == PCAPNG_SPB:
            if n_if < 1:
                if stats[STAT_UNDEF_IF] == 0:
                    stats[STAT_UNDEF_IF_OFF] = pos
                    stats[STAT_UNDEF_IF_ID] = 0
                stats[STAT_UNDEF_IF] += 1
                pos += blen
                continue
            orig = rd32(data, pos + 8, be)
            incl = np.int64(orig)
            room = blen - 16
            incl = min(incl, room)
            if if_snaplen[0] > 0 and incl > if_snaplen[0]:
                incl = np.int64(if_snaplen[0])
            off[n] = pos + 12
            caplen[n] = incl
            wirelen[n] = orig
            ts_ns[n] = 0
            rec_pos[n] = pos
            linktype[n] = if_linktype[0]
            if_id[n] = 0
            flags[n] = 0
            n += 1
        pos += blen
