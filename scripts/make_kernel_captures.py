#!/usr/bin/env python3
"""Make real Linux BIG TCP / GRO capture pairs in two network namespaces.

This reproduces the experiment of ``gro-spec.md`` section 8 on the local kernel:

* two fresh network namespaces (``btp-snd-<pid>``, ``btp-rcv-<pid>``) joined by a veth pair,
  sender ``va`` and receiver ``vb``, MTU 1500, private addresses only inside those namespaces
  (``fd00:b1::1/64``/``::2`` with ``nodad``, ``10.199.0.1/30``/``.2``);
* ``ethtool -K va tso off gso off`` so that TCP's GSO skbs are cut into MSS segments before the
  driver, and ``ethtool -K vb gro on`` so that the receiving veth runs NAPI + GRO (spec R1);
* a ``pfifo limit 10000`` qdisc on ``va`` so the 256-slot veth ring does not drop (spec section 8.6);
* the BIG TCP limits of the scenario on each end (see ``SCENARIOS``): IPv6 with ``ip link set ...
  gso_max_size N gro_max_size N``; IPv4 ``gso_ipv4_max_size``/``gro_ipv4_max_size`` through
  rtnetlink (IFLA 63/64, iproute2 6.1 can neither set nor show them), all read back and checked;
* one bounded iperf3 transfer per address family (``-n BYTES -l 128K``; the ``mixed`` scenario runs
  an IPv6 and an IPv4 flow at once, BYTES/2 each), captured with tcpdump on BOTH sides with no
  filter (a ``tcp port`` filter hides every IPv6 HBH jumbo packet, spec R20).

Each scenario writes ``<name>.snd.pcap``, ``<name>.rcv.pcap`` and ``<name>.json`` (every setting
read back, every command line, tcpdump drop counters and a summary of what the captures show).

Usage (as root)::

    python scripts/make_kernel_captures.py --outdir tests/fixtures/kernel --all
    python scripts/make_kernel_captures.py --outdir /tmp/caps --scenario v6_80000 --bytes 3000000

The module is importable without side effects; ``summarize_pcap()`` is a small stdlib-only pcap
reader used for the JSON summaries and usable by tests.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import hashlib
import itertools
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------

IPV6_SND, IPV6_RCV = "fd00:b1::1", "fd00:b1::2"
IPV4_SND, IPV4_RCV = "10.199.0.1", "10.199.0.2"
PORT_V6, PORT_V4 = 5201, 5202
DEFAULT_BYTES = 3_000_000
DEFAULT_SNAPLEN = 96
IPERF_LEN = "128K"
BURST_GAP_S = 20e-6  # gro-spec 7.1 poll_gap_us
SAMPLE_SOURCE = (
    "v6_185000"  # sample.pcap = copy of this scenario's receiver capture (with --all)
)

# rtnetlink constants (include/uapi/linux/rtnetlink.h, if_link.h, netlink.h)
RTM_NEWLINK, RTM_GETLINK = 16, 18
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
IFLA = {
    "gso_max_segs": 40,
    "gso_max_size": 41,
    "gro_max_size": 58,
    "tso_max_size": 59,
    "tso_max_segs": 60,
    "gso_ipv4_max_size": 63,
    "gro_ipv4_max_size": 64,
}
IFLA_GSO_IPV4_MAX_SIZE = IFLA["gso_ipv4_max_size"]
IFLA_GRO_IPV4_MAX_SIZE = IFLA["gro_ipv4_max_size"]


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One capture run: which address families carry traffic and which limits are set.

    Each size sets both the GSO and the GRO limit of that end (None: leave the kernel default
    65536). IPv6: ``gso_max_size``/``gro_max_size`` (``ip link``); IPv4: ``gso_ipv4_max_size``/
    ``gro_ipv4_max_size`` (rtnetlink IFLA 63/64). The receiver's GRO limit is what GRO enforces
    (spec R15a); the sender's GSO limit sets how large the sender's back-to-back bursts are (T1/T2).
    """

    name: str
    families: tuple[
        int, ...
    ]  # 6 and/or 4; one iperf3 flow per family, run concurrently
    snd_v6: int | None  # va: gso_max_size = gro_max_size
    rcv_v6: int | None  # vb: gso_max_size = gro_max_size
    snd_v4: int | None  # va: gso_ipv4_max_size = gro_ipv4_max_size
    rcv_v4: int | None  # vb: gso_ipv4_max_size = gro_ipv4_max_size
    note: str = ""

    def sizes(self, dev: str) -> tuple[int | None, int | None]:
        """(IPv6 size, IPv4 size) to set on ``va`` (sender) or ``vb`` (receiver)."""
        return (self.snd_v6, self.snd_v4) if dev == "va" else (self.rcv_v6, self.rcv_v4)


