"""Throughput of the GRO engine (not a test): ``.venv/bin/python tests/gro/bench_engine.py [n]``.

Feeds synthetic IPv6 bulk streams (``synth.bulk_stream``) in 65536-packet batches and reports input packets
per second for GroEngine.feed + flush, including the per-batch vectorized preparation.
"""

from __future__ import annotations

import sys
import time

from bigtcp_pcap.gro import GroConfig, GroEngine
from bigtcp_pcap.gro.synth import bulk_stream

BATCH = 65536


def bench(n: int, nflows: int, interleave: str, cfg: GroConfig) -> tuple[float, int]:
    b, fid = bulk_stream(n, nflows=nflows, interleave=interleave)
    parts = [(b.take(slice(s, s + BATCH)), fid[s:s + BATCH]) for s in range(0, n, BATCH)]
    eng = GroEngine(cfg)
    rows = 0
    t = time.perf_counter()
    for pb, f in parts:
        rows += len(eng.feed(pb, f))
    rows += len(eng.flush())
    return n / (time.perf_counter() - t), rows


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    for nflows, inter in ((1, "burst"), (100, "burst"), (100, "packet")):
        for cfg in (GroConfig(), GroConfig(gro_max_size=185000, hz=1000)):
            rate, rows = bench(n, nflows, inter, cfg)
            print(f"{nflows:4d} flows, {inter:6s} interleave, gro_max_size {cfg.gro_max_size:6d}, hz {cfg.hz:4d}: "
                  f"{rate / 1e3:7.0f} k segments/s ({rows} super-packets)")


if __name__ == "__main__":
    main()
