"""CompiledGroEngine against the reference GroEngine: identical SuperPacketBatch, every column, every row.

Inputs: every kernel capture in tests/fixtures/kernel (both directions, decoded as the CLI does, flow ids
from FlowTable) and randomized synthetic streams (many interleaved flows, random flags, header changes, gaps,
retransmissions, IP-ID modes, GSO inputs, give-up and non-TCP packets, timestamps around poll_gap_us and
jiffy/timeout boundaries), under many configs, with the input split into batches at random points. The
reference engine is batch-boundary invariant (test_rules.test_batches_of_any_size_give_the_same_rows), so
each split run of the compiled engine is compared with one whole-input reference run; a random split of the
reference itself is compared too.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from bigtcp_pcap.capture import CaptureReader
from bigtcp_pcap.decode import PacketBatch, decode
from bigtcp_pcap.decode.schema import (
    ST_IP_FRAGMENT,
    ST_TRUNC_L4,
    TH_ACK,
    TH_CWR,
    TH_ECE,
    TH_FIN,
    TH_PSH,
    TH_RST,
    TH_SYN,
    TH_URG,
)
from bigtcp_pcap.flows.table import FlowTable
from bigtcp_pcap.gro import GroConfig, GroEngine, SuperPacketBatch
from bigtcp_pcap.gro.compiled import CompiledGroEngine, prepare_compiled
from bigtcp_pcap.gro.prepare import KIND_TCP, prepare
from bigtcp_pcap.gro.superpacket import COLUMN_TYPES
from bigtcp_pcap.gro.synth import build_batch

KERNEL_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "kernel"
CAPTURES = sorted(p.name for p in KERNEL_DIR.glob("*.pcap"))
US = 1000


# --- helpers ----------------------------------------------------------------------------------------------------
def run(engine_cls, cfg: GroConfig, batch: PacketBatch, fid: np.ndarray, cuts=(), poll_start=None) -> SuperPacketBatch:
    """Feed ``batch`` split at ``cuts`` (sorted row indexes), then flush; all rows. ``poll_start``: marks."""
    eng = engine_cls(cfg)
    bounds = [0, *cuts, len(batch)]
    parts = [eng.feed(batch.take(slice(a, b)), fid[a:b], None if poll_start is None else poll_start[a:b])
             for a, b in itertools.pairwise(bounds)]
    parts.append(eng.flush())
    assert eng.held == 0
    return SuperPacketBatch.concat(parts)


def assert_same(ref: SuperPacketBatch, got: SuperPacketBatch, label: str) -> None:
    assert len(got) == len(ref), f"{label}: {len(got)} rows, reference {len(ref)}"
    for name, dtype in COLUMN_TYPES.items():
        a, b = getattr(ref, name), getattr(got, name)
        assert b.dtype == dtype, f"{label}: column {name} dtype {b.dtype}"
        if not np.array_equal(a, b):
            i = int(np.flatnonzero(a != b)[0])
            raise AssertionError(f"{label}: column {name} differs first at row {i}:\n reference {ref.row(i)}\n"
                                 f" compiled  {got.row(i)}")


def random_cuts(rng: np.random.Generator, n: int, k: int) -> list[int]:
    return sorted(set(rng.integers(1, max(n, 2), size=k).tolist())) if n > 1 else []


def every(step: int, n: int) -> list[int]:
    return list(range(step, n, step))


# --- kernel captures --------------------------------------------------------------------------------------------
_DECODED: dict[str, tuple[PacketBatch, np.ndarray]] = {}


def load_capture(name: str) -> tuple[PacketBatch, np.ndarray]:
    """All frames of a capture (both directions) and FlowTable flow ids, as ``analyze`` produces them."""
    if name not in _DECODED:
        pb = PacketBatch.concat([decode(rb)[0] for rb in CaptureReader(str(KERNEL_DIR / name))])
        _DECODED[name] = (pb, FlowTable().assign(pb))
    return _DECODED[name]


def pair_settings(name: str) -> dict:
    """The receiver's settings recorded next to a capture pair (as test_kernel_pairs.pair_config), or {}."""
    js = KERNEL_DIR / (name.split(".")[0] + ".json")
    if not js.exists():
        return {}
    meta = json.loads(js.read_text())
    lim = meta["limits_read_back"]["vb"]
    sysfs = meta["interfaces"]["vb"]["sysfs"]
    return {"kernel": meta["kernel"], "gro_max_size": lim["gro_max_size"],
            "gro_ipv4_max_size": lim["gro_ipv4_max_size"], "hz": meta["hz"]["hz"],
            "gro_flush_timeout_ns": int(sysfs["gro_flush_timeout"]),
            "napi_defer_hard_irqs": int(sysfs["napi_defer_hard_irqs"]), "poll_gap_us": 20.0}


