#!/usr/bin/env python3
"""Make real Linux egress (GSO/TSO) capture pairs: what a BIG TCP sender hands its device, and what a bridge
port with smaller limits transmits (docs/gso-spec.md, issue 13).

Topology, three fresh network namespaces per scenario (names ``eg-a-<pid>``, ``eg-b-<pid>``, ``eg-c-<pid>``)::

    ns A: a0 (BIG TCP sender, TSO on) --veth-- a1 ] ns B: bridge egbr0 [ b1 --veth-- b0 :ns C (iperf3 server)

* ``a0``: gso_max_size 185000 (IPv6, ``ip link``) and gso_ipv4_max_size 185000 (rtnetlink IFLA 63, iproute2
  6.1 cannot set it), TSO on (the veth default), so tcpdump on a0 records the sender's super-packets;
* ``b1``: the egress port under test, with the scenario's profile (gso_max_size, gso_ipv4_max_size,
  gso_max_segs, TSO on/off); tcpdump on b1 records what that port transmits after the egress decision;
* ``a1`` and ``b0`` keep the defaults. veth hands a GSO skb unchanged to its peer (no GRO: the sending peer has
  TSO on), so the bridge forwards a0's skbs whole to b1 (gso-spec G13).

Both captures are ``tcpdump -s 128`` with no filter (a port filter hides IPv6 HBH jumbo packets). Each
scenario writes ``<name>.a0.pcap.xz``, ``<name>.b1.pcap.xz`` (xz -9e) and ``<name>.json``:
every command, the ``ip -d -j link show`` and ``ethtool -k`` of a0 and b1, the rtnetlink read-back of all
limits, tcpdump counters, iperf3 results and a frame-length summary of both captures.

Usage (as root)::

    python scripts/make_egress_captures.py --outdir tests/fixtures/kernel/egress --all
    python scripts/make_egress_captures.py --outdir /tmp/eg --scenario v6_gso65536 --bytes 4000000
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import lzma
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_kernel_captures import (  # the sibling script, imported by path
    CaptureError,
    Runner,
    kernel_hz,
    parse_frame,
    read_pcap,
    stop_process,
    tool_versions,
)

KERNEL_SCRIPT = Path(__file__).resolve().parent / "make_kernel_captures.py"
A0_V6, B0_V6 = "fd00:e9::1", "fd00:e9::3"
A0_V4, B0_V4 = "10.197.0.1", "10.197.0.3"
PORT = 5201
BIG = 185000
DEFAULT_BYTES = 1_000_000
SNAPLEN = 128
IPERF_LEN = "1M"  # large writes, so TSO autosizing (not the write size) decides the skb sizes


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One run: the address family of the iperf3 flow and b1's egress profile (None: kernel default)."""

    name: str
    family: int
    gso_max_size: int | None = None  # b1, ip link set gso_max_size (also lowers the IPv4 limit if <= 65536)
    gso_ipv4_max_size: int | None = None  # b1, rtnetlink IFLA_GSO_IPV4_MAX_SIZE
    gso_max_segs: int | None = None  # b1, ip link set gso_max_segs
    tso: bool = True  # b1, ethtool -K b1 tso on|off
    qinq: bool = False  # 802.1ad 100 + 802.1Q 200 pushed on a0 (tc eBPF), popped on b0: in-band inner tag
    note: str = ""


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("v6_gso65536", 6, note="b1 defaults: gso_max_size 65536; every skb >= 65536 bytes is cut (G2)"),
    Scenario("v6_gso100000", 6, gso_max_size=100000, note="b1 gso_max_size 100000: only the largest skbs cut"),
    Scenario("v6_segs24", 6, gso_max_size=BIG, gso_max_segs=24, note="b1 gso_max_segs 24 (size limit 185000)"),
    Scenario("v6_tso_off", 6, gso_max_size=BIG, tso=False, note="ethtool -K b1 tso off: every GSO skb cut (G4)"),
    Scenario("v6_edge", 6, gso_max_size=184306,
             note="b1 gso_max_size = the frame length of a0's largest skb (184306): cut, since the test is >= on "
                  "skb->len with L2 and the HBH (G2)"),
    Scenario("v6_edge_plus1", 6, gso_max_size=184307, note="one byte more than v6_edge: those skbs pass whole (G2)"),
    Scenario("v6_qinq_g3", 6, gso_max_size=BIG, qinq=True,
             note="QinQ-tagged IPv6 through b1 with gso_max_size 185000 and gso_ipv4_max_size 65536: the inner "
                  "tag is in-band, skb->protocol is 802.1Q, so the IPv4 limit applies (G3)"),
    Scenario("v4_gso65536", 4, note="IPv4 BIG TCP through b1 at the defaults (gso_ipv4_max_size 65536)"),
    Scenario("v4_gso100000", 4, gso_max_size=100000, gso_ipv4_max_size=100000,
             note="b1 gso_ipv4_max_size 100000"),
    Scenario("v4_segs24", 4, gso_max_size=BIG, gso_ipv4_max_size=BIG, gso_max_segs=24,
             note="b1 gso_max_segs 24 (IPv4 size limit 185000)"),
    Scenario("v4_tso_off", 4, gso_max_size=BIG, gso_ipv4_max_size=BIG, tso=False, note="ethtool -K b1 tso off"),
)}


