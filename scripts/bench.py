#!/usr/bin/env python3
"""Benchmark `bigtcp-pcap analyze` against peers on the same capture, in one run.

    .venv/bin/python scripts/bench.py [--packets 2000000] [--capture FILE | --replay FIXTURE] [--repeat 3]
                                      [--skip TOOL] [--keep]
    .venv/bin/python scripts/bench.py --field [--packets 2000000] [--repeat 3]

``--field`` builds the field-shaped captures (the inbound direction of a kernel BIG TCP receiver capture, a
sender capture, a many-flows capture from make_field_captures.py, that one as pcapng and the receiver's as
.gz) and runs analyze (default options, and --no-audit for the audit's share), tshark, dpkt and nfstream on
each, printing steady rate, ratios and peak RSS per capture, plus the load average and CPU steal.

Without --capture it builds a long capture by replaying a kernel-made fixture (by default MSS segments from a
sender with TSO off, IPv6 BIG TCP; --replay picks another, such as the receiver's HBH super-packets) end to end
many times, shifting sequence/ack numbers and timestamps so the result is one
long, contiguous TCP conversation. Then it runs, one after the other on that file:

* bigtcp-pcap analyze (read + decode + GRO rebuild + flows + findings + Parquet), with and without the default
  filter audit;
* tshark -T fields (the fields a user would export), with the BIG TCP preferences;
* a dpkt loop (its pcap reader + Ethernet/IP/TCP decode, the way most Python scripts do it);
* nfstream, if installed, with one metering process (its default starts one per core).

For each tool it prints wall and CPU seconds, peak RSS (from wait4's rusage), its fixed start-up (the same
command on a 147-packet capture) and its steady state, packets / (wall - start-up), with the ratio to
bigtcp-pcap's. No timing is asserted anywhere; this only measures.
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
FIXTURE = ROOT / "tests" / "fixtures" / "kernel" / "v6_185000.snd.pcap"
SMALL = ROOT / "tests" / "fixtures" / "kernel" / "v6_185000.rcv.pcap"  # start-up probe
SMALL_PACKETS = 147


def build_capture(src: Path, dst: Path, min_packets: int, inbound: bool = False) -> int:
    """Replay ``src`` (little-endian pcap, Ethernet) until ``min_packets``, keeping TCP seq/ack contiguous.

    ``inbound``: only the frames sent by the data sender (the receiver's inbound direction, where its tcpdump
    shows the GRO super-packets), as ``tcpdump -Q in`` would record them."""
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
        elif et == 0x86DD and len(d) >= 62 + 20 and d[20] == 0 and d[54] == 6:  # Hop-by-Hop (Jumbo), then TCP
            l4, key = 62, (d[22:38], d[38:54])
            plen = orig - 14 - 48 - (d[l4 + 12] >> 4) * 4
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
    if inbound:  # keep the TCP direction that carries the most payload (and no other frames)
        top = max(span, key=span.get)
        parsed = [r for r in parsed if r[3] is not None and r[3][1] == top]
    duration = recs[-1][0] - recs[0][0] + 1_000_000
    copies = -(-min_packets // len(parsed))
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


# Each tool runs under this small launcher: Linux carries a process's peak RSS across exec, so a tool forked
# straight from this script would report at least this script's RSS as its own.
LAUNCH = r"""
import json, os, sys, time
t = time.perf_counter()
pid = os.fork()
if pid == 0:
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, ru = os.wait4(pid, 0)
print(json.dumps({"wall": time.perf_counter() - t, "rc": os.waitstatus_to_exitcode(status),
                  "cpu": ru.ru_utime + ru.ru_stime, "rss_kib": ru.ru_maxrss}))
"""


def cpu_steal() -> tuple[int, int]:
    """(steal, total) jiffies from /proc/stat: time the hypervisor gave this VM's CPUs to others."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 1
    return (v[7] if len(v) > 7 else 0), sum(v)


