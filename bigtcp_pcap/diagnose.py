"""Why super-packets are small: the capture's kind, what the capturing host's limits must be, and per flow what
ended its super-packets, in words, with the knob that would change it and a measured what-if.

Three parts, all fed batch by batch from ``analyze()`` (bounded memory) and finished once:

* ``SuperPacketTally`` counts rows and payload bytes per (flow, flush reason) and keeps the sizes of observed
  super-packets (already aggregated in the capture: a receiver with GRO on, or a sender with TSO/GSO on).
* ``infer_capture`` says whether the capture is post-GRO (or TSO-side), with the evidence, and what the
  observed sizes tell about the capturing host: super-packets that stop at the NAPI budget (64 segments at
  HZ < 1000, gro-spec R21.3), just below 64 KiB (a limit left at 65536), or below a raised limit; and whether
  the modelled ``GroConfig`` contradicts what was observed.
* ``diagnose`` ranks each top flow's flush reasons by payload bytes and, for every reason a receiver setting can
  change, re-runs the GRO stage (only that stage, on the decoded packets ``WhatIfInput`` kept: the first
  ``WHATIF_MAX_PACKETS`` of the capture, all flows, so NAPI budgets count as in the real run) with the knob
  changed, and reports what ``analyze`` would then build. Nothing here is guessed from the reason name alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from .decode import PacketBatch
from .gro import make_engine, rules
from .gro import reasons as R
from .gro.config import GRO_LEGACY_MAX_SIZE, GRO_MAX_SIZE, GroConfig
from .gro.superpacket import SOURCE_OBSERVED, SuperPacketBatch
from .keyed import KeyedSums, tally_keys

WHATIF_MAX_PACKETS = 131072
"""Decoded packets kept for the what-if runs (~170 bytes each): the first this many of the capture."""
TOP_FLOWS = 5
BIG_TCP_SIZE = 185000  # the value the BIG TCP patches and most guides use for gso/gro_max_size
TH_PSH = 0x08

# reason -> (words, knob): what ended the super-packet and what would change it. Knob None: not a receiver
# setting (the sender, the application or the network decides).
REASON_TEXT: dict[str, tuple[str, str | None]] = {
    "size_limit": ("the receiver's size limit (the next segment would have reached it)", "gro_max_size"),
    "napi_poll": ("the end of a NAPI poll", "napi"),
    "psh": ("application writes: PSH on the last segment (one write or TSO burst ends)", None),
    "short_segment": ("application writes: a segment shorter than the MSS ends a write", None),
    "option_change": (("TSval ticks: the TCP timestamp changed (every 1 ms at the sender's clock), or other "
                      "options such as SACK"), None),
    "ip_change": ("a change of TOS/traffic class (an ECN CE mark), TTL/hop limit or DF", None),
    "seq_gap": ("sequence gaps: loss, reordering, retransmissions or packets the capture dropped", None),
    "ack_change": ("a new ACK number (data flowing both ways)", None),
    "window_change": ("a receive-window update from the sender of the data", None),
    "flags": ("a change of ECE/ACK flags", None),
    "cwr": ("CWR set (the sender reacted to an ECN mark; kernel <= 6.19 flushes)", None),
    "ip_id": ("IPv4 IDs neither incrementing nor fixed", None),
    "mss_exceeded": ("a segment larger than the first one", None),
    "gso_size_mismatch": ("an aggregated input with a different segment size", None),
    "no_payload": ("a packet without payload on the flow (pure ACK, window update)", None),
    "flush_marked": (("packets GRO must not merge (length field differs from the frame: padding, truncation)"),
                     None),
    "rst": ("RST", None), "syn": ("SYN", None), "urg": ("URG", None), "fin": ("FIN (end of the transfer)", None),
    "bucket_evict": ("a full GRO bucket (more than 8 flows held in one bucket)", "rx_queues"),
    "end_of_capture": ("the end of the capture", None),
    "not_mergeable_alone": ("packets GRO gives up on (tunnels, IP options, fragments, bad checksums)", None),
    "observed": ("already aggregated in the capture (not built by the model)", None),
}

KNOB_TEXT = {
    "gro_max_size": "raise gro_max_size (IPv6): ip link set dev DEV gro_max_size {v}",
    "gro_ipv4_max_size": "raise gro_ipv4_max_size, which gro_max_size does not raise above 65536: "
                         "ip link set dev DEV gro_ipv4_max_size {v}",
    "hz": "a kernel with HZ >= 1000 (CONFIG_HZ_1000): full-budget polls then keep this jiffy's entries",
    "gro_flush_timeout": "gro_flush_timeout + napi_defer_hard_irqs (sysfs /sys/class/net/DEV/...): poll ends keep "
                         "young entries",
    "rx_queues": "more RX queues / RSS spreading the flows over more NAPI instances",
}


# per-flow keys of the observed sizes: flow << OBS_SHIFT | kind << OBS_BITS | value
OBS_BITS = 21
OBS_SHIFT = OBS_BITS + 3
OBS_VALUE_MAX = (1 << OBS_BITS) - 1
OBS_D, OBS_D_PSH, OBS_BUDGET, OBS_MSS, OBS_NSEG = range(5)  # kinds (OBS_D*: value 65536 - l3_len of a row)
_VERSIONS = (4, 6)
# per IP version: rows, largest l3_len (the first row of it), its segments, MSS, rows at the budget, most segments
V_COUNT, V_LMAX, V_SMAX, V_MSS, V_BUDGET, V_NMAX = range(6)  # (keyed.tally_keys writes them in this order)


class ObservedSizes:
    """What the capture inference and the per-flow ``observed`` ends need of the observed super-packets (input
    packets that already carry several segments), as exact aggregates that do not grow with the capture: per
    IP version the counts and maxima ``_infer_version`` reads and a histogram of IP lengths below 64 KiB (its
    share near 64 KiB needs the final MSS); per flow, counts keyed by (kind, value) in a ``KeyedSums``
    (keyed.py) pruned with the tally's flows (``flow_ends``). It used to keep the first 1 M observed rows
    (23 MiB, and the capture-level counts stopped at 1 M rows). ``SuperPacketTally.add`` counts them, in the same
    compiled pass as its own keys (``keyed.tally_keys``)."""

    def __init__(self, weight: int, keep: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.weight = weight
        self.n = 0  # every observed row (any IP version)
        self.nseg_max = 0
        self.l3_max = 0
        self.big = 0  # rows above 64 KiB
        self.v = np.zeros((len(_VERSIONS), 6), np.int64)
        self.v[:, V_LMAX] = -1
        self.hist = np.zeros((len(_VERSIONS), GRO_LEGACY_MAX_SIZE), np.int64)  # rows per l3_len below 64 KiB
        self.flows = KeyedSums(1, keep, shift=OBS_SHIFT)
        self.batches = 0

    def flow_ends(self, fid: int) -> dict[str, Any]:
        """How one flow's observed super-packets end: at the NAPI budget, within one (the flow's largest)
        segment below 64 KiB, with PSH, or otherwise."""
        codes, sums, _ = self.flows.of_flow(fid)
        if not codes.size:
            return {"ends": {}, "ends_text": "sizes not kept"}
        kind, value, cnt = codes >> OBS_BITS, codes & OBS_VALUE_MAX, sums[:, 0]
        mss = int(value[kind == OBS_MSS].max(initial=0))
        near = (kind <= OBS_D_PSH) & (value <= mss)
        ends = {"napi_budget": int(cnt[kind == OBS_BUDGET].sum()), "below_64k": int(cnt[near].sum()),
                "psh": int(cnt[(kind == OBS_D_PSH) & ~near].sum()), "other": int(cnt[(kind == OBS_D) & ~near].sum())}
        words = {"napi_budget": f"{self.weight} segments (NAPI budget)", "below_64k": "within one segment of 64 KiB",
                 "psh": "PSH (end of a write)", "other": "shorter, no PSH (a poll end or the host's size limit)"}
        parts = [f"{v:,} at {words[k]}" if k in ("napi_budget",) else f"{v:,} {words[k]}"
                 for k, v in sorted(ends.items(), key=lambda t: -t[1]) if v]
        return {"ends": ends, "ends_text": ", ".join(parts), "max_segments": int(value[kind == OBS_NSEG].max())}

    def version(self, ver: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(aggregates, histogram) of one IP version, None without rows."""
        j = _VERSIONS.index(ver)
        return (self.v[j], self.hist[j]) if self.v[j, V_COUNT] else None

    def state(self) -> dict[str, np.ndarray]:
        """Everything, as arrays (a split run's part writes it; ``merge`` adds the parts up in capture order)."""
        nz = [np.flatnonzero(h) for h in self.hist]
        return {"obs_scalars": np.array([self.n, self.nseg_max, self.l3_max, self.big, self.batches], np.int64),
                "obs_versions": self.v.copy(),
                "obs_hist_v4_at": nz[0], "obs_hist_v4": self.hist[0][nz[0]],
                "obs_hist_v6_at": nz[1], "obs_hist_v6": self.hist[1][nz[1]],
                "obs_keys": self.flows.keys, "obs_counts": self.flows.sums[:, 0], "obs_first": self.flows.first}

    def merge(self, st: dict[str, np.ndarray], fmap: np.ndarray, row_base: int) -> None:
        """Add a later part's ``state()`` (its flow ids mapped by ``fmap``, its rows numbered from ``row_base``)."""
        n, nseg_max, l3_max, big, batches = (int(x) for x in st["obs_scalars"])
        self.n += n
        self.nseg_max, self.l3_max = max(self.nseg_max, nseg_max), max(self.l3_max, l3_max)
        self.big += big
        self.batches += batches
        for j in range(len(_VERSIONS)):
            a, b = self.v[j], st["obs_versions"][j]
            if b[V_COUNT] == 0:
                continue
            if b[V_LMAX] > a[V_LMAX]:  # an earlier part's largest wins a tie (the first row of it)
                a[V_LMAX], a[V_SMAX] = b[V_LMAX], b[V_SMAX]
            a[V_MSS], a[V_NMAX] = max(a[V_MSS], b[V_MSS]), max(a[V_NMAX], b[V_NMAX])
            a[V_COUNT] += b[V_COUNT]
            a[V_BUDGET] += b[V_BUDGET]
            tag = f"obs_hist_v{_VERSIONS[j]}"
            self.hist[j][st[tag + "_at"]] += st[tag]
        self.flows.add_mapped(st["obs_keys"], st["obs_counts"].astype(np.int64).reshape(-1, 1),
                              st["obs_first"].astype(np.int64) + row_base, fmap)