class Experiment:
    """One scenario: namespaces, veths, bridge, limits, captures, traffic, read-back, cleanup."""

    def __init__(self, sc: Scenario, outdir: Path, nbytes: int) -> None:
        self.sc, self.outdir, self.nbytes = sc, outdir, nbytes
        tag = os.getpid()
        self.ns = {"a": f"eg-a-{tag}", "b": f"eg-b-{tag}", "c": f"eg-c-{tag}"}
        self.r = Runner()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tmp = Path(tempfile.mkdtemp(prefix=f"eg-{sc.name}-"))
        self.info: dict[str, Any] = {"scenario": dataclasses.asdict(sc)}

    def netlink(self, ns: str, *args: str) -> dict[str, Any]:
        cp = self.r.run([sys.executable, str(KERNEL_SCRIPT), "--_netlink", *args], ns=ns)
        return json.loads(cp.stdout)

    def setup(self) -> None:
        r, a, b, c = self.r, self.ns["a"], self.ns["b"], self.ns["c"]
        for ns in (a, b, c):
            r.run(["ip", "netns", "add", ns])
            r.run(["ip", "-n", ns, "link", "set", "lo", "up"])
        r.run(["ip", "-n", a, "link", "add", "a0", "type", "veth", "peer", "name", "a1", "netns", b])
        r.run(["ip", "-n", c, "link", "add", "b0", "type", "veth", "peer", "name", "b1", "netns", b])
        r.run(["ip", "-n", b, "link", "add", "egbr0", "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        for dev in ("a1", "b1"):
            r.run(["ip", "-n", b, "link", "set", dev, "master", "egbr0"])
        for ns, dev, a6, a4 in ((a, "a0", A0_V6, A0_V4), (c, "b0", B0_V6, B0_V4)):
            r.run(["ip", "-n", ns, "-6", "addr", "add", f"{a6}/64", "dev", dev, "nodad"])
            r.run(["ip", "-n", ns, "-4", "addr", "add", f"{a4}/24", "dev", dev])
        for ns, dev in ((a, "a0"), (b, "a1"), (b, "b1"), (c, "b0"), (b, "egbr0")):
            r.run(["ip", "-n", ns, "link", "set", dev, "mtu", "1500"])
        # the sender: BIG TCP for both families, TSO on (veth default; set explicitly)
        r.run(["ip", "-n", a, "link", "set", "dev", "a0", "gso_max_size", str(BIG), "gro_max_size", str(BIG)])
        self.info["a0_ipv4_limit_method"] = self.netlink(a, "set4", "a0", str(BIG), str(BIG))["method"]
        r.run(["ethtool", "-K", "a0", "tso", "on", "gso", "on"], ns=a)
        # the egress port under test
        sc = self.sc
        if sc.gso_max_size is not None:
            r.run(["ip", "-n", b, "link", "set", "dev", "b1", "gso_max_size", str(sc.gso_max_size)])
        if sc.gso_ipv4_max_size is not None:
            self.info["b1_ipv4_limit_method"] = self.netlink(b, "set4", "b1", str(sc.gso_ipv4_max_size),
                                                             str(sc.gso_ipv4_max_size))["method"]
        if sc.gso_max_segs is not None:
            r.run(["ip", "-n", b, "link", "set", "dev", "b1", "gso_max_segs", str(sc.gso_max_segs)])
        r.run(["ethtool", "-K", "b1", "tso", "on" if sc.tso else "off"], ns=b)
        if sc.qinq:  # the capture script's tc eBPF push (egress) / pop (ingress) on both end points
            for ns, dev in ((a, "a0"), (c, "b0")):
                r.run(["tc", "qdisc", "add", "dev", dev, "clsact"], ns=ns)
                cp = r.run([sys.executable, str(KERNEL_SCRIPT), "--_tcbpf", dev, "100", "200"], ns=ns)
                self.info.setdefault("qinq_bpf", {})[dev] = json.loads(cp.stdout)
        for ns, dev in ((a, "a0"), (b, "a1"), (b, "b1"), (b, "egbr0"), (c, "b0")):
            r.run(["ip", "-n", ns, "link", "set", dev, "up"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            cp = r.run([sys.executable, str(KERNEL_SCRIPT), "--_probe", B0_V6 if sc.family == 6 else B0_V4, "9"],
                       ns=a, check=False)  # a TCP SYN to a closed port: the RST says b0 is reachable
            if cp.returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise CaptureError("a0 cannot reach b0 through the bridge")

    def read_back(self) -> None:
        dev_info: dict[str, Any] = {}
        for key, dev in (("a", "a0"), ("b", "b1")):
            ns = self.ns[key]
            link = json.loads(self.r.run(["ip", "-d", "-j", "link", "show", "dev", dev], ns=ns).stdout)
            sizes = self.netlink(ns, "get", dev)["sizes"]
            feats = self.r.run(["ethtool", "-k", dev], ns=ns).stdout.splitlines()
            keep = ("tcp-segmentation-offload", "tx-tcp-segmentation", "tx-tcp6-segmentation",
                    "tx-tcp-mangleid-segmentation", "generic-segmentation-offload", "generic-receive-offload",
                    "scatter-gather", "tx-checksumming")
            dev_info[dev] = {"netns": ns, "ip_d_j_link_show": link, "rtnetlink_sizes": sizes,
                             "ethtool_k": [ln.strip() for ln in feats if ln.strip().split(":")[0] in keep]}
        self.info["interfaces"] = dev_info
        sc, got = self.sc, dev_info["b1"]["rtnetlink_sizes"]
        want = {"gso_max_size": sc.gso_max_size or 65536,
                "gso_ipv4_max_size": sc.gso_ipv4_max_size or min(sc.gso_max_size or 65536, 65536),
                "gso_max_segs": sc.gso_max_segs or 65535}
        bad = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
        if bad:
            raise CaptureError(f"b1 limits read back differ (got, want): {bad}")
        a0 = dev_info["a0"]["rtnetlink_sizes"]
        if (a0.get("gso_max_size"), a0.get("gso_ipv4_max_size")) != (BIG, BIG):
            raise CaptureError(f"a0 limits read back: {a0}")
        tso_line = [ln for ln in dev_info["b1"]["ethtool_k"] if ln.startswith("tcp-segmentation-offload")]
        if not tso_line or tso_line[0].split(":")[1].split()[0] != ("on" if sc.tso else "off"):
            raise CaptureError(f"b1 TSO state reads {tso_line}")

    def start_tcpdump(self, ns: str, dev: str, path: Path) -> tuple[subprocess.Popen[bytes], Path]:
        errpath = self.tmp / f"{dev}.err"
        cmd = ["tcpdump", "-i", dev, "-n", "-s", str(SNAPLEN), "-B", "16384", "-Z", "root", "--immediate-mode",
               "--time-stamp-precision", "nano", "-w", str(path)]  # deliberately no filter expression
        with open(errpath, "wb") as errf:
            p = self.r.popen(cmd, ns, stdout=subprocess.DEVNULL, stderr=errf)
        self.procs.append(p)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if "listening on" in errpath.read_text(errors="replace"):
                return p, errpath
            if p.poll() is not None:
                break
            time.sleep(0.05)
        raise CaptureError(f"tcpdump on {dev} did not start: {errpath.read_text(errors='replace').strip()}")

    @staticmethod
    def stop_tcpdump(p: subprocess.Popen[bytes], errpath: Path) -> dict[str, Any]:
        rc = stop_process(p, signal.SIGINT)
        text = errpath.read_text(errors="replace")
        counters = {}
        for key in ("captured", "received by filter", "dropped by kernel"):
            n = [int(w.split()[0]) for w in text.splitlines() if w.endswith(key) or f" {key}" in w]
            counters[key.replace(" ", "_")] = n[0] if n else None
        return {"exit_status": rc, **counters}

    def traffic(self) -> None:
        fam = self.sc.family
        dst = B0_V6 if fam == 6 else B0_V4
        srv_cmd = ["iperf3", "-s", "-1", "-B", dst, "-p", str(PORT)]
        srv = self.r.popen(srv_cmd, self.ns["c"], subprocess.DEVNULL, subprocess.DEVNULL)
        self.procs.append(srv)
        deadline = time.monotonic() + 10
        while not self.r.run(["ss", "-Hltn", f"sport = :{PORT}"], ns=self.ns["c"], check=False).stdout.strip():
            if time.monotonic() > deadline:
                raise CaptureError("iperf3 server did not listen")
            time.sleep(0.1)
        cmd = ["iperf3", "-c", dst, "-p", str(PORT), "-n", str(self.nbytes), "-l", IPERF_LEN, "-J",
               "--connect-timeout", "5000"]
        cp = self.r.run(cmd, ns=self.ns["a"], timeout=60, check=False)
        try:
            j = json.loads(cp.stdout)
        except json.JSONDecodeError:
            j = {"error": cp.stdout[-300:] + cp.stderr[-300:]}
        if cp.returncode != 0 or "error" in j:
            raise CaptureError(f"iperf3 failed: {j.get('error')}")
        with contextlib.suppress(subprocess.TimeoutExpired):
            srv.wait(timeout=5)
        stop_process(srv, signal.SIGTERM, timeout=5)
        end = j.get("end", {})
        self.info["iperf3"] = {"client_cmd": " ".join(cmd), "server_cmd": " ".join(srv_cmd),
                               "bytes": self.nbytes, "sender_bytes": end.get("sum_sent", {}).get("bytes"),
                               "retransmits": end.get("sum_sent", {}).get("retransmits"),
                               "tcp_mss_default": j.get("start", {}).get("tcp_mss_default")}

    def run(self) -> dict[str, Any]:
        name = self.sc.name
        raw = {dev: self.tmp / f"{name}.{dev}.pcap" for dev in ("a0", "b1")}
        self.info |= {
            "generated_by": "scripts/make_egress_captures.py",
            "script_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
            "argv": sys.argv, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "kernel": platform.release(), "hz": kernel_hz(), "tools": tool_versions(self.r),
            "namespaces": self.ns,
            "topology": "ns A a0 --veth-- a1 [bridge egbr0 in ns B] b1 --veth-- b0 in ns C",
            "addresses": {"a0": [f"{A0_V6}/64", f"{A0_V4}/24"], "b0": [f"{B0_V6}/64", f"{B0_V4}/24"]},
            "capture": {"snaplen": SNAPLEN, "filter": None, "timestamp_precision": "nano",
                        "files": {dev: f"{name}.{dev}.pcap.xz" for dev in raw}},
        }
        try:
            self.setup()
            self.read_back()
            running = [(dev, *self.start_tcpdump(self.ns[k], dev, raw[dev])) for k, dev in (("a", "a0"),
                                                                                             ("b", "b1"))]
            time.sleep(0.2)
            self.traffic()
            time.sleep(1.5)  # > libpcap's TPACKET_V3 block timeout
            for dev, p, errpath in running:
                self.info["capture"][f"tcpdump_{dev}"] = c = self.stop_tcpdump(p, errpath)
                if c["dropped_by_kernel"] != 0 or c["captured"] != c["received_by_filter"]:
                    raise CaptureError(f"tcpdump on {dev} lost packets: {c}")
            self.info["observed"] = obs = {dev: summarize(raw[dev]) for dev in raw}
            sent = self.info["iperf3"]["sender_bytes"] or self.nbytes
            short = {dev: o["payload_bytes"] for dev, o in obs.items() if o["payload_bytes"] < sent}
            if short:  # the server got every byte, so each device carried them: a capture missed frames
                raise CaptureError(f"incomplete capture: iperf3 sent {sent} payload bytes, the captures hold {short} "
                                   f"(tcpdump counters {self.info['capture']})")
            for dev, path in raw.items():
                with open(path, "rb") as fi, lzma.open(self.outdir / f"{name}.{dev}.pcap.xz", "wb",
                                                       preset=9 | lzma.PRESET_EXTREME) as fo:
                    shutil.copyfileobj(fi, fo)
        except BaseException as e:
            self.info["error"] = f"{type(e).__name__}: {e}"
            raise
        finally:
            self.cleanup()
            self.info["commands"] = self.r.log
            (self.outdir / f"{name}.json").write_text(json.dumps(self.info, indent=1) + "\n")
        return self.info

    def cleanup(self) -> None:
        for p in self.procs:
            stop_process(p, signal.SIGTERM, timeout=5)
        for ns in self.ns.values():
            with contextlib.suppress(CaptureError):
                self.r.run(["ip", "netns", "del", ns], check=False, timeout=20)
        shutil.rmtree(self.tmp, ignore_errors=True)


def summarize(path: Path) -> dict[str, Any]:
    """Data frames of the a0 -> b0 direction by frame length (the ten most common), and their totals."""
    lens: Counter[int] = Counter()
    payload = 0
    for ts, orig, d in read_pcap(path):
        p = parse_frame(ts, orig, d)
        if p is not None and p.sport != PORT and p.payload > 0:
            lens[orig] += 1
            payload += p.payload
    return {"data_frames": sum(lens.values()), "payload_bytes": payload,
            "frame_lengths_top10": [[n, k] for n, k in lens.most_common(10)], "max_frame_len": max(lens, default=0)}


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--outdir", required=True, type=Path)
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="repeatable")
    ap.add_argument("--all", action="store_true", help="every scenario")
    ap.add_argument("--bytes", type=int, default=DEFAULT_BYTES, help=f"iperf3 -n (default {DEFAULT_BYTES})")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("make_egress_captures: must run as root (network namespaces, tcpdump)")
    for tool in ("ip", "ethtool", "tcpdump", "iperf3", "ss"):
        if shutil.which(tool) is None:
            sys.exit(f"make_egress_captures: required tool '{tool}' not found")
    names = sorted(SCENARIOS) if args.all else (args.scenario or [])
    if not names:
        ap.error("give --scenario NAME or --all")
    args.outdir.mkdir(parents=True, exist_ok=True)
    for name in names:
        info = Experiment(SCENARIOS[name], args.outdir, args.bytes).run()
        obs = info["observed"]
        print(f"{name}: a0 {obs['a0']['data_frames']} data frames (max {obs['a0']['max_frame_len']}), "
              f"b1 {obs['b1']['data_frames']} (max {obs['b1']['max_frame_len']}), "
              f"payload {obs['a0']['payload_bytes']} / {obs['b1']['payload_bytes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
