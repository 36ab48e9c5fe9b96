"""GroEngine: the Linux GRO receive path as a sans-IO state machine (gro-spec.md R4-R21, section 3).

Feed decoded packets in capture order; get back the super-packets the receiver's GRO would have built, each
with the reason it was completed::

    eng = GroEngine(GroConfig(gro_max_size=185000))
    for batch in batches:                       # PacketBatch, in capture order
        rows = eng.feed(batch, flow_id)         # flow_id: int64 per row, -1 = not a tracked TCP flow
    rows = eng.flush()                          # end of input: complete whatever is still held

The engine keeps only what the kernel keeps: the held super-packets (bounded by buckets x MAX_GRO_SKBS per RX
queue) plus a small table per flow key (its hash, and the MSS used to recognise already aggregated input).

Structure: every rule (the R14/R15 merge verdict and its reason, R2 detection, R16/R17, R20, R21 poll ends
and timers) is a function in ``rules.py``; this engine calls them as plain Python and keeps only the kernel's
bookkeeping (held entries per bucket and queue, poll state, per-flow facts) as Python objects. The compiled
port, ``compiled.CompiledGroEngine`` (numba, the default of ``api.analyze``), inlines the same functions over
flat arrays; this engine is the readable oracle its bookkeeping is tested against.

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

from .._native import python_twin
from ..decode.schema import TH_PSH, TH_SYN, PacketBatch
from . import reasons as R
from . import rules
from .config import GroConfig
from .prepare import KIND_ALONE, KIND_OTHER, KIND_TCP, Prepared, prepare
from .rules import M32
from .superpacket import SuperPacketBatch

# the rules, as plain Python (the compiled engine inlines the same source)
_py = python_twin("bigtcp_pcap.gro.rules")
merge_verdict = _py.merge_verdict
r2_syn_mss, r2_plain_limit, r2_gso_size, r2_gso_segs = _py.r2_syn_mss, _py.r2_plain_limit, _py.r2_gso_size, \
    _py.r2_gso_segs
r2_fallback_limit = _py.r2_fallback_limit
r16_completes, r16_ored_flags, r16_reason = _py.r16_completes, _py.r16_ored_flags, _py.r16_reason
r17_goes_alone, r17_alone_reason = _py.r17_goes_alone, _py.r17_alone_reason
r20_completed, r20_observed = _py.r20_completed, _py.r20_observed
r21_4_jiffy, r21_2_poll_ended, r21_5_poll_end = _py.r21_4_jiffy, _py.r21_2_poll_ended, _py.r21_5_poll_end
r21_2_end_cause = _py.r21_2_end_cause
r21_3_budget_used = _py.r21_3_budget_used
acked_end_ends_poll, busy_poll_continues = _py.acked_end_ends_poll, _py.busy_poll_continues
acked_end_poll_waits, acked_flow_returns = _py.acked_end_poll_waits, _py.acked_flow_returns
acked_row_poll_end = _py.acked_row_poll_end
nic_window_closed = _py.nic_window_closed


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
        self.next_window: int | None = rules.ACK_NEXT_ROWS  # see ``next_same``
        self._lim4, self._lim6 = rules.r15_limits(cfg)
        self._gap_ns = float(cfg.poll_gap_us) * 1000.0
        self._pgap_ns = rules.r21_2_push_gap_ns(cfg)
        self._cwr = rules.r14_1_cwr_mask(cfg)
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
        self._qcause: list[int] = []  # what ends the poll being completed (reasons.PE_*)
        self._qws: list[int] = []  # NIC coalescing: arrival of the packet that opened the IRQ window
        self._qwn: list[int] = []  # packets since then (0: no window open)
        self._qbusy: list[int] = []  # latest busy time (evidence.evidence_scan) of the running poll's packets
        self._qpush: list[bool] = []  # the running poll's last packet was a TCP segment with PSH (R21.2b)
        self._qwait: list[int] = []  # the flow key whose ACKed end left the poll's end waiting, -1: none
        self._rxu = cfg.rx_usecs * 1000
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
    def feed(self, batch: PacketBatch, flow_id: np.ndarray, poll_start: np.ndarray | None = None,
             acked: np.ndarray | None = None, receiver: np.ndarray | None = None,
             busy: np.ndarray | None = None, upto: int | None = None) -> SuperPacketBatch:
        """Process the next packets (capture order); return the rows completed meanwhile, in delivery order.

        ``poll_start`` (optional, one bool per packet): known NAPI poll boundaries, e.g. from the kernel's
        napi:napi_poll tracepoint (``polls.poll_starts_from_trace``). A marked packet begins a new poll of its
        queue: the running poll ends first (R21.2, the same napi_complete_done the gap rule applies) and the
        napi_weight budget count restarts. The gap rule is not applied to a batch given with marks.

        ``acked`` (optional, one bool per packet, ``evidence.AckEvidence``): the other side ACKed exactly this
        segment's end; when no rule completed its super-packet, the poll ends after it (rules.acked_end_ends_poll),
        or, when other flows' packets come first, before the flow's next segment (rules.acked_end_poll_waits).

        ``receiver`` (optional, one int per packet, ``receivers.Receivers``): the receiving host, each with its
        own NAPI instances (``rx_queues`` of them) and GRO tables; default: the capture interface.

        ``busy`` (optional, int64 ns per packet, ``evidence.AckEvidence``; 0 = none): an ACK sent at that time did
        not yet cover this segment; while a packet of the running poll has one later than the next packet's
        arrival, an idle gap does not end the poll (rules.busy_poll_continues). Not used with ``poll_start``.

        ``upto`` (optional): process only the first ``upto`` packets; the others are lookahead, the packets that
        follow in the capture, read only as a flow's next segment by the ACK-evidence rule (which asks whether it
        would merge), so that the rows do not depend on where batches end. They are fed again, as the next
        packets, in a later call."""
        flow_id = np.asarray(flow_id)
        n = len(batch)
        if flow_id.shape != (n,):
            raise ValueError(f"flow_id must have one entry per packet: shape {flow_id.shape}, {n} packets")
        marks = _poll_marks(poll_start, n)
        ak = _poll_marks(acked, n) if acked is not None else None
        bz = _busy_times(busy, n) if busy is not None and marks is None else None
        rx = _receivers(receiver, batch)
        if n:
            prep = prepare(batch, flow_id, self.config)
            gids = self._assign_gids(batch, prep, rx)
            self._run(batch, flow_id, prep, gids, marks, ak, rx, bz, n if upto is None else upto)
        return self._take()

    def flush(self) -> SuperPacketBatch:
        """End of input: complete every held entry (reason end_of_capture) and reset the poll state."""
        for q in range(len(self._buckets)):
            if self._qheld[q]:
                self._qcause[q] = R.PE_END
                self._flush_all(q, R.END_OF_CAPTURE)
            self._qlast[q] = None
            self._qwn[q] = 0
            self._qn[q] = 0
            self._qbusy[q] = 0
            self._qwait[q] = -1
            self._qdeadline[q] = None
            self._qmasked[q] = False
            self._qdefer[q] = 0
        return self._take()

    @property
    def held(self) -> int:
        """Number of super-packets currently held (all queues)."""
        return sum(self._qheld)

    def recycle(self, flow_in_memory) -> int:
        """The compiled engine forgets keys of ended flows (``CompiledGroEngine.recycle``); the reference keeps
        every key (it runs on small inputs), which gives the same rows on captures where no flow ends early."""
        return 0

    def held_flow_ids(self) -> np.ndarray:
        """Flow ids of the entries currently held (their rows are still to come)."""
        return np.array([e.fid for e in self._held if e is not None], np.int64)

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
            self._qcause.append(R.PE_NONE)
            self._qws.append(0)
            self._qwn.append(0)
            self._qbusy.append(0)
            self._qpush.append(False)
            self._qwait.append(-1)

    def _queue_rows(self, prep: Prepared, rx: np.ndarray) -> np.ndarray:
        """RX queue per packet: per receiver, (flow hash >> 32) % rx_queues (RSS stand-in)."""
        nq = self.config.rx_queues
        return rx * nq + ((prep.flow_hash >> np.uint64(32)) % np.uint64(nq)).astype(np.int64)

    def _assign_gids(self, b: PacketBatch, prep: Prepared, rx: np.ndarray) -> list[int]:
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
                q = int(rx[row]) * nq + (h >> 32) % nq
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
        return r2_syn_mss(self._syn_mss.get(self._g_rdk[g], 0), self._syn_mss.get(self._g_dk[g], 0))

    def _plain_limit(self, g: int) -> int:
        """R2 detection: a payload above this cannot be one wire segment of flow g."""
        return r2_plain_limit(self._gso_auto, self._syn_mss_of(g),
                              r2_fallback_limit(self.config.mtu, self._g_v4[g]))

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
        return r2_gso_size(self._syn_mss_of(g), self._gmax[g], self._glim[g], tcp_hdr_len)

    # --- the loop -----------------------------------------------------------------------------------------
    def _run(self, b: PacketBatch, flow_id: np.ndarray, p: Prepared, gids: list[int],
             marks: np.ndarray | None, acked: np.ndarray | None, rx: np.ndarray, busy: np.ndarray | None,
             n: int) -> None:
        cfg = self.config
        kind = p.kind.tolist()
        ts = b.ts_ns.tolist()
        qrow_arr = self._queue_rows(p, rx)
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
        ak = acked.tolist() if acked is not None else None
        bz = busy.tolist() if busy is not None else None
        qbusy = self._qbusy
        qpush = self._qpush
        qwait = self._qwait
        pgap = self._pgap_ns
        slack = rules.BUSY_SLACK_NS
        nxt = next_same(np.asarray(gids), self.next_window).tolist() if acked is not None else None
        qcause = self._qcause
        qws, qwn, rxu, rxf = self._qws, self._qwn, self._rxu, cfg.rx_frames
        nq = cfg.rx_queues

        tmo = cfg.gro_flush_timeout_ns > 0
        weight = cfg.napi_weight
        gap = self._gap_ns
        cwr = self._cwr
        needs_df = self._needs_df
        maxskbs = cfg.max_gro_skbs
        hz = cfg.hz
        phase = cfg.jiffy_phase_ns
        flush_old_full = rules.r21_3_flush_old_on_full_budget(cfg)
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
                if r21_2_poll_ended(last is not None, t, last, gap, ps is not None, ps is not None and ps[i],
                                    qpush[q], pgap) and not busy_poll_continues(qbusy[q], t, slack):
                    qcause[q] = r21_2_end_cause(ps is not None, t - last, gap)
                    self._complete_poll(q, last, qn[q])
                elif nic_window_closed(qwn[q], t, qws[q], rxu, rxf):
                    qcause[q] = R.PE_COALESCE
                    self._complete_poll(q, last, qn[q])
                elif acked_flow_returns(qwait[q], gids[i]):
                    qcause[q] = R.PE_ACK
                    self._complete_poll(q, last, qn[q])
                now = t
            if qlast[q] is None or t > qlast[q]:  # the poll's clock does not go back (a late segment fed out of
                qlast[q] = t  # capture order, a capture clock that steps back)
            qpush[q] = kind[i] != KIND_OTHER and (fl[i] & TH_PSH) != 0
            if bz is not None and bz[i] > qbusy[q]:
                qbusy[q] = bz[i]
            if not qwn[q]:  # this packet found NAPI idle: it opens the NIC's coalescing window
                qws[q] = t
            qwn[q] += 1

            k = kind[i]
            if k == KIND_TCP:
                g = gids[i]
                e = held[g]
                ln = pl[i]
                f = fl[i]
                if ln > glim[g]:
                    # R2: already aggregated input, a GSO skb of gso_segs segments
                    gsz = self._gso_size(g, int(b.tcp_hdr_len[i]))
                    cnt = r2_gso_segs(ln, gsz)
                else:
                    gsz = 0
                    cnt = 1
                    if ln > gmax[g]:  # noqa: PLR1730 - hot loop: no call, no store in the common case
                        gmax[g] = ln
                merged = False
                if e is not None:
                    # R14 (all against p's first segment), R15a, R15c
                    why, fixed = merge_verdict(fm[i], f, cwr, fwm[i], ack[i], opt[i], l3w[i], seq[i], ln, gsz,
                                               ipid[i], needs_df, e.v4, e.fwm, e.ack, e.opt, e.l3w, e.nxt, e.mss,
                                               e.plen, e.limit, e.id0, e.count, e.fixed)
                    if why == rules.MERGE:
                        # R15: merge; count += gso_segs, p->len += len
                        e.fixed = fixed
                        e.plen += ln
                        e.count += cnt
                        e.npk += 1
                        e.nxt = (e.nxt + ln) & M32
                        e.flags |= r16_ored_flags(f)
                        e.f1 = frame[i]
                        e.t1 = t
                        merged = True
                        if r16_completes(ln, cnt, gsz, e.mss, f):
                            complete(e, r16_reason(f))
                    else:
                        complete(e, why)  # R17: no merge -> p is flushed now
                if not merged:
                    # R17: deliver alone (flush-marked, no payload, URG/PSH/RST/SYN/FIN) or hold as a new p
                    if r17_goes_alone(fm[i], f, ln, cnt, gsz):
                        if f & TH_SYN:
                            self._on_syn(g, int(b.tcp_mss[i]))
                        if ln:
                            self._out.append(self._alone_row(b, i, flow_id, r17_alone_reason(fm[i], f), cnt, gsz,
                                                             q // nq))
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
                        e.age = r21_4_jiffy(now, phase, hz)  # R21.4: age = jiffies when held
                        e.f0 = e.f1 = frame[i]
                        e.t0 = e.t1 = t
                        bucket.append(e)
                        held[g] = e
                        qheld[q] += 1
            elif k == KIND_ALONE and pl[i]:
                # R5/R9/R12/R19: GRO gives up; delivered alone, held entries untouched (may overtake them)
                self._out.append(self._alone_row(b, i, flow_id, R.NOT_MERGEABLE_ALONE, 1, 0, q // nq))

            # R21.3: a poll that used its whole budget (napi_weight packets of this queue)
            c = qn[q] + 1
            if r21_3_budget_used(c, weight):
                c = 0
                if qheld[q]:
                    qcause[q] = R.PE_BUDGET
                    if flush_old_full:
                        self._flush_old(q, now)  # R21.3/R21.4: HZ >= 1000 keeps this jiffy's entries
                    else:
                        self._flush_all(q, R.NAPI_POLL)  # R21.3: HZ < 1000 flushes everything
                qwait[q] = -1
            qn[q] = c
            # evidence (gro-spec 7.1): the receiver ACKed this segment's end, no rule ended its super-packet
            if ak is not None and k == KIND_TCP and ak[i] and held[gids[i]] is not None:
                j = nxt[i]
                e = held[gids[i]]
                merges = j < 0 or self._would_merge(e, gids[i], int(b.tcp_hdr_len[j]), fm[j], fl[j], fwm[j], ack[j],
                                                    opt[j], l3w[j], seq[j], pl[j], ipid[j])
                if acked_end_ends_poll(True, True, merges):
                    if acked_end_poll_waits(tmo or flush_old_full, c, qwait[q]):
                        qwait[q] = gids[i]  # the other flows' packets before this flow's next one come in it
                    else:
                        qcause[q] = R.PE_ACK
                        self._complete_poll(q, t, c)

    def _would_merge(self, e: _Held, g: int, thl: int, fm: bool, f: int, fwm: int, ack: int, opt: int, l3w: int,
                     seq: int, ln: int, ipid: int) -> bool:
        """Would a later segment of flow g merge into its held entry e as it stands? (R2, R14/R15)."""
        gsz = self._gso_size(g, thl) if ln > self._glim[g] else 0
        why, _ = merge_verdict(fm, f, self._cwr, fwm, ack, opt, l3w, seq, ln, gsz, ipid, self._needs_df, e.v4,
                               e.fwm, e.ack, e.opt, e.l3w, e.nxt, e.mss, e.plen, e.limit, e.id0, e.count, e.fixed)
        return why == rules.MERGE

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
        jiffy = r21_4_jiffy(now, self.config.jiffy_phase_ns, self.config.hz)
        for bucket in self._buckets[q]:
            while bucket and bucket[0].age != jiffy:
                self._complete(bucket[0], R.NAPI_POLL)

    def _complete_poll(self, q: int, tnow: int, work: int) -> None:
        """R21.2/R21.5 napi_complete_done(work) at time tnow: flush all, or only old entries + arm the timer."""
        timeout, masked, self._qdefer[q] = r21_5_poll_end(work, self._qheld[q], self.config.gro_flush_timeout_ns,
                                                          self.config.napi_defer_hard_irqs, self._qdefer[q])
        if self._qheld[q]:
            if timeout:
                self._flush_old(q, tnow)
            else:
                self._flush_all(q, R.NAPI_POLL)
        self._qdeadline[q] = tnow + timeout if timeout else None
        self._qmasked[q] = masked
        self._qn[q] = 0
        self._qlast[q] = None
        self._qwn[q] = 0
        self._qbusy[q] = 0
        self._qwait[q] = -1

    def _timers(self, q: int, t: int, mark: bool | None = None) -> int:
        """R21.5 (gro_flush_timeout > 0): run the poll ends and timer polls due before a packet at t.

        ``mark``: None = the gap rule ends a running poll; else whether the packet is marked as a poll start.
        Returns the time the packet is processed: t, or the pending timer poll while IRQs are masked."""
        while True:
            if self._qmasked[q]:
                dl = self._qdeadline[q]
                if t <= dl:
                    return dl  # IRQs masked: the packet waits for the timer poll at dl
                self._qcause[q] = R.PE_TIMER
                self._complete_poll(q, dl, self._qn[q])
                continue
            last = self._qlast[q]
            if r21_2_poll_ended(last is not None, t, last, self._gap_ns, mark is not None, mark, self._qpush[q],
                                self._pgap_ns) and not busy_poll_continues(self._qbusy[q], t, rules.BUSY_SLACK_NS):
                self._qcause[q] = r21_2_end_cause(mark is not None, t - last, self._gap_ns)
                self._complete_poll(q, last, self._qn[q])
                continue
            if nic_window_closed(self._qwn[q], t, self._qws[q], self._rxu, self.config.rx_frames):
                self._qcause[q] = R.PE_COALESCE
                self._complete_poll(q, last, self._qn[q])
                continue
            dl = self._qdeadline[q]
            if dl is not None and t >= dl:
                self._qcause[q] = R.PE_TIMER
                self._complete_poll(q, dl, 0)
                continue
            return t

    # --- rows ---------------------------------------------------------------------------------------------
    def _row(self, e: _Held, reason: int) -> tuple:
        """R20: what the receiver sees for a completed p."""
        l3 = e.plen
        frame_len, big, gso = r20_completed(e.l2, l3, e.count, e.mss, e.v4, self.config.ipv6_hbh)
        source = r20_observed(e.gso, e.npk)
        nq = self.config.rx_queues
        pe = acked_row_poll_end(self._qcause[e.q], self._qwait[e.q], e.gid) if reason in (R.NAPI_POLL, R.END_OF_CAPTURE) \
            else R.PE_NONE
        return (e.fid, 4 if e.v4 else 6, e.sport, e.dport, e.seq0, l3 - e.hdr, e.count, l3, frame_len, big,
                e.f0, e.f1, e.t0, e.t1, reason, source, e.flags, e.ack, gso, e.q // nq, pe)

    @staticmethod
    def _alone_row(b: PacketBatch, i: int, flow_id: np.ndarray, reason: int, cnt: int, gsz: int, rx: int) -> tuple:
        """A payload-carrying packet delivered alone: it reaches the stack unchanged."""
        frame = int(b.frame[i])
        t = int(b.ts_ns[i])
        return (int(flow_id[i]), int(b.ip_version[i]), int(b.sport[i]), int(b.dport[i]), int(b.tcp_seq[i]),
                int(b.tcp_payload_len[i]), cnt, int(b.ip_len[i]), int(b.wirelen[i]), int(b.bigtcp[i]), frame,
                frame, t, t, reason, r20_observed(gsz != 0, 1), int(b.tcp_flags[i]),
                int(b.tcp_ack[i]), gsz, rx, R.PE_NONE)


def next_same(gids: np.ndarray, window: int | None = None) -> np.ndarray:
    """For each row, the next row with the same gid (-1 for the last one, and for rows with gid -1).

    ``window``: a next row more than this many rows later counts as none (``rules.ACK_NEXT_ROWS``: the engines
    are given that many rows of lookahead past a batch, so the ACK-evidence rule's answer does not depend on where
    batches end)."""
    gids = np.asarray(gids)
    out = np.full(len(gids), -1, np.int64)
    order = np.argsort(gids, kind="stable")
    g = gids[order]
    same = (g[1:] == g[:-1]) & (g[1:] >= 0)
    out[order[:-1][same]] = order[1:][same]
    return cap_next(out, window)


def cap_next(nxt: np.ndarray, window: int | None) -> np.ndarray:
    """``nxt`` (next row with the same gid, -1: none) with next rows more than ``window`` rows later set to -1."""
    if window is not None and nxt.shape[0]:
        nxt[(nxt >= 0) & (nxt - np.arange(nxt.shape[0]) > window)] = -1
    return nxt


def _receivers(receiver: np.ndarray | None, batch: PacketBatch) -> np.ndarray:
    """``feed``'s receiver column as int64 (default: the capture interface); ValueError unless one per packet."""
    if receiver is None:
        return batch.if_gid.astype(np.int64)
    rx = np.asarray(receiver)
    if rx.shape != (len(batch),) or (rx.size and rx.min() < 0):
        raise ValueError(f"receiver must have one index >= 0 per packet: shape {rx.shape}, {len(batch)} packets")
    return rx.astype(np.int64, copy=False)


def _per_packet(values: np.ndarray, n: int, name: str) -> np.ndarray:
    """One of ``feed``'s optional columns as an array; ValueError unless one entry per packet."""
    a = np.asarray(values)
    if a.shape != (n,):
        raise ValueError(f"{name} must have one entry per packet: shape {a.shape}, {n} packets")
    return a


def _busy_times(busy: np.ndarray, n: int) -> np.ndarray:
    """``feed``'s busy column as int64 ns; ValueError unless one entry per packet."""
    return _per_packet(busy, n, "busy").astype(np.int64, copy=False)


def _poll_marks(poll_start: np.ndarray | None, n: int) -> np.ndarray | None:
    """``feed``'s poll_start column as uint8 (0/1), or None; ValueError unless one entry per packet."""
    if poll_start is None:
        return None
    return (_per_packet(poll_start, n, "poll_start") != 0).astype(np.uint8)