class SuperPacketTally:
    """Bytes and rows per (flow, flush reason), segments at NAPI budget, and observed super-packet sizes.

    A rebuilt row whose next segment could not have joined it anyway (``l3_len`` + one more segment >= the
    modelled limit of its IP version) is at the size limit, whatever the engine's reason (a PSH on the 45th
    segment of a 64 KiB super-packet): such rows are counted under ``size_limit``, and the reason the engine gave
    is kept too (``also(flow)``: ``{"psh": rows}``).
    """

    def __init__(self, cfg: GroConfig | None = None,
                 keep: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        cfg = cfg or GroConfig()
        self.napi_weight = cfg.napi_weight
        self.limits = (cfg.ipv4_limit, cfg.gro_max_size)
        # (flow << 7 | code) -> [rows, bytes, rows at budget] and a first-seen ordinal. code < 64: the reason the
        # row is counted under; 64 + r: engine reason r of a row counted under size_limit (``also``)
        self._sums = KeyedSums(3, keep)
        self._rows = 0
        self.observed = ObservedSizes(cfg.napi_weight, keep)
        self._params = np.array([cfg.napi_weight, *self.limits, R.SIZE_LIMIT, R.OBSERVED, SOURCE_OBSERVED,
                                 self._sums.shift, OBS_BITS, OBS_SHIFT, OBS_VALUE_MAX, GRO_LEGACY_MAX_SIZE, TH_PSH,
                                 OBS_D, OBS_D_PSH, OBS_BUDGET, OBS_MSS, OBS_NSEG], np.int64)  # keyed.tally_keys' P

    def add(self, spb: SuperPacketBatch) -> None:
        """Count one batch of rows (already labelled ``observed`` where the capture aggregated them): the keys come
        from one compiled pass (``keyed.tally_keys``)."""
        n = len(spb)
        if not n:
            return
        obs = self.observed
        tk, ts, tf = np.empty(2 * n, np.int64), np.empty((2 * n, 3), np.int64), np.empty(2 * n, np.int64)
        ok, of = np.empty(3 * n, np.int64), np.empty(3 * n, np.int64)
        sc = np.array([obs.n, obs.nseg_max, obs.l3_max, obs.big], np.int64)
        c = np.ascontiguousarray
        got = int(tally_keys(c(spb.flow_id, np.int64), c(spb.ip_version, np.uint8), c(spb.payload_len, np.uint32),
                             c(spb.n_segments, np.uint32), c(spb.l3_len, np.uint32), c(spb.flush_reason, np.uint8),
                             c(spb.source, np.uint8), c(spb.tcp_flags, np.uint16), np.int64(self._rows),
                             self._params, tk, ts, tf, ok, of, obs.v, obs.hist, sc))
        t, o = got & 0xFFFFFFFF, got >> 32
        self._sums.add(tk[:t], ts[:t], tf[:t])
        self._rows += n
        if o:
            obs.n, obs.nseg_max, obs.l3_max, obs.big = (int(x) for x in sc)
            obs.batches += 1
            obs.flows.add(ok[:o], np.ones((o, 1), np.int64), of[:o])

    def reasons(self, flow: int) -> list[tuple[str, list[int]]]:
        """(reason, [rows, bytes, rows at the NAPI budget]) of one flow, most bytes first."""
        code, sums, first = self._sums.of_flow(flow)
        sel = code < 64
        order = np.lexsort((first[sel], -sums[sel, 1]))
        return [(R.REASON_NAMES[int(c)], [int(v) for v in row])
                for c, row in zip(code[sel][order], sums[sel][order], strict=True)]

    def also(self, flow: int) -> dict[str, int]:
        """{engine reason: rows} of one flow's rows counted under size_limit, in order of first appearance."""
        code, sums, first = self._sums.of_flow(flow)
        sel = np.flatnonzero(code >= 64)
        sel = sel[np.argsort(first[sel], kind="stable")]
        return {R.REASON_NAMES[int(code[i]) - 64]: int(sums[i, 0]) for i in sel}

    def state(self) -> dict[str, np.ndarray]:
        """What a split run's merge needs of a part's tally (``merged``): the sums per key, the rows counted and
        the observed sizes; written by the part as ``diagnosis_state.npz``."""
        return {"keys": self._sums.keys, "sums": self._sums.sums, "first": self._sums.first,
                "rows": np.int64(self._rows), **self.observed.state()}

    @classmethod
    def merged(cls, states: list[dict[str, np.ndarray]], flow_maps: list[np.ndarray],
               cfg: GroConfig | None = None) -> SuperPacketTally:
        """The tally of the whole capture from its parts' ``state()`` (kept unpruned) in capture order:
        ``flow_maps[k]`` maps part k's flow ids to the whole capture's (``merge.py``); rows are numbered on
        from the earlier parts', so ties rank as in the serial run."""
        t = cls(cfg)
        base = 0
        for st, fmap in zip(states, flow_maps, strict=True):
            t._sums.add_mapped(st["keys"], st["sums"].astype(np.int64), st["first"].astype(np.int64) + base, fmap)
            t.observed.merge(st, fmap, base)
            base += int(st["rows"])
        t._rows = base
        return t


@dataclass
class WhatIfInput:
    """The first ``limit`` decoded packets of the capture with their flow ids, for re-running the GRO stage."""

    limit: int = WHATIF_MAX_PACKETS
    batches: list[tuple[PacketBatch, np.ndarray, np.ndarray | None]] = field(default_factory=list)
    kept: int = 0
    seen: int = 0
    _acked: np.ndarray | None = None  # the kept packets' ACK evidence (gro/evidence.py), made at the first run

    def add(self, pb: PacketBatch, fid: np.ndarray, receivers: np.ndarray | None = None) -> None:
        """Keep (a prefix of) this batch while the budget lasts, with its receiver index per packet (the GRO
        stage's routing, gro/receivers.py; None when the run does not split receivers)."""
        self.seen += len(pb)
        room = self.limit - self.kept
        if room <= 0 or not len(pb):
            return
        if len(pb) > room:
            idx = np.arange(room)
            pb, fid = pb.take(idx), fid[:room]
            receivers = receivers[:room] if receivers is not None else None
        self.batches.append((pb, np.asarray(fid).copy(), None if receivers is None else receivers.copy()))
        self.kept += len(pb)

    FEED_ROWS = 1 << 14  # the engine is fed the kept packets this many at a time (its buffers follow the feed)

    def run(self, cfg: GroConfig, engine: str = "compiled") -> SuperPacketBatch:
        """The super-packets the GRO stage builds from the kept packets with ``cfg`` (observed rows labelled):
        the same receivers and ACK evidence as the full run (gro/stage.py)."""
        from .gro.evidence import acked_ends

        if not self.batches:
            return SuperPacketBatch.empty(0)
        if len(self.batches) > 1:  # joined once, for every what-if run
            self.batches = [(_join_releasing([b for b, _, _ in self.batches]),
                             np.concatenate([f for _, f, _ in self.batches]),
                             None if any(r is None for _, _, r in self.batches)
                             else np.concatenate([r for _, _, r in self.batches]))]
        pb, fid, rx = self.batches[0]
        rx = rx if cfg.split_receivers else None
        if cfg.ack_evidence and self._acked is None:
            self._acked = acked_ends(pb)
        acked = self._acked if cfg.ack_evidence else None
        eng = make_engine(engine, cfg)
        out = []
        for s in range(0, len(pb), self.FEED_ROWS):  # the engine's rows do not depend on how its input is split
            e = s + self.FEED_ROWS
            out.append(eng.feed(pb.take(slice(s, e)), fid[s:e], acked=None if acked is None else acked[s:e],
                                receiver=None if rx is None else rx[s:e]))
        out.append(eng.flush())
        return label_observed(SuperPacketBatch.concat(out))


def _join_releasing(batches: list[PacketBatch]) -> PacketBatch:
    """``PacketBatch.concat``, dropping each column from the parts once it is joined (the parts are not used
    again), so the join does not hold two copies of every column at once."""
    cols = {}
    for f in fields(PacketBatch):
        cols[f.name] = np.concatenate([getattr(b, f.name) for b in batches])
        for b in batches:
            setattr(b, f.name, None)
    return PacketBatch(**cols)


def label_observed(spb: SuperPacketBatch) -> SuperPacketBatch:
    """Rows that are one already aggregated input packet get the reason ``observed`` (in place; returned)."""
    if len(spb):
        spb.flush_reason[spb.source == SOURCE_OBSERVED] = R.OBSERVED
    return spb


# --- what the observed sizes say about the capturing host -----------------------------------------------------
def infer_capture(tally: SuperPacketTally, cfg: GroConfig, payload_packets: int,
                  top: dict[str, list] | None = None) -> dict[str, Any]:
    """Is the capture post-GRO (or TSO-side), the evidence, and the limits the observed sizes imply. ``top``: the
    top flows as columns (``mss``, ``max_payload_len``, ...), for the caveat on segment counts without a SYN."""
    obs = tally.observed
    n = obs.n
    out: dict[str, Any] = {"post_gro": False, "observed_superpackets": n, "evidence": [], "host": [],
                           "contradictions": []}
    if n == 0:
        out["kind"] = "pre-GRO (segments)" if payload_packets else "no TCP payload"
        out["evidence"].append("no packet carries more than one MSS segment: every super-packet is rebuilt")
        return out
    out["post_gro"] = True
    out["kind"] = "post-GRO (or TSO-side)"
    share = n / max(1, payload_packets)
    out["evidence"].append(f"{n:,} of {payload_packets:,} payload packets ({share:.0%}) already carry more than "
                           f"one MSS segment (observed super-packets, up to {obs.nseg_max} segments and "
                           f"{obs.l3_max:,} bytes of IP length)")
    if obs.big:
        out["evidence"].append(f"{obs.big:,} of them exceed 64 KiB (BIG TCP encodings)")
    nosyn = [i for i, m in enumerate((top or {}).get("mss", [])) if not m and (top["max_payload_len"][i] or 0)
             > rules.r2_fallback_limit(cfg.mtu, False)]
    if nosyn and cfg.mtu <= 1500:
        # R2 without a SYN: the segment size comes from plain segments or the fallback MTU (a TSO-side capture
        # has few plain segments, and on a jumbo-frame link that MTU's MSS makes every count several times too big)
        out["evidence"].append(f"{len(nosyn)} of the top flows show no SYN (no MSS in the capture): their segment "
                               f"counts and the limits below assume the MSS a {cfg.mtu}-byte MTU leaves unless "
                               "plain segments show a larger one; on a jumbo-frame link pass --fallback-mtu (e.g. "
                               "9000)")
    for ver in (6, 4):
        got = obs.version(ver)
        if got is not None:
            out["host"].append(_infer_version(ver, *got, tally.napi_weight, cfg, out["contradictions"]))
    return out


def _infer_version(ver: int, agg: np.ndarray, hist: np.ndarray, weight: int, cfg: GroConfig,
                   contradictions: list[str]) -> dict[str, Any]:
    """The host's limits for one IP version, from its observed sizes (``ObservedSizes``: ``agg`` the counts
    and maxima, ``hist`` the rows per IP length below 64 KiB)."""
    lmax, smax, mss, at_budget, nmax, count = (int(agg[i]) for i in (V_LMAX, V_SMAX, V_MSS, V_BUDGET, V_NMAX,
                                                                     V_COUNT))
    near64 = int(hist[max(0, GRO_LEGACY_MAX_SIZE - mss):].sum()) if mss > 0 else 0
    knob = "gro_max_size" if ver == 6 else "gro_ipv4_max_size"
    # a capture on the sending host (TSO side, loopback: no GRO there) shows its GSO size instead
    gso = f" (its gso{'' if ver == 6 else '_ipv4'}_max_size where the capture is the sending host's, as on loopback)"
    limit = cfg.gro_max_size if ver == 6 else cfg.ipv4_limit
    d: dict[str, Any] = {"ip_version": ver, "largest_l3_len": lmax, "segments_of_largest": smax,
                         "max_segments": nmax, "at_napi_budget": at_budget, "mss": mss,
                         "limit_at_least": lmax + 1}
    if smax >= weight and at_budget >= 2:
        d["stops_at"] = "napi_budget"
        d["text"] = (f"IPv{ver}: super-packets stop at {weight} segments ({at_budget:,} of {count:,} have "
                     f"exactly {weight}, the largest {lmax:,} bytes): the NAPI budget at HZ < 1000, not "
                     f"{knob}; the host's {knob} is at least {lmax + 1:,}")
    elif lmax < GRO_LEGACY_MAX_SIZE and near64:
        d["stops_at"] = "size_limit"
        d["limit_at_most"] = GRO_LEGACY_MAX_SIZE
        d["text"] = (f"IPv{ver}: super-packets stop just below 64 KiB ({near64:,} within one {mss}-byte segment "
                     f"of 65536, the largest {lmax:,} bytes): the host's {knob} is 65536, not raised"
                     + (" (gro_max_size does not raise it: set gro_ipv4_max_size)" if ver == 4 else ""))
    elif lmax >= GRO_LEGACY_MAX_SIZE:
        d["stops_at"] = "size_limit"
        d["limit_at_most"] = lmax + mss
        d["text"] = (f"IPv{ver}: super-packets stop at {lmax:,} bytes ({smax} segments), above 64 KiB: the host's "
                     f"{knob}{gso} is between {lmax + 1:,} and {lmax + mss:,} (the next {mss}-byte segment would "
                     "reach it)")
    else:
        d["stops_at"] = "other"
        d["text"] = (f"IPv{ver}: the largest observed super-packet is {lmax:,} bytes ({smax} segments), far from "
                     "64 KiB and below the NAPI budget: limited by the sender's writes or poll ends, not by a size "
                     "limit")
    if lmax >= limit:
        contradictions.append(f"IPv{ver}: observed super-packets of {lmax:,} bytes, but the model assumed "
                              f"{knob} {limit:,} (its largest is {limit - 1:,}): re-run with --{knob.replace('_', '-')}"
                              f" {max(lmax + 1, BIG_TCP_SIZE) if lmax + 1 <= BIG_TCP_SIZE else lmax + 1}")
    return d


# --- per-flow diagnosis with what-ifs -------------------------------------------------------------------------
def _whatif_configs(reason: str, ver: int, cfg: GroConfig) -> list[tuple[str, str, GroConfig]]:
    """(knob, description, changed config) for a reason a receiver setting can change."""
    out = []
    if reason == "size_limit":
        if ver == 6:
            cur = cfg.gro_max_size
            v = BIG_TCP_SIZE if cur < BIG_TCP_SIZE else GRO_MAX_SIZE
            if v > cur:
                out.append(("gro_max_size", f"gro_max_size {v}",
                            replace(cfg, gro_max_size=v, gro_ipv4_max_size=cfg.ipv4_limit)))
        else:
            cur = cfg.ipv4_limit
            v = BIG_TCP_SIZE if cur < BIG_TCP_SIZE else GRO_MAX_SIZE
            if v > cur:
                out.append(("gro_ipv4_max_size", f"gro_ipv4_max_size {v}", replace(cfg, gro_ipv4_max_size=v)))
    elif reason == "napi_poll":
        if cfg.hz < 1000:
            out.append(("hz", "HZ 1000", replace(cfg, hz=1000)))
        if cfg.gro_flush_timeout_ns == 0:
            out.append(("gro_flush_timeout", "gro_flush_timeout 200000 ns + napi_defer_hard_irqs 2",
                        replace(cfg, gro_flush_timeout_ns=200_000, napi_defer_hard_irqs=2)))
    elif reason == "bucket_evict":
        out.append(("rx_queues", f"rx_queues {cfg.rx_queues * 4}", replace(cfg, rx_queues=cfg.rx_queues * 4)))
    return out


def _flow_stats(spb: SuperPacketBatch, fid: int) -> dict[str, Any]:
    sel = (spb.flow_id == fid) & (spb.source != SOURCE_OBSERVED)
    l3 = spb.l3_len[sel].astype(np.int64)
    if not l3.size:
        return {"superpackets": 0, "p50_l3_len": None, "max_l3_len": None, "mean_segments": None}
    return {"superpackets": int(l3.size), "p50_l3_len": int(np.median(l3)), "max_l3_len": int(l3.max()),
            "mean_segments": round(float(spb.n_segments[sel].mean()), 1)}


def diagnose(tally: SuperPacketTally, flow_cols: dict[str, list], cfg: GroConfig, whatif: WhatIfInput | None,
             engine: str = "compiled", top: int = TOP_FLOWS) -> dict[str, Any]:
    """The diagnosis section: per top flow, ranked reasons with words, knob and measured what-if."""
    n = len(flow_cols["flow_id"])
    order = sorted(range(n), key=lambda i: -flow_cols["payload_bytes"][i])
    order = [i for i in order if flow_cols["payload_bytes"][i] > 0][:top]
    runs: dict[str, SuperPacketBatch] = {}
    base = None
    # what-ifs compare the timing model with and without a change: the ACK evidence records where the capture's
    # own receiver, at its own settings, ended its super-packets, and under another setting it would pin the
    # same ends (a 65536 receiver's ACKed size-limit ends stayed poll ends at 185000: no gain shown)
    wcfg = replace(cfg, ack_evidence=False)
    if whatif is not None and whatif.kept:
        base = whatif.run(wcfg, engine)
    flows_out = []
    for i in order:
        fid = int(flow_cols["flow_id"][i])
        ver = int(flow_cols["ip_version"][i])
        items = tally.reasons(fid)
        total = sum(v[1] for _, v in items) or 1
        reasons = []
        for name, (rows, nbytes, at_budget) in items:
            words, _ = REASON_TEXT.get(name, (name, None))
            entry: dict[str, Any] = {"reason": name, "superpackets": rows, "bytes": nbytes,
                                     "share": round(nbytes / total, 4), "text": words, "knobs": []}
            if name == "size_limit":
                entry["knob"] = "gro_max_size" if ver == 6 else "gro_ipv4_max_size"
                lim = cfg.gro_max_size if ver == 6 else cfg.ipv4_limit
                entry["text"] = f"the IPv{ver} size limit {lim:,} ({entry['knob']}"
                entry["text"] += ", which gro_max_size does not raise)" if ver == 4 else ")"
                also = tally.also(fid)
                if also:
                    entry["also"] = also
                    entry["text"] += (": " + ", ".join(f"{v:,} ended by {k}" for k, v in also.items())
                                      + " one segment below it")
            elif name == "napi_poll":
                entry["at_napi_budget"] = at_budget
                if at_budget * 2 >= rows and cfg.hz < 1000:
                    entry["text"] = (f"the NAPI budget: {at_budget:,} of {rows:,} reached {cfg.napi_weight} "
                                     f"segments, and at HZ {cfg.hz} (< 1000) a full-budget poll flushes everything")
                    entry["knob"] = "napi budget / HZ"
                else:
                    entry["text"] = "the end of a NAPI poll (an idle gap or a short poll: R21.2)"
                    entry["knob"] = "gro_flush_timeout + napi_defer_hard_irqs"
            elif name == "observed":
                entry.update(tally.observed.flow_ends(fid))
                entry["text"] = "already aggregated in the capture: " + entry["ends_text"]
            elif name == "psh" or name == "short_segment":
                entry["knob"] = "application writes (sender)"
            elif name == "option_change":
                entry["knob"] = "TSval ticks (sender's TCP timestamps)"
            elif name == "ip_change":
                entry["knob"] = "CE marks (ECN at a queue) / TOS"
            elif name == "seq_gap":
                entry["knob"] = "drops / reordering"
            else:
                entry["knob"] = REASON_TEXT.get(name, ("", None))[1]
            if base is not None and entry["share"] >= 0.01:
                for knob, desc, cfg2 in _whatif_configs(name, ver, wcfg):
                    if desc not in runs:
                        runs[desc] = whatif.run(cfg2, engine)
                    before, after = _flow_stats(base, fid), _flow_stats(runs[desc], fid)
                    entry["knobs"].append({"knob": knob, "change": desc, "suggest": KNOB_TEXT[knob].format(
                        v=desc.split()[-1]), "before": before, "after": after,
                        "text": _whatif_text(desc, before, after)})
                if (name == "size_limit" and entry["knobs"] and entry.get("also")
                        and all((k["after"]["max_l3_len"] or 0) <= (k["before"]["max_l3_len"] or 0)
                                for k in entry["knobs"])):
                    entry["text"] += ("; raising it alone builds nothing larger here: the sender's own bursts end "
                                      "at the same size (PSH), so its gso_max_size / TSO size must go up too")
            reasons.append(entry)
        f = {k: flow_cols[k][i] for k in ("flow_id", "src", "dst", "sport", "dport", "if_id", "ifindex", "direction",
                                          "ip_version", "payload_bytes")}
        f["reasons"] = reasons
        f["text"] = _flow_text(f)
        flows_out.append(f)
    d: dict[str, Any] = {"flows": flows_out, "model": {"gro_max_size": cfg.gro_max_size,
                                                        "gro_ipv4_max_size": cfg.ipv4_limit, "hz": cfg.hz,
                                                        "napi_weight": cfg.napi_weight}}
    if whatif is not None:
        d["what_if_input"] = {"packets": whatif.kept, "of": whatif.seen,
                              "note": ("what-ifs re-run the GRO stage on all decoded packets" if whatif.kept ==
                                       whatif.seen else f"what-ifs re-run the GRO stage on the first "
                                       f"{whatif.kept:,} of {whatif.seen:,} packets (before/after on the same "
                                       "packets)") + (", by timing alone: the ACK evidence records the capture's "
                                                      "own receiver at its own settings"
                                                      if cfg.ack_evidence else "")}
    return d


def _whatif_text(desc: str, before: dict, after: dict) -> str:
    if not before["superpackets"] and not after["superpackets"]:
        return f"with {desc}: nothing to rebuild (the input is already aggregated)"
    return (f"with {desc}: {after['superpackets']:,} super-packets instead of {before['superpackets']:,}, "
            f"median {_n(before['p50_l3_len'])} -> {_n(after['p50_l3_len'])} bytes, largest "
            f"{_n(before['max_l3_len'])} -> {_n(after['max_l3_len'])}")


def _n(v) -> str:
    return "-" if v is None else f"{v:,}"


def _flow_text(f: dict) -> str:
    rs = [r for r in f["reasons"] if r["reason"] not in ("end_of_capture",)] or f["reasons"]
    if not rs:
        return "no super-packets"
    top = rs[0]
    s = f"{top['share']:.0%} of the bytes: {top['text']}"
    best = max(top["knobs"], key=lambda k: (k["after"]["p50_l3_len"] or 0), default=None)
    if best is not None and best["after"]["superpackets"] and (best["after"]["p50_l3_len"] or 0) > (
            best["before"]["p50_l3_len"] or 0):
        s += f"; {best['text']}"
    elif top.get("knob") and not top["knobs"]:
        s += f" (what changes it: {top['knob']})"
    return s

