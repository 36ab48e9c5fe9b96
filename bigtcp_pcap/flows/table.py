"""The flow table: one row per TCP flow direction, updated batch by batch.

State grows with the number of flows, never with the number of packets: per flow a few counters, a histogram of
payload lengths (lengths cluster at the MSS, so these stay small) and at most ``MAX_HOLES`` open sequence
holes. The sequence bookkeeping (retransmissions, out-of-order, capture gaps) is a compiled loop over the batch.
"""

from __future__ import annotations

import ipaddress
from collections import Counter

import numpy as np

from .._native import njit
from ..decode.schema import BIGTCP_NONE, ST_TRUNC_L4, TH_FIN, TH_SYN, PacketBatch

MAX_HOLES = 16


@njit(cache=True)
def _unwrap(seq, ref):
    """64-bit sequence position of a 32-bit seq nearest to the 64-bit reference ``ref``."""
    d = np.int64(np.int32(np.uint32((np.int64(seq) - ref) & 0xFFFFFFFF)))
    return ref + d


@njit(cache=True, entry=True)
def seq_kernel(fid, seq, plen, flags, valid, inited, max_end, holes, nholes, gap_total, retrans, ooo):
    """Track each flow's highest sequence end and its holes; count retransmissions and out-of-order data."""
    for i in range(fid.shape[0]):
        f = fid[i]
        if f < 0 or not valid[i]:
            continue
        ln = np.int64(plen[i])
        if flags[i] & TH_SYN:
            ln += 1
        if flags[i] & TH_FIN:
            ln += 1
        if not inited[f]:
            inited[f] = True
            max_end[f] = np.int64(seq[i]) + ln
            continue
        if ln == 0:
            continue
        s = _unwrap(seq[i], max_end[f])
        e = s + ln
        if s > max_end[f]:
            # a hole: sequence space the capture has not shown (yet)
            k = nholes[f]
            if k == MAX_HOLES:  # forget the oldest hole; it stays counted as a gap
                for j in range(MAX_HOLES - 1):
                    holes[f, j, 0] = holes[f, j + 1, 0]
                    holes[f, j, 1] = holes[f, j + 1, 1]
                k -= 1
            holes[f, k, 0] = max_end[f]
            holes[f, k, 1] = s
            nholes[f] = k + 1
            gap_total[f] += s - max_end[f]
            max_end[f] = e
        elif e <= max_end[f] or s < max_end[f]:
            filled = np.int64(0)
            j = 0
            while j < nholes[f]:
                hs = holes[f, j, 0]
                he = holes[f, j, 1]
                a = max(hs, s)
                b = min(he, e)
                if a < b:
                    filled += b - a
                    # shrink or split the hole
                    if a == hs and b == he:
                        for m in range(j, nholes[f] - 1):
                            holes[f, m, 0] = holes[f, m + 1, 0]
                            holes[f, m, 1] = holes[f, m + 1, 1]
                        nholes[f] -= 1
                        continue
                    elif a == hs:
                        holes[f, j, 0] = b
                    elif b == he:
                        holes[f, j, 1] = a
                    elif nholes[f] < MAX_HOLES:
                        for m in range(nholes[f], j + 1, -1):
                            holes[f, m, 0] = holes[f, m - 1, 0]
                            holes[f, m, 1] = holes[f, m - 1, 1]
                        holes[f, j, 1] = a
                        holes[f, j + 1, 0] = b
                        holes[f, j + 1, 1] = he
                        nholes[f] += 1
                        j += 1
                j += 1
            gap_total[f] -= filled
            if filled > 0:
                ooo[f] += 1
            else:
                retrans[f] += 1
            max_end[f] = max(max_end[f], e)
        else:
            max_end[f] = e


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def _mix(h, x):
    h = (h ^ x) * _M1
    h ^= h >> np.uint64(31)
    h *= _M2
    return h ^ (h >> np.uint64(29))


