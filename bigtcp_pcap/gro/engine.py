"""GroEngine: the Linux GRO receive path as a sans-IO state machine (gro-spec.md R4-R21, section 3).

Feed decoded packets in capture order; get back the super-packets the receiver's GRO would have built, each
with the reason it was completed::

    eng = GroEngine(GroConfig(gro_max_size=185000))
    for batch in batches:                       # PacketBatch, in capture order
        rows = eng.feed(batch, flow_id)         # flow_id: int64 per row, -1 = not a tracked TCP flow
    rows = eng.flush()                          # end of input: complete whatever is still held

The engine keeps only what the kernel keeps: the held super-packets (bounded by buckets x MAX_GRO_SKBS per RX
queue) plus a small table per flow key (its hash, and the MSS used to recognise already aggregated input).

Structure, for a compiled port: all per-packet inputs are precomputed as flat columns (``prepare.py``),
the state of a held entry is a fixed set of integer fields (``_Held``), reasons are small integers, and the
loop in ``_run`` touches nothing else. That port is ``compiled.CompiledGroEngine`` (numba, identical rows,
the default of ``api.analyze``); this engine stays the readable reference it is tested against.

Modelling choices (gro-spec section 7):

* NAPI polls (R21, section 7.1): each RX queue's packet stream is cut into polls wherever the inter-arrival
  gap exceeds ``poll_gap_us`` and into budget chunks of ``napi_weight`` packets (every packet of the queue
  counts: non-TCP, pure ACKs, untracked flows). The end of a short poll flushes everything (R21.2); the end of
  a full-budget chunk flushes everything at HZ < 1000, else only entries of an older jiffy (R21.3/R21.4).
  With ``gro_flush_timeout_ns`` > 0 a poll that ends with entries held flushes only old entries and a timer
  poll follows after the timeout; ``napi_defer_hard_irqs`` keeps IRQs masked so that packets arriving before
  the timer are processed by the timer poll (R21.5).
  Known poll boundaries (``feed(..., poll_start=marks)``, e.g. from the kernel's napi:napi_poll tracepoint)
  replace the gap rule for that batch: a marked packet ends the running poll exactly as a gap would (the
  same napi_complete_done, R21.2) and restarts the budget count; the budget chunks and R21.5 timers stay.
* A data segment held and later completed alone (count = 1) is emitted as a row with n_segments = 1, and so
  is a payload-carrying packet delivered alone (lone PSH segment, flush-marked or R5/R9/R12 give-up): the
  receiver's stack and tcpdump see both as packets. Packets without payload never become rows.
* Already aggregated input (R2): with ``input_is_gso`` "auto" a packet whose payload exceeds the flow's MSS
  (the smaller SYN MSS option of the connection; without one, what fits ``fallback_mtu``) is a GSO skb with
  gso_size = that MSS less the packet's TCP option bytes (or the largest plain segment seen) and
  gso_segs = ceil(payload / gso_size).
* The RX queue of a flow is (flow hash >> 32) % rx_queues per capture interface, a stand-in for RSS.
* Rows with ``flow_id`` -1 are traffic the caller does not track: they count toward the NAPI budget and
  never touch GRO state (like non-TCP packets).

Not modelled (invisible in a capture or out of scope): R1 (GRO off / XDP: do not run the engine), R12 bad
checksums (``checksum_ok`` must be True), R14.8 TLS-decrypted bit, R15d page-pool mismatch, R19 tunnels
(delivered alone here), R22 fraglist GRO, R21.7 netdev_budget across NAPIs, R24 delivery timestamps (rows
carry the first and last segment's capture times).
"""

from __future__ import annotations

import numpy as np

from ..decode.schema import (
    BIGTCP_HBH_JUMBO,
    BIGTCP_NONE,
    BIGTCP_V4_TOTLEN0,
    BIGTCP_V6_PLEN0,
    TH_CWR,
    TH_FIN,
    TH_PSH,
    TH_RST,
    TH_SYN,
    TH_URG,
    PacketBatch,
)
from . import reasons as R
from .config import GRO_LEGACY_MAX_SIZE, GroConfig
from .prepare import KIND_ALONE, KIND_TCP, Prepared, prepare
from .superpacket import SOURCE_OBSERVED, SOURCE_REBUILT, SuperPacketBatch