CONFIGS: dict[str, dict] = {
    "default": {},
    "g80000": {"gro_max_size": 80000},
    "g185000": {"gro_max_size": 185000},
    "v4_185000": {"gro_max_size": 185000, "gro_ipv4_max_size": 185000},
    "hz1000": {"gro_max_size": 185000, "gro_ipv4_max_size": 185000, "hz": 1000, "jiffy_phase_ns": 123_456},
    "timeout_defer": {"gro_max_size": 185000, "gro_flush_timeout_ns": 200_000, "napi_defer_hard_irqs": 2},
    "timeout_hz1000": {"gro_flush_timeout_ns": 50_000, "hz": 1000},
    "rxq2": {"rx_queues": 2, "gro_max_size": 185000},
    "evict": {"gro_hash_buckets": 1, "max_gro_skbs": 1},
    "inf_skbs": {"max_gro_skbs": math.inf, "gro_hash_buckets": 1, "poll_gap_us": math.inf},
    "k6_17": {"kernel": "6.17"},
    "k7_0": {"kernel": "7.0", "gro_max_size": 185000},
    "weight16": {"napi_weight": 16, "poll_gap_us": 7.5},
    "nic": {"rx_usecs": 30, "rx_frames": 40, "poll_gap_us": 200.0, "gro_max_size": 185000},
    "nic_timeout": {"rx_usecs": 50, "gro_flush_timeout_ns": 100_000, "napi_defer_hard_irqs": 1},
    "odd": {"treat_padding_as_flush": False, "input_is_gso": False, "hbh_headroom_ok": False,
            "gro_max_size": 185000, "fallback_mtu": 9000},
}


@pytest.mark.parametrize("capture", CAPTURES)
def test_kernel_capture_identical(capture):
    pb, fid = load_capture(capture)
    rng = np.random.default_rng(len(pb))
    configs = dict(CONFIGS)
    if pair_settings(capture):
        configs["pair"] = pair_settings(capture)
    for cname, kw in configs.items():
        cfg = GroConfig(**kw)
        ref = run(GroEngine, cfg, pb, fid)
        assert len(ref) > 0
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid), f"{capture}/{cname}/whole")
        cuts = random_cuts(rng, len(pb), 12)
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, cuts), f"{capture}/{cname}/random {cuts}")
        if cname in ("default", "timeout_defer", "hz1000"):
            assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, every(7, len(pb))), f"{capture}/{cname}/7")
        if cname == "default":
            assert_same(ref, run(GroEngine, cfg, pb, fid, cuts), f"{capture}/{cname}/reference random split")


@pytest.mark.parametrize("capture", [c for c in CAPTURES if c.endswith(".snd.pcap")][:3] + ["sample.pcap"])
def test_kernel_capture_batch_size_1(capture):
    pb, fid = load_capture(capture)
    for cname in ("default", "timeout_defer"):
        cfg = GroConfig(**CONFIGS[cname])
        ref = run(GroEngine, cfg, pb, fid)
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, every(1, len(pb))), f"{capture}/{cname}/1")


