"""Throughput of the GRO engines (not a test): ``.venv/bin/python tests/gro/bench_engine.py [n] [--reps R]``.

Runs the reference ``GroEngine`` and the numba ``CompiledGroEngine`` on the same inputs and reports input
segments per second for feed + flush (including the per-batch vectorized preparation), best of R runs:

* synthetic IPv6 bulk streams (``synth.bulk_stream``) in 65536-packet batches: 1 flow, 100 flows in whole
  bursts, 100 flows alternating packet by packet (worst case: every super-packet is one segment);
* a replayed kernel capture (``scripts/bench.py``'s ``build_capture`` of tests/fixtures/kernel/v6_185000.snd.pcap,
  n packets), decoded with ``CaptureReader`` + ``decode`` and flow ids from ``FlowTable`` beforehand, so only
  feed + flush is timed.

Both engines must return the same number of rows (the differential tests check every column).
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

from bigtcp_pcap.capture import CaptureReader
from bigtcp_pcap.decode import decode
from bigtcp_pcap.flows.table import FlowTable
from bigtcp_pcap.gro import CompiledGroEngine, GroConfig, GroEngine
from bigtcp_pcap.gro.synth import bulk_stream

BATCH = 65536
ROOT = Path(__file__).resolve().parents[2]
ENGINES = (("reference", GroEngine), ("compiled", CompiledGroEngine))


def timed(engine_cls, cfg: GroConfig, parts: list, reps: int) -> tuple[float, int]:
    """Best wall time of ``reps`` runs of feed(all parts) + flush() on a fresh engine, and the row count."""
    best, rows = float("inf"), 0
    for _ in range(reps):
        eng = engine_cls(cfg)
        t = time.perf_counter()
        rows = sum(len(eng.feed(pb, f)) for pb, f in parts) + len(eng.flush())
        best = min(best, time.perf_counter() - t)
    return best, rows


def compare(label: str, cfg: GroConfig, parts: list, n: int, reps: int) -> None:
    rates, counts = {}, set()
    for name, cls in ENGINES:
        sec, rows = timed(cls, cfg, parts, reps)
        rates[name] = n / sec
        counts.add(rows)
    assert len(counts) == 1, f"{label}: engines disagree on the row count {counts}"
    print(f"{label:58s} reference {rates['reference'] / 1e3:7.0f} k/s   compiled {rates['compiled'] / 1e6:6.2f} M/s"
          f"   x{rates['compiled'] / rates['reference']:5.1f}   ({counts.pop()} rows)")


def capture_parts(n: int) -> list:
    """Decoded batches + FlowTable flow ids of a replayed kernel capture of >= n packets."""
    spec = importlib.util.spec_from_file_location("bigtcp_bench_script", ROOT / "scripts" / "bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "replay.pcap"
        mod.build_capture(mod.FIXTURE, path, n)
        flows = FlowTable()
        parts = []
        for rb in CaptureReader(str(path)):
            pb, _ = decode(rb)
            parts.append((pb, flows.assign(pb)))
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", nargs="?", type=int, default=1_000_000, help="segments per stream / capture packets")
    ap.add_argument("--reps", type=int, default=3, help="runs per measurement; the best is reported")
    args = ap.parse_args()
    n = args.n
    CompiledGroEngine(GroConfig()).feed(*bulk_stream(100))  # compile (or load numba's cache) outside the timing
    for nflows, inter in ((1, "burst"), (100, "burst"), (100, "packet")):
        b, fid = bulk_stream(n, nflows=nflows, interleave=inter)
        parts = [(b.take(slice(s, s + BATCH)), fid[s:s + BATCH]) for s in range(0, n, BATCH)]
        for cfg in (GroConfig(), GroConfig(gro_max_size=185000, hz=1000)):
            compare(f"{nflows:4d} flows {inter:6s}, gro_max_size {cfg.gro_max_size:6d}, hz {cfg.hz:4d}", cfg, parts, n,
                    args.reps)
    parts = capture_parts(n)
    total = sum(len(pb) for pb, _ in parts)
    for cfg in (GroConfig(), GroConfig(gro_max_size=185000)):
        compare(f"replayed v6_185000.snd.pcap ({total} pkts), gro_max_size {cfg.gro_max_size:6d}", cfg, parts, total,
                args.reps)


if __name__ == "__main__":
    main()
