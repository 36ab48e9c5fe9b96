#!/usr/bin/env python3
"""Benchmark `bigtcp-pcap analyze` against peers on the same capture, in one run.

    .venv/bin/python scripts/bench.py [--packets 2000000] [--capture FILE] [--keep]

Without --capture it builds a long capture by replaying a kernel-made fixture (MSS segments from a sender with
TSO off, IPv6 BIG TCP) end to end many times, shifting sequence/ack numbers and timestamps so the result is one
long, contiguous TCP conversation. Then it runs, one after the other on that file:

* bigtcp-pcap analyze (read + decode + GRO rebuild + flows + findings + Parquet), with and without the default
  filter audit;
* tshark -T fields (the fields a user would export), with the BIG TCP preferences;
* a dpkt loop (its pcap reader + Ethernet/IP/TCP decode, the way most Python scripts do it);
* nfstream, if installed.

and prints packets/s, the ratio to bigtcp-pcap, and peak RSS of each (from wait4's rusage). No timing is
asserted anywhere; this only measures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "kernel" / "v6_185000.snd.pcap"


def build_capture(src: Path, dst: Path, min_packets: int) -> int:
    """Replay ``src`` (little-endian pcap, Ethernet) until ``min_packets``, keeping TCP seq/ack contiguous."""
    raw = src.read_bytes()
    hdr, recs, p = raw[:24], [], 24
    magic = struct.unpack("<I", raw[:4])[0]
    ts_div = 1 if magic == 0xA1B23C4D else 1000  # ns or us file
    while p + 16 <= len(raw):
        sec, frac, incl, orig = struct.unpack("<IIII", raw[p:p + 16])
        recs.append((sec * 1_000_000_000 + frac * (1000 if ts_div == 1000 else 1), raw[p + 16:p + 16 + incl], orig))
        p += 16 + incl
    # per direction: sequence span of one replay (payload + SYN/FIN), to shift seq and the peer's ack
    span: dict[tuple, int] = {}
    parsed = []
    for ts, d, orig in recs:
        info = None
        et = struct.unpack(">H", d[12:14])[0] if len(d) >= 14 else 0
        if et == 0x86DD and len(d) >= 54 + 20 and d[20] == 6:
            l4, key = 54, (d[22:38], d[38:54])
            plen = orig - 14 - 40 - (d[l4 + 12] >> 4) * 4
        elif et == 0x0800 and len(d) >= 34 + 20 and d[23] == 6:
            ihl = (d[14] & 15) * 4
            l4, key = 14 + ihl, (d[26:30], d[30:34])
            plen = orig - 14 - ihl - (d[l4 + 12] >> 4) * 4
        else:
            parsed.append((ts, d, orig, None))
            continue
        sport, dport = struct.unpack(">HH", d[l4:l4 + 4])
        k = (key[0], sport, key[1], dport)
        flags = d[l4 + 13]
        span[k] = span.get(k, 0) + max(plen, 0) + (1 if flags & 2 else 0) + (1 if flags & 1 else 0)
        info = (l4, k, (key[1], dport, key[0], sport))
        parsed.append((ts, d, orig, info))
    duration = recs[-1][0] - recs[0][0] + 1_000_000
    copies = -(-min_packets // len(recs))
    n = 0
    with open(dst, "wb") as f:
        f.write(hdr[:4] if ts_div == 1 else struct.pack("<I", 0xA1B23C4D))
        f.write(hdr[4:])
        for c in range(copies):
            for ts, d, orig, info in parsed:
                if info is not None:
                    l4, k, rev = info
                    seq, ack = struct.unpack(">II", d[l4 + 4:l4 + 12])
                    seq = (seq + c * span[k]) & 0xFFFFFFFF
                    ack = (ack + c * span.get(rev, 0)) & 0xFFFFFFFF
                    d = d[:l4 + 4] + struct.pack(">II", seq, ack) + d[l4 + 12:]
                t = ts + c * duration
                f.write(struct.pack("<IIII", t // 1_000_000_000, t % 1_000_000_000, len(d), orig))
                f.write(d)
                n += 1
    return n


def run(name: str, cmd: list[str], packets: int) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    rc = os.waitstatus_to_exitcode(status)
    ok = rc in (0, 1)  # analyze exits 1 when findings are present
    return {"name": name, "seconds": wall, "pps": packets / wall if ok else 0.0, "rss_mib": ru.ru_maxrss / 1024,
            "rc": rc, "err": "" if ok else err.strip().splitlines()[-1:]}


DPKT_LOOP = r"""
import sys, dpkt
n = tcp_bytes = 0
with open(sys.argv[1], 'rb') as f:
    for ts, buf in dpkt.pcap.Reader(f):
        eth = dpkt.ethernet.Ethernet(buf)
        ip = eth.data
        if isinstance(ip, (dpkt.ip.IP, dpkt.ip6.IP6)) and isinstance(ip.data, dpkt.tcp.TCP):
            tcp_bytes += len(ip.data.data)
        n += 1