@pytest.mark.parametrize("order", ["time", "round_robin"])
def test_interleaved_kernel_captures_identical(order):
    """Three sender captures replayed at once: concurrent real flows, so polls mix flows and small tables
    evict (R18). ``time``: timestamps aligned, merged in time order; ``round_robin``: one packet of each in
    turn, 1.5 us apart (bursts overlap, polls end by budget)."""
    names = [c for c in CAPTURES if c.endswith(".snd.pcap")][:3]
    parts, local = [], []
    for k, name in enumerate(names):
        pb, _ = load_capture(name)
        pb = pb.take(slice(0, len(pb)))
        pb.ts_ns = pb.ts_ns - pb.ts_ns[0] + 1_700_000_000_000_000_000 + 3_000 * k
        pb.sport = pb.sport + np.uint16(k)  # the runs reused their ports: keep their flows apart
        parts.append(pb)
        local.append(np.arange(len(pb)) * len(names) + k)
    pb = PacketBatch.concat(parts)
    if order == "time":
        pb = pb.take(np.argsort(pb.ts_ns, kind="stable"))
    else:
        pb = pb.take(np.argsort(np.concatenate(local), kind="stable"))
        pb.ts_ns = 1_700_000_000_000_000_000 + 1_500 * np.arange(len(pb), dtype=np.int64)
    pb.frame = np.arange(1, len(pb) + 1, dtype=np.uint64)
    fid = FlowTable().assign(pb)
    rng = np.random.default_rng(5)
    evictions = 0
    for cname in ("default", "evict", "hz1000", "timeout_defer", "rxq2", "weight16", "k7_0"):
        cfg = GroConfig(**CONFIGS[cname])
        ref = run(GroEngine, cfg, pb, fid)
        evictions += int((ref.flush_reason == 21).sum())
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid), f"interleaved/{cname}/whole")
        cuts = random_cuts(rng, len(pb), 30)
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, cuts), f"interleaved/{cname}/random {cuts}")
    assert order == "time" or evictions > 100