@njit(cache=True, entry=True)
def assign_kernel(ver, src, dst, sport, dport, mask, start, tab_d, tab_id, st, fid, new_rows):
    """flow_id of each ``mask`` row from ``start`` on (-1 elsewhere), by a 64-bit digest of (version, src, dst,
    sport, dport) in an open-addressing table (``tab_d`` digests, ``tab_id`` ids, -1 empty; a power of 2 kept at
    most half full). ``src``/``dst`` are the address columns viewed as two uint64 words per row. A digest not seen
    before gets the next id (st[0]) and its row goes to ``new_rows`` (st[1] of them). Returns the row where it
    stopped: len(mask) when done, less when the table must grow first."""
    n = mask.shape[0]
    size = tab_d.shape[0]
    nflows = st[0]
    nnew = st[1]
    pw = np.uint64(0)
    ps0 = ps1 = pd0 = pd1 = np.uint64(0)
    prev_id = -1
    for i in range(start, n):
        if not mask[i]:
            fid[i] = -1
            continue
        w = (np.uint64(ver[i]) << np.uint64(32)) | (np.uint64(sport[i]) << np.uint64(16)) | np.uint64(dport[i])
        s0, s1, d0, d1 = src[i, 0], src[i, 1], dst[i, 0], dst[i, 1]
        if prev_id >= 0 and w == pw and s0 == ps0 and s1 == ps1 and d0 == pd0 and d1 == pd1:
            fid[i] = prev_id  # bursts of one flow skip the digest and the table
            continue
        h = _mix(_mix(_mix(_mix(_mix(np.uint64(0x6A09E667F3BCC908), w), s0), s1), d0), d1)
        j = np.int64(h & np.uint64(size - 1))
        while True:
            g = tab_id[j]
            if g < 0:
                if 2 * (nflows + 1) > size:
                    st[0] = nflows
                    st[1] = nnew
                    return i
                g = nflows
                nflows += 1
                tab_id[j] = g
                tab_d[j] = h
                new_rows[nnew] = i
                nnew += 1
                break
            if tab_d[j] == h:
                break
            j = (j + 1) & (size - 1)
        fid[i] = g
        prev_id = g
        pw, ps0, ps1, pd0, pd1 = w, s0, s1, d0, d1
    st[0] = nflows
    st[1] = nnew
    return n


@njit(cache=True, entry=True)
def rehash_kernel(old_d, old_id, tab_d, tab_id):
    """Insert the occupied slots of (old_d, old_id) into the empty, larger table (tab_d, tab_id)."""
    size = tab_d.shape[0]
    for k in range(old_d.shape[0]):
        if old_id[k] < 0:
            continue
        h = old_d[k]
        j = np.int64(h & np.uint64(size - 1))
        while tab_id[j] >= 0:
            j = (j + 1) & (size - 1)
        tab_d[j] = h
        tab_id[j] = old_id[k]


@njit(cache=True, entry=True)
def counters_kernel(fid, plen, wirelen, bigtcp, ts, frame, flags, mss, packets, payload, wire, big, maxp,
                    first_frame, ts_first, ts_last, mss_out):
    """Per-flow packet/byte counters, first/last sighting and the SYN's MSS option, in one pass."""
    for i in range(fid.shape[0]):
        f = fid[i]
        if f < 0:
            continue
        if packets[f] == 0:
            first_frame[f] = frame[i]
            ts_first[f] = ts[i]
        packets[f] += 1
        pl = np.int64(plen[i])
        payload[f] += pl
        wire[f] += wirelen[i]
        if bigtcp[i] != BIGTCP_NONE:
            big[f] += 1
        maxp[f] = max(maxp[f], pl)
        ts_last[f] = ts[i]
        if (flags[i] & TH_SYN) and mss[i] > 0:
            mss_out[f] = mss[i]


