#!/usr/bin/env python3
"""Benchmark the parallel forms of `bigtcp-pcap analyze`: --jobs 2 and a Dask LocalCluster vs one process.

    .venv/bin/python scripts/bench_scale.py [--packets 2000000] [--captures 8] [--repeat 1] [--keep DIR]

Builds (with scripts/bench.py's replay builder) a set of --captures captures of --packets/--captures packets
each, and one capture of the set's runs one after the other (1 s apart, each run's connections on their own
client ports, as a file of repeated iperf3 runs looks), then times, as separate commands:

* one capture: `analyze BIG` (one process), `analyze BIG --jobs 2` (cut at its idle gaps, 2 processes),
  `analyze BIG --dask local:2` (2 one-thread LocalCluster workers; the cluster's start-up is included);
* the set: `analyze DIR` (one process, one capture after the other), `--jobs 2`, `--dask local:2`;
* both again with `--dask ADDRESS`: a cluster started before the timing (a scheduler and 2 one-thread workers,
  as a user's running cluster), so its start-up is not counted; the first task of each worker warms it;
* the machine's ceiling ("ceiling"): the one-process command twice at once, as a speed-up over twice its time
  alone. Two independent processes with no cut and no merge: no form of `--jobs 2` can do better here.

It prints wall seconds, packets per second, the speed-up over the one-process run and the 1-minute load average
before and after each command (the machine may be shared). No timing is asserted anywhere; this only measures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from bench import FIXTURE, build_capture

CLI = str(ROOT / ".venv" / "bin" / "bigtcp-pcap")


def test_runs(paths: list[Path], dst: Path, pause_s: int = 1) -> None:
    """One capture of several test runs: the captures of ``paths`` one after the other, ``pause_s`` apart, each
    run's connections on their own client port (+ run number), as a capture of repeated iperf3 runs looks.
    Each pause is an idle gap where a split run can cut exactly."""
    out: list[bytes] = []
    end = None  # the last timestamp written (ns)
    for k, p in enumerate(paths):
        raw = p.read_bytes()
        assert struct.unpack("<I", raw[:4])[0] == 0xA1B23C4D, p  # the replays are nanosecond pcap
        if not out:
            out.append(raw[:24])
        pos, shift = 24, None
        while pos + 16 <= len(raw):
            sec, ns, incl, orig = struct.unpack("<IIII", raw[pos:pos + 16])
            d = bytearray(raw[pos + 16:pos + 16 + incl])
            t = sec * 10**9 + ns
            if shift is None:
                shift = 0 if end is None else end + pause_s * 10**9 - t
            t += shift
            end = t
            et = struct.unpack(">H", d[12:14])[0] if len(d) >= 14 else 0
            l4 = 0
            if et == 0x86DD and len(d) > 54:
                l4 = 62 if d[20] == 0 else 54  # a Hop-by-Hop header (Jumbo) before TCP, or TCP
            elif et == 0x0800 and len(d) > 14:
                l4 = 14 + (d[14] & 15) * 4
            if l4 and len(d) >= l4 + 4:
                sp, dp = struct.unpack(">HH", d[l4:l4 + 4])
                if sp > dp:  # the client's (ephemeral) port; the server's port stays
                    sp += k
                else:
                    dp += k
                d[l4:l4 + 4] = struct.pack(">HH", sp & 0xFFFF, dp & 0xFFFF)
            out.append(struct.pack("<IIII", t // 10**9, t % 10**9, incl, orig) + bytes(d))
            pos += 16 + incl
    dst.write_bytes(b"".join(out))


def timed(args: list[str], repeat: int) -> dict:
    """The fastest of ``repeat`` runs of one command."""
    return timed_pair([args], repeat)


def timed_pair(arg_sets: list[list[str]], repeat: int) -> dict:
    """The fastest of ``repeat`` runs of the commands started together (wall time until all ended)."""
    best = None
    for _ in range(repeat):
        la0 = os.getloadavg()[0]
        t = time.perf_counter()
        procs = [subprocess.Popen([CLI, *args, "--no-progress"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for args in arg_sets]
        errs = [p.communicate()[1] for p in procs]
        wall = time.perf_counter() - t
        for p, e in zip(procs, errs, strict=True):
            if p.returncode not in (0, 1):
                raise SystemExit(f"{' '.join(p.args)} failed ({p.returncode}): {e[-1000:]}")
        run = {"wall": wall, "load_before": la0, "load_after": os.getloadavg()[0]}
        if best is None or wall < best["wall"]:
            best = run
    return best


class RunningCluster:
    """A dask.distributed cluster started before the timed commands, as a user's cluster is running when they
    pass ``--dask ADDRESS``: ``dask scheduler`` and ``workers`` one-thread ``dask worker`` processes (with their
    nannies, as a LocalCluster has), on a free localhost port, stopped at exit."""

    def __init__(self, workers: int = 2) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{port}"
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        dask = str(ROOT / ".venv" / "bin" / "dask")
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
        self.procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                        "--no-dashboard"], **quiet)]
        self.procs += [subprocess.Popen([dask, "worker", self.address, "--nthreads", "1", "--no-dashboard",
                                         "--memory-limit", "0"], **quiet) for _ in range(workers)]
        from distributed import Client

        with Client(self.address, timeout=60) as c:
            c.wait_for_workers(workers, timeout=120)

    def close(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            p.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=int, default=2_000_000)
    ap.add_argument("--captures", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1, help="runs per command; the fastest is reported")
    ap.add_argument("--keep", type=Path, help="build the captures here and keep them")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON document")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    many = work / "set"
    many.mkdir(exist_ok=True)
    each = a.packets // a.captures
    for i in range(a.captures):
        p = many / f"cap{i}.pcap"
        if not p.exists():
            build_capture(FIXTURE, p, each)
    big = work / "big.pcap"
    if not big.exists():  # the set's runs in one file, 1 s apart, each on its own client ports
        test_runs(sorted(many.glob("cap*.pcap")), big)
    n_big = (big.stat().st_size, a.packets)
    rows = []
    cluster = RunningCluster(2)
    modes = (("1 process", []), ("--jobs 2", ["--jobs", "2"]), ("--dask local:2", ["--dask", "local:2"]),
             ("--dask ADDRESS", ["--dask", cluster.address]))
    try:
        _run_all(a, big, many, n_big, each, modes, work, rows)
    finally:
        cluster.close()
    if a.json:
        print(json.dumps({"cpus": os.cpu_count(), "rows": rows}))
    else:
        print(f"cpus {os.cpu_count()}; captures in {work}; --dask ADDRESS: a running cluster "
              f"(dask scheduler + 2 one-thread dask workers, started before timing)")
        for r in rows:
            print(f"{r['input']:>12}  {r['mode']:<15} {r['wall_s']:7.2f} s  {r['packets_per_s']:>9} pkt/s  "
                  f"x{r['speedup']:.2f}  load {r['load1_before']:.2f} -> {r['load1_after']:.2f}")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


def _run_all(a, big: Path, many: Path, n_big: tuple, each: int, modes: tuple, work: Path, rows: list) -> None:
    for label, src, n in (("one capture", str(big), n_big[1]), (f"{a.captures} captures", str(many), each * a.captures)):
        base = None
        for mode, extra in modes:
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            r = timed(["analyze", src, "-o", str(out), *extra], a.repeat)
            base = base or r["wall"]
            rows.append({"input": label, "mode": mode, "wall_s": round(r["wall"], 2),
                         "packets_per_s": round(n / r["wall"]), "speedup": round(base / r["wall"], 2),
                         "load1_before": r["load_before"], "load1_after": r["load_after"]})
        # the machine's own ceiling for two processes: the one-process command twice at once (twice the work,
        # no cut and no merge), as a speed-up over running it twice one after the other
        r = timed_pair([["analyze", src, "-o", str(work / f"out{k}")] for k in (1, 2)], a.repeat)
        rows.append({"input": label, "mode": "ceiling", "wall_s": round(r["wall"], 2),
                     "packets_per_s": round(2 * n / r["wall"]), "speedup": round(2 * base / r["wall"], 2),
                     "load1_before": r["load_before"], "load1_after": r["load_after"]})


if __name__ == "__main__":
    main()