# --- randomized synthetic streams ------------------------------------------------------------------------------
class _Flow:
    """One direction of a synthetic connection with its own header state."""

    def __init__(self, rng: np.random.Generator, fid: int, rev: _Flow | None = None) -> None:
        r = rng
        if rev is None:
            self.v = int(r.choice([4, 6]))
            base = 0x0A000000 if self.v == 4 else 0xFD00_00B1 << 96
            self.src = base + int(r.integers(1, 4))
            self.dst = base + 100 + int(r.integers(1, 3))
            self.sport = int(r.integers(40000, 40008))
            self.dport = int(r.choice([5201, 443]))
            self.l2 = int(r.choice([0x1234, 0x1234, 0x1234, 0x5678]))
            self.vlan = int(r.choice([0xFFFF, 0xFFFF, 0xFFFF, 10]))
            self.if_id = int(r.choice([0, 0, 0, 1]))
        else:  # the reverse direction of ``rev``
            self.v, self.src, self.dst = rev.v, rev.dst, rev.src
            self.sport, self.dport = rev.dport, rev.sport
            self.l2, self.vlan, self.if_id = rev.l2 + 1, rev.vlan, rev.if_id
        self.fid = fid
        self.mss = int(r.choice([1448 if self.v == 4 else 1428] * 6 + [1000, 536, 100, 8948]))
        self.seq = int(r.integers(0, 1 << 32))
        self.ack = int(r.integers(0, 1 << 32))
        self.win = 512
        self.hdr = int(r.choice([20, 32, 32, 40]))
        self.opt = int(r.integers(1, 1 << 63)) if self.hdr > 20 else 0
        self.ttl, self.tos = 64, 0
        self.df = int(r.choice([0, 1, 1]))
        self.idmode = int(r.choice([0, 1, 1, 2]))  # 0 fixed, 1 incrementing, 2 random
        self.ipid = int(r.integers(0, 1 << 16))
        self.label = int(r.integers(0, 1 << 20)) if self.v == 6 else 0

    def packet(self, r: np.random.Generator, t: int, noise: float) -> dict:
        u = 0.68 + 0.32 * r.random() if r.random() < 0.32 * noise else 0.0
        if u < 0.68:
            pay = self.mss
        elif u < 0.78:
            pay = int(r.integers(1, self.mss + 1))
        elif u < 0.88:
            pay = 0
        elif u < 0.94:  # already aggregated (GSO) input, a multiple of the MSS or not
            pay = self.mss * int(r.integers(2, 40)) + int(r.choice([0, 0, int(r.integers(1, self.mss))]))
        else:
            pay = self.mss + int(r.integers(1, 64))
        flags = TH_ACK
        for bit, p in ((TH_PSH, 0.06), (TH_FIN, 0.01), (TH_SYN, 0.008), (TH_RST, 0.005), (TH_URG, 0.005),
                       (TH_CWR, 0.015), (TH_ECE, 0.01)):
            if r.random() < p * noise:
                flags |= bit
        # header changes (persistent) and one-off anomalies
        c = r.random() / noise
        if c < 0.02:
            self.win = int(r.integers(0, 1 << 16))
        elif c < 0.04:
            self.ack = (self.ack + int(r.integers(1, 5000))) & 0xFFFFFFFF
        elif c < 0.07 and self.hdr > 20:
            self.opt = int(r.integers(1, 1 << 63))  # TSval tick
        elif c < 0.075:
            self.hdr = int(r.choice([20, 32, 40]))
            self.opt = int(r.integers(1, 1 << 63)) if self.hdr > 20 else 0
        elif c < 0.085:
            self.seq = (self.seq + int(r.integers(1, 3 * self.mss))) & 0xFFFFFFFF  # hole
        elif c < 0.095:
            self.seq = (self.seq - self.mss * int(r.integers(1, 4))) & 0xFFFFFFFF  # retransmission
        elif c < 0.10:
            self.ttl = int(r.choice([63, 64]))
        elif c < 0.105:
            self.tos = int(r.choice([0, 1, 2, 3]))  # ECN bits (CE = 3)
        elif c < 0.11:
            self.df ^= 1
        elif c < 0.115 and self.v == 6:
            self.label = int(r.integers(0, 1 << 20))  # flow-label change: a new GRO entry (R10)
        elif c < 0.12:
            self.idmode = int(r.integers(0, 3))
        p = {"ip_version": self.v, "src": self.src, "dst": self.dst, "sport": self.sport, "dport": self.dport,
             "l2_hash": self.l2, "vlan": self.vlan, "if_id": self.if_id, "flow_id": self.fid,
             "tcp_seq": self.seq, "tcp_ack": self.ack, "tcp_win": self.win, "tcp_hdr_len": self.hdr,
             "tcp_opt_hash": self.opt, "ttl": self.ttl, "tos": self.tos, "tcp_flags": flags,
             "tcp_payload_len": pay, "ts_ns": t}
        if self.v == 4:
            p["df"] = self.df
            p["ip_id"] = self.ipid
            step = (0, 1, int(r.integers(0, 1 << 16)))[self.idmode]
            if r.random() < 0.02:
                step += 1  # a skipped ID
            self.ipid = (self.ipid + step) & 0xFFFF
        else:
            p["flow_label"] = self.label
        if flags & TH_SYN:
            p["tcp_mss"] = int(r.choice([0, 536, 1460] + [self.mss + self.hdr - 20] * 5))
        a = r.random() / noise
        if a < 0.01:  # length field disagrees with the frame (padding, truncation): flush-marked (R7/R11)
            ipl = p.get("ip_hdr_len", 20 if self.v == 4 else 40) + self.hdr + pay
            p["ip_len_field"] = (ipl if self.v == 4 else ipl - 40) + int(r.choice([-4, 6]))
        elif a < 0.015 and self.v == 4:
            p["ip_evil"] = 1
        elif a < 0.02 and self.v == 4:
            p["ip_hdr_len"] = 24  # IP options: delivered alone (R5)
        elif a < 0.025:
            p["status"] = ST_TRUNC_L4  # TCP header cut: delivered alone (R12)
        elif a < 0.028:
            p["tunnel"] = 1  # R19: give-up
        elif a < 0.031:
            p["status"] = ST_IP_FRAGMENT  # no TCP GRO, no row
        elif a < 0.04:
            p["l4_proto"] = 17  # UDP: counts toward the budget only
        elif a < 0.045:
            p["flow_id"] = -1  # untracked traffic
        self.seq = (self.seq + pay + (1 if flags & (TH_SYN | TH_FIN) else 0)) & 0xFFFFFFFF
        return p