print(n, tcp_bytes)
"""

NFSTREAM = r"""
import sys
from nfstream import NFStreamer
print(sum(1 for _ in NFStreamer(source=sys.argv[1], statistical_analysis=False)))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, default=2_000_000, help="minimum packets in the generated capture")
    ap.add_argument("--capture", type=Path, help="benchmark this capture instead of generating one")
    ap.add_argument("--keep", action="store_true", help="keep the generated capture and outputs")
    ap.add_argument("--skip", action="append", default=[], help="skip a peer: tshark, dpkt, nfstream, audit")
    args = ap.parse_args()
    py = sys.executable
    exe = shutil.which("bigtcp-pcap", path=str(Path(py).parent)) or shutil.which("bigtcp-pcap")
    if exe is None:
        print("bench: bigtcp-pcap is not installed (run scripts/setup demo first)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bigtcp-bench-"))
    try:
        if args.capture:
            cap = args.capture
            count = subprocess.run([py, "-c", "import sys; from bigtcp_pcap.capture import CaptureReader; "
                                    "print(sum(len(b) for b in CaptureReader(sys.argv[1])))", str(cap)],
                                   capture_output=True, text=True, check=True)
            packets = int(count.stdout)
        else:
            cap = work / "bench.pcap"
            t = time.perf_counter()
            packets = build_capture(FIXTURE, cap, args.packets)
            print(f"built {cap} from {FIXTURE.name}: {packets:,} packets, {cap.stat().st_size / 2**20:.0f} MiB "
                  f"({time.perf_counter() - t:.1f} s)")
        # warm the page cache and numba's on-disk cache so that every tool starts equal
        cap.read_bytes()
        subprocess.run([exe, "analyze", str(FIXTURE), "-o", str(work / "warm"), "--no-progress"],
                       capture_output=True)
        startup = run("bigtcp-pcap start-up (one-packet capture)", [exe, "analyze", str(ROOT / "tests" / "fixtures" / "kernel" / "v6_185000.rcv.pcap"), "-o", str(work / "o0"), "--no-progress", "--no-audit"], 147)
        results = [run("bigtcp-pcap analyze --no-audit",
                       [exe, "analyze", str(cap), "-o", str(work / "o1"), "--no-progress", "--no-audit"], packets)]
        if "audit" not in args.skip:
            results.append(run("bigtcp-pcap analyze (default filter audit)",
                               [exe, "analyze", str(cap), "-o", str(work / "o2"), "--no-progress"], packets))
        results.append(run("bigtcp-pcap analyze --no-audit --packets",
                           [exe, "analyze", str(cap), "-o", str(work / "o3"), "--no-progress", "--no-audit",
                            "--packets"], packets))
        if "tshark" not in args.skip and shutil.which("tshark"):
            results.append(run("tshark -T fields", [
                "tshark", "-r", str(cap), "-o", "ipv6.tso_support:TRUE", "-o", "ip.tso_support:TRUE", "-T", "fields",
                "-e", "frame.number", "-e", "frame.len", "-e", "ipv6.opt.jumbo", "-e", "tcp.srcport", "-e",
                "tcp.dstport", "-e", "tcp.seq_raw", "-e", "tcp.len"], packets))
        if "dpkt" not in args.skip:
            results.append(run("dpkt loop (pcap.Reader + decode)", [py, "-c", DPKT_LOOP, str(cap)], packets))
        if "nfstream" not in args.skip:
            has = subprocess.run([py, "-c", "import nfstream"], capture_output=True).returncode == 0
            if has:
                results.append(run("nfstream", [py, "-c", NFSTREAM, str(cap)], packets))
            else:
                print("nfstream: not installed, skipped")
        base = results[0]["pps"]
        print(f"\n{'tool':44} {'seconds':>8} {'packets/s':>12} {'vs bigtcp-pcap':>15} {'peak RSS MiB':>13}")
        for r in results:
            ratio = f"{r['pps'] / base:.3f}x" if base and r["pps"] else "-"
            print(f"{r['name']:44} {r['seconds']:8.2f} {r['pps']:12,.0f} {ratio:>15} {r['rss_mib']:13.0f}"
                  + (f"  rc={r['rc']} {r['err']}" if r["err"] else ""))
        steady = packets / max(results[0]["seconds"] - startup["seconds"], 1e-9)
        print(f"\n{packets:,} packets; ratios < 1 mean slower than `bigtcp-pcap analyze --no-audit`.")
        print(f"bigtcp-pcap fixed start-up (imports, numba cache, exit) on a 147-packet capture: "
              f"{startup['seconds']:.2f} s, {startup['rss_mib']:.0f} MiB peak RSS")
        print(f"bigtcp-pcap steady state (2M-packet run minus start-up): {steady:,.0f} packets/s; "
              + ", ".join(f"{r['name'].split(' (')[0].split(' -T')[0]} x{steady / r['pps']:.0f}"
                          for r in results[1:] if r["pps"] and not r["name"].startswith("bigtcp")))
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