M32 = 0xFFFFFFFF
ALONE_FLAGS = TH_URG | TH_PSH | TH_RST | TH_SYN | TH_FIN  # R16/R17: these complete p / keep a packet out
ORED_FLAGS = TH_PSH | TH_FIN  # R16: ORed into p's header on merge
IPV6_MAXPLEN = 65535
NO_LIMIT = 1 << 62


class _Held:
    """One held super-packet p (struct napi_gro_cb + the first segment's headers), integer fields only."""

    __slots__ = (
        "ack",
        "age",
        "b",
        "count",
        "dport",
        "f0",
        "f1",
        "fid",
        "fixed",
        "flags",
        "fwm",
        "gid",
        "gso",
        "hdr",
        "id0",
        "l2",
        "l3w",
        "limit",
        "mss",
        "npk",
        "nxt",
        "opt",
        "plen",
        "q",
        "seq0",
        "sport",
        "t0",
        "t1",
        "v4",
    )


class GroEngine:
    """Rebuilds GRO super-packets from pre-GRO packets; see the module docstring."""

    def __init__(self, config: GroConfig | None = None) -> None:
        cfg = config if config is not None else GroConfig()
        self.config = cfg
        self._lim6 = cfg.gro_max_size
        if cfg.ipv6_hbh and not cfg.hbh_headroom_ok:
            # R15b: without 8 bytes of headroom for the HBH, IPv6 (<= 6.19) cannot pass 64 KiB
            self._lim6 = min(self._lim6, GRO_LEGACY_MAX_SIZE)
        self._lim4 = cfg.ipv4_limit
        self._gap_ns = float(cfg.poll_gap_us) * 1000.0
        self._cwr = TH_CWR if cfg.cwr_flushes else 0
        self._gso_auto = cfg.input_is_gso is not False
        self._needs_df = cfg.fixedid_needs_df
        # per NAPI instance (RX queue; one set of rx_queues per capture interface)
        self._buckets: list[list[list[_Held]]] = []
        self._qheld: list[int] = []  # entries held in the queue's table
        self._qlast: list[int | None] = []  # arrival time of the running poll's last packet; None = idle
        self._qn: list[int] = []  # packets processed since the last poll boundary (the poll's work)
        self._qdeadline: list[int | None] = []  # R21.5 timer poll
        self._qmasked: list[bool] = []  # R21.5 IRQs kept masked (napi_defer_hard_irqs)
        self._qdefer: list[int] = []  # R21.5 defer_hard_irqs_count
        self._ensure_queues(cfg.rx_queues)
        # per flow key (gid)
        self._gid_of: dict[tuple[int, ...], int] = {}
        self._g_queue: list[int] = []
        self._g_bucket: list[int] = []
        self._g_v4: list[bool] = []
        self._g_ports: list[tuple[int, int]] = []
        self._g_dk: list[tuple[int, ...]] = []
        self._g_rdk: list[tuple[int, ...]] = []
        self._held: list[_Held | None] = []
        self._glim: list[int] = []  # largest payload a plain segment of the flow can have (R2 detection)
        self._gmax: list[int] = []  # largest plain segment payload seen
        self._syn_mss: dict[tuple[int, ...], int] = {}  # SYN MSS option per direction
        self._dk_gids: dict[tuple[int, ...], list[int]] = {}
        self._out: list[tuple] = []

    # --- public API ---------------------------------------------------------------------------------------
    def feed(self, batch: PacketBatch, flow_id: np.ndarray, poll_start: np.ndarray | None = None) -> SuperPacketBatch:
        """Process the next packets (capture order); return the rows completed meanwhile, in delivery order.

        ``poll_start`` (optional, one bool per packet): known NAPI poll boundaries, e.g. from the kernel's
        napi:napi_poll tracepoint (``polls.poll_starts_from_trace``). A marked packet begins a new poll of its
        queue: the running poll ends first (R21.2, the same napi_complete_done the gap rule applies) and the
        napi_weight budget count restarts. The gap rule is not applied to a batch given with marks."""
        flow_id = np.asarray(flow_id)
        if flow_id.shape != (len(batch),):
            raise ValueError(f"flow_id must have one entry per packet: shape {flow_id.shape}, {len(batch)} packets")
        marks = _poll_marks(poll_start, len(batch))
        if len(batch):
            prep = prepare(batch, flow_id, self.config)
            gids = self._assign_gids(batch, prep)
            self._run(batch, flow_id, prep, gids, marks)
        return self._take()

    def flush(self) -> SuperPacketBatch:
        """End of input: complete every held entry (reason end_of_capture) and reset the poll state."""
        for q in range(len(self._buckets)):
            if self._qheld[q]:
                self._flush_all(q, R.END_OF_CAPTURE)
            self._qlast[q] = None
            self._qn[q] = 0
            self._qdeadline[q] = None
            self._qmasked[q] = False
            self._qdefer[q] = 0
        return self._take()

    @property
    def held(self) -> int:
        """Number of super-packets currently held (all queues)."""
        return sum(self._qheld)

    # --- set-up helpers -----------------------------------------------------------------------------------
    def _take(self) -> SuperPacketBatch:
        rows, self._out = self._out, []
        return SuperPacketBatch.from_rows(rows)

    def _ensure_queues(self, nq: int) -> None:
        nb = self.config.gro_hash_buckets
        while len(self._buckets) < nq:
            self._buckets.append([[] for _ in range(nb)])
            self._qheld.append(0)
            self._qlast.append(None)
            self._qn.append(0)
            self._qdeadline.append(None)
            self._qmasked.append(False)
            self._qdefer.append(0)

    def _queue_rows(self, batch: PacketBatch, prep: Prepared) -> np.ndarray:
        """RX queue per packet: per capture interface, (flow hash >> 32) % rx_queues (RSS stand-in)."""
        nq = self.config.rx_queues
        return batch.if_id.astype(np.int64) * nq + ((prep.flow_hash >> np.uint64(32)) % np.uint64(nq)).astype(np.int64)

    def _assign_gids(self, b: PacketBatch, prep: Prepared) -> list[int]:
        """Global id per KIND_TCP row (-1 elsewhere), creating per-key state for new keys."""
        gids = np.full(len(b), -1, dtype=np.int64)
        if prep.key_rows.shape[0] == 0:
            return gids.tolist()
        nq = self.config.rx_queues
        nb = self.config.gro_hash_buckets
        first_keys = prep.keys[prep.key_first].tolist()
        first_rows = prep.key_rows[prep.key_first].tolist()
        ugid = np.empty(len(first_keys), dtype=np.int64)
        for j, (kt, row) in enumerate(zip(first_keys, first_rows, strict=True)):
            kt = tuple(kt)
            g = self._gid_of.get(kt)
            if g is None:
                g = len(self._held)
                self._gid_of[kt] = g
                h = int(prep.flow_hash[row])
                q = int(b.if_id[row]) * nq + (h >> 32) % nq
                self._ensure_queues(q + 1)
                self._g_queue.append(q)
                self._g_bucket.append(h % nb)  # R4: bucket = skb->hash & (GRO_HASH_BUCKETS - 1)
                v4 = int(b.ip_version[row]) == 4
                sport, dport = int(b.sport[row]), int(b.dport[row])
                self._g_v4.append(v4)
                self._g_ports.append((sport, dport))
                dk = (v4, kt[2], kt[3], kt[4], kt[5], sport, dport)
                rdk = (v4, kt[4], kt[5], kt[2], kt[3], dport, sport)
                self._g_dk.append(dk)
                self._g_rdk.append(rdk)
                self._dk_gids.setdefault(dk, []).append(g)
                self._held.append(None)
                self._gmax.append(0)
                self._glim.append(self._plain_limit(g))
            ugid[j] = g
        gids[prep.key_rows] = ugid[prep.key_inverse]
        return gids.tolist()

    def _syn_mss_of(self, g: int) -> int:
        """The connection's MSS bound from SYN options: min over both directions seen, 0 if none."""
        vals = [m for m in (self._syn_mss.get(self._g_rdk[g]), self._syn_mss.get(self._g_dk[g])) if m]
        return min(vals) if vals else 0

    def _plain_limit(self, g: int) -> int:
        """R2 detection: a payload above this cannot be one wire segment of flow g."""
        if not self._gso_auto:
            return NO_LIMIT
        m = self._syn_mss_of(g)
        if m:
            return m
        return self.config.fallback_mtu - (20 if self._g_v4[g] else 40) - 20

    def _on_syn(self, g: int, mss: int) -> None:
        """Record a SYN's MSS option and refresh the R2 limits of both directions."""
        if mss <= 0:
            return
        self._syn_mss[self._g_dk[g]] = mss
        for dk in (self._g_dk[g], self._g_rdk[g]):
            for gg in self._dk_gids.get(dk, ()):
                self._glim[gg] = self._plain_limit(gg)

    def _gso_size(self, g: int, tcp_hdr_len: int) -> int:
        """R2/R14.6: gso_size of an aggregated input: the SYN MSS less option bytes, else the largest segment."""
        m = self._syn_mss_of(g)
        if m:
            return max(1, m - (tcp_hdr_len - 20))
        if self._gmax[g]:
            return self._gmax[g]
        return max(1, self._glim[g] - (tcp_hdr_len - 20))

    # --- the loop -----------------------------------------------------------------------------------------
    def _run(self, b: PacketBatch, flow_id: np.ndarray, p: Prepared, gids: list[int],
             marks: np.ndarray | None = None) -> None:
        cfg = self.config
        n = len(b)
        kind = p.kind.tolist()
        ts = b.ts_ns.tolist()
        qrow_arr = self._queue_rows(b, p)
        multiq = bool(qrow_arr.any())
        if multiq:
            self._ensure_queues(int(qrow_arr.max()) + 1)
        qrow = qrow_arr.tolist() if multiq else None
        fm = p.flushmark.tolist()
        fwm = p.flagword.tolist()
        l3w = p.l3word.tolist()
        pl = b.tcp_payload_len.tolist()
        fl = b.tcp_flags.tolist()
        seq = b.tcp_seq.tolist()
        ack = b.tcp_ack.tolist()
        opt = b.tcp_opt_hash.tolist()
        ipid = b.ip_id.tolist()
        frame = b.frame.tolist()
        fids = flow_id.tolist()
        l2len = b.l2_len.tolist()
        hdrlen = p.hdr_len.tolist()
        ps = marks.tolist() if marks is not None else None

        tmo = cfg.gro_flush_timeout_ns > 0
        weight = cfg.napi_weight
        gap = self._gap_ns
        cwr = self._cwr
        needs_df = self._needs_df
        maxskbs = cfg.max_gro_skbs
        hz = cfg.hz
        phase = cfg.jiffy_phase_ns
        flush_old_full = cfg.hz >= 1000
        qlast = self._qlast
        qn = self._qn
        qheld = self._qheld
        held = self._held
        glim = self._glim
        gmax = self._gmax
        complete = self._complete
        buckets = self._buckets
        g_bucket = self._g_bucket
        g_v4 = self._g_v4
        g_ports = self._g_ports
        lim4 = self._lim4
        lim6 = self._lim6

        for i in range(n):
            t = ts[i]
            q = qrow[i] if multiq else 0
            # R21.2/R21.5 (section 7.1): a gap longer than poll_gap_us (or, given marks, a marked packet) ended
            # the previous poll
            if tmo:
                now = self._timers(q, t, None if ps is None else ps[i])
            else:
                last = qlast[q]
                if last is not None and (t - last > gap if ps is None else ps[i]):
                    self._complete_poll(q, last, qn[q])
                now = t
            qlast[q] = t

            k = kind[i]
            if k == KIND_TCP:
                g = gids[i]
                e = held[g]
                ln = pl[i]
                f = fl[i]
                if ln > glim[g]:
                    # R2: already aggregated input, a GSO skb of gso_segs segments
                    gsz = self._gso_size(g, int(b.tcp_hdr_len[i]))
                    cnt = -(-ln // gsz)
                else:
                    gsz = 0
                    cnt = 1
                    if ln > gmax[g]:  # noqa: PLR1730 - hot loop: no call, no store in the common case
                        gmax[g] = ln
                merged = False
                if e is not None:
                    # R14 (all against p's first segment) and R15a, R15c
                    ok = (not fm[i]  # R15c: a flush-marked packet never merges
                          and not (f & cwr)  # R14.1: CWR on the new segment flushes (<= 6.19)
                          and fwm[i] == e.fwm  # R14.2: flag word (doff, ECE/URG/ACK/RST/SYN, window) must match
                          and ack[i] == e.ack  # R14.3: ack_seq must match
                          and opt[i] == e.opt  # R14.4: every option byte must match
                          and l3w[i] == e.l3w  # R8/R11/R14.5: TTL/hop limit, TOS/TC, DF must match
                          and seq[i] == e.nxt  # R14.7: contiguous (mod 2^32)
                          and (gsz == e.mss if gsz else 0 < ln <= e.mss)  # R14.6: MSS rule / GSO gso_size
                          and e.plen + ln < e.limit)  # R15a: p->len + len >= limit refuses
                    if ok and e.v4:
                        # R14.5: IPv4 ID: fixed (delta 0) or incrementing (delta == count) as decided on packet 2
                        d = (ipid[i] - e.id0) & 0xFFFF
                        if e.count == 1 and d == 0 and (l3w[i] & 1 or not needs_df):
                            e.fixed = True
                        ok = d == 0 if e.fixed else d == e.count
                    if ok:
                        # R15: merge; count += gso_segs, p->len += len
                        e.plen += ln
                        e.count += cnt
                        e.npk += 1
                        e.nxt = (e.nxt + ln) & M32
                        e.flags |= f & ORED_FLAGS  # R16: PSH and FIN ORed into p's header
                        e.f1 = frame[i]
                        e.t1 = t
                        merged = True
                        # R16: complete p now if the segment is short or carries URG/PSH/RST/SYN/FIN
                        short = (ln != cnt * gsz) if gsz else (ln < e.mss)
                        if short or f & ALONE_FLAGS:
                            complete(e, _r16_reason(f))
                    else:
                        # R17: no merge -> p is flushed now
                        complete(e, self._mismatch(e, fm[i], f, fwm[i], ack[i], opt[i], l3w[i], seq[i], ln, gsz,
                                                   ipid[i]))
                if not merged:
                    # R17: deliver alone (flush-marked, no payload, URG/PSH/RST/SYN/FIN) or hold as a new p
                    if fm[i] or f & ALONE_FLAGS or ((ln != cnt * gsz) if gsz else ln == 0):
                        if f & TH_SYN:
                            self._on_syn(g, int(b.tcp_mss[i]))
                        if ln:
                            self._out.append(self._alone_row(b, i, flow_id, _alone_reason(fm[i], f), cnt, gsz))
                    else:
                        bkt = g_bucket[g]
                        bucket = buckets[q][bkt]
                        if len(bucket) >= maxskbs:
                            complete(bucket[0], R.BUCKET_EVICT)  # R18: bucket full, flush its oldest first
                        e = _Held()
                        e.gid = g
                        e.q = q
                        e.b = bkt
                        e.fid = fids[i]
                        e.v4 = v4 = g_v4[g]
                        e.sport, e.dport = g_ports[g]
                        e.l2 = l2len[i]
                        e.hdr = h = hdrlen[i]
                        e.seq0 = seq[i]
                        e.nxt = (seq[i] + ln) & M32
                        e.ack = ack[i]
                        e.fwm = fwm[i]
                        e.opt = opt[i]
                        e.l3w = l3w[i]
                        e.id0 = ipid[i]
                        e.fixed = False
                        e.mss = gsz if gsz else ln  # R17: mss = the first segment's payload (GSO: gso_size)
                        e.gso = gsz != 0
                        e.count = cnt
                        e.npk = 1
                        e.plen = h + ln  # p->len: L3 length
                        e.limit = lim4 if v4 else lim6  # R15a: netif_get_gro_max_size by protocol
                        e.flags = f
                        e.age = ((now - phase) * hz) // 1_000_000_000  # R21.4: age = jiffies when held
                        e.f0 = e.f1 = frame[i]
                        e.t0 = e.t1 = t
                        bucket.append(e)
                        held[g] = e
                        qheld[q] += 1
            elif k == KIND_ALONE and pl[i]:
                # R5/R9/R12/R19: GRO gives up; delivered alone, held entries untouched (may overtake them)
                self._out.append(self._alone_row(b, i, flow_id, R.NOT_MERGEABLE_ALONE, 1, 0))

            # R21.3: a poll that used its whole budget (napi_weight packets of this queue)
            c = qn[q] + 1
            if c >= weight:
                c = 0
                if qheld[q]:
                    if flush_old_full:
                        self._flush_old(q, now)  # R21.3/R21.4: HZ >= 1000 keeps this jiffy's entries
                    else:
                        self._flush_all(q, R.NAPI_POLL)  # R21.3: HZ < 1000 flushes everything
            qn[q] = c

    # --- completion and flushing --------------------------------------------------------------------------
    def _complete(self, e: _Held, reason: int) -> None:
        """Complete p (R20) and append its row (R23: delivery order = completion order)."""
        self._buckets[e.q][e.b].remove(e)
        self._held[e.gid] = None
        self._qheld[e.q] -= 1
        self._out.append(self._row(e, reason))

    def _flush_all(self, q: int, reason: int) -> None:
        """R21.2/R21.4: every bucket in ascending order, each oldest to newest."""
        for bucket in self._buckets[q]:
            if bucket:
                for e in bucket:
                    self._held[e.gid] = None
                    self._out.append(self._row(e, reason))
                self._qheld[q] -= len(bucket)
                bucket.clear()

    def _flush_old(self, q: int, now: int) -> None:
        """R21.4 flush_old: per bucket (ascending) oldest to newest, stopping at the first entry of this jiffy."""
        jiffy = ((now - self.config.jiffy_phase_ns) * self.config.hz) // 1_000_000_000
        for bucket in self._buckets[q]:
            while bucket and bucket[0].age != jiffy:
                self._complete(bucket[0], R.NAPI_POLL)

    def _complete_poll(self, q: int, tnow: int, work: int) -> None:
        """R21.2/R21.5 napi_complete_done(work) at time tnow: flush all, or only old entries + arm the timer."""
        tmo = self.config.gro_flush_timeout_ns
        timeout = 0
        if work:
            if self._qheld[q]:
                timeout = tmo
            self._qdefer[q] = self.config.napi_defer_hard_irqs
        masked = False
        if self._qdefer[q] > 0:
            self._qdefer[q] -= 1
            timeout = tmo
            masked = tmo > 0
        if self._qheld[q]:
            if timeout:
                self._flush_old(q, tnow)
            else:
                self._flush_all(q, R.NAPI_POLL)
        self._qdeadline[q] = tnow + timeout if timeout else None
        self._qmasked[q] = masked
        self._qn[q] = 0
        self._qlast[q] = None

    def _timers(self, q: int, t: int, mark: bool | None = None) -> int:
        """R21.5 (gro_flush_timeout > 0): run the poll ends and timer polls due before a packet at t.

        ``mark``: None = the gap rule ends a running poll; else whether the packet is marked as a poll start.
        Returns the time the packet is processed: t, or the pending timer poll while IRQs are masked."""
        while True:
            if self._qmasked[q]:
                dl = self._qdeadline[q]
                if t <= dl:
                    return dl  # IRQs masked: the packet waits for the timer poll at dl
                self._complete_poll(q, dl, self._qn[q])
                continue
            last = self._qlast[q]
            if last is not None and (t - last > self._gap_ns if mark is None else mark):
                self._complete_poll(q, last, self._qn[q])
                continue
            dl = self._qdeadline[q]
            if dl is not None and t >= dl:
                self._complete_poll(q, dl, 0)
                continue
            return t

    # --- rows ---------------------------------------------------------------------------------------------
    def _row(self, e: _Held, reason: int) -> tuple:
        """R20: what the receiver sees for a completed p."""
        l3 = e.plen
        frame_len = e.l2 + l3
        big = BIGTCP_NONE
        gso = 0
        if e.count > 1:
            gso = e.mss
            if e.v4:
                if l3 > 65535:
                    big = BIGTCP_V4_TOTLEN0  # R20: tot_len = 0 above 65535
            elif l3 - 40 > IPV6_MAXPLEN:
                if self.config.ipv6_hbh:
                    big = BIGTCP_HBH_JUMBO  # R20 (<= 6.19): 8-byte HBH jumbo inserted, payload_len 0
                    frame_len += 8
                else:
                    big = BIGTCP_V6_PLEN0  # R20 (7.0): payload_len 0, no extension header
        source = SOURCE_OBSERVED if (e.gso and e.npk == 1) else SOURCE_REBUILT
        return (e.fid, 4 if e.v4 else 6, e.sport, e.dport, e.seq0, l3 - e.hdr, e.count, l3, frame_len, big,
                e.f0, e.f1, e.t0, e.t1, reason, source, e.flags, e.ack, gso)

    @staticmethod
    def _alone_row(b: PacketBatch, i: int, flow_id: np.ndarray, reason: int, cnt: int, gsz: int) -> tuple:
        """A payload-carrying packet delivered alone: it reaches the stack unchanged."""
        frame = int(b.frame[i])
        t = int(b.ts_ns[i])
        return (int(flow_id[i]), int(b.ip_version[i]), int(b.sport[i]), int(b.dport[i]), int(b.tcp_seq[i]),
                int(b.tcp_payload_len[i]), cnt, int(b.ip_len[i]), int(b.wirelen[i]), int(b.bigtcp[i]), frame,
                frame, t, t, reason, SOURCE_OBSERVED if gsz else SOURCE_REBUILT, int(b.tcp_flags[i]),
                int(b.tcp_ack[i]), gsz)

    def _mismatch(self, e: _Held, fm: bool, f: int, fwm: int, ack: int, opt: int, l3w: int, seq: int, ln: int,
                  gsz: int, ipid: int) -> int:
        """Why a packet could not merge into p: the most specific failing check (order in reasons.py)."""
        if fm:
            return R.FLUSH_MARKED  # R15c (R2/R7/R11)
        if f & TH_RST:
            return R.RST  # R14.2
        if f & TH_SYN:
            return R.SYN  # R14.2
        if f & TH_URG:
            return R.URG  # R14.2
        if f & self._cwr:
            return R.CWR  # R14.1
        if ln == 0:
            return R.FIN if f & TH_FIN else R.NO_PAYLOAD  # R14.6: (len - 1) >= mss for len 0
        if seq != e.nxt:
            return R.SEQ_GAP  # R14.7
        if ack != e.ack:
            return R.ACK_CHANGE  # R14.3
        d = fwm ^ e.fwm
        if d:
            if d >> 28:
                return R.OPTION_CHANGE  # R14.2: data offset differs (option length)
            if d >> 16:
                return R.CWR if (d >> 16) & TH_CWR else R.FLAGS  # R14.2 (CWR compared on 7.0)
            return R.WINDOW_CHANGE  # R14.2: window field
        if opt != e.opt:
            return R.OPTION_CHANGE  # R14.4
        if l3w != e.l3w:
            return R.IP_CHANGE  # R8/R11
        if e.v4:
            dlt = (ipid - e.id0) & 0xFFFF
            fixed = e.fixed or (e.count == 1 and dlt == 0 and (l3w & 1 or not self._needs_df))
            if dlt != (0 if fixed else e.count):
                return R.IP_ID  # R14.5
        if gsz:
            if gsz != e.mss:
                return R.GSO_SIZE_MISMATCH  # R14.6
        elif ln > e.mss:
            return R.MSS_EXCEEDED  # R14.6
        return R.SIZE_LIMIT  # R15a/R15b


def _poll_marks(poll_start: np.ndarray | None, n: int) -> np.ndarray | None:
    """``feed``'s poll_start column as uint8 (0/1), or None; ValueError unless one entry per packet."""
    if poll_start is None:
        return None
    ps = np.asarray(poll_start)
    if ps.shape != (n,):
        raise ValueError(f"poll_start must have one entry per packet: shape {ps.shape}, {n} packets")
    return (ps != 0).astype(np.uint8)


def _r16_reason(f: int) -> int:
    """R16: why p completed right after merging a segment with flags f (else it was short)."""
    if f & TH_FIN:
        return R.FIN
    if f & TH_PSH:
        return R.PSH
    if f & TH_URG:
        return R.URG
    if f & TH_RST:
        return R.RST
    if f & TH_SYN:
        return R.SYN
    return R.SHORT_SEGMENT


def _alone_reason(fm: bool, f: int) -> int:
    """R17: why a payload-carrying packet was delivered alone instead of held."""
    if fm:
        return R.FLUSH_MARKED
    if f & TH_RST:
        return R.RST
    if f & TH_SYN:
        return R.SYN
    if f & ALONE_FLAGS:
        return _r16_reason(f)
    return R.SHORT_SEGMENT  # a GSO input with len != count * gso_size