class FlowTable:
    """Assigns ``flow_id`` to TCP packets and accumulates per-flow columns."""

    def __init__(self) -> None:
        self._tab_d = np.zeros(1024, np.uint64)  # 64-bit flow digest per slot (open addressing)
        self._tab_id = np.full(1024, -1, np.int64)  # its flow_id, -1 for an empty slot
        self._key_text: dict[int, tuple[str, str, int, int, int]] = {}
        self.keys: list[bytes] = []
        self._cap = 0
        self._alloc(1024)
        self.hist: list[Counter] = []  # observed payload lengths per flow
        self.sp_hist: list[Counter] = []  # rebuilt super-packet payload lengths per flow

    def _alloc(self, cap: int) -> None:
        old = self._cap
        def grow(a, shape_tail=(), dtype=np.int64, fill=0):
            new = np.full((cap, *shape_tail), fill, dtype)
            if old:
                new[:old] = a
            return new
        z = lambda name, **kw: grow(getattr(self, name, None), **kw)
        self.packets = z("packets")
        self.payload_bytes = z("payload_bytes")
        self.wire_bytes = z("wire_bytes")
        self.bigtcp_packets = z("bigtcp_packets")
        self.max_payload = z("max_payload")
        self.first_frame = z("first_frame")
        self.ts_first = z("ts_first")
        self.ts_last = z("ts_last")
        self.mss = z("mss")
        self.inited = z("inited", dtype=np.bool_, fill=False)
        self.max_end = z("max_end")
        self.holes = z("holes", shape_tail=(MAX_HOLES, 2))
        self.nholes = z("nholes")
        self.gap_total = z("gap_total")
        self.retrans = z("retrans")
        self.ooo = z("ooo")
        self._cap = cap

    def __len__(self) -> int:
        return len(self.keys)

    def assign(self, pb: PacketBatch) -> np.ndarray:
        """flow_id per row (int64), -1 for packets that are not TCP with readable ports. Ids are given in order
        of first appearance."""
        n = len(pb)
        fid = np.empty(n, np.int64)
        tcp = (pb.l4_proto == 6) & (pb.l4_off >= 0) & (pb.ip_version > 0) & ((pb.status & ST_TRUNC_L4) == 0)
        new_rows = np.empty(n, np.int64)
        st = np.array([len(self.keys), 0], np.int64)
        src = np.ascontiguousarray(pb.src).view(np.uint64)  # (n, 2) words
        dst = np.ascontiguousarray(pb.dst).view(np.uint64)
        i = 0
        while True:
            i = assign_kernel(pb.ip_version, src, dst, pb.sport, pb.dport, tcp, i, self._tab_d, self._tab_id, st,
                              fid, new_rows)
            if i >= n:
                break
            tab_d = np.zeros(2 * self._tab_d.shape[0], np.uint64)
            tab_id = np.full(tab_d.shape[0], -1, np.int64)
            rehash_kernel(self._tab_d, self._tab_id, tab_d, tab_id)
            self._tab_d, self._tab_id = tab_d, tab_id
        for row in new_rows[: int(st[1])].tolist():
            self.keys.append(bytes([int(pb.ip_version[row])]) + pb.src[row].tobytes() + pb.dst[row].tobytes()
                             + int(pb.sport[row]).to_bytes(2, "big") + int(pb.dport[row]).to_bytes(2, "big"))
            self.hist.append(Counter())
            self.sp_hist.append(Counter())
        if len(self.keys) > self._cap:
            self._alloc(max(len(self.keys), 2 * self._cap))
        return fid

    def update(self, pb: PacketBatch, fid: np.ndarray) -> None:
        if not (fid >= 0).any():
            return
        counters_kernel(fid, pb.tcp_payload_len, pb.wirelen, pb.bigtcp, pb.ts_ns, pb.frame, pb.tcp_flags, pb.tcp_mss,
                        self.packets, self.payload_bytes, self.wire_bytes, self.bigtcp_packets, self.max_payload,
                        self.first_frame, self.ts_first, self.ts_last, self.mss)
        self._add_hist(self.hist, np.where(pb.tcp_payload_len > 0, fid, -1), pb.tcp_payload_len)
        seq_kernel(fid, pb.tcp_seq, pb.tcp_payload_len, pb.tcp_flags, fid >= 0, self.inited, self.max_end,
                   self.holes, self.nholes, self.gap_total, self.retrans, self.ooo)

    def add_superpackets(self, flow_id: np.ndarray, payload_len: np.ndarray) -> None:
        self._add_hist(self.sp_hist, np.asarray(flow_id, np.int64), np.asarray(payload_len))

    @staticmethod
    def _add_hist(hists: list[Counter], fid: np.ndarray, lengths: np.ndarray) -> None:
        """Add (flow, length) counts to per-flow histograms: one sort per batch, one dict update per distinct pair."""
        m = fid >= 0
        if not m.any():
            return
        pairs, counts = np.unique((fid[m] << 32) | lengths[m].astype(np.int64), return_counts=True)
        for key, c in zip(pairs.tolist(), counts.tolist()):
            hists[key >> 32][key & 0xFFFFFFFF] += c

    def key(self, flow_id: int) -> tuple[str, str, int, int, int]:
        """(src, dst, sport, dport, ip_version) of a flow, addresses as text (computed once per flow)."""
        got = self._key_text.get(flow_id)
        if got is None:
            got = self._key_text[flow_id] = self._key(flow_id)
        return got

    def _key(self, flow_id: int) -> tuple[str, str, int, int, int]:
        kb = self.keys[flow_id]
        ver = kb[0]
        if ver == 4:
            src, dst = str(ipaddress.IPv4Address(kb[1:5])), str(ipaddress.IPv4Address(kb[17:21]))
        else:
            src, dst = str(ipaddress.IPv6Address(kb[1:17])), str(ipaddress.IPv6Address(kb[17:33]))
        return src, dst, int.from_bytes(kb[33:35], "big"), int.from_bytes(kb[35:37], "big"), ver

    def columns(self) -> dict[str, list]:
        """The flows table (one row per flow direction), in flow_id order."""
        n = len(self.keys)
        cols: dict[str, list] = {k: [] for k in (
            "flow_id", "ip_version", "src", "dst", "sport", "dport", "first_frame", "ts_first_ns", "ts_last_ns",
            "packets", "payload_bytes", "wire_bytes", "bigtcp_packets", "max_payload_len", "mss",
            "p50_payload_len", "p99_payload_len", "superpackets", "p50_superpacket_len", "p99_superpacket_len",
            "max_superpacket_len", "retransmissions", "out_of_order", "capture_gap_bytes")}
        for f in range(n):
            src, dst, sport, dport, ver = self.key(f)
            p50, p99, _ = _percentiles(self.hist[f])
            s50, s99, smax = _percentiles(self.sp_hist[f])
            row = {"flow_id": f, "ip_version": ver, "src": src, "dst": dst, "sport": sport, "dport": dport,
                       "first_frame": int(self.first_frame[f]), "ts_first_ns": int(self.ts_first[f]),
                       "ts_last_ns": int(self.ts_last[f]), "packets": int(self.packets[f]),
                       "payload_bytes": int(self.payload_bytes[f]), "wire_bytes": int(self.wire_bytes[f]),
                       "bigtcp_packets": int(self.bigtcp_packets[f]), "max_payload_len": int(self.max_payload[f]),
                       "mss": int(self.mss[f]) or None, "p50_payload_len": p50, "p99_payload_len": p99,
                       "superpackets": sum(self.sp_hist[f].values()), "p50_superpacket_len": s50,
                       "p99_superpacket_len": s99, "max_superpacket_len": smax,
                       "retransmissions": int(self.retrans[f]), "out_of_order": int(self.ooo[f]),
                       "capture_gap_bytes": int(self.gap_total[f])}
            for k, v in row.items():
                cols[k].append(v)
        return cols


def _percentiles(hist: Counter) -> tuple[int | None, int | None, int | None]:
    """Nearest-rank p50 and p99 and the maximum of a length histogram (None when empty)."""
    total = sum(hist.values())
    if not total:
        return None, None, None
    items = sorted(hist.items())
    out = []
    for q in (0.50, 0.99):
        rank = max(1, int(np.ceil(q * total)))
        acc = 0
        for v, c in items:
            acc += c
            if acc >= rank:
                out.append(v)
                break
    return out[0], out[1], items[-1][0]