def run(name: str, cmd: list[str], packets: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", LAUNCH, *cmd], capture_output=True, text=True, check=False)
    m = json.loads(proc.stdout)
    ok = m["rc"] in (0, 1)  # analyze exits 1 when findings are present
    return {"name": name, "seconds": m["wall"], "cpu": m["cpu"], "pps": packets / m["wall"] if ok else 0.0,
            "rss_mib": m["rss_kib"] / 1024, "rc": m["rc"], "err": "" if ok else proc.stderr.strip().splitlines()[-1:]}


def _on(cmd: list[str], path: Path) -> list[str]:
    """``cmd`` with the capture path at its "{}" placeholder, or appended."""
    return [c.replace("{}", str(path)) for c in cmd] if "{}" in cmd else [*cmd, str(path)]


def measure(name: str, cmd: list[str], cap: Path, packets: int, repeat: int) -> dict:
    """Best of ``repeat`` runs on ``cap``, plus the tool's fixed start-up: its best of max(5, 2 * repeat) runs on
    ``SMALL`` (short runs are the noisier ones, and steady = packets / (wall - start-up) amplifies their noise)."""
    best = min((run(name, _on(cmd, cap), packets) for _ in range(repeat)), key=lambda r: r["seconds"])
    fixed = min(run(name, _on(cmd, SMALL), SMALL_PACKETS)["seconds"] for _ in range(max(5, 2 * repeat)))
    best["startup"] = fixed
    best["steady"] = packets / max(best["seconds"] - fixed, 1e-9) if best["pps"] else 0.0
    return best


DPKT_LOOP = r"""
import gzip, sys, dpkt
n = tcp_bytes = 0
path = sys.argv[1]
with (gzip.open(path, 'rb') if path.endswith('.gz') else open(path, 'rb')) as f:
    reader = dpkt.pcapng.Reader(f) if '.pcapng' in path else dpkt.pcap.Reader(f)
    for ts, buf in reader:
        eth = dpkt.ethernet.Ethernet(buf)
        ip = eth.data
        if isinstance(ip, (dpkt.ip.IP, dpkt.ip6.IP6)) and isinstance(ip.data, dpkt.tcp.TCP):
            tcp_bytes += len(ip.data.data)
        n += 1
print(n, tcp_bytes)
"""

TSHARK = ["tshark", "-r", "{}", "-o", "ipv6.tso_support:TRUE", "-o", "ip.tso_support:TRUE", "-T", "fields",
          "-e", "frame.number", "-e", "frame.len", "-e", "ipv6.opt.jumbo", "-e", "tcp.srcport", "-e", "tcp.dstport",
          "-e", "tcp.seq_raw", "-e", "tcp.len"]

NFSTREAM = r"""
import sys
from nfstream import NFStreamer
# one metering process: the comparison is per core (nfstream's default starts one per core)
print(sum(1 for _ in NFStreamer(source=sys.argv[1], statistical_analysis=False, n_meters=1)))
"""

RECEIVER = ROOT / "tests" / "fixtures" / "kernel" / "v6_185000.rcv.pcap"


def field_captures(work: Path, packets: int, py: str) -> list[tuple[str, Path, int]]:
    """The field-shaped captures: (name, path, packets)."""
    rcv, snd, mf = work / "receiver.pcap", work / "sender.pcap", work / "many_flows.pcap"
    out = [("kernel receiver, inbound (HBH super-packets)", rcv, build_capture(RECEIVER, rcv, packets, inbound=True)),
           ("kernel sender (MSS segments)", snd, build_capture(FIXTURE, snd, packets))]
    subprocess.run([py, str(ROOT / "scripts" / "make_field_captures.py"), str(mf), "--packets", str(packets)],
                   check=True, stdout=subprocess.DEVNULL)
    out.append(("many flows (make_field_captures.py)", mf, packets))
    png = work / "many_flows.pcapng"
    subprocess.run(["editcap", "-F", "pcapng", str(mf), str(png)], check=True)
    out.append(("many flows, pcapng", png, packets))
    gz = work / "receiver.pcap.gz"
    with open(gz, "wb") as f:
        subprocess.run(["gzip", "-1", "-c", str(rcv)], stdout=f, check=True)
    out.append(("kernel receiver, .gz (gzip -1)", gz, out[0][2]))
    return out


def hbh_share(cap: Path) -> tuple[float, int]:
    """(share of frames that are BIG TCP super-packets, TCP flow directions) of a capture."""
    code = ("import sys, numpy as np; from bigtcp_pcap.api import iter_batches; from bigtcp_pcap.flows.table import "
            "FlowTable\nn = b = 0; ft = FlowTable()\nfor pb, _ in iter_batches(sys.argv[1]):\n"
            "    n += len(pb); b += int((pb.bigtcp != 0).sum()); ft.assign(pb)\nprint(b / max(n, 1), len(ft))")
    r = subprocess.run([sys.executable, "-c", code, str(cap)], capture_output=True, text=True, check=True)
    share, flows = r.stdout.split()
    return float(share), int(flows)


def field(args, exe: str, py: str, work: Path) -> int:
    """Every field-shaped capture against every peer, one run; a summary table at the end."""
    t = time.perf_counter()
    caps = field_captures(work, args.packets, py)
    print(f"built {len(caps)} captures in {time.perf_counter() - t:.1f} s")
    subprocess.run([exe, "analyze", str(SMALL), "-o", str(work / "warm"), "--no-progress"], capture_output=True,
                   check=False)
    has_nfstream = "nfstream" not in args.skip and subprocess.run(
        [py, "-c", "import nfstream"], capture_output=True, check=False).returncode == 0
    if has_nfstream:
        subprocess.run([py, "-c", NFSTREAM, str(SMALL)], capture_output=True, check=False)
    out = str(work / "out")
    tools = [("analyze", [exe, "analyze", "{}", "-o", out, "--no-progress"]),
             ("analyze --no-audit", [exe, "analyze", "{}", "-o", out, "--no-progress", "--no-audit"])]
    if "tshark" not in args.skip:
        tools.append(("tshark", TSHARK))
    if "dpkt" not in args.skip:
        tools.append(("dpkt", [py, "-c", DPKT_LOOP]))
    if has_nfstream:
        tools.append(("nfstream", [py, "-c", NFSTREAM]))
    startup: dict[str, float] = {}
    load0, steal0 = os.getloadavg(), cpu_steal()
    summary = []
    for cname, cap, packets in caps:
        subprocess.run(["cat", str(cap)], stdout=subprocess.DEVNULL, check=False)
        share, nflows = hbh_share(cap)
        print(f"\n{cname}: {packets:,} packets, {cap.stat().st_size / 2**20:.0f} MiB, {100 * share:.0f} % BIG TCP "
              f"super-packets, {nflows:,} flow directions")
        res = {}
        for name, cmd in tools:
            if name == "nfstream" and cap.suffix == ".gz":
                continue  # libpcap does not read gzip
            slow = name in ("tshark", "dpkt")
            best = min((run(name, _on(cmd, cap), packets) for _ in range(max(1, args.repeat - 1) if slow
                                                                            else args.repeat)),
                       key=lambda r: r["seconds"])
            if name not in startup:
                startup[name] = min(run(name, _on(cmd, SMALL), SMALL_PACKETS)["seconds"] for _ in range(5))
            best["startup"] = startup[name]
            best["steady"] = packets / max(best["seconds"] - startup[name], 1e-9) if best["pps"] else 0.0
            res[name] = best
            print(f"  {name:20} wall {best['seconds']:7.2f} s  CPU {best['cpu']:6.2f} s  steady "
                  f"{best['steady'] / 1e6:7.3f} M/s  peak RSS {best['rss_mib']:5.0f} MiB"
                  + (f"  rc={best['rc']} {best['err']}" if best["err"] else ""), flush=True)
        summary.append((cname, packets, res))
    load1, steal1 = os.getloadavg(), cpu_steal()
    steal = 100 * (steal1[0] - steal0[0]) / max(steal1[1] - steal0[1], 1)
    print("\n| capture | packets | analyze steady | vs tshark | vs dpkt | vs nfstream | analyze peak RSS | "
          "--no-audit steady | audit share of wall |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cname, packets, res in summary:
        a = res["analyze"]

        def vs(tool: str, a: dict = a, res: dict = res) -> str:
            r = res.get(tool)
            return f"{a['steady'] / r['steady']:.0f}x" if r and r["steady"] else "n/a"

        na = res["analyze --no-audit"]
        share = max(a["seconds"] - na["seconds"], 0.0) / a["seconds"]
        print(f"| {cname} | {packets:,} | {a['steady'] / 1e6:.2f} M/s | {vs('tshark')} | {vs('dpkt')} | "
              f"{vs('nfstream')} | {a['rss_mib']:.0f} MiB | {na['steady'] / 1e6:.2f} M/s | {100 * share:.0f} % |")
    print(f"\nload average before/after: {load0[0]:.2f} / {load1[0]:.2f}; CPU steal during the runs: {steal:.1f} %; "
          f"best of {args.repeat} runs ({max(1, args.repeat - 1)} for tshark and dpkt); start-up (best of 5 on a "
          "147-packet capture) subtracted for 'steady'; ratios are steady rates measured in this run.")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, default=2_000_000, help="minimum packets in the generated capture")
    ap.add_argument("--capture", type=Path, help="benchmark this capture instead of generating one")
    ap.add_argument("--replay", type=Path, default=FIXTURE,
                    help="the kernel capture (little-endian pcap, Ethernet) to replay; default: a BIG TCP sender's MSS "
                         "segments. tests/fixtures/kernel/v6_185000.rcv.pcap gives a receiver's HBH super-packets")
    ap.add_argument("--keep", action="store_true", help="keep the generated capture and outputs")
    ap.add_argument("--skip", action="append", default=[], help="skip a peer: tshark, dpkt, nfstream, audit")
    ap.add_argument("--repeat", type=int, default=3, help="runs per fast tool (the best is kept)")
    ap.add_argument("--field", action="store_true",
                    help="benchmark the field-shaped captures (receiver, sender, many flows, pcapng, .gz) in one run")
    args = ap.parse_args()
    py = sys.executable
    exe = shutil.which("bigtcp-pcap", path=str(Path(py).parent)) or shutil.which("bigtcp-pcap")
    if exe is None:
        print("bench: bigtcp-pcap is not installed (run scripts/setup demo first)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bigtcp-bench-"))
    if args.field:
        try:
            return field(args, exe, py, work)
        finally:
            if args.keep:
                print(f"kept {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)
    try:
        if args.capture:
            cap = args.capture
            count = subprocess.run([py, "-c", ("import sys; from bigtcp_pcap.capture import CaptureReader; "
                                               "print(sum(len(b) for b in CaptureReader(sys.argv[1])))"), str(cap)],
                                   capture_output=True, text=True, check=True)
            packets = int(count.stdout)
        else:
            cap = work / "bench.pcap"
            t = time.perf_counter()
            packets = build_capture(args.replay, cap, args.packets)
            print(f"built {cap} from {args.replay.name}: {packets:,} packets, {cap.stat().st_size / 2**20:.0f} MiB "
                  f"({time.perf_counter() - t:.1f} s)")
        # warm the page cache and the tools' own caches so that every tool starts equal
        subprocess.run(["cat", str(cap)], stdout=subprocess.DEVNULL, check=False)
        subprocess.run([exe, "analyze", str(SMALL), "-o", str(work / "warm"), "--no-progress"], capture_output=True,
                       check=False)
        out = str(work / "out")
        tools = [("bigtcp-pcap analyze --no-audit", [exe, "analyze", "{}", "-o", out, "--no-progress", "--no-audit"])]
        if "audit" not in args.skip:
            tools.append(("bigtcp-pcap analyze (default audit)", [exe, "analyze", "{}", "-o", out, "--no-progress"]))
        tools.append(("bigtcp-pcap analyze --packets", [exe, "analyze", "{}", "-o", out, "--no-progress",
                                                        "--no-audit", "--packets"]))
        if "tshark" not in args.skip and shutil.which("tshark"):
            tools.append(("tshark -T fields", TSHARK))
        if "dpkt" not in args.skip:
            tools.append(("dpkt loop (pcap.Reader + decode)", [py, "-c", DPKT_LOOP]))
        if "nfstream" not in args.skip:
            if subprocess.run([py, "-c", "import nfstream"], capture_output=True, check=False).returncode == 0:
                subprocess.run([py, "-c", NFSTREAM, str(SMALL)], capture_output=True, check=False)  # first-run setup
                tools.append(("nfstream (1 meter)", [py, "-c", NFSTREAM]))
            else:
                print("nfstream: not installed, skipped (pip install nfstream)")
        results = []
        steal0 = cpu_steal()
        for name, cmd in tools:
            slow = name.startswith(("tshark", "dpkt"))
            results.append(measure(name, cmd, cap, packets, 1 if slow else args.repeat))
            r = results[-1]
            print(f"  {name}: {r['seconds']:.2f} s" + (f"  rc={r['rc']} {r['err']}" if r["err"] else ""), flush=True)
        base = results[0]
        print(f"\n{'tool':36} {'wall s':>7} {'CPU s':>6} {'start-up s':>10} {'packets/s':>11} {'steady/s':>11} "
              f"{'steady vs us':>12} {'peak RSS MiB':>12}")
        for r in results:
            ratio = f"1/{base['steady'] / r['steady']:.1f}" if r["steady"] and r is not base else "1"
            print(f"{r['name']:36} {r['seconds']:7.2f} {r['cpu']:6.2f} {r['startup']:10.2f} {r['pps']:11,.0f} "
                  f"{r['steady']:11,.0f} {ratio:>12} {r['rss_mib']:12.0f}")
        steal1 = cpu_steal()
        steal = 100 * (steal1[0] - steal0[0]) / max(steal1[1] - steal0[1], 1)
        print(f"\nCPU steal during the runs (time the hypervisor gave to other guests): {steal:.1f} %")
        print(f"{packets:,} packets, {cap.stat().st_size / 2**20:.0f} MiB. wall: best of {args.repeat} runs (1 for "
              f"tshark and dpkt); start-up: the same command on a 147-packet capture (best of "
              f"{max(5, 2 * args.repeat)}); steady: packets / (wall - start-up); 'steady vs us' 1/N: N times slower "
              "than bigtcp-pcap analyze --no-audit.")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
