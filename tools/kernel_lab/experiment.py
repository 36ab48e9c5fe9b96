"""One scenario run from start to finish: namespaces, veth, limits, topology, captures, traffic, read-back.

``Experiment(SCENARIOS[name], outdir, nbytes, snaplen, cpu).run()`` writes ``<name>.<side>.pcap`` and
``<name>.json`` into ``outdir`` and returns the JSON record. Every command goes through a ``Runner`` so the JSON
lists them; the parts that must run inside a namespace as Python (netlink, tc bpf, relays, probe) are this
package's hidden entry points (``runner.helper_command``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .cpu import CpuPlan, counter_delta, cpu_counters
from .host import kernel_hz, source_sha256, tool_versions
from .napitrace import NapiTrace
from .pcapsummary import pcap_header, summarize_pcap
from .relays import PROBE_PORT
from .runner import CaptureError, Runner, helper_command, stop_process
from .scenarios import (
    DEFAULT_BYTES,
    DEFAULT_CAPTURES,
    DEFAULT_SNAPLEN,
    GENEVE_MTU,
    GENEVE_PORT,
    IPERF_LEN,
    IPV4_RCV,
    IPV4_SND,
    IPV6_RCV,
    IPV6_SND,
    LINKTYPE_NAMES,
    OVERLAY,
    OVERLAY_PREFIX,
    PORT_V4,
    PORT_V6,
    QINQ_INNER_ID,
    QINQ_OUTER_ID,
    SIDE_NAMES,
    TUNNEL_VNI,
    VXLAN_MTU,
    VXLAN_PORT,
    Scenario,
)

GENERATED_BY = "tools/kernel_lab"  # the JSON's generated_by (run as scripts/make_kernel_captures.py or -m)


class Experiment:
    """One scenario run: namespaces, veth, limits, captures, traffic, read-back, cleanup."""

    def __init__(
        self, sc: Scenario, outdir: Path, nbytes: int | None, snaplen: int | None, cpu: CpuPlan | None = None,
        sender_qdisc: str | None = None, suffix: str = "", rx_drop: int | None = None,
    ) -> None:
        self.sc, self.outdir = sc, outdir
        # tc qdisc spec for va instead of "pfifo limit 10000": "netem loss 0.5% limit 10000" drops before the
        # sender's tap (the capture shows only the retransmission), "noqueue" lets the 256-slot veth ring drop after
        # it (the sender's capture shows a segment the receiver never got)
        self.sender_qdisc = sender_qdisc
        self.rx_drop = rx_drop  # XDP on vb drops one data frame in rx_drop at random (after the sender's tap)
        self.suffix = suffix  # appended to the scenario name in the output file names
        self.cpu = cpu or CpuPlan()
        self.napi_trace: NapiTrace | None = None
        self.nbytes = nbytes or sc.nbytes or DEFAULT_BYTES
        self.snaplen = snaplen or sc.snaplen or DEFAULT_SNAPLEN
        self.dst = {6: IPV6_RCV, 4: IPV4_RCV}  # iperf3 server addresses (the overlay's for other topologies)
        self.relays: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        tag = f"{os.getpid()}-{sc.name}"
        self.snd, self.rcv = f"btp-snd-{tag}", f"btp-rcv-{tag}"
        self.r = Runner()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.info: dict[str, Any] = {"scenario": dataclasses.asdict(sc)}
        self.tmp = Path(tempfile.mkdtemp(prefix=f"btp-{sc.name}-"))

    # -- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        """Create the namespaces and the veth pair, set offloads, qdisc and limits, wait for the link, check limits."""
        r, snd, rcv = self.r, self.snd, self.rcv
        r.run(["ip", "netns", "add", snd])
        r.run(["ip", "netns", "add", rcv])
        r.run(["ip", "-n", snd, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", rcv])
        for ns, dev, a6, a4 in ((snd, "va", IPV6_SND, IPV4_SND), (rcv, "vb", IPV6_RCV, IPV4_RCV)):
            r.run(["ip", "-n", ns, "link", "set", "lo", "up"])
            r.run(["ip", "-n", ns, "link", "set", dev, "mtu", "1500"])
            r.run(["ip", "-n", ns, "-6", "addr", "add", f"{a6}/64", "dev", dev, "nodad"])
            r.run(["ip", "-n", ns, "-4", "addr", "add", f"{a4}/30", "dev", dev])
        r.run(["ethtool", "-K", "va", "tso", "off", "gso", "off"], ns=snd)
        r.run(["ethtool", "-K", "vb", "gro", "on"], ns=rcv)
        if self.sender_qdisc == "noqueue":
            r.run(["tc", "qdisc", "del", "dev", "va", "root"], ns=snd, check=False)
            r.run(["tc", "qdisc", "replace", "dev", "va", "root", "noqueue"], ns=snd, check=False)
        else:
            spec = (self.sender_qdisc or "pfifo limit 10000").split()
            r.run(["tc", "qdisc", "replace", "dev", "va", "root", *spec], ns=snd)
        self.info["sender_qdisc"] = self.sender_qdisc or "pfifo limit 10000"
        for ns, dev in ((snd, "va"), (rcv, "vb")):
            v6, v4 = self.sc.sizes(dev)
            if v6 is not None:
                n = str(v6)
                r.run(["ip", "-n", ns, "link", "set", "dev", dev, "gso_max_size", n, "gro_max_size", n])
            if v4 is not None:
                n = str(v4)
                cp = r.run(helper_command("--_netlink", "set4", dev, n, n), ns=ns)
                self.info.setdefault("ipv4_limit_method", {})[dev] = json.loads(cp.stdout)["method"]
        for ns, dev in ((snd, "va"), (rcv, "vb")):
            r.run(["ip", "-n", ns, "link", "set", dev, "up"])
        # Wait for both ends to report operstate "up" (addresses use nodad, so no DAD wait).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            states = [
                r.run(["cat", f"/sys/class/net/{dev}/operstate"], ns=ns, check=False).stdout.strip()
                for ns, dev in ((snd, "va"), (rcv, "vb"))
            ]
            if states == ["up", "up"]:
                break
            time.sleep(0.1)
        else:
            raise CaptureError(f"veth pair did not come up (operstate {states})")
        if self.cpu.threaded is not None:  # threaded NAPI of the receiver's veth (needs GRO on, link up)
            r.run(["sh", "-c", f"echo {self.cpu.threaded} > /sys/class/net/vb/threaded"], ns=rcv)
            got = r.run(["cat", "/sys/class/net/vb/threaded"], ns=rcv).stdout.strip()
            if got != str(self.cpu.threaded):
                raise CaptureError(f"vb threaded reads back {got!r}, wanted {self.cpu.threaded}")
        if self.rx_drop is not None:
            if self.sc.topology != "veth":
                raise CaptureError("--rx-drop needs a plain veth scenario")
            cp = r.run(helper_command("--_xdpdrop", "vb", str(self.rx_drop)), ns=rcv)
            self.info["rx_drop"] = json.loads(cp.stdout) | {"one_in": self.rx_drop}
        self.check_limits()
        if self.sc.topology != "veth":
            self.setup_topology()

    # -- linktype topologies -------------------------------------------------------------------
    def setup_topology(self) -> None:
        """Build the scenario's extra topology on the veth underlay, address it and check it carries traffic.

        * ``qinq``: 802.1ad 100 + 802.1Q 200 on every frame between va and vb. With 8021q devices
          (``va.ad``/``va.q``) when the kernel has them, else a clsact eBPF program on each veth pushing both
          tags on egress and popping them on ingress (same frames on the wire).
        * ``vxlan``: ``vx0`` VXLAN VNI 42, UDP 4789, over the IPv4 underlay (10.199.0.x on va/vb).
        * ``geneve``: ``gn0`` Geneve VNI 42, UDP 6081, over the IPv6 underlay (fd00:b1::x): the kernel's
          geneve device when it has one, else a tap device + a userspace Geneve endpoint (_geneve_relay).
        * ``tun``: ``tn0`` tun devices in both namespaces joined by _tun_relay (point-to-point, RAW).

        The first overlay packet is sent by check_overlay() once the captures run, so they also hold the
        neighbour resolution through the topology (ARP and ND inside the tunnel, tagged ARP).
        """
        r, snd, rcv, topo = self.r, self.snd, self.rcv, self.sc.topology
        (a6s, a6r), (a4s, a4r) = OVERLAY[topo]
        self.dst = {6: a6r, 4: a4r}
        t: dict[str, Any] = {"kind": topo}
        if topo == "qinq":
            ad = ["type", "vlan", "proto", "802.1ad", "id", str(QINQ_OUTER_ID)]
            cp = r.run(["ip", "-n", snd, "link", "add", "link", "va", "name", "va.ad", *ad], check=False)
            if cp.returncode == 0:
                t["method"] = "8021q devices: X.ad (802.1ad 100) on the veth, X.q (802.1Q 200) on X.ad"
                r.run(["ip", "-n", rcv, "link", "add", "link", "vb", "name", "vb.ad", *ad])
                for ns, x in ((snd, "va"), (rcv, "vb")):
                    r.run(["ip", "-n", ns, "link", "add", "link", f"{x}.ad", "name", f"{x}.q", "type", "vlan",
                           "id", str(QINQ_INNER_ID)])  # fmt: skip
                    r.run(["ip", "-n", ns, "link", "set", f"{x}.ad", "up"])
                    r.run(["ip", "-n", ns, "link", "set", f"{x}.q", "up"])
                devs = {"snd": "va.q", "rcv": "vb.q"}
            else:
                t["method"] = (
                    "clsact + eBPF on each veth: egress bpf_skb_vlan_push(802.1Q 200) then (802.1ad 100), "
                    "ingress bpf_skb_vlan_pop x2"
                )
                t["vlan_device_unavailable"] = cp.stderr.strip()
                for ns, x in ((snd, "va"), (rcv, "vb")):
                    r.run(["tc", "qdisc", "add", "dev", x, "clsact"], ns=ns)
                    cp = r.run(helper_command("--_tcbpf", x, str(QINQ_OUTER_ID), str(QINQ_INNER_ID)), ns=ns)
                    t.setdefault("bpf", {})[x] = json.loads(cp.stdout)
                    for d in ("egress", "ingress"):
                        t.setdefault("tc_filter_show", {})[f"{x} {d}"] = r.run(
                            ["tc", "filter", "show", "dev", x, d], ns=ns
                        ).stdout.strip().splitlines()
                devs = {"snd": "va", "rcv": "vb"}
        elif topo == "vxlan":
            for ns, x, local, remote in ((snd, "va", IPV4_SND, IPV4_RCV), (rcv, "vb", IPV4_RCV, IPV4_SND)):
                r.run(["ip", "-n", ns, "link", "add", "vx0", "type", "vxlan", "id", str(TUNNEL_VNI), "remote",
                       remote, "local", local, "dstport", str(VXLAN_PORT), "dev", x])  # fmt: skip
                r.run(["ip", "-n", ns, "link", "set", "vx0", "mtu", str(VXLAN_MTU), "up"])
            devs = {"snd": "vx0", "rcv": "vx0"}
        elif topo == "geneve":
            gn = ["type", "geneve", "id", str(TUNNEL_VNI), "dstport", str(GENEVE_PORT)]
            cp = r.run(["ip", "-n", snd, "link", "add", "gn0", *gn, "remote", IPV6_RCV], check=False)
            if cp.returncode == 0:
                t["method"] = "kernel geneve device"
                r.run(["ip", "-n", rcv, "link", "add", "gn0", *gn, "remote", IPV6_SND])
            else:
                t["method"] = (
                    "tap gn0 + userspace Geneve endpoint (this package's --_geneve_relay): kernel UDP sockets on "
                    "the underlay, 8-byte Geneve header (no options, protocol 0x6558, VNI 42)"
                )
                t["geneve_device_unavailable"] = cp.stderr.strip()
                for side, ns, local, peer in (("snd", snd, IPV6_SND, IPV6_RCV), ("rcv", rcv, IPV6_RCV, IPV6_SND)):
                    self.start_relay(f"geneve_{side}", ns, ["--_geneve_relay", "gn0", local, peer, str(TUNNEL_VNI)])
            for ns in (snd, rcv):
                r.run(["ip", "-n", ns, "link", "set", "gn0", "mtu", str(GENEVE_MTU), "up"])
            devs = {"snd": "gn0", "rcv": "gn0"}
        elif topo == "tun":
            t["method"] = "tun tn0 in each namespace (IFF_VNET_HDR, TSO4/TSO6/CSUM), joined by _tun_relay"
            self.start_relay("tun", snd, ["--_tun_relay", "tn0", f"/run/netns/{rcv}"])
            for ns in (snd, rcv):
                r.run(["ip", "-n", ns, "link", "set", "tn0", "mtu", "1500", "up"])
            devs = {"snd": "tn0", "rcv": "tn0"}
        else:
            raise CaptureError(f"unknown topology {topo!r}")
        for side, ns, a6, a4 in (("snd", snd, a6s, a4s), ("rcv", rcv, a6r, a4r)):
            dev = devs[side]
            r.run(["ip", "-n", ns, "-6", "addr", "add", f"{a6}/{OVERLAY_PREFIX[6]}", "dev", dev, "nodad"])
            r.run(["ip", "-n", ns, "-4", "addr", "add", f"{a4}/{OVERLAY_PREFIX[4]}", "dev", dev])
        t["overlay_devices"] = devs
        t["addresses"] = {
            devs["snd"] + " (sender)": [f"{a6s}/{OVERLAY_PREFIX[6]}", f"{a4s}/{OVERLAY_PREFIX[4]}"],
            devs["rcv"] + " (receiver)": [f"{a6r}/{OVERLAY_PREFIX[6]}", f"{a4r}/{OVERLAY_PREFIX[4]}"],
        }
        self.info["topology"] = t
        t["links"] = {
            side: json.loads(r.run(["ip", "-d", "-j", "link", "show"], ns=ns).stdout)
            for side, ns in (("snd", snd), ("rcv", rcv))
        }

    def start_relay(self, name: str, ns: str, args: list[str]) -> None:
        """Start one of this package's relay entry points in ``ns`` and wait for its "ready" line."""
        out = self.tmp / f"relay-{name}.out"
        with open(out, "wb") as fo:
            p = self.r.popen(helper_command(*args), ns, stdout=fo, stderr=subprocess.STDOUT)
        self.procs.append(p)
        self.relays.append((name, p, out))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if '"ready"' in out.read_text(errors="replace"):
                return
            if p.poll() is not None:
                break
            time.sleep(0.05)
        raise CaptureError(f"relay {name} did not start: {out.read_text(errors='replace').strip()[-500:]}")

    def stop_relays(self) -> None:
        """Stop the relays (SIGTERM) and keep their packet counters for the JSON."""
        res = {}
        for name, p, out in self.relays:
            rc = stop_process(p, signal.SIGTERM, timeout=5)
            lines = out.read_text(errors="replace").strip().splitlines()
            stats = [json.loads(ln) for ln in lines if ln.startswith("{")]
            res[name] = {"exit_status": rc, "output": stats or lines[-5:]}
        if res:
            self.info["topology"]["relays"] = res

    def check_overlay(self) -> None:
        """A TCP connect per family over the overlay to a closed port: an RST back proves the path both ways
        (and fills the neighbour caches before the captures start). No ping binary is needed."""
        res = {}
        for fam in (6, 4):
            cmd = helper_command("--_probe", self.dst[fam], str(PROBE_PORT))
            for _ in range(10):
                cp = self.r.run(cmd, ns=self.snd, check=False)
                if cp.returncode == 0:
                    break
                time.sleep(0.3)
            else:
                raise CaptureError(f"no IPv{fam} path over {self.sc.topology}: {cp.stdout}{cp.stderr}")
            res[f"ipv{fam}"] = cp.stdout.strip()
        self.info["topology"]["connectivity_probe"] = res

    def check_limits(self) -> None:
        """Read every limit back (rtnetlink) and fail if it differs from what the scenario set."""
        for ns, dev in ((self.snd, "va"), (self.rcv, "vb")):
            want = self.sc.expected_limits(dev)
            cp = self.r.run(helper_command("--_netlink", "get", dev), ns=ns)
            got = json.loads(cp.stdout)["sizes"]
            self.info.setdefault("limits_read_back", {})[dev] = got
            bad = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
            if bad:
                raise CaptureError(f"{dev}: limits read back differ (got, want): {bad}")

    # -- capture + traffic ---------------------------------------------------------------------
    def start_tcpdump(
        self, ns: str, dev: str, path: Path, dlt: str | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """Start tcpdump on ``dev`` in ``ns`` (no filter, spec R20) and wait for its "listening on" line."""
        errpath = self.tmp / f"{path.name}.tcpdump.err"
        cmd = self.cpu.prefix(self.cpu.tcpdump) + [
            "tcpdump",
            "-i",
            dev,
            "-n",
            "-s",
            str(self.snaplen),
            "-B",
            "16384",
            "-Z",
            "root",
            "--immediate-mode",
        ]
        if dlt:
            cmd += ["-y", dlt]
        if self.tcpdump_nano:
            cmd += ["--time-stamp-precision", "nano"]
        cmd += ["-w", str(path)]  # deliberately no filter expression (spec R20)
        errf = open(errpath, "wb")  # noqa: SIM115 - handed to tcpdump, closed below
        p = self.r.popen(cmd, ns, stdout=subprocess.DEVNULL, stderr=errf)
        errf.close()
        self.procs.append(p)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if "listening on" in errpath.read_text(errors="replace"):
                return p, errpath
            if p.poll() is not None:
                break
            time.sleep(0.05)
        raise CaptureError(
            f"tcpdump on {dev} did not start: {errpath.read_text(errors='replace').strip()}"
        )

    @staticmethod
    def stop_tcpdump(p: subprocess.Popen[bytes], errpath: Path) -> dict[str, Any]:
        """Stop a tcpdump (SIGINT) and return its exit status, stderr and packet counters."""
        rc = stop_process(p, signal.SIGINT)
        text = errpath.read_text(errors="replace")
        errpath.unlink()
        counters = {}
        for key in ("captured", "received by filter", "dropped by kernel"):
            m = re.search(r"(\d+) packets? " + key, text)
            counters[key.replace(" ", "_")] = int(m.group(1)) if m else None
        return {"exit_status": rc, "stderr": text.strip().splitlines(), **counters}

    def wait_listening(self, port: int) -> None:
        """Wait until a TCP listener on ``port`` shows in the receiver namespace (``ss``)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            cp = self.r.run(["ss", "-Hltn", f"sport = :{port}"], ns=self.rcv, check=False)
            if cp.stdout.strip():
                return
            time.sleep(0.1)
        raise CaptureError(f"iperf3 server did not listen on port {port}")

    def traffic(self) -> None:
        """One bounded iperf3 transfer per family of the scenario, all at once; record their results."""
        flows = []
        for fam in self.sc.families:
            port, addr = (PORT_V6, self.dst[6]) if fam == 6 else (PORT_V4, self.dst[4])
            srv_cmd = self.cpu.prefix(self.cpu.server) + ["iperf3", "-s", "-1", "-B", addr, "-p", str(port)]
            srv = self.r.popen(srv_cmd, self.rcv, subprocess.DEVNULL, subprocess.DEVNULL)
            self.procs.append(srv)
            self.wait_listening(port)
            flows.append((fam, port, addr, srv, shlex.join(srv_cmd)))
        clients = []
        per_flow = self.sc.bytes_per_flow(self.nbytes)
        for fam, port, addr, srv, srv_cmd in flows:
            cmd = self.cpu.prefix(self.cpu.client) + [
                "iperf3", "-c", addr, "-p", str(port), "-n", str(per_flow), "-l", IPERF_LEN, "-J",
                "--connect-timeout", "5000",
            ]  # fmt: skip
            outf = self.tmp / f"iperf{fam}.json"
            with open(outf, "wb") as fo:
                c = self.r.popen(cmd, self.snd, stdout=fo, stderr=subprocess.STDOUT)
            self.procs.append(c)
            clients.append((fam, c, outf, srv, cmd, srv_cmd))
        res = {}
        for fam, c, outf, srv, cmd, srv_cmd in clients:
            try:
                c.wait(timeout=60)
            except subprocess.TimeoutExpired as e:
                raise CaptureError(f"iperf3 client (IPv{fam}) did not finish in 60 s") from e
            text = outf.read_text(errors="replace")
            outf.unlink()
            try:
                j = json.loads(text)
            except json.JSONDecodeError:
                j = {"raw": text[-2000:]}
            if c.returncode != 0 or "error" in j:
                raise CaptureError(f"iperf3 client (IPv{fam}) failed: {j.get('error', text[-300:])}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                srv.wait(timeout=5)  # -1: the server exits by itself after one test
            stop_process(srv, signal.SIGTERM, timeout=5)
            end = j.get("end", {})
            start = j.get("start", {})
            res[f"ipv{fam}"] = {
                "client_cmd": shlex.join(cmd),
                "server_cmd": srv_cmd,
                "bytes": per_flow,
                "blksize": IPERF_LEN,
                "tcp_mss_default": start.get("tcp_mss_default"),
                "sender_bytes": end.get("sum_sent", {}).get("bytes"),
                "sender_retransmits": end.get("sum_sent", {}).get("retransmits"),
                "receiver_bytes": end.get("sum_received", {}).get("bytes"),
                "seconds": end.get("sum_sent", {}).get("seconds"),
                "bits_per_second": end.get("sum_sent", {}).get("bits_per_second"),
            }
        self.info["iperf3"] = res

    # -- read-back of the environment ------------------------------------------------------------
    def read_back(self) -> None:
        """Record the environment as the kernel reports it: links, offloads, coalescing, qdiscs, sysfs, sysctls."""
        r = self.r
        dev_info: dict[str, Any] = {}
        for ns, dev in ((self.snd, "va"), (self.rcv, "vb")):
            d: dict[str, Any] = {"netns": ns}
            cp = r.run(["ip", "-d", "-j", "link", "show", "dev", dev], ns=ns)
            d["ip_d_j_link_show"] = json.loads(cp.stdout)[0]
            feats = r.run(["ethtool", "-k", dev], ns=ns).stdout.splitlines()
            keep = (
                "tcp-segmentation-offload", "tx-tcp-segmentation", "tx-tcp6-segmentation",
                "generic-segmentation-offload", "generic-receive-offload", "large-receive-offload",
                "rx-gro-hw", "rx-gro-list", "rx-udp-gro-forwarding", "scatter-gather",
                "tx-checksumming", "rx-checksumming",
            )  # fmt: skip
            d["ethtool_k"] = [ln.strip() for ln in feats if ln.strip().split(":")[0] in keep]
            cp = r.run(["ethtool", "-c", dev], ns=ns, check=False)
            d["ethtool_c"] = (cp.stdout + cp.stderr).strip().splitlines()
            cp = r.run(["ethtool", "-l", dev], ns=ns, check=False)
            d["ethtool_l"] = (cp.stdout + cp.stderr).strip().splitlines()
            d["qdisc"] = json.loads(r.run(["tc", "-j", "qdisc", "show", "dev", dev], ns=ns).stdout or "[]")
            sysfs = {}
            for leaf in ("gro_flush_timeout", "napi_defer_hard_irqs", "threaded", "mtu", "tx_queue_len"):
                cp = r.run(["cat", f"/sys/class/net/{dev}/{leaf}"], ns=ns, check=False)
                sysfs[leaf] = cp.stdout.strip() if cp.returncode == 0 else f"unreadable: {cp.stderr.strip()}"
            d["sysfs"] = sysfs
            link = d["ip_d_j_link_show"]
            d["limits"] = {
                k: link.get(k, self.info["limits_read_back"][dev].get(k))
                for k in ("gso_max_size", "gro_max_size", "gso_max_segs", "tso_max_size", "tso_max_segs")
            } | {
                k: self.info["limits_read_back"][dev].get(k)
                for k in ("gso_ipv4_max_size", "gro_ipv4_max_size")
            }
            dev_info[dev] = d
        self.info["interfaces"] = dev_info
        sysctls = {}
        for key in (
            "net.core.netdev_budget", "net.core.netdev_budget_usecs", "net.core.gro_normal_batch",
            "net.core.dev_weight", "net.ipv4.tcp_congestion_control", "net.ipv4.tcp_min_tso_segs",
            "net.ipv4.tcp_tso_rtt_log", "net.ipv4.tcp_timestamps", "net.ipv4.tcp_ecn",
        ):  # fmt: skip
            # net.core.* are global (readable only in the initial netns); net.ipv4.* per netns.
            ns = self.snd if key.startswith("net.ipv4.") else None
            cp = r.run(["sysctl", "-n", key], ns=ns, check=False)
            sysctls[key] = cp.stdout.strip() if cp.returncode == 0 else None
        self.info["sysctl"] = sysctls

    # -- orchestration --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run the whole scenario, always clean up and write ``<name>.json`` (with ``error`` on failure)."""
        caps = self.sc.captures
        files = {side: self.outdir / f"{self.sc.name}{self.suffix}.{side}.pcap" for side, *_ in caps}
        help_text = self.r.run(["tcpdump", "--help"], check=False)
        self.tcpdump_nano = "time-stamp-precision" in (help_text.stdout + help_text.stderr)
        capture: dict[str, Any] = {
            "snaplen": self.snaplen,
            "timestamp_precision": "nano" if self.tcpdump_nano else "micro",
            "filter": None,
        }
        for side, *_ in caps:
            capture[f"{SIDE_NAMES[side]}_file"] = files[side].name
        if caps != DEFAULT_CAPTURES:
            capture["interfaces"] = {
                SIDE_NAMES[side]: {"netns": self.snd if side == "snd" else self.rcv, "interface": iface,
                                   "tcpdump_y": dlt, "linktype_expected": lt}
                for side, iface, dlt, lt in caps
            }  # fmt: skip
        self.info |= {
            "generated_by": GENERATED_BY,
            "script_sha256": source_sha256(),
            "argv": sys.argv,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "kernel": platform.release(),
            "uname": " ".join(platform.uname()),
            "hz": kernel_hz(),
            "tools": tool_versions(self.r),
            "namespaces": {"sender": self.snd, "receiver": self.rcv},
            "addresses": {
                "va": [f"{IPV6_SND}/64", f"{IPV4_SND}/30"],
                "vb": [f"{IPV6_RCV}/64", f"{IPV4_RCV}/30"],
            },
            "capture": capture,
        }
        if self.sc.group != "gro":
            self.info["iperf3_bytes"] = self.nbytes
        try:
            self.setup()
            self.read_back()
            running = []
            for side, iface, dlt, _lt in caps:
                ns = self.snd if side == "snd" else self.rcv
                running.append((side, *self.start_tcpdump(ns, iface, files[side], dlt)))
            time.sleep(0.2)
            if self.sc.topology != "veth":
                self.check_overlay()
            if self.cpu.trace_napi:
                self.napi_trace = NapiTrace(f"btp-{os.getpid()}-{self.sc.name}")
                self.napi_trace.start()
            before = cpu_counters()
            self.traffic()
            after = cpu_counters()
            if self.napi_trace is not None:
                self.info["napi_trace"] = self.napi_trace.stop(self.outdir / f"{self.sc.name}{self.suffix}.napi.tsv")
            self.info["cpu"] = self.cpu.record() | {"counters_during_traffic": counter_delta(before, after)}
            if self.rx_drop is not None:  # veth's per-queue XDP counters (ethtool -S): what the program dropped
                st = self.r.run(["ethtool", "-S", "vb"], ns=self.rcv, check=False).stdout.splitlines()
                self.info["rx_drop"]["ethtool_S"] = [ln.strip() for ln in st if "xdp" in ln or "drop" in ln]
            time.sleep(1.5)  # > libpcap's TPACKET_V3 block timeout, so every packet reaches the file
            for side, p, errpath in running:
                self.info["capture"][f"tcpdump_{SIDE_NAMES[side]}"] = self.stop_tcpdump(p, errpath)
            self.stop_relays()
            for side in (f"tcpdump_{SIDE_NAMES[c[0]]}" for c in caps):
                drops = self.info["capture"][side]["dropped_by_kernel"]
                if drops != 0:
                    raise CaptureError(
                        f"{side}: tcpdump reported {drops} packets dropped by kernel"
                    )
                cap = self.info["capture"][side]
                if cap["captured"] != cap["received_by_filter"]:
                    raise CaptureError(
                        f"{side}: tcpdump captured {cap['captured']} of {cap['received_by_filter']}"
                    )
            if caps != DEFAULT_CAPTURES:
                self.check_linktypes(files)
            self.summarize(files)
        except BaseException as e:
            self.info["error"] = f"{type(e).__name__}: {e}"
            raise
        finally:
            self.cleanup()
            self.info["commands"] = self.r.log
            (self.outdir / f"{self.sc.name}{self.suffix}.json").write_text(
                json.dumps(self.info, indent=1) + "\n"
            )
        return self.info

    def check_linktypes(self, files: dict[str, Path]) -> None:
        """The linktype each file was written with (pcap header, and capinfos when installed) must be the
        scenario's."""
        for side, _iface, _dlt, want in self.sc.captures:
            path = files[side]
            got = pcap_header(path)["linktype"]
            rec: dict[str, Any] = {"linktype": got, "name": LINKTYPE_NAMES.get(got, "?")}
            if shutil.which("capinfos"):
                cp = self.r.run(["capinfos", "-t", "-E", "-l", str(path)], check=False)
                rec["capinfos"] = [ln.strip() for ln in cp.stdout.splitlines()[1:] if ln.strip()]
            self.info["capture"][f"{SIDE_NAMES[side]}_linktype"] = rec
            if got != want:
                raise CaptureError(f"{path.name}: linktype {got}, expected {want}")

    def summarize(self, files: dict[str, Path]) -> None:
        """Summarise the captures into ``observed`` and ``mss_seen``; a sender packet above the MSS is an error."""
        if self.sc.captures == DEFAULT_CAPTURES and self.sc.topology == "veth":
            snd_pcap, rcv_pcap = files["snd"], files["rcv"]
            snd = summarize_pcap(snd_pcap)
            mss = {f["family"]: f["max_payload"] for f in snd["flows"]}
            rcv = summarize_pcap(rcv_pcap, mss)
            self.info["mss_seen"] = {f"ipv{k}": v for k, v in mss.items()} | {"syn_mss_options": snd["syn_mss_options"]}
            self.info["observed"] = {"sender": snd, "receiver": rcv}
            for f in snd["flows"]:
                if f["packets_payload_gt_mss"]:
                    raise CaptureError(f"sender capture has packets larger than the MSS: {f}")
            return
        # Other scenarios may lack a sender capture (or, tun, see GSO packets there): the segment count uses
        # the MSS the SYNs announce, minus the 12 bytes of the timestamp option.
        first = {side: summarize_pcap(path) for side, path in files.items()}
        mss: dict[int, int] = {}
        for summ in first.values():
            for fam, m in summ["mss_from_syn"].items():
                mss[fam] = min(mss.get(fam, m), m)
        self.info["mss_seen"] = {f"ipv{k}": v for k, v in sorted(mss.items())} | {
            "source": "SYN MSS option minus 12 (timestamp option)",
            "syn_mss_options": sorted({m for summ in first.values() for m in summ["syn_mss_options"]}),
        }
        self.info["observed"] = {SIDE_NAMES[side]: summarize_pcap(path, mss) for side, path in files.items()}
        if self.sc.topology != "tun":  # a tun sender with TSO hands 64 KiB GSO packets to the capture
            for f in self.info["observed"].get("sender", {}).get("flows", []):
                if f["packets_payload_gt_mss"]:
                    raise CaptureError(f"sender capture has packets larger than the MSS: {f}")

    def cleanup(self) -> None:
        """Stop every process started, delete the namespaces and the temporary directory."""
        if self.napi_trace is not None:
            self.napi_trace.close()
        for p in self.procs:
            stop_process(p, signal.SIGTERM, timeout=5)
        for ns in (self.snd, self.rcv):
            with contextlib.suppress(CaptureError):
                self.r.run(["ip", "netns", "del", ns], check=False, timeout=20)
        shutil.rmtree(self.tmp, ignore_errors=True)


def one_line_summary(info: dict[str, Any]) -> str:
    """A human summary of a finished scenario."""
    parts = [info["scenario"]["name"]]
    for f in info.get("observed", {}).get("receiver", {}).get("flows", []):
        parts.append(
            f"IPv{f['family']} rcv segs={f['segments_histogram']} max_frame={f['largest_frame']} "
            f"hbh={f['hbh_jumbo']} totlen0={f['ipv4_tot_len_0']}"
        )
    cap = info.get("capture", {})
    drops = [cap.get(k, {}).get("dropped_by_kernel") for k in ("tcpdump_sender", "tcpdump_receiver")]
    parts.append(f"drops={drops}")
    if "rx_drop" in info:
        parts.append("rx_drop " + ", ".join(info["rx_drop"].get("ethtool_S", [])))
    return " | ".join(parts)