_DELTAS = np.array([0, 100, 1 * US, 1 * US, 1 * US, 2 * US, 5 * US, 19_999, 20 * US, 20_001, 25 * US, 50 * US,
                    199 * US, 200 * US, 201 * US, 999 * US, 1000 * US, 4000 * US, -3 * US])
_DELTA_P = np.array([3, 3, 30, 20, 10, 8, 6, 3, 3, 3, 3, 2, 1, 1, 1, 1, 1, 1, 0.3])


def synth_stream(seed: int, n: int) -> tuple[PacketBatch, np.ndarray]:
    """A randomized multi-flow segment stream (see ``_Flow``) as one PacketBatch with its flow ids."""
    r = np.random.default_rng(seed)
    flows: list[_Flow] = []
    for i in range(int(r.integers(1, 16))):
        f = _Flow(r, i)
        flows.append(f)
        if r.random() < 0.4:
            flows.append(_Flow(r, 100 + i, rev=f))
    p_delta = _DELTA_P / _DELTA_P.sum()
    noise = float(r.choice([0.1, 0.3, 1.0, 1.0]))  # calm streams build long super-packets (R15 limits)
    t = int(r.integers(0, 1 << 40)) * 1000 + int(r.integers(0, 1000))
    pkts = []
    cur = 0
    while len(pkts) < n:
        if r.random() < 0.3:  # bursty: stay on the current flow most of the time
            cur = int(r.integers(0, len(flows)))
        t += int(r.choice(_DELTAS, p=p_delta))
        pkts.append(flows[cur].packet(r, t, noise))
    pb = build_batch(pkts)
    fid = np.array([p["flow_id"] for p in pkts], np.int64)
    return pb, fid


SYNTH_CONFIGS = [GroConfig(**kw) for kw in CONFIGS.values()] + [
    GroConfig(gro_max_size=30000, hz=1000, rx_queues=3, gro_hash_buckets=4, max_gro_skbs=2),
    GroConfig(gro_flush_timeout_ns=20_000, napi_defer_hard_irqs=1, max_gro_skbs=2, gro_hash_buckets=2,
              napi_weight=8),
    GroConfig(kernel="7.0", gro_flush_timeout_ns=1_000_000, napi_defer_hard_irqs=3, hz=100, rx_queues=2),
    GroConfig(kernel="6.3", gro_max_size=16000, poll_gap_us=0, napi_weight=4),
]
SEEDS = list(range(30))


@pytest.mark.parametrize("seed", SEEDS)
def test_synthetic_stream_identical(seed):
    rng = np.random.default_rng(1000 + seed)
    pb, fid = synth_stream(seed, 1500)
    # each seed: four configs, whole and split runs
    for ci in rng.choice(len(SYNTH_CONFIGS), size=4, replace=False).tolist():
        cfg = SYNTH_CONFIGS[ci]
        ref = run(GroEngine, cfg, pb, fid)
        label = f"seed {seed} config {ci}"
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid), f"{label}/whole")
        cuts = random_cuts(rng, len(pb), int(rng.integers(1, 40)))
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, cuts), f"{label}/random {cuts}")
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, every(7, len(pb))), f"{label}/7")
    if seed % 5 == 0:
        cfg = SYNTH_CONFIGS[seed % len(SYNTH_CONFIGS)]
        cuts = random_cuts(rng, len(pb), 25)
        ref = run(GroEngine, cfg, pb, fid, cuts)
        assert_same(ref, run(GroEngine, cfg, pb, fid), f"seed {seed}: reference split vs whole")
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, every(1, len(pb))), f"seed {seed}/1")