BIG = 185000
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("v6_185000", (6,), BIG, BIG, None, None, "IPv6 BIG TCP; >64 KiB super-packets carry HBH"),
        Scenario("v6_80000", (6,), 80000, 80000, None, None, "IPv6 80000 both ends: 55-segment limit"),
        Scenario("v6_65536", (6,), None, None, None, None, "IPv6 default limits (65536)"),
        Scenario("v4_185000", (4,), None, None, BIG, BIG, "IPv4 BIG TCP via IFLA 63/64: tot_len 0"),
        Scenario("v4_65536", (4,), None, None, None, None, "IPv4 default limits (65536)"),
        Scenario(
            "v6_snd185000_rcv80000", (6,), BIG, 80000, None, None,
            "sender bursts up to 185000, receiver gro_max_size 80000 (gro-spec 8: 55 + 9 pattern)",
        ),
        Scenario(
            "v4_snd185000_rcv65536", (4,), None, None, BIG, None,
            "sender gso_ipv4 185000, receiver gro_ipv4 65536 (gro-spec 8: 45 + 19 pattern)",
        ),
        Scenario("mixed_185000", (6, 4), BIG, BIG, BIG, BIG, "IPv6 + IPv4 flows at once, both BIG TCP"),
    )
}  # fmt: skip


class CaptureError(RuntimeError):
    """A step of the experiment failed; the message says which."""


# ---------------------------------------------------------------------------------------------
# Command runner (every command is recorded for the JSON)
# ---------------------------------------------------------------------------------------------


