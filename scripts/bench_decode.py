#!/usr/bin/env python3
"""Decoder speed: nanoseconds per packet of ``decode()`` on records replayed from kernel captures.

    .venv/bin/python scripts/bench_decode.py [--packets 2000000] [--repeat 7] [CAPTURE ...]

Each capture's records are read once (``CaptureReader``), then tiled into one RecordBatch of ``--packets``
records over the same buffer, so the timing is the decoder alone (no I/O, no reader). Prints the best and the
median of ``--repeat`` runs per capture, in ns per packet, and whether the kernels ran ahead-of-time or on
numba's JIT (a JIT run is warmed up first). Without arguments it uses the Ethernet BIG TCP sender and receiver
captures, the SLL2 capture and the VXLAN capture from tests/fixtures/kernel.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bigtcp_pcap import _native
from bigtcp_pcap.capture import CaptureReader, RecordBatch
from bigtcp_pcap.decode import decode

K = ROOT / "tests" / "fixtures" / "kernel"
DEFAULT = [K / "mixed_185000.snd.pcap", K / "mixed_185000.rcv.pcap", K / "linktypes" / "sll2_v6_185000.rcv.pcap",
           K / "linktypes" / "vxlan.snd.pcap"]


def tiled(path: Path, n: int) -> RecordBatch:
    """One RecordBatch of n records cycling over the capture's records (one shared buffer)."""
    parts = list(CaptureReader(path, batch_size=1 << 20))
    buf = np.concatenate([p.buf for p in parts])
    offs, base = [], 0
    for p in parts:
        offs.append(p.off + base)
        base += p.buf.shape[0]
    off = np.concatenate(offs)
    cat = {f: np.concatenate([getattr(p, f) for p in parts]) for f in ("caplen", "wirelen", "ts_ns", "linktype",
                                                                         "if_id", "file_off")}
    idx = np.arange(n) % off.shape[0]
    return RecordBatch(buf, off[idx], cat["caplen"][idx], cat["wirelen"][idx], cat["ts_ns"][idx],
                       cat["linktype"][idx], cat["if_id"][idx], np.arange(1, n + 1, dtype=np.uint64),
                       cat["file_off"][idx])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("captures", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--packets", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    print(f"kernels: {_native.MODE}" if hasattr(_native, "MODE") else "kernels: (mode not reported)")
    for path in a.captures:
        rb = tiled(path, a.packets)
        decode(tiled(path, 1000))  # warm-up (JIT compile when not ahead-of-time)
        times = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            decode(rb)
            times.append(time.perf_counter() - t0)
        ns = [t / a.packets * 1e9 for t in times]
        print(f"{path.name:32s} best {min(ns):6.1f}  median {statistics.median(ns):6.1f} ns/packet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