@pytest.mark.parametrize("seed", SEEDS[:12])
def test_synthetic_stream_with_poll_starts_identical(seed):
    """feed(..., poll_start=marks): random marks (sparse to dense, bool or uint8) replace the gap rule in both
    engines alike, under every config (budget chunks, HZ >= 1000 flush_old, R21.5 timers, several queues)."""
    rng = np.random.default_rng(5000 + seed)
    pb, fid = synth_stream(seed, 1200)
    density = float(rng.choice([0.002, 0.02, 0.1, 0.5]))
    marks = rng.random(len(pb)) < density
    if seed % 2:
        marks = marks.astype(np.uint8)
    for ci in rng.choice(len(SYNTH_CONFIGS), size=4, replace=False).tolist():
        cfg = SYNTH_CONFIGS[ci]
        ref = run(GroEngine, cfg, pb, fid, poll_start=marks)
        label = f"seed {seed} config {ci} marks {density}"
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, poll_start=marks), f"{label}/whole")
        cuts = random_cuts(rng, len(pb), int(rng.integers(1, 40)))
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, cuts, poll_start=marks), f"{label}/random {cuts}")
        assert_same(ref, run(GroEngine, cfg, pb, fid, cuts, poll_start=marks), f"{label}/reference split")
    if seed % 4 == 0:
        cfg = SYNTH_CONFIGS[seed % len(SYNTH_CONFIGS)]
        ref = run(GroEngine, cfg, pb, fid, poll_start=marks)
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, every(1, len(pb)), marks), f"seed {seed}/1")


@pytest.mark.parametrize("capture", [c for c in CAPTURES if c.endswith(".snd.pcap")][:2])
def test_kernel_capture_with_poll_starts_identical(capture):
    pb, fid = load_capture(capture)
    rng = np.random.default_rng(len(pb) + 1)
    marks = rng.random(len(pb)) < 0.03
    for cname in ("default", "hz1000", "timeout_defer", "weight16"):
        cfg = GroConfig(**CONFIGS[cname])
        ref = run(GroEngine, cfg, pb, fid, poll_start=marks)
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, poll_start=marks), f"{capture}/{cname}/marks")
        cuts = random_cuts(rng, len(pb), 12)
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, cuts, marks), f"{capture}/{cname}/marks {cuts}")


def test_synthetic_streams_exercise_every_flush_reason():
    """The random streams above reach every reason code (else the differential test proves less)."""
    seen: set[int] = set()
    for seed in SEEDS[:10]:
        pb, fid = synth_stream(seed, 1500)
        for cfg in (SYNTH_CONFIGS[0], SYNTH_CONFIGS[8], SYNTH_CONFIGS[5]):
            seen |= set(run(CompiledGroEngine, cfg, pb, fid).flush_reason.tolist())
    from bigtcp_pcap.gro.reasons import OBSERVED, REASON_NAMES

    # OBSERVED is not an engine flush: the pipeline labels rows of one already aggregated input with it
    engine_codes = [c for c in range(1, len(REASON_NAMES)) if c != OBSERVED]
    missing = {REASON_NAMES[c] for c in engine_codes} - {REASON_NAMES[c] for c in seen}
    assert not missing


def test_large_batch_and_state_across_feeds():
    """64k-packet batches of a long stream: compiled == reference, split at 65536 and at random points."""
    from bigtcp_pcap.gro.synth import bulk_stream

    pb, fid = bulk_stream(150_000, nflows=30, interleave="burst")
    for cfg in (GroConfig(), GroConfig(gro_max_size=185000, hz=1000, max_gro_skbs=2)):
        ref = run(GroEngine, cfg, pb, fid, every(65536, len(pb)))
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid), "bulk/whole")
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, every(65536, len(pb))), "bulk/65536")
        assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, [1, 2, 99_999, 100_000, 100_001]), "bulk/random")


# --- API details ------------------------------------------------------------------------------------------------
def test_interface_matches_reference():
    eng, ref = CompiledGroEngine(), GroEngine()
    assert eng.config == GroConfig() and eng.held == 0 and eng.compiled
    assert CompiledGroEngine(GroConfig(gro_max_size=80000)).config.gro_max_size == 80000
    pb, fid = synth_stream(3, 50)
    with pytest.raises(ValueError, match="one entry per packet"):
        eng.feed(pb, fid[:-1])
    with pytest.raises(ValueError, match="poll_start must have one entry per packet"):
        eng.feed(pb, fid, np.zeros(len(pb) + 1, bool))
    empty = eng.feed(pb.take(slice(0, 0)), fid[:0])
    assert len(empty) == 0 and isinstance(empty, SuperPacketBatch)
    assert_same(ref.feed(pb, fid), eng.feed(pb, fid.astype(np.int32)), "int32 flow ids")
    assert eng.held == ref.held > 0
    assert_same(ref.flush(), eng.flush(), "flush")
    assert len(eng.flush()) == 0