class Runner:
    """Runs commands (optionally inside a namespace) with timeouts and records each command line."""

    def __init__(self) -> None:
        self.log: list[dict[str, Any]] = []

    @staticmethod
    def wrap(cmd: list[str], ns: str | None) -> list[str]:
        return ["ip", "netns", "exec", ns, *cmd] if ns else cmd

    def run(
        self,
        cmd: list[str],
        ns: str | None = None,
        timeout: float = 20,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        full = self.wrap(cmd, ns)
        try:
            cp = subprocess.run(
                full, check=False, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as e:
            self.log.append({"cmd": shlex.join(full), "rc": "timeout"})
            raise CaptureError(f"timed out after {timeout}s: {shlex.join(full)}") from e
        self.log.append({"cmd": shlex.join(full), "rc": cp.returncode})
        if check and cp.returncode != 0:
            raise CaptureError(
                f"failed ({cp.returncode}): {shlex.join(full)}: {cp.stderr.strip()}"
            )
        return cp

    def popen(
        self, cmd: list[str], ns: str | None, stdout: Any, stderr: Any
    ) -> subprocess.Popen[bytes]:
        full = self.wrap(cmd, ns)
        self.log.append({"cmd": shlex.join(full), "rc": "background"})
        # `ip netns exec` execs the command, so the Popen pid is the command's own pid.
        return subprocess.Popen(
            full, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL
        )


def stop_process(
    p: subprocess.Popen[bytes], sig: int = signal.SIGINT, timeout: float = 10
) -> int:
    """Send ``sig`` to a process we started, escalate to SIGKILL, return its exit status."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=5)
    return p.returncode


# ---------------------------------------------------------------------------------------------
# rtnetlink for the IPv4 BIG TCP limits (stdlib only; run inside the namespace)
# ---------------------------------------------------------------------------------------------


def _nl_request(
    msg_type: int, flags: int, ifindex: int, attrs: list[tuple[int, int]]
) -> list[bytes]:
    """Send one rtnetlink link message in the current netns; return the reply messages."""
    body = struct.pack(
        "=BxHiII", socket.AF_UNSPEC, 0, ifindex, 0, 0
    )  # struct ifinfomsg
    for typ, val in attrs:  # u32 attributes: struct rtattr {u16 len; u16 type} + u32
        body += struct.pack("=HHI", 8, typ, val)
    seq = int(time.time()) & 0xFFFFFFFF
    msg = struct.pack("=IHHII", 16 + len(body), msg_type, flags, seq, 0) + body
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.settimeout(5)
        s.bind((0, 0))
        s.send(msg)
        data = s.recv(1 << 17)
    replies = []
    off = 0
    while off + 16 <= len(data):
        ln, typ, _fl, _seq, _pid = struct.unpack_from("=IHHII", data, off)
        replies.append(data[off : off + ln])
        if typ == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", data, off + 16)
            if err != 0:
                raise OSError(-err, f"rtnetlink: {os.strerror(-err)}")
        off += (ln + 3) & ~3
    return replies


def nl_get_link_sizes(ifname: str) -> dict[str, int]:
    """Read the GSO/GRO/TSO size attributes of ``ifname`` (current netns) via RTM_GETLINK."""
    idx = socket.if_nametoindex(ifname)
    out: dict[str, int] = {}
    names = {v: k for k, v in IFLA.items()}
    for rep in _nl_request(RTM_GETLINK, NLM_F_REQUEST, idx, []):
        (typ,) = struct.unpack_from("=H", rep, 4)
        if typ != RTM_NEWLINK:
            continue
        off = 16 + 16
        while off + 4 <= len(rep):
            alen, atyp = struct.unpack_from("=HH", rep, off)
            if alen < 4:
                break
            atyp &= 0x3FFF
            if atyp in names and alen >= 8:
                out[names[atyp]] = struct.unpack_from("=I", rep, off + 4)[0]
            off += (alen + 3) & ~3
    return out


def nl_set_ipv4_sizes(ifname: str, gso: int, gro: int) -> str:
    """Set gso_ipv4_max_size/gro_ipv4_max_size of ``ifname`` (current netns); return the method used.

    pyroute2 is used when its ifinfmsg nla_map knows the attributes; otherwise a raw RTM_NEWLINK
    with IFLA_GSO_IPV4_MAX_SIZE (63) and IFLA_GRO_IPV4_MAX_SIZE (64) is sent.
    """
    try:
        from pyroute2 import IPRoute  # type: ignore[import-untyped]
        from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg  # type: ignore[import-untyped]

        known = {n[0] for n in ifinfmsg.nla_map}
        have = {"IFLA_GSO_IPV4_MAX_SIZE", "IFLA_GRO_IPV4_MAX_SIZE"} <= known
        ver = __import__("pyroute2").__version__
    except ImportError:
        have, ver = False, None
    if have:
        with IPRoute() as ipr:
            ipr.link(
                "set",
                index=socket.if_nametoindex(ifname),
                gso_ipv4_max_size=gso,
                gro_ipv4_max_size=gro,
            )
        return f"pyroute2 {ver} link set gso_ipv4_max_size/gro_ipv4_max_size"
    _nl_request(
        RTM_NEWLINK,
        NLM_F_REQUEST | NLM_F_ACK,
        socket.if_nametoindex(ifname),
        [(IFLA_GSO_IPV4_MAX_SIZE, gso), (IFLA_GRO_IPV4_MAX_SIZE, gro)],
    )
    why = (
        f"pyroute2 {ver} nla_map lacks IFLA 63/64" if ver else "pyroute2 not importable"
    )
    return f"raw RTM_NEWLINK with IFLA 63/64 ({why})"


def _netlink_helper(argv: list[str]) -> int:
    """Hidden entry point run via ``ip netns exec NS python this.py --_netlink ...``."""
    op, ifname = argv[0], argv[1]
    res: dict[str, Any] = {}
    if op == "set4":
        res["method"] = nl_set_ipv4_sizes(ifname, int(argv[2]), int(argv[3]))
    res["sizes"] = nl_get_link_sizes(ifname)
    print(json.dumps(res))
    return 0


# ---------------------------------------------------------------------------------------------
# pcap summary (stdlib only)
# ---------------------------------------------------------------------------------------------


def read_pcap(path: str | os.PathLike[str]):
    """Yield ``(ts_seconds_float, orig_len, data)`` for each record of a classic pcap file."""
    with open(path, "rb") as f:
        hdr = f.read(24)
        magic = hdr[:4]
        table = {
            b"\xd4\xc3\xb2\xa1": ("<", 1e-6),
            b"\xa1\xb2\xc3\xd4": (">", 1e-6),
            b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
            b"\xa1\xb2\x3c\x4d": (">", 1e-9),
        }
        if magic not in table:
            raise ValueError(f"{path}: not a classic pcap file")
        endian, frac = table[magic]
        (linktype,) = struct.unpack(endian + "I", hdr[20:24])
        if linktype != 1:
            raise ValueError(f"{path}: linktype {linktype}, expected 1 (Ethernet)")
        rec = struct.Struct(endian + "IIII")
        while True:
            h = f.read(16)
            if len(h) < 16:
                return
            sec, sub, incl, orig = rec.unpack(h)
            yield sec + sub * frac, orig, f.read(incl)


@dataclasses.dataclass
class TcpPacket:
    """The fields of one captured TCP/IP frame that the summaries need."""

    ts: float
    frame_len: int
    family: int
    src: str
    dst: str
    sport: int
    dport: int
    seq: int
    flags: int
    payload: (
        int  # TCP payload length derived from the IP length fields (or frame length)
    )
    l3_len: int  # IP packet length (IPv6: 40 + payload incl. extension headers)
    mss_opt: int | None
    hbh_jumbo: (
        int | None
    )  # RFC 2675 jumbo payload length, if an HBH jumbo option is present
    ipv4_totlen0: bool
    ipv6_plen0: bool


def parse_frame(ts: float, orig: int, d: bytes) -> TcpPacket | None:
    """Decode an Ethernet/IP/TCP frame (snaplen-truncated is fine); None if not TCP."""
    off, etype = 14, struct.unpack_from("!H", d, 12)[0]
    while etype in (0x8100, 0x88A8):
        etype = struct.unpack_from("!H", d, off + 2)[0]
        off += 4
    jumbo, tl0, pl0 = None, False, False
    if etype == 0x0800:
        ihl = (d[off] & 0x0F) * 4
        totlen = struct.unpack_from("!H", d, off + 2)[0]
        if d[off + 9] != 6:
            return None
        src, dst = (
            socket.inet_ntop(socket.AF_INET, d[off + 12 : off + 16]),
            socket.inet_ntop(socket.AF_INET, d[off + 16 : off + 20]),
        )
        tl0 = totlen == 0
        l3 = totlen if totlen else orig - off
        tcp = off + ihl
        fam = 4
    elif etype == 0x86DD:
        plen = struct.unpack_from("!H", d, off + 4)[0]
        nh = d[off + 6]
        src = socket.inet_ntop(socket.AF_INET6, d[off + 8 : off + 24])
        dst = socket.inet_ntop(socket.AF_INET6, d[off + 24 : off + 40])
        p = off + 40
        while nh in (0, 43, 60):  # HBH, routing, destination options
            enh, elen = d[p], (d[p + 1] + 1) * 8
            if nh == 0:
                q = p + 2
                while q < p + elen:
                    if d[q] == 0:  # Pad1
                        q += 1
                        continue
                    if d[q] == 0xC2 and d[q + 1] == 4:
                        jumbo = struct.unpack_from("!I", d, q + 2)[0]
                    q += 2 + d[q + 1]
            nh, p = enh, p + elen
        if nh != 6:
            return None
        pl0 = plen == 0
        l3 = 40 + (plen if plen else (jumbo if jumbo is not None else orig - off - 40))
        tcp = p
        fam = 6
    else:
        return None
    sport, dport, seq = struct.unpack_from("!HHI", d, tcp)
    doff = (d[tcp + 12] >> 4) * 4
    flags = d[tcp + 13]
    mss = None
    if flags & 0x02:  # SYN: look for the MSS option
        q = tcp + 20
        while q < min(tcp + doff, len(d)):
            kind = d[q]
            if kind == 0:
                break
            if kind == 1:
                q += 1
                continue
            if kind == 2 and q + 4 <= len(d):
                mss = struct.unpack_from("!H", d, q + 2)[0]
            q += max(d[q + 1], 2)
    payload = l3 - (tcp - off) - doff
    return TcpPacket(
        ts,
        orig,
        fam,
        src,
        dst,
        sport,
        dport,
        seq,
        flags,
        payload,
        l3,
        mss,
        jumbo,
        tl0,
        pl0,
    )


def summarize_pcap(
    path: str | os.PathLike[str], mss: dict[int, int] | None = None
) -> dict[str, Any]:
    """Summarise a capture: per data flow, segment-count histogram, largest frame, BIG TCP markers.

    ``mss`` maps family -> MSS used for the segment count (``ceil(payload / mss)``); by default the
    largest payload seen for that family in this capture (right for a sender-side capture).
    """
    pkts = [p for r in read_pcap(path) if (p := parse_frame(*r)) is not None]
    flows: dict[tuple[str, int, str, int], list[TcpPacket]] = {}
    for p in pkts:
        flows.setdefault((p.src, p.sport, p.dst, p.dport), []).append(p)
    out: dict[str, Any] = {
        "packets": sum(1 for _ in read_pcap(path)),
        "tcp_packets": len(pkts),
        "largest_frame": max((p.frame_len for p in pkts), default=0),
        "ipv6_hbh_jumbo": sum(p.hbh_jumbo is not None for p in pkts),
        "ipv6_payload_len_0": sum(p.ipv6_plen0 for p in pkts),
        "ipv4_tot_len_0": sum(p.ipv4_totlen0 for p in pkts),
        "l3_over_65535": sum(p.l3_len > 65535 for p in pkts),
        "syn_mss_options": sorted({p.mss_opt for p in pkts if p.mss_opt}),
        "flows": [],
    }
    for (src, sport, dst, dport), fp in flows.items():
        data = [p for p in fp if p.payload > 0]
        total = sum(p.payload for p in data)
        if total < 100_000:  # iperf3 control connection / ACK directions
            continue
        fam = fp[0].family
        m = (mss or {}).get(fam) or max(p.payload for p in data)
        hist = Counter(math.ceil(p.payload / m) for p in data)
        high, retrans, holes = None, 0, 0
        for p in data:
            end = (p.seq + p.payload) & 0xFFFFFFFF
            if high is not None and ((end - high) & 0xFFFFFFFF) >= 0x80000000:
                retrans += 1
                continue
            if high is not None and p.seq != high:
                holes += 1
            high = end
        bursts, cur = (
            Counter(),
            1,
        )  # runs of data packets closer than BURST_GAP_S (gro-spec 7.1)
        for a, b in itertools.pairwise(data):
            if b.ts - a.ts > BURST_GAP_S:
                bursts[cur] += 1
                cur = 1
            else:
                cur += 1
        bursts[cur] += 1
        rst = [q for q in flows.get((dst, dport, src, sport), []) if q.flags & 0x04]
        out["flows"].append(
            {
                "flow": f"{src}.{sport} > {dst}.{dport}",
                "family": fam,
                "data_packets": len(data),
                "payload_bytes": total,
                "mss_for_segment_count": m,
                "max_payload": max(p.payload for p in data),
                "packets_payload_gt_mss": sum(p.payload > m for p in data),
                "segments_histogram": {str(k): v for k, v in sorted(hist.items())},
                "max_segments": max(hist),
                "largest_frame": max(p.frame_len for p in data),
                "hbh_jumbo": sum(p.hbh_jumbo is not None for p in data),
                "ipv4_tot_len_0": sum(p.ipv4_totlen0 for p in data),
                "out_of_order_or_retransmitted": retrans,
                "sequence_holes": holes,
                "bursts_gap_20us_histogram": {
                    str(k): v for k, v in sorted(bursts.items())
                },
                "reverse_direction_rst": len(rst),
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# The experiment
# ---------------------------------------------------------------------------------------------


def kernel_hz() -> dict[str, Any]:
    """CONFIG_HZ from /proc/config.gz or /boot/config-*, else the spec's 250 marked as assumed."""
    for cand in ("/proc/config.gz", f"/boot/config-{platform.release()}"):
        try:
            opener = gzip.open if cand.endswith(".gz") else open
            with opener(cand, "rt") as f:  # type: ignore[operator]
                for line in f:
                    if line.startswith("CONFIG_HZ="):
                        return {"hz": int(line.split("=")[1]), "source": cand}
        except OSError:
            continue
    return {
        "hz": 250,
        "source": "assumed from gro-spec.md section 8 (kernel config not readable)",
    }


def tool_versions(r: Runner) -> dict[str, str]:
    """Version strings of the tools used."""
    out = {}
    for name, cmd in {
        "tcpdump": ["tcpdump", "--version"],
        "iperf3": ["iperf3", "--version"],
        "iproute2": ["ip", "-V"],
        "ethtool": ["ethtool", "--version"],
    }.items():
        cp = r.run(cmd, check=False)
        out[name] = (cp.stdout + cp.stderr).strip()
    try:
        import pyroute2  # type: ignore[import-untyped]

        out["pyroute2"] = pyroute2.__version__
    except ImportError:
        out["pyroute2"] = "not installed"
    out["python"] = sys.version.split()[0]
    return out


def check_prerequisites() -> None:
    """Exit with a one-line message unless root with ip netns, tc, ethtool, tcpdump and iperf3."""
    if os.geteuid() != 0:
        sys.exit(
            "make_kernel_captures: must run as root (needs network namespaces and tcpdump)"
        )
    for tool in ("ip", "tc", "ethtool", "tcpdump", "iperf3"):
        if shutil.which(tool) is None:
            sys.exit(f"make_kernel_captures: required tool '{tool}' not found in PATH")
    cp = subprocess.run(
        ["ip", "netns", "list"], check=False, capture_output=True, text=True, timeout=10
    )
    if cp.returncode != 0:
        sys.exit(f"make_kernel_captures: 'ip netns' unusable: {cp.stderr.strip()}")


class Experiment:
    """One scenario run: namespaces, veth, limits, captures, traffic, read-back, cleanup."""

    def __init__(self, sc: Scenario, outdir: Path, nbytes: int, snaplen: int) -> None:
        self.sc, self.outdir, self.nbytes, self.snaplen = sc, outdir, nbytes, snaplen
        tag = f"{os.getpid()}-{sc.name}"
        self.snd, self.rcv = f"btp-snd-{tag}", f"btp-rcv-{tag}"
        self.r = Runner()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.info: dict[str, Any] = {"scenario": dataclasses.asdict(sc)}
        self.tmp = Path(tempfile.mkdtemp(prefix=f"btp-{sc.name}-"))

    # -- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        r, snd, rcv = self.r, self.snd, self.rcv
        r.run(["ip", "netns", "add", snd])
        r.run(["ip", "netns", "add", rcv])
        r.run(
            [
                "ip",
                "-n",
                snd,
                "link",
                "add",
                "va",
                "type",
                "veth",
                "peer",
                "name",
                "vb",
                "netns",
                rcv,
            ]
        )
        for ns, dev, a6, a4 in (
            (snd, "va", IPV6_SND, IPV4_SND),
            (rcv, "vb", IPV6_RCV, IPV4_RCV),
        ):
            r.run(["ip", "-n", ns, "link", "set", "lo", "up"])
            r.run(["ip", "-n", ns, "link", "set", dev, "mtu", "1500"])
            r.run(
                ["ip", "-n", ns, "-6", "addr", "add", f"{a6}/64", "dev", dev, "nodad"]
            )
            r.run(["ip", "-n", ns, "-4", "addr", "add", f"{a4}/30", "dev", dev])
        r.run(["ethtool", "-K", "va", "tso", "off", "gso", "off"], ns=snd)
        r.run(["ethtool", "-K", "vb", "gro", "on"], ns=rcv)
        r.run(
            ["tc", "qdisc", "replace", "dev", "va", "root", "pfifo", "limit", "10000"],
            ns=snd,
        )
        for ns, dev in ((snd, "va"), (rcv, "vb")):
            v6, v4 = self.sc.sizes(dev)
            if v6 is not None:
                n = str(v6)
                r.run(
                    [
                        "ip",
                        "-n",
                        ns,
                        "link",
                        "set",
                        "dev",
                        dev,
                        "gso_max_size",
                        n,
                        "gro_max_size",
                        n,
                    ]
                )
            if v4 is not None:
                n = str(v4)
                cp = r.run(
                    [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--_netlink",
                        "set4",
                        dev,
                        n,
                        n,
                    ],
                    ns=ns,
                )
                self.info.setdefault("ipv4_limit_method", {})[dev] = json.loads(
                    cp.stdout
                )["method"]
        for ns, dev in ((snd, "va"), (rcv, "vb")):
            r.run(["ip", "-n", ns, "link", "set", dev, "up"])
        # Wait for both ends to report operstate "up" (addresses use nodad, so no DAD wait).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            states = [
                r.run(
                    ["cat", f"/sys/class/net/{dev}/operstate"], ns=ns, check=False
                ).stdout.strip()
                for ns, dev in ((snd, "va"), (rcv, "vb"))
            ]
            if states == ["up", "up"]:
                break
            time.sleep(0.1)
        else:
            raise CaptureError(f"veth pair did not come up (operstate {states})")
        self.check_limits()

    def check_limits(self) -> None:
        """Read every limit back (rtnetlink) and fail if it differs from what the scenario set."""
        for ns, dev in ((self.snd, "va"), (self.rcv, "vb")):
            v6, v4 = self.sc.sizes(dev)
            if v4 is None and v6 is not None and v6 <= 65536:
                v4 = v6  # netif_set_gro/gso_max_size also lower the IPv4 limit (gro-spec section 4)
            want = {
                "gso_max_size": v6 or 65536,
                "gro_max_size": v6 or 65536,
                "gso_ipv4_max_size": v4 or 65536,
                "gro_ipv4_max_size": v4 or 65536,
            }
            cp = self.r.run(
                [sys.executable, os.path.abspath(__file__), "--_netlink", "get", dev],
                ns=ns,
            )
            got = json.loads(cp.stdout)["sizes"]
            self.info.setdefault("limits_read_back", {})[dev] = got
            bad = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
            if bad:
                raise CaptureError(f"{dev}: limits read back differ (got, want): {bad}")

    # -- capture + traffic ---------------------------------------------------------------------
    def start_tcpdump(
        self, ns: str, dev: str, path: Path
    ) -> tuple[subprocess.Popen[bytes], Path]:
        errpath = self.tmp / f"{path.name}.tcpdump.err"
        cmd = [
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
        rc = stop_process(p, signal.SIGINT)
        text = errpath.read_text(errors="replace")
        errpath.unlink()
        counters = {}
        for key in ("captured", "received by filter", "dropped by kernel"):
            m = re.search(r"(\d+) packets? " + key, text)
            counters[key.replace(" ", "_")] = int(m.group(1)) if m else None
        return {"exit_status": rc, "stderr": text.strip().splitlines(), **counters}

    def wait_listening(self, port: int) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            cp = self.r.run(
                ["ss", "-Hltn", f"sport = :{port}"], ns=self.rcv, check=False
            )
            if cp.stdout.strip():
                return
            time.sleep(0.1)
        raise CaptureError(f"iperf3 server did not listen on port {port}")

    def traffic(self) -> None:
        flows = []
        for fam in self.sc.families:
            port, addr = (PORT_V6, IPV6_RCV) if fam == 6 else (PORT_V4, IPV4_RCV)
            srv_cmd = ["iperf3", "-s", "-1", "-B", addr, "-p", str(port)]
            srv = self.r.popen(
                srv_cmd, self.rcv, subprocess.DEVNULL, subprocess.DEVNULL
            )
            self.procs.append(srv)
            self.wait_listening(port)
            flows.append((fam, port, addr, srv, shlex.join(srv_cmd)))
        clients = []
        per_flow = self.nbytes // len(
            flows
        )  # mixed scenarios split the byte budget between flows
        for fam, port, addr, srv, srv_cmd in flows:
            cmd = [
                "iperf3",
                "-c",
                addr,
                "-p",
                str(port),
                "-n",
                str(per_flow),
                "-l",
                IPERF_LEN,
                "-J",
            ]
            cmd += ["--connect-timeout", "5000"]
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
                raise CaptureError(
                    f"iperf3 client (IPv{fam}) did not finish in 60 s"
                ) from e
            text = outf.read_text(errors="replace")
            outf.unlink()
            try:
                j = json.loads(text)
            except json.JSONDecodeError:
                j = {"raw": text[-2000:]}
            if c.returncode != 0 or "error" in j:
                raise CaptureError(
                    f"iperf3 client (IPv{fam}) failed: {j.get('error', text[-300:])}"
                )
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
            d["ethtool_k"] = [
                ln.strip() for ln in feats if ln.strip().split(":")[0] in keep
            ]
            cp = r.run(["ethtool", "-c", dev], ns=ns, check=False)
            d["ethtool_c"] = (cp.stdout + cp.stderr).strip().splitlines()
            cp = r.run(["ethtool", "-l", dev], ns=ns, check=False)
            d["ethtool_l"] = (cp.stdout + cp.stderr).strip().splitlines()
            d["qdisc"] = json.loads(
                r.run(["tc", "-j", "qdisc", "show", "dev", dev], ns=ns).stdout or "[]"
            )
            sysfs = {}
            for leaf in (
                "gro_flush_timeout",
                "napi_defer_hard_irqs",
                "threaded",
                "mtu",
                "tx_queue_len",
            ):
                cp = r.run(["cat", f"/sys/class/net/{dev}/{leaf}"], ns=ns, check=False)
                sysfs[leaf] = (
                    cp.stdout.strip()
                    if cp.returncode == 0
                    else f"unreadable: {cp.stderr.strip()}"
                )
            d["sysfs"] = sysfs
            link = d["ip_d_j_link_show"]
            d["limits"] = {
                k: link.get(k, self.info["limits_read_back"][dev].get(k))
                for k in (
                    "gso_max_size",
                    "gro_max_size",
                    "gso_max_segs",
                    "tso_max_size",
                    "tso_max_segs",
                )
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
        snd_pcap = self.outdir / f"{self.sc.name}.snd.pcap"
        rcv_pcap = self.outdir / f"{self.sc.name}.rcv.pcap"
        help_text = self.r.run(["tcpdump", "--help"], check=False)
        self.tcpdump_nano = "time-stamp-precision" in (
            help_text.stdout + help_text.stderr
        )
        self.info |= {
            "generated_by": "scripts/make_kernel_captures.py",
            "script_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
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
            "capture": {
                "snaplen": self.snaplen,
                "timestamp_precision": "nano" if self.tcpdump_nano else "micro",
                "filter": None,
                "sender_file": snd_pcap.name,
                "receiver_file": rcv_pcap.name,
            },
        }
        try:
            self.setup()
            self.read_back()
            ps, es = self.start_tcpdump(self.snd, "va", snd_pcap)
            pr, er = self.start_tcpdump(self.rcv, "vb", rcv_pcap)
            time.sleep(0.2)
            self.traffic()
            time.sleep(
                1.5
            )  # > libpcap's TPACKET_V3 block timeout, so every packet reaches the file
            self.info["capture"]["tcpdump_sender"] = self.stop_tcpdump(ps, es)
            self.info["capture"]["tcpdump_receiver"] = self.stop_tcpdump(pr, er)
            for side in ("tcpdump_sender", "tcpdump_receiver"):
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
            self.summarize(snd_pcap, rcv_pcap)
        except BaseException as e:
            self.info["error"] = f"{type(e).__name__}: {e}"
            raise
        finally:
            self.cleanup()
            self.info["commands"] = self.r.log
            (self.outdir / f"{self.sc.name}.json").write_text(
                json.dumps(self.info, indent=1) + "\n"
            )
        return self.info

    def summarize(self, snd_pcap: Path, rcv_pcap: Path) -> None:
        snd = summarize_pcap(snd_pcap)
        mss = {f["family"]: f["max_payload"] for f in snd["flows"]}
        rcv = summarize_pcap(rcv_pcap, mss)
        self.info["mss_seen"] = {f"ipv{k}": v for k, v in mss.items()} | {
            "syn_mss_options": snd["syn_mss_options"]
        }
        self.info["observed"] = {"sender": snd, "receiver": rcv}
        for f in snd["flows"]:
            if f["packets_payload_gt_mss"]:
                raise CaptureError(
                    f"sender capture has packets larger than the MSS: {f}"
                )

    def cleanup(self) -> None:
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
    drops = [
        cap.get(k, {}).get("dropped_by_kernel")
        for k in ("tcpdump_sender", "tcpdump_receiver")
    ]
    parts.append(f"drops={drops}")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_netlink"]:
        return _netlink_helper(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--outdir",
        required=True,
        type=Path,
        help="directory for <scenario>.{snd,rcv}.pcap/.json",
    )
    ap.add_argument(
        "--scenario",
        action="append",
        choices=sorted(SCENARIOS),
        help="scenario to run (repeatable)",
    )
    ap.add_argument(
        "--all",
        action="store_true",
        help=f"run every scenario and copy {SAMPLE_SOURCE}.rcv.pcap to sample.pcap",
    )
    ap.add_argument(
        "--bytes",
        type=int,
        default=DEFAULT_BYTES,
        help=f"iperf3 -n (default {DEFAULT_BYTES})",
    )
    ap.add_argument(
        "--snaplen",
        type=int,
        default=DEFAULT_SNAPLEN,
        help=f"tcpdump -s (default {DEFAULT_SNAPLEN})",
    )
    args = ap.parse_args(argv)
    names = sorted(SCENARIOS) if args.all else (args.scenario or [])
    if not names:
        ap.error("give --scenario NAME (repeatable) or --all")
    if args.snaplen < 94:
        ap.error(
            "--snaplen must be >= 94 (Ethernet + IPv6 + HBH + TCP with timestamps)"
        )
    check_prerequisites()
    args.outdir.mkdir(parents=True, exist_ok=True)

    def _term(signum: int, _frame: object) -> None:
        raise SystemExit(f"make_kernel_captures: terminated by signal {signum}")

    signal.signal(signal.SIGTERM, _term)
    failed = 0
    for name in names:
        try:
            info = Experiment(
                SCENARIOS[name], args.outdir, args.bytes, args.snaplen
            ).run()
            print(one_line_summary(info))
        except CaptureError as e:
            print(f"make_kernel_captures: {name}: {e}", file=sys.stderr)
            failed += 1
    if args.all and not failed:
        shutil.copyfile(
            args.outdir / f"{SAMPLE_SOURCE}.rcv.pcap", args.outdir / "sample.pcap"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
