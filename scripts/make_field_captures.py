#!/usr/bin/env python3
"""Many-flows captures shaped like the ones users bring: short TCP connections, mixed IPv4/IPv6, some BIG TCP.

    .venv/bin/python scripts/make_field_captures.py OUT.pcap [--packets 2000000] [--alive 2000] [--gap-us 20000]
                                                    [--big-every 16] [--v6-every 4] [--seed 1]

Every connection is both directions of one short TCP exchange: SYN, SYN-ACK, ACK, a request, then the server's
response as pairs of data segments each followed by the client's ACK, and the end: FIN both ways and a last
ACK, or (1 connection in 8) a client RST. One connection in ``--big-every`` is BIG TCP: its response segments
are super-packets of 16-64 MSS (IPv6 with a Hop-by-Hop Jumbo Payload option and payload_len 0, IPv4 with
tot_len 0), as a receiver's tcpdump shows them. One connection in ``--v6-every`` is IPv6. About ``--alive``
connections are open at any moment (Little's law: connection arrival rate = alive / mean duration; packets of
a connection are ``--gap-us`` apart on average), so the packet rate is about alive / gap.

Frames are headers only (snaplen 96, like ``tcpdump -s 96``); the pcap has nanosecond timestamps. The capture
is built and written in chunks of connections with numpy (no per-packet Python): memory is bounded by the
connections open across a chunk boundary, and 20 M packets take well under a minute.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

import numpy as np

SNAP = 96
REC = 16 + SNAP  # pcap record header + the longest frame prefix we write
MSS = 1448
# roles of a packet within its connection
SYN, SYNACK, ACK3, REQ, DATA, DACK, FIN_S, FIN_C, LAST, RST = range(10)
SERVER_SENDS = np.array([0, 1, 0, 0, 1, 0, 1, 0, 1, 0], bool)
FLAGS = np.array([0x02, 0x12, 0x10, 0x18, 0x10, 0x10, 0x11, 0x11, 0x10, 0x14], np.uint8)


def _connections(rng: np.random.Generator, first: int, n: int, args) -> dict:
    """Static facts of connections first .. first+n-1."""
    cid = np.arange(first, first + n, dtype=np.int64)
    pairs = rng.integers(1, 9, n)  # response: 2..16 data segments, each pair followed by one ACK
    return {
        "cid": cid,
        "v6": (cid % args.v6_every) == 1,
        "big": (cid % args.big_every) == 3,
        "rst": rng.random(n) < 0.125,
        "pairs": pairs,
        "req": rng.integers(60, 900, n),
        "bigsegs": rng.integers(16, 65, n),
        "isn_c": rng.integers(0, 2**32, n, dtype=np.uint64),
        "isn_s": rng.integers(0, 2**32, n, dtype=np.uint64),
        "cport": (1024 + (cid * 7919) % 64000).astype(np.uint16),
        "sport": np.array([443, 80, 5201, 8080], np.uint16)[rng.integers(0, 4, n)],
        "caddr": cid // 64000,  # the client address changes every 64000 connections: 5-tuples stay unique
        "saddr": rng.integers(0, 4096, n),
    }


def _packets(c: dict, start: np.ndarray, rng: np.random.Generator, gap_ns: float) -> dict:
    """Per-packet columns of the connections ``c`` (start times ``start``), in connection order."""
    pairs = c["pairs"]
    tail = np.where(c["rst"], 1, 3)
    npk = 4 + 3 * pairs + tail
    conn = np.repeat(np.arange(pairs.shape[0]), npk)
    pos = np.arange(conn.shape[0]) - np.repeat(np.cumsum(npk) - npk, npk)
    body = 4 + 3 * pairs[conn]
    q = pos - 4
    role = np.full(conn.shape[0], SYN, np.int64)
    role[pos == 1] = SYNACK
    role[pos == 2] = ACK3
    role[pos == 3] = REQ
    inbody = (pos >= 4) & (pos < body)
    role[inbody] = np.where(q[inbody] % 3 == 2, DACK, DATA)
    end = pos - body
    rst = c["rst"][conn]
    role[(end == 0) & rst] = RST
    role[(end == 0) & ~rst] = FIN_S
    role[end == 1] = FIN_C
    role[end == 2] = LAST
    big = c["big"][conn]
    seglen = np.where(big, MSS * c["bigsegs"][conn], MSS)
    # data segments sent by the server before this packet (for its seq and the client's ack)
    sent = np.where(inbody, q - q // 3, 0)
    sent = np.where(pos >= body, 2 * pairs[conn], sent)
    req = c["req"][conn]
    isn_c, isn_s = c["isn_c"][conn], c["isn_s"][conn]
    srv = SERVER_SENDS[role]
    plen = np.zeros(conn.shape[0], np.int64)
    plen[role == REQ] = req[role == REQ]
    plen[role == DATA] = seglen[role == DATA]
    # next sequence number each side has used before this packet (SYN and FIN count one)
    c_off = np.where(role == SYN, 0, np.where((role == ACK3) | (role == REQ) | (role == SYNACK), 1, 1 + req))
    c_off = c_off + (role == LAST)  # the client's FIN came before the server's last ACK
    s_off = np.where(role == SYNACK, 0, 1 + sent * seglen) + ((role == FIN_C) | (role == LAST))
    c_seq = (isn_c + c_off.astype(np.uint64)) & np.uint64(0xFFFFFFFF)
    s_seq = (isn_s + s_off.astype(np.uint64)) & np.uint64(0xFFFFFFFF)
    # a server packet acks the client's next seq, a client packet the server's (SYN: no ack)
    seq = np.where(srv, s_seq, c_seq)
    ack = np.where(srv, c_seq, s_seq)
    ack = np.where(role == SYN, np.uint64(0), ack)
    seq &= np.uint64(0xFFFFFFFF)
    ack &= np.uint64(0xFFFFFFFF)
    # timestamps: exponential gaps within the connection
    gaps = rng.exponential(gap_ns, conn.shape[0])
    gaps[pos == 0] = 0
    cs = np.cumsum(gaps)
    base = np.repeat(cs[np.cumsum(npk) - npk], npk)
    ts = start[conn] + (cs - base).astype(np.int64)
    return {"conn": conn, "role": role, "ts": ts, "srv": srv, "plen": plen, "seq": seq.astype(np.uint32),
            "ack": ack.astype(np.uint32), "v6": c["v6"][conn], "big": big & (role == DATA),
            "cport": c["cport"][conn], "sport": c["sport"][conn], "caddr": c["caddr"][conn],
            "saddr": c["saddr"][conn], "cid": c["cid"][conn]}


def _frames(p: dict) -> tuple[np.ndarray, np.ndarray]:
    """pcap records (header + up to SNAP frame bytes) as an (n, REC) uint8 array and each record's length."""
    n = p["ts"].shape[0]
    rec = np.zeros((n, REC), np.uint8)
    v6, big, srv, role = p["v6"], p["big"], p["srv"], p["role"]
    syn = (role == SYN) | (role == SYNACK)
    thl = np.where(syn, 24, 20)
    hbh = v6 & big
    l3h = np.where(v6, 40 + 8 * hbh, 20)
    l4 = 14 + l3h
    wire = l4 + thl + p["plen"]
    cap = np.minimum(wire, SNAP)
    ts = p["ts"]
    hdr = np.stack([ts // 1_000_000_000, ts % 1_000_000_000, cap, wire], axis=1).astype("<u4")
    rec[:, :16] = hdr.view(np.uint8).reshape(n, 16)
    f = rec[:, 16:]
    # Ethernet: two fixed MACs, swapped by direction
    f[:, 0:6] = np.where(srv[:, None], [2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
    f[:, 6:12] = np.where(srv[:, None], [2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1])
    f[:, 12] = np.where(v6, 0x86, 0x08)
    f[:, 13] = np.where(v6, 0xDD, 0x00)

    def put16(off, mask, val):
        rows = np.nonzero(mask)[0]
        o = off[rows] if isinstance(off, np.ndarray) else off
        f[rows, o] = (val[rows] >> 8) & 0xFF
        f[rows, o + 1] = val[rows] & 0xFF

    def put32(off, mask, val):
        rows = np.nonzero(mask)[0]
        o = off[rows] if isinstance(off, np.ndarray) else off
        v = val[rows].astype(np.uint64)
        for k in range(4):
            f[rows, o + k] = (v >> np.uint64(24 - 8 * k)) & np.uint64(0xFF)

    # client address: 10.(caddr).x / fd00::caddr; server: 192.0.2.x-ish / 2001:db8::saddr (documentation ranges)
    cli_a = p["caddr"] & 0xFFFF
    srv_a = p["saddr"]
    v4 = ~v6
    r4 = np.nonzero(v4)[0]
    f[r4, 14] = 0x45
    tot = np.where(big, 0, 20 + thl + p["plen"])
    put16(16, v4, tot)
    put16(18, v4, (p["cid"] * 3 + role) & 0xFFFF)
    f[r4, 20] = 0x40  # DF
    f[r4, 22] = 64
    f[r4, 23] = 6
    a_cli = np.stack([np.full(n, 10), np.full(n, 1), (cli_a >> 8) & 0xFF, cli_a & 0xFF], 1).astype(np.uint8)
    a_srv = np.stack([np.full(n, 198), np.full(n, 18), (srv_a >> 8) & 0xFF, srv_a & 0xFF], 1).astype(np.uint8)
    s4 = np.where(srv[:, None], a_srv, a_cli)
    d4 = np.where(srv[:, None], a_cli, a_srv)
    f[r4, 26:30] = s4[r4]
    f[r4, 30:34] = d4[r4]
    r6 = np.nonzero(v6)[0]
    f[r6, 14] = 0x60
    put16(18, v6, np.where(hbh, 0, thl + p["plen"]))
    f[r6, 20] = np.where(hbh[r6], 0, 6)
    f[r6, 21] = 64
    b_cli = np.zeros((n, 16), np.uint8)
    b_cli[:, 0], b_cli[:, 1] = 0xFD, 0x00
    b_cli[:, 14], b_cli[:, 15] = (cli_a >> 8) & 0xFF, cli_a & 0xFF
    b_cli[:, 13] = (p["caddr"] >> 16) & 0xFF
    b_srv = np.zeros((n, 16), np.uint8)
    b_srv[:, 0:4] = [0x20, 0x01, 0x0D, 0xB8]
    b_srv[:, 14], b_srv[:, 15] = (srv_a >> 8) & 0xFF, srv_a & 0xFF
    f[r6, 22:38] = np.where(srv[r6, None], b_srv[r6], b_cli[r6])
    f[r6, 38:54] = np.where(srv[r6, None], b_cli[r6], b_srv[r6])
    rh = np.nonzero(hbh)[0]
    f[rh, 54] = 6  # HBH: next header TCP, length 0, Jumbo Payload option (type 0xC2, length 4)
    f[rh, 56] = 0xC2
    f[rh, 57] = 4
    put32(58, hbh, 8 + thl + p["plen"])
    # TCP
    sp = np.where(srv, p["sport"], p["cport"]).astype(np.int64)
    dp = np.where(srv, p["cport"], p["sport"]).astype(np.int64)
    allr = np.ones(n, bool)
    put16(l4, allr, sp)
    put16(l4 + 2, allr, dp)
    put32(l4 + 4, allr, p["seq"])
    put32(l4 + 8, allr, p["ack"])
    rows = np.arange(n)
    f[rows, l4 + 12] = (thl // 4) << 4
    f[rows, l4 + 13] = FLAGS[role]
    put16(l4 + 14, allr, np.full(n, 64240, np.int64))
    rs = np.nonzero(syn)[0]
    f[rs, l4[rs] + 20] = 2  # MSS option
    f[rs, l4[rs] + 21] = 4
    put16(l4 + 22, syn, np.where(v6, 1440, 1460))
    return rec, 16 + cap


def generate(out: Path, packets: int, args) -> int:
    """Write ``out`` (pcap, ns timestamps) with at least ``packets`` packets; returns the packet count."""
    rng = np.random.default_rng(args.seed)
    gap_ns = args.gap_us * 1000.0
    mean_pk = 4 + 3 * 4.5 + 2.75
    rate = args.alive / (mean_pk * gap_ns)  # connections per ns
    chunk = 20000
    written = 0
    first = 0
    t_next = 1_700_000_000 * 10**9
    carry: dict | None = None
    with open(out, "wb") as fo:
        fo.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, SNAP, 1))
        while written < packets:
            c = _connections(rng, first, chunk, args)
            first += chunk
            start = t_next + np.cumsum(rng.exponential(1 / rate, chunk)).astype(np.int64)
            t_next = int(start[-1])
            p = _packets(c, start, rng, gap_ns)
            if carry is not None:
                p = {k: np.concatenate([carry[k], p[k]]) for k in p}
            order = np.argsort(p["ts"], kind="stable")
            ts = p["ts"][order]
            cut = np.searchsorted(ts, t_next)  # later chunks start at or after t_next
            now, later = order[:cut], order[cut:]
            carry = {k: v[later] for k, v in p.items()}
            take = now[: max(0, packets - written)] if written + now.shape[0] > packets else now
            written += _write(fo, {k: v[take] for k, v in p.items()})
    return written


def _write(fo, p: dict) -> int:
    rec, length = _frames(p)
    keep = np.arange(REC)[None, :] < length[:, None]
    fo.write(rec[keep].tobytes())
    return rec.shape[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--packets", type=int, default=2_000_000)
    ap.add_argument("--alive", type=int, default=2000, help="connections open at once (about)")
    ap.add_argument("--gap-us", type=float, default=20000.0, help="mean gap between a connection's packets")
    ap.add_argument("--big-every", type=int, default=16, help="1 connection in N is BIG TCP")
    ap.add_argument("--v6-every", type=int, default=4, help="1 connection in N is IPv6")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    t = time.perf_counter()
    n = generate(args.out, args.packets, args)
    print(f"{args.out}: {n:,} packets, {args.out.stat().st_size / 2**20:.0f} MiB ({time.perf_counter() - t:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