@pytest.mark.parametrize("kw", [{"hz": 10**7, "jiffy_phase_ns": 5}, {"jiffy_phase_ns": -(1 << 70)},
                                {"gro_flush_timeout_ns": 1 << 64, "napi_defer_hard_irqs": 1}])
def test_overflow_prone_config_falls_back_to_the_reference(kw):
    cfg = GroConfig(**kw)
    eng = CompiledGroEngine(cfg)
    assert not eng.compiled
    pb, fid = synth_stream(4, 300)
    assert_same(run(GroEngine, cfg, pb, fid), run(CompiledGroEngine, cfg, pb, fid), "fallback")
    assert CompiledGroEngine(GroConfig(max_gro_skbs=1 << 70)).compiled


def test_held_counts_match_after_each_feed():
    cfg = GroConfig(gro_max_size=185000, hz=1000, rx_queues=2)
    pb, fid = synth_stream(7, 800)
    ref, com = GroEngine(cfg), CompiledGroEngine(cfg)
    for a in range(0, len(pb), 37):
        sl = slice(a, a + 37)
        assert_same(ref.feed(pb.take(sl), fid[sl]), com.feed(pb.take(sl), fid[sl]), f"feed at {a}")
        assert com.held == ref.held
    assert_same(ref.flush(), com.flush(), "flush")
    assert com.held == ref.held == 0


def test_analyze_uses_the_compiled_engine_by_default_and_records_it(tmp_path):
    from bigtcp_pcap.api import analyze
    from bigtcp_pcap.output.parquet import read_metadata

    src = KERNEL_DIR / "mixed_185000.snd.pcap"
    a = analyze(src, outdir=tmp_path / "c", audit=False, gro_max_size=185000)
    b = analyze(src, outdir=tmp_path / "r", audit=False, gro_max_size=185000, gro_engine="reference")
    assert a.params["gro_engine"] == "compiled" and b.params["gro_engine"] == "reference"
    assert read_metadata(tmp_path / "c" / "superpackets.parquet")["params"]["gro_engine"] == "compiled"
    assert len(a.superpackets) > 100
    assert a.superpackets.equals(b.superpackets)
    with pytest.raises(ValueError, match="gro_engine"):
        analyze(src, outdir=tmp_path / "x", audit=False, gro_engine="fast")


def test_many_flow_keys_grow_the_key_table():
    """Thousands of flow keys (table growth and rehash mid-batch), keys differing in one word only."""
    from bigtcp_pcap.gro.synth import bulk_stream

    pb, fid = bulk_stream(40_000, nflows=3000, interleave="packet", burst=8)
    pb.l2_hash[::3] ^= np.uint64(1)  # same 5-tuple, other MAC header: another key (R4)
    pb.vlan[1::5] = 7
    pb.ext_hash[2::7] = np.uint64(99)
    cfg = GroConfig(max_gro_skbs=math.inf, gro_hash_buckets=1, poll_gap_us=math.inf, napi_weight=1 << 20)
    ref = run(GroEngine, cfg, pb, fid, [10_000])
    assert len(ref) < len(pb)  # the packets of each key did merge
    assert_same(ref, run(CompiledGroEngine, cfg, pb, fid), "many keys/whole")
    assert_same(ref, run(CompiledGroEngine, cfg, pb, fid, every(333, len(pb))), "many keys/333")
    eng = CompiledGroEngine(cfg)
    eng.feed(pb, fid)
    assert eng._ngid > 3000


_PREP_CONFIGS = [GroConfig(), GroConfig(kernel="7.0", treat_padding_as_flush=False)]


def _assert_prepared_equal(pb: PacketBatch, fid: np.ndarray, label: str) -> None:
    for cfg in _PREP_CONFIGS:
        want = prepare(pb, fid, cfg, dedupe=False, row_hash=False)
        got = prepare_compiled(pb, fid, cfg)
        for name in ("kind", "flushmark", "flagword", "l3word", "hdr_len"):
            w, g = getattr(want, name), getattr(got, name)
            assert g.dtype == w.dtype and np.array_equal(g, w), f"{label}: {name} ({cfg.kernel})"
        assert len(got.key_cols) == len(want.key_cols) == 9
        for j, (w, g) in enumerate(zip(want.key_cols, got.key_cols, strict=True)):
            assert g.dtype == w.dtype and np.array_equal(g, w), f"{label}: key column {j}"


@pytest.mark.parametrize("capture", CAPTURES)
def test_compiled_prepare_equals_the_vectorized_one_on_kernel_captures(capture):
    pb, fid = load_capture(capture)
    assert (prepare_compiled(pb, fid, GroConfig()).kind == KIND_TCP).any()
    _assert_prepared_equal(pb, fid, capture)


@pytest.mark.parametrize("seed", SEEDS[:10])
def test_compiled_prepare_equals_the_vectorized_one_on_synthetic_streams(seed):
    pb, fid = synth_stream(seed, 400)
    r = np.random.default_rng(seed)
    # vary what prepare looks at beyond what the stream generator sets
    pb.ip_evil[r.random(len(pb)) < 0.05] = 1
    pb.tunnel[r.random(len(pb)) < 0.05] = 1
    pb.status[r.random(len(pb)) < 0.05] |= ST_TRUNC_L4
    pb.status[r.random(len(pb)) < 0.05] |= ST_IP_FRAGMENT
    pb.wirelen[r.random(len(pb)) < 0.1] = 60
    fid[r.random(len(pb)) < 0.05] = -1
    _assert_prepared_equal(pb, fid, f"seed {seed}")


@pytest.mark.parametrize("capture,cname", [(c, n) for c in CAPTURES
                                           for n in ("default", "pair", "timeout_defer", "rxq2", "hz1000", "nic")
                                           if n != "pair" or pair_settings(c)])
def test_kernel_capture_with_receivers_and_ack_evidence_identical(capture, cname):
    """analyze's GRO stage (gro/stage.py: receivers routed, ACK evidence one batch late) on both engines, with
    small batches so that the lookahead crosses batch boundaries."""
    from bigtcp_pcap.gro.stage import GroStage

    cfg = GroConfig(**(pair_settings(capture) if cname == "pair" else CONFIGS[cname]))
    out = {}
    for engine in ("reference", "compiled"):
        stage = GroStage(cfg, engine)
        flows = FlowTable()
        parts = []
        for rb in CaptureReader(str(KERNEL_DIR / capture), batch_size=97):
            pb, _ = decode(rb)
            parts.append(stage.feed(rb, pb, flows.assign(pb)))
        parts.append(stage.finish())
        out[engine] = SuperPacketBatch.concat(parts)
    assert len(out["reference"]) > 0
    assert_same(out["reference"], out["compiled"], f"{capture}/{cname}/stage")
    pe = set(out["compiled"].poll_end.tolist())
    assert pe <= {0, 1, 2, 3, 4, 6, 7}


@pytest.mark.parametrize("seed", range(4))
def test_next_same_twins(seed):
    """The compiled one-pass next-row-of-the-same-gid (the ACK evidence's successor links) is the reference's
    sort-based definition, on gids with repeats, gaps and -1 rows; and by a direct scan on the first rows."""
    from bigtcp_pcap.gro.compiled import next_same_compiled
    from bigtcp_pcap.gro.engine import next_same

    rng = np.random.default_rng(seed)
    n = [0, 1, 1000, 70_000][seed]
    gids = rng.integers(-1, max(2, n // [1, 1, 3, 50][seed]), n).astype(np.int64)
    got = next_same_compiled(gids)
    assert np.array_equal(got, next_same(gids))
    for i in range(min(n, 200)):
        later = [j for j in range(i + 1, n) if gids[j] == gids[i]]
        assert got[i] == (later[0] if later and gids[i] >= 0 else -1)
