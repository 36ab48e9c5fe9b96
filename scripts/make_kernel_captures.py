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

The ``linktype`` scenarios (``--linktypes``) reuse the same namespaces, veth pair and checks to get real
captures of every link type and tunnel the decoder claims (see ``Experiment.setup_topology``):

* ``sll2_v6_185000`` / ``sll_v4_185000``: BIG TCP runs captured on the receiver with ``tcpdump -i any``
  (``-y LINUX_SLL2`` / ``-y LINUX_SLL``);
* ``qinq``: every frame between va and vb tagged 802.1ad 100 + 802.1Q 200 (8021q devices, or a clsact eBPF
  push/pop program when the kernel has no 8021q);
* ``vxlan`` / ``geneve``: overlay traffic through VNI 42 on UDP 4789 / 6081, captured on the underlay veth
  (Geneve through a tap + userspace endpoint when the kernel has no geneve device);
* ``tun_raw``: a tun point-to-point link, captured on the tun devices (LINKTYPE_RAW);
* plus ``null_from_v6_185000.pcap`` / ``loop_from_v4.pcap``, NULL and LOOP files *derived* from Ethernet
  captures by ``derive_loopback_pcap()`` (Linux cannot capture those link types).

Only the sides listed in a scenario's ``captures`` are captured (``<name>.<side>.pcap``).

Usage (as root)::

    python scripts/make_kernel_captures.py --outdir tests/fixtures/kernel --all
    python scripts/make_kernel_captures.py --outdir /tmp/caps --scenario v6_80000 --bytes 3000000
    python scripts/make_kernel_captures.py --outdir tests/fixtures/kernel/linktypes --linktypes
    python scripts/make_kernel_captures.py --outdir /tmp/caps --derive   # NULL/LOOP only, no root

The module is importable without side effects; ``summarize_pcap()`` is a small stdlib-only pcap
reader used for the JSON summaries and usable by tests.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import gzip
import hashlib
import itertools
import json
import math
import os
import platform
import re
import select
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

# Linktype scenarios (group "linktype", written to tests/fixtures/kernel/linktypes/): extra topologies on top of
# the same veth underlay. Overlay addresses are private and exist only inside the two namespaces.
OVERLAY: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {
    # topology: ((IPv6 sender, IPv6 receiver), (IPv4 sender, IPv4 receiver))
    "vxlan": (("fd00:b2::1", "fd00:b2::2"), ("10.198.0.1", "10.198.0.2")),
    "geneve": (("fd00:b3::1", "fd00:b3::2"), ("10.198.1.1", "10.198.1.2")),
    "tun": (("fd00:b4::1", "fd00:b4::2"), ("10.198.2.1", "10.198.2.2")),
    "qinq": (("fd00:b5::1", "fd00:b5::2"), ("10.198.3.1", "10.198.3.2")),
}
OVERLAY_PREFIX = {6: 64, 4: 30}
VXLAN_PORT, GENEVE_PORT, TUNNEL_VNI = 4789, 6081, 42
VXLAN_MTU = 1450  # 1500 - IPv4 20 - UDP 8 - VXLAN 8 - Ethernet 14 (IPv4 underlay)
GENEVE_MTU = 1430  # 1500 - IPv6 40 - UDP 8 - Geneve 8 - Ethernet 14 (IPv6 underlay)
QINQ_OUTER_ID, QINQ_INNER_ID = 100, 200  # 802.1ad S-tag (outer), 802.1Q C-tag (inner)
LINKTYPE_NAMES = {
    0: "NULL", 1: "ETHERNET", 12: "RAW (DLT 12)", 101: "RAW", 108: "LOOP", 113: "LINUX_SLL", 276: "LINUX_SLL2",
}  # fmt: skip
SIDE_NAMES = {"snd": "sender", "rcv": "receiver"}
# (side, interface, tcpdump -y DLT or None, linktype the file must have): tcpdump on va and on vb, Ethernet
DEFAULT_CAPTURES: tuple[tuple[str, str, str | None, int], ...] = (("snd", "va", None, 1), ("rcv", "vb", None, 1))
KERNEL_FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kernel"


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
    # veth: the plain pair; qinq / vxlan / geneve / tun: see Experiment.setup_topology()
    topology: str = "veth"
    # (side, interface, tcpdump -y DLT or None, linktype the file must have); side snd/rcv = namespace
    captures: tuple[tuple[str, str, str | None, int], ...] = DEFAULT_CAPTURES
    snaplen: int | None = None  # tcpdump -s for this scenario (--snaplen overrides; default DEFAULT_SNAPLEN)
    nbytes: int | None = None  # iperf3 -n for this scenario (--bytes overrides; default DEFAULT_BYTES)
    group: str = "gro"  # "gro": the --all set (GRO pairs); "linktype": the --linktypes set

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
        # --- linktype scenarios (--linktypes; outdir tests/fixtures/kernel/linktypes) -------------------------
        Scenario(
            "sll2_v6_185000", (6,), BIG, BIG, None, None,
            "v6_185000 captured on the receiver with tcpdump -i any -y LINUX_SLL2 (HBH jumbo in SLL2)",
            captures=(("rcv", "any", "LINUX_SLL2", 276),), snaplen=128, group="linktype",
        ),
        Scenario(
            "sll_v4_185000", (4,), None, None, BIG, BIG,
            "v4_185000 captured on the receiver with tcpdump -i any -y LINUX_SLL (tot_len 0 in SLL)",
            captures=(("rcv", "any", "LINUX_SLL", 113),), snaplen=128, group="linktype",
        ),
        Scenario(
            "qinq", (6, 4), BIG, BIG, BIG, BIG,
            "IPv6 + IPv4 over 802.1ad 100 / 802.1Q 200 stacked tags, captured on both veths",
            topology="qinq", captures=(("snd", "va", None, 1), ("rcv", "vb", None, 1)), snaplen=128,
            nbytes=1_000_000, group="linktype",
        ),
        Scenario(
            "vxlan", (6, 4), BIG, BIG, BIG, BIG,
            "IPv6 + IPv4 over VXLAN 42 (UDP 4789, IPv4 underlay), captured on both veths",
            topology="vxlan", captures=(("snd", "va", None, 1), ("rcv", "vb", None, 1)), snaplen=192,
            nbytes=1_000_000, group="linktype",
        ),
        Scenario(
            "geneve", (6, 4), BIG, BIG, BIG, BIG,
            "IPv6 + IPv4 over Geneve 42 (UDP 6081, IPv6 underlay), captured on the receiver's veth",
            topology="geneve", captures=(("rcv", "vb", None, 1),), snaplen=192, nbytes=600_000, group="linktype",
        ),
        Scenario(
            "tun_raw", (6, 4), None, None, None, None,
            "IPv6 + IPv4 through a tun point-to-point link (vnet_hdr, TSO): LINKTYPE_RAW on both ends",
            topology="tun", captures=(("snd", "tn0", None, 101), ("rcv", "tn0", None, 101)), snaplen=128,
            group="linktype",
        ),
    )
}  # fmt: skip

# NULL and LOOP cannot be captured on Linux: these files are derived from Ethernet kernel captures by
# derive_loopback_pcap() (name: source capture in KERNEL_FIXTURES, linktype, ethertype -> address family).
# The IPv6 family values are the BSD ones tshark and tcpdump know (24 OpenBSD/NetBSD, 28 FreeBSD, 30 Darwin);
# Linux's AF_INET6 (10) never appears in a NULL/LOOP file and tshark does not dissect it.
DERIVED: dict[str, tuple[str, int, dict[int, int]]] = {
    "null_from_v6_185000": ("v6_185000.rcv.pcap", 0, {0x0800: 2, 0x86DD: 30}),
    "loop_from_v4": ("v4_185000.rcv.pcap", 108, {0x0800: 2, 0x86DD: 24}),
}


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
    return _nl_send(msg_type, flags, body)


def _nl_send(msg_type: int, flags: int, body: bytes) -> list[bytes]:
    """Send one rtnetlink message (header + ``body``) in the current netns; return the replies."""
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


# ---------------------------------------------------------------------------------------------
# tc + eBPF stacked VLAN tags (qinq fallback when the kernel has no 802.1Q/802.1ad devices)
# ---------------------------------------------------------------------------------------------

RTM_NEWTFILTER = 44
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS, TCA_BPF_FLAG_ACT_DIRECT = 6, 7, 8, 1
TC_H_CLSACT_INGRESS, TC_H_CLSACT_EGRESS = 0xFFFFFFF2, 0xFFFFFFF3
BPF_PROG_LOAD, BPF_PROG_TYPE_SCHED_CLS = 5, 3
BPF_FUNC_SKB_VLAN_PUSH, BPF_FUNC_SKB_VLAN_POP = 18, 19  # include/uapi/linux/bpf.h __BPF_FUNC_MAPPER
SYS_BPF = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "ppc64le": 361, "s390x": 351}


def _nl_attr(typ: int, payload: bytes) -> bytes:
    """One struct rtattr, padded to 4 bytes."""
    n = 4 + len(payload)
    return struct.pack("=HH", n, typ) + payload + b"\0" * (-n % 4)


def _bpf_insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """struct bpf_insn {u8 code; u8 dst_reg:4, src_reg:4; s16 off; s32 imm} in host order."""
    regs = (src << 4) | dst if sys.byteorder == "little" else (dst << 4) | src
    return struct.pack("=BBhi", code, regs, off, imm)


def bpf_vlan_programs(outer_id: int, inner_id: int) -> tuple[bytes, bytes]:
    """(egress, ingress) SCHED_CLS programs: push 802.1Q inner_id then 802.1ad outer_id; pop two tags.

    bpf_skb_vlan_push() puts the new tag into the skb's VLAN metadata and moves an existing one into the
    packet, so the wire order is 88a8 outer_id, 8100 inner_id. Both programs return TC_ACT_OK (direct action).
    bpf_skb_vlan_pop() on an untagged skb changes nothing.
    """
    mov_rr, mov_ri, call, exit_ = 0xBF, 0xB7, 0x85, 0x95  # BPF_ALU64|BPF_MOV|BPF_X/K, BPF_JMP|BPF_CALL/EXIT
    push = [
        _bpf_insn(mov_rr, 6, 1),  # r6 = skb
        _bpf_insn(mov_ri, 2, imm=socket.htons(0x8100)),
        _bpf_insn(mov_ri, 3, imm=inner_id),
        _bpf_insn(call, imm=BPF_FUNC_SKB_VLAN_PUSH),
        _bpf_insn(mov_rr, 1, 6),
        _bpf_insn(mov_ri, 2, imm=socket.htons(0x88A8)),
        _bpf_insn(mov_ri, 3, imm=outer_id),
        _bpf_insn(call, imm=BPF_FUNC_SKB_VLAN_PUSH),
        _bpf_insn(mov_ri, 0, imm=0),  # TC_ACT_OK
        _bpf_insn(exit_),
    ]
    pop = [
        _bpf_insn(mov_rr, 6, 1),
        _bpf_insn(call, imm=BPF_FUNC_SKB_VLAN_POP),
        _bpf_insn(mov_rr, 1, 6),
        _bpf_insn(call, imm=BPF_FUNC_SKB_VLAN_POP),
        _bpf_insn(mov_ri, 0, imm=0),
        _bpf_insn(exit_),
    ]
    return b"".join(push), b"".join(pop)


def bpf_prog_load(insns: bytes, name: str) -> int:
    """BPF_PROG_LOAD a SCHED_CLS program through the raw bpf(2) syscall; return its fd."""
    import ctypes

    nr = SYS_BPF.get(platform.machine())
    if nr is None:
        raise OSError(f"bpf(2) syscall number unknown for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    ibuf = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(1 << 16)
    attr = struct.pack(
        "=IIQQIIQII16s", BPF_PROG_TYPE_SCHED_CLS, len(insns) // 8, ctypes.addressof(ibuf),
        ctypes.addressof(lic), 1, len(log), ctypes.addressof(log), 0, 0, name.encode()[:15],
    )  # fmt: skip
    abuf = ctypes.create_string_buffer(attr, 128)  # the rest of union bpf_attr stays zero
    fd = libc.syscall(ctypes.c_long(nr), ctypes.c_long(BPF_PROG_LOAD), abuf, ctypes.c_long(len(abuf)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"BPF_PROG_LOAD {name}: {os.strerror(err)}: {log.value.decode(errors='replace')}")
    return fd


def tc_attach_bpf(ifname: str, fd: int, parent: int, name: str) -> None:
    """``tc filter add dev IF {egress|ingress} prio 1 handle 1 bpf da fd FD`` as one RTM_NEWTFILTER."""
    info = (1 << 16) | socket.htons(0x0003)  # TC_H_MAKE(prio 1 << 16, htons(ETH_P_ALL))
    tcm = struct.pack("=BxHiIII", socket.AF_UNSPEC, 0, socket.if_nametoindex(ifname), 1, parent, info)
    opts = (
        _nl_attr(TCA_BPF_FD, struct.pack("=I", fd))
        + _nl_attr(TCA_BPF_NAME, name.encode() + b"\0")
        + _nl_attr(TCA_BPF_FLAGS, struct.pack("=I", TCA_BPF_FLAG_ACT_DIRECT))
    )
    body = tcm + _nl_attr(TCA_KIND, b"bpf\0") + _nl_attr(TCA_OPTIONS, opts)
    _nl_send(RTM_NEWTFILTER, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)


def _tcbpf_helper(argv: list[str]) -> int:
    """Hidden entry point ``--_tcbpf DEV OUTER_ID INNER_ID`` run inside the namespace (clsact must exist)."""
    dev, outer_id, inner_id = argv[0], int(argv[1]), int(argv[2])
    push, pop = bpf_vlan_programs(outer_id, inner_id)
    fds = {"egress": bpf_prog_load(push, "qinq_push"), "ingress": bpf_prog_load(pop, "qinq_pop")}
    tc_attach_bpf(dev, fds["egress"], TC_H_CLSACT_EGRESS, "qinq_push")
    tc_attach_bpf(dev, fds["ingress"], TC_H_CLSACT_INGRESS, "qinq_pop")
    print(json.dumps({
        "egress": f"bpf_skb_vlan_push 802.1Q {inner_id}, then 802.1ad {outer_id} ({len(push) // 8} insns)",
        "ingress": f"bpf_skb_vlan_pop twice ({len(pop) // 8} insns)",
        "egress_insns_hex": push.hex(), "ingress_insns_hex": pop.hex(),
    }))  # fmt: skip
    return 0


# ---------------------------------------------------------------------------------------------
# tun/tap relays (tun_raw topology, and Geneve when the kernel has no geneve device)
# ---------------------------------------------------------------------------------------------

TUNSETIFF, TUNSETOFFLOAD = 0x400454CA, 0x400454D0  # _IOW('T', 202/208, int) (x86, arm, riscv)
IFF_TUN, IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0001, 0x0002, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04
CLONE_NEWNET = 0x40000000


def _open_tun(name: str, flags: int) -> int:
    """Create tun/tap ``name`` in the current netns (fixed at open() time) and return its fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), flags))
    return fd


def _setns(path: str) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f:
        if libc.setns(f.fileno(), CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")


def _relay_signals() -> None:
    def _exit(_signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)


def _tun_relay(argv: list[str]) -> int:
    """``--_tun_relay NAME OTHER_NETNS_PATH``: tun NAME here and in the other netns, packets copied both ways.

    Both tun devices use IFF_VNET_HDR with TSO4/TSO6/CSUM offloads, so the sending stack hands 64 KiB GSO
    packets to the tun and the relay writes them, virtio_net_hdr included, unchanged into the peer tun:
    both captures show the same (large) packets. A tun device is ARPHRD_NONE: libpcap writes LINKTYPE_RAW.
    """
    name, other = argv[0], argv[1]
    flags = IFF_TUN | IFF_NO_PI | IFF_VNET_HDR
    offl = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6
    a = _open_tun(name, flags)
    fcntl.ioctl(a, TUNSETOFFLOAD, offl)
    _setns(other)
    b = _open_tun(name, flags)
    fcntl.ioctl(b, TUNSETOFFLOAD, offl)
    _relay_signals()
    peer = {a: b, b: a}
    stats = Counter()
    print(json.dumps({"ready": name, "flags": hex(flags), "offload": hex(offl)}), flush=True)
    try:
        while True:
            ready, _, _ = select.select([a, b], [], [])
            for fd in ready:
                pkt = os.read(fd, 1 << 17)
                try:
                    os.write(peer[fd], pkt)
                    stats["here_to_other" if fd == a else "other_to_here"] += 1
                except OSError as e:
                    stats[f"write_error_{e.errno}"] += 1
    finally:
        print(json.dumps({"stats": dict(stats)}), flush=True)


def _geneve_relay(argv: list[str]) -> int:
    """``--_geneve_relay TAP LOCAL PEER VNI``: a userspace Geneve endpoint (RFC 8926) for kernels without geneve.

    Ethernet frames read from tap TAP are sent to PEER:6081 as UDP (kernel socket, ephemeral source port, like
    the kernel's flow-hashed one) behind an 8-byte Geneve header (version 0, no options, protocol 0x6558
    Transparent Ethernet Bridging, VNI); datagrams received on LOCAL:6081 are checked and written to the tap.
    """
    name, local, peer, vni = argv[0], argv[1], argv[2], int(argv[3])
    fam = socket.AF_INET6 if ":" in local else socket.AF_INET
    tap = _open_tun(name, IFF_TAP | IFF_NO_PI)
    rx = socket.socket(fam, socket.SOCK_DGRAM)
    rx.bind((local, GENEVE_PORT))
    tx = socket.socket(fam, socket.SOCK_DGRAM)
    tx.bind((local, 0))
    # 8 MB buffers (SO_*BUFFORCE, root): the kernel side is far faster than this loop
    rx.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE
    tx.setsockopt(socket.SOL_SOCKET, 32, 8 << 20)  # SO_SNDBUFFORCE
    hdr = struct.pack("!BBHI", 0, 0, 0x6558, vni << 8)
    _relay_signals()
    stats = Counter()
    print(json.dumps({"ready": name, "udp_source_port": tx.getsockname()[1]}), flush=True)
    try:
        while True:
            ready, _, _ = select.select([tap, rx], [], [])
            if tap in ready:
                frame = os.read(tap, 1 << 16)
                try:
                    tx.sendto(hdr + frame, (peer, GENEVE_PORT))
                    stats["tap_to_udp"] += 1
                except OSError as e:
                    stats[f"send_error_{e.errno}"] += 1
            if rx in ready:
                data, _src = rx.recvfrom(1 << 16)
                optlen = (data[0] & 0x3F) * 4 if data else 0
                if len(data) < 8 + optlen or data[0] >> 6 != 0 or data[2:4] != b"\x65\x58" or data[4:7] != hdr[4:7]:
                    stats["bad_geneve"] += 1
                    continue
                try:
                    os.write(tap, data[8 + optlen :])
                    stats["udp_to_tap"] += 1
                except OSError as e:
                    stats[f"write_error_{e.errno}"] += 1
    finally:
        print(json.dumps({"stats": dict(stats)}), flush=True)


PROBE_PORT = 9  # discard: nothing listens, so a reachable peer answers a SYN with an RST


def _probe(argv: list[str]) -> int:
    """``--_probe ADDR PORT``: 0 if ADDR answers a TCP SYN (accept or RST), 1 on timeout or error."""
    try:
        with socket.create_connection((argv[0], int(argv[1])), timeout=1):
            print(f"{argv[0]}: connected")
    except ConnectionRefusedError:
        print(f"{argv[0]}: RST (connection refused): reachable")
    except OSError as e:
        print(f"{argv[0]}: {e}")
        return 1
    return 0


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


PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1e-6),
    b"\xa1\xb2\xc3\xd4": (">", 1e-6),
    b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
    b"\xa1\xb2\x3c\x4d": (">", 1e-9),
}


def pcap_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The global header of a classic pcap file: byte order, timestamp unit, snaplen, linktype."""
    with open(path, "rb") as f:
        hdr = f.read(24)
    if len(hdr) < 24 or hdr[:4] not in PCAP_MAGICS:
        raise ValueError(f"{path}: not a classic pcap file")
    endian, frac = PCAP_MAGICS[hdr[:4]]
    snaplen, linktype = struct.unpack(endian + "II", hdr[16:24])
    return {"endian": endian, "frac": frac, "snaplen": snaplen, "linktype": linktype}


def read_pcap(path: str | os.PathLike[str], linktypes: tuple[int, ...] | None = (1,)):
    """Yield ``(ts_seconds_float, orig_len, data)`` for each record of a classic pcap file.

    Raises ValueError unless the file's linktype is in ``linktypes`` (None: any; see pcap_header()).
    """
    h0 = pcap_header(path)
    endian, frac, linktype = h0["endian"], h0["frac"], h0["linktype"]
    if linktypes is not None and linktype not in linktypes:
        raise ValueError(f"{path}: linktype {linktype}, expected {' or '.join(map(str, linktypes))}")
    with open(path, "rb") as f:
        f.seek(24)
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
    syn_ts_opt: bool = False  # a SYN carrying the timestamp option (data segments then carry 12 option bytes)
    tunnel: str | None = None  # "vxlan" / "geneve": the TCP fields are the inner frame's
    vlans: tuple[int, ...] = ()  # VLAN ids of the (outer) link header, outermost first
    linktype: int = 1


def _ether_payload(d: bytes, off: int) -> tuple[int, int, tuple[int, ...]]:
    """(L3 offset, ethertype, VLAN ids) of the Ethernet header at ``off``, 802.1Q/802.1ad tags skipped."""
    etype = struct.unpack_from("!H", d, off + 12)[0]
    off += 14
    vlans = []
    while etype in (0x8100, 0x88A8):
        vlans.append(struct.unpack_from("!H", d, off)[0] & 0xFFF)
        etype = struct.unpack_from("!H", d, off + 2)[0]
        off += 4
    return off, etype, tuple(vlans)


def _link_payload(d: bytes, linktype: int) -> tuple[int, int, tuple[int, ...]] | None:
    """(L3 offset, ethertype, VLAN ids) after the link header of ``linktype``; None if not IPv4/IPv6."""
    if linktype == 1:
        return _ether_payload(d, 0)
    if linktype == 113:  # LINUX_SLL: 16 bytes, protocol at 14
        return 16, struct.unpack_from("!H", d, 14)[0], ()
    if linktype == 276:  # LINUX_SLL2: 20 bytes, protocol at 0
        return 20, struct.unpack_from("!H", d, 0)[0], ()
    if linktype in (12, 101):  # RAW: the IP version nibble says which
        ver = d[0] >> 4 if d else 0
        return 0, {4: 0x0800, 6: 0x86DD}.get(ver, -1), ()
    if linktype in (0, 108):  # NULL (host order) / LOOP (network order) 4-byte address family
        le, be = struct.unpack_from("<I", d, 0)[0], struct.unpack_from(">I", d, 0)[0]
        fam = be if linktype == 108 else (le if le < 256 else be)
        return 4, 0x0800 if fam == 2 else (0x86DD if fam in (10, 24, 28, 30) else -1), ()
    return None


def parse_frame(ts: float, orig: int, d: bytes, linktype: int = 1) -> TcpPacket | None:
    """Decode a captured frame down to TCP (snaplen-truncated is fine); None if not TCP.

    ``linktype``: Ethernet (stacked 802.1Q/802.1ad tags skipped), LINUX_SLL, LINUX_SLL2, RAW, NULL or LOOP.
    A VXLAN (UDP 4789) or Geneve (UDP 6081) datagram is followed into its inner frame; the TCP fields are
    then the inner ones, ``tunnel`` names the tunnel and ``frame_len`` stays the outer frame's length.
    """
    link = _link_payload(d, linktype)
    if link is None:
        return None
    off, etype, vlans = link
    pkt = _parse_ip(ts, orig, d, off, etype, orig, None)
    if pkt is not None:
        pkt.vlans, pkt.linktype = vlans, linktype
    return pkt


def _parse_ip(
    ts: float, orig: int, d: bytes, off: int, etype: int, wire_end: int, tunnel: str | None
) -> TcpPacket | None:
    """The IP/TCP part of parse_frame(); ``wire_end``: where this layer ends on the wire (offset in ``d``)."""
    jumbo, tl0, pl0 = None, False, False
    if etype == 0x0800:
        ihl = (d[off] & 0x0F) * 4
        totlen = struct.unpack_from("!H", d, off + 2)[0]
        proto = d[off + 9]
        if proto != 6 and not (proto == 17 and tunnel is None):
            return None
        src, dst = (
            socket.inet_ntop(socket.AF_INET, d[off + 12 : off + 16]),
            socket.inet_ntop(socket.AF_INET, d[off + 16 : off + 20]),
        )
        tl0 = totlen == 0
        l3 = totlen if totlen else wire_end - off
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
        proto = nh
        if proto != 6 and not (proto == 17 and tunnel is None):
            return None
        pl0 = plen == 0
        l3 = 40 + (plen if plen else (jumbo if jumbo is not None else wire_end - off - 40))
        tcp = p
        fam = 6
    else:
        return None
    if proto == 17:  # UDP: follow a VXLAN / Geneve tunnel into its inner frame (one level)
        _sport, dport, ulen = struct.unpack_from("!HHH", d, tcp)
        ulen = ulen or l3 - (tcp - off)
        u = tcp + 8
        if dport == VXLAN_PORT:
            inner_off, inner_etype, _ = _ether_payload(d, u + 8)
            kind = "vxlan"
        elif dport == GENEVE_PORT:
            g = u + 8 + (d[u] & 0x3F) * 4
            ptype = struct.unpack_from("!H", d, u + 2)[0]
            inner_off, inner_etype, _ = _ether_payload(d, g) if ptype == 0x6558 else (g, ptype, ())
            kind = "geneve"
        else:
            return None
        inner = _parse_ip(ts, orig, d, inner_off, inner_etype, tcp + ulen, kind)
        if inner is not None:
            inner.tunnel = kind
        return inner
    sport, dport, seq = struct.unpack_from("!HHI", d, tcp)
    doff = (d[tcp + 12] >> 4) * 4
    flags = d[tcp + 13]
    mss, syn_ts = None, False
    if flags & 0x02:  # SYN: look for the MSS and timestamp options
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
            if kind == 8:
                syn_ts = True
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
        syn_ts,
        tunnel,
    )


def mss_from_syn(pkts: list[TcpPacket]) -> dict[int, int]:
    """family -> data-segment MSS from the SYNs: smallest MSS option, minus 12 when the SYN has timestamps."""
    out: dict[int, int] = {}
    for p in pkts:
        if p.mss_opt:
            m = p.mss_opt - (12 if p.syn_ts_opt else 0)
            out[p.family] = min(out.get(p.family, m), m)
    return out


def summarize_pcap(
    path: str | os.PathLike[str], mss: dict[int, int] | None = None
) -> dict[str, Any]:
    """Summarise a capture: per data flow, segment-count histogram, largest frame, BIG TCP markers.

    ``mss`` maps family -> MSS used for the segment count (``ceil(payload / mss)``); by default the
    largest payload seen for that family in this capture (right for a sender-side capture).
    """
    lt = pcap_header(path)["linktype"]
    pkts = [p for r in read_pcap(path, None) if (p := parse_frame(*r, lt)) is not None]
    flows: dict[tuple[str, int, str, int], list[TcpPacket]] = {}
    for p in pkts:
        flows.setdefault((p.src, p.sport, p.dst, p.dport), []).append(p)
    out: dict[str, Any] = {
        "packets": sum(1 for _ in read_pcap(path, None)),
        "linktype": lt,
        "linktype_name": LINKTYPE_NAMES.get(lt, "?"),
        "tcp_packets": len(pkts),
        "tunneled_tcp_packets": dict(Counter(p.tunnel for p in pkts if p.tunnel)),
        "vlan_tagged_tcp_packets": {
            "/".join(map(str, k)): v for k, v in Counter(p.vlans for p in pkts if p.vlans).items()
        },
        "largest_frame": max((p.frame_len for p in pkts), default=0),
        "ipv6_hbh_jumbo": sum(p.hbh_jumbo is not None for p in pkts),
        "ipv6_payload_len_0": sum(p.ipv6_plen0 for p in pkts),
        "ipv4_tot_len_0": sum(p.ipv4_totlen0 for p in pkts),
        "l3_over_65535": sum(p.l3_len > 65535 for p in pkts),
        "syn_mss_options": sorted({p.mss_opt for p in pkts if p.mss_opt}),
        "mss_from_syn": mss_from_syn(pkts),
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
                "largest_l3": max(p.l3_len for p in data),  # the inner IP packet for tunneled flows
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


@dataclasses.dataclass(frozen=True)
class CpuPlan:
    """CPU placement of the capture run (``--pin-cpu`` etc.); every field None = the scheduler's choice.

    veth's NAPI is scheduled (napi_schedule) on the CPU that transmits on ``va``. With the two iperf3 ends on
    different CPUs, transmits happen on both (the client's sendmsg and the ACK-clocked softirq that follows
    the server's ACKs), so vb's poll can run on one CPU while the other keeps filling the ring: polls then
    see a few packets each and the sender timestamps do not show the poll boundaries. Pinning both ends
    to one CPU serializes transmit and poll (see ``--pin-cpu``).
    """

    client: int | None = None  # taskset -c for the iperf3 client (sender namespace)
    server: int | None = None  # taskset -c for the iperf3 server (receiver namespace)
    tcpdump: int | None = None  # taskset -c for both tcpdumps
    threaded: int | None = None  # /sys/class/net/vb/threaded (threaded NAPI), None: kernel default
    trace_napi: bool = False  # record every napi:napi_poll of vb (tracefs) to <name>.napi.tsv

    @staticmethod
    def prefix(cpu: int | None) -> list[str]:
        return ["taskset", "-c", str(cpu)] if cpu is not None else []

    def record(self) -> dict[str, Any]:
        return {
            "iperf3_client_cpu": self.client, "iperf3_server_cpu": self.server, "tcpdump_cpu": self.tcpdump,
            "vb_threaded": self.threaded, "trace_napi": self.trace_napi, "online_cpus": os.cpu_count(),
            "busy_poll": _read_text("/proc/sys/net/core/busy_poll"),
            "busy_read": _read_text("/proc/sys/net/core/busy_read"),
        }  # fmt: skip


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cpu_counters() -> dict[str, Any]:
    """Per-CPU NET_RX/NET_TX softirq counts, softnet_stat (processed, time_squeeze) and ksoftirqd CPU ticks."""
    out: dict[str, Any] = {}
    for line in (_read_text("/proc/softirqs") or "").splitlines():
        name, _, vals = line.partition(":")
        if name.strip() in ("NET_RX", "NET_TX"):
            out[name.strip()] = [int(v) for v in vals.split()]
    proc, squeeze = [], []
    for line in (_read_text("/proc/net/softnet_stat") or "").splitlines():
        f = [int(x, 16) for x in line.split()]
        proc.append(f[0])
        squeeze.append(f[2])
    out["softnet_processed"], out["softnet_time_squeeze"] = proc, squeeze
    ticks: dict[str, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        comm = _read_text(f"/proc/{d.name}/comm") or ""
        if comm.startswith(("ksoftirqd/", "napi/")):
            st = (_read_text(f"/proc/{d.name}/stat") or "").rsplit(")", 1)[-1].split()
            if len(st) > 13:
                ticks[comm] = ticks.get(comm, 0) + int(st[11]) + int(st[12])  # utime + stime
    out["kthread_ticks"] = ticks
    return out


def counter_delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in b.items():
        if isinstance(v, list):
            old = a.get(k, [0] * len(v))
            out[k] = [x - y for x, y in zip(v, old)]
        elif isinstance(v, dict):
            out[k] = {n: t - a.get(k, {}).get(n, 0) for n, t in v.items() if t - a.get(k, {}).get(n, 0)}
    out["kthread_ticks_hz"] = os.sysconf("SC_CLK_TCK")
    return out


TRACEFS = Path("/sys/kernel/tracing")
NAPI_POLL_RE = re.compile(
    r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>\d+\.\d+): napi_poll: .*? "
    r"work (?P<work>\d+) budget (?P<budget>\d+)"
)


class NapiTrace:
    """napi:napi_poll events of the receiver's ``vb`` in a private tracefs instance (``--trace-napi``).

    Each event is one veth_poll() call: CPU, the task it interrupted (or ksoftirqd / napi/vb-N), ``work``
    packets taken from the ring. The trace clock is ``mono``; the JSON records CLOCK_REALTIME - CLOCK_MONOTONIC
    so the poll times can be put on the pcap time axis (``<name>.napi.tsv`` has both).
    """

    def __init__(self, name: str) -> None:
        self.mounted = False
        if not (TRACEFS / "events" / "napi" / "napi_poll").is_dir():
            if not (TRACEFS / "instances").is_dir():
                subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=True, timeout=10)
                self.mounted = True
            if not (TRACEFS / "events" / "napi" / "napi_poll").is_dir():
                raise CaptureError("tracefs has no napi:napi_poll event")
        self.inst = TRACEFS / "instances" / name
        self.inst.mkdir()
        self._w("buffer_size_kb", "16384")
        self._w("trace_clock", "mono")
        self._w("events/napi/napi_poll/filter", 'dev_name == "vb"')
        self._w("events/napi/napi_poll/enable", "1")
        self.offsets: list[int] = []

    def _w(self, leaf: str, value: str) -> None:
        (self.inst / leaf).write_text(value + "\n")

    def _offset(self) -> None:
        self.offsets.append(time.clock_gettime_ns(time.CLOCK_REALTIME) - time.clock_gettime_ns(time.CLOCK_MONOTONIC))

    def start(self) -> None:
        self._offset()
        self._w("tracing_on", "1")

    def stop(self, tsv: Path) -> dict[str, Any]:
        self._w("tracing_on", "0")
        self._offset()
        off = sum(self.offsets) / len(self.offsets) / 1e9
        text = (self.inst / "trace").read_text(errors="replace")
        work_hist: Counter[int] = Counter()
        per_cpu: Counter[int] = Counter()
        per_ctx: Counter[str] = Counter()
        rows = ["realtime_s\tmono_s\tcpu\tcontext\twork\tbudget"]
        for line in text.splitlines():
            m = NAPI_POLL_RE.match(line)
            if not m:
                continue
            w, cpu, ts = int(m["work"]), int(m["cpu"]), float(m["ts"])
            ctx = re.sub(r"[/:].*", "", m["comm"].strip())  # ksoftirqd/0 -> ksoftirqd, napi/vb-3 -> napi
            rows.append(f"{ts + off:.9f}\t{ts:.9f}\t{cpu}\t{m['comm'].strip()}\t{w}\t{m['budget']}")
            work_hist[w] += 1
            per_cpu[cpu] += w
            per_ctx[ctx] += w
        tsv.write_text("\n".join(rows) + "\n")
        lost = re.search(r"entries-in-buffer/entries-written: (\d+)/(\d+)", text)
        return {
            "file": tsv.name, "event": "napi:napi_poll", "filter": 'dev_name == "vb"', "trace_clock": "mono",
            "realtime_minus_mono_ns": self.offsets, "polls": sum(work_hist.values()),
            "packets": sum(per_cpu.values()), "work_histogram": dict(sorted(work_hist.items())),
            "packets_per_cpu": dict(sorted(per_cpu.items())), "packets_per_context": dict(per_ctx.most_common()),
            "entries_in_buffer_written": [int(lost[1]), int(lost[2])] if lost else None,
        }  # fmt: skip

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._w("events/napi/napi_poll/enable", "0")
        with contextlib.suppress(OSError):
            self.inst.rmdir()
        if self.mounted:
            subprocess.run(["umount", str(TRACEFS)], check=False, timeout=10)


class Experiment:
    """One scenario run: namespaces, veth, limits, captures, traffic, read-back, cleanup."""

    def __init__(
        self, sc: Scenario, outdir: Path, nbytes: int | None, snaplen: int | None, cpu: CpuPlan | None = None
    ) -> None:
        self.sc, self.outdir = sc, outdir
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
        if self.cpu.threaded is not None:  # threaded NAPI of the receiver's veth (needs GRO on, link up)
            r.run(["sh", "-c", f"echo {self.cpu.threaded} > /sys/class/net/vb/threaded"], ns=rcv)
            got = r.run(["cat", "/sys/class/net/vb/threaded"], ns=rcv).stdout.strip()
            if got != str(self.cpu.threaded):
                raise CaptureError(f"vb threaded reads back {got!r}, wanted {self.cpu.threaded}")
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
        me = os.path.abspath(__file__)
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
                    cp = r.run([sys.executable, me, "--_tcbpf", x, str(QINQ_OUTER_ID), str(QINQ_INNER_ID)], ns=ns)
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
                    "tap gn0 + userspace Geneve endpoint (this script's _geneve_relay): kernel UDP sockets on "
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
        """Start one of this script's relay entry points in ``ns`` and wait for its "ready" line."""
        out = self.tmp / f"relay-{name}.out"
        with open(out, "wb") as fo:
            p = self.r.popen([sys.executable, os.path.abspath(__file__), *args], ns, stdout=fo, stderr=subprocess.STDOUT)
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
            cmd = [sys.executable, os.path.abspath(__file__), "--_probe", self.dst[fam], str(PROBE_PORT)]
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
        self, ns: str, dev: str, path: Path, dlt: str | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
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
            port, addr = (PORT_V6, self.dst[6]) if fam == 6 else (PORT_V4, self.dst[4])
            srv_cmd = self.cpu.prefix(self.cpu.server) + ["iperf3", "-s", "-1", "-B", addr, "-p", str(port)]
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
            cmd = self.cpu.prefix(self.cpu.client) + [
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
        caps = self.sc.captures
        files = {side: self.outdir / f"{self.sc.name}.{side}.pcap" for side, *_ in caps}
        help_text = self.r.run(["tcpdump", "--help"], check=False)
        self.tcpdump_nano = "time-stamp-precision" in (
            help_text.stdout + help_text.stderr
        )
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
                self.info["napi_trace"] = self.napi_trace.stop(self.outdir / f"{self.sc.name}.napi.tsv")
            self.info["cpu"] = self.cpu.record() | {"counters_during_traffic": counter_delta(before, after)}
            time.sleep(
                1.5
            )  # > libpcap's TPACKET_V3 block timeout, so every packet reaches the file
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
            (self.outdir / f"{self.sc.name}.json").write_text(
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
        if self.sc.captures == DEFAULT_CAPTURES and self.sc.topology == "veth":
            snd_pcap, rcv_pcap = files["snd"], files["rcv"]
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
    drops = [
        cap.get(k, {}).get("dropped_by_kernel")
        for k in ("tcpdump_sender", "tcpdump_receiver")
    ]
    parts.append(f"drops={drops}")
    return " | ".join(parts)


# ---------------------------------------------------------------------------------------------
# NULL / LOOP files derived from Ethernet kernel captures (Linux cannot capture these link types)
# ---------------------------------------------------------------------------------------------


def derive_loopback_pcap(src: Path, dst: Path, linktype: int, families: dict[int, int]) -> dict[str, Any]:
    """Rewrite the link header of every IP frame of Ethernet capture ``src`` into a NULL (0) or LOOP (108) file.

    Deterministic, stdlib only. The 14-byte Ethernet header (the source must carry no VLAN tag) becomes the
    4-byte address family ``families[ethertype]``: in the file's own byte order for NULL (BSD loopback, "host
    order" of the writer), in network order for LOOP (OpenBSD). Captured and original lengths shrink by 10,
    the snaplen too; timestamps, byte order and timestamp precision are kept; the IP packets are untouched.
    Frames with any other ethertype are left out and counted. Returns a record for the JSON.
    """
    if linktype not in (0, 108):
        raise ValueError(f"linktype {linktype}: only NULL (0) and LOOP (108) are derived")
    raw = src.read_bytes()
    h0 = pcap_header(src)
    e = h0["endian"]
    if h0["linktype"] != 1:
        raise ValueError(f"{src}: linktype {h0['linktype']}, expected Ethernet")
    fam_fmt = e + "I" if linktype == 0 else ">I"
    out = [raw[:16] + struct.pack(e + "II", h0["snaplen"] - 10, linktype)]
    kept, left_out = Counter(), Counter()
    pos = 24
    while pos + 16 <= len(raw):
        sec, sub, incl, orig = struct.unpack(e + "IIII", raw[pos : pos + 16])
        data = raw[pos + 16 : pos + 16 + incl]
        pos += 16 + incl
        etype = struct.unpack_from("!H", data, 12)[0] if incl >= 14 else -1
        if etype not in families:
            left_out[f"0x{etype:04x}"] += 1
            continue
        body = struct.pack(fam_fmt, families[etype]) + data[14:]
        out.append(struct.pack(e + "IIII", sec, sub, len(body), orig - 10) + body)
        kept[f"0x{etype:04x} -> family {families[etype]}"] += 1
    dst.write_bytes(b"".join(out))
    return {
        "derived_by": "scripts/make_kernel_captures.py derive_loopback_pcap()",
        "script_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "source": src.name,
        "source_sha256": hashlib.sha256(raw).hexdigest(),
        "output": dst.name,
        "output_sha256": hashlib.sha256(dst.read_bytes()).hexdigest(),
        "linktype": linktype,
        "linktype_name": LINKTYPE_NAMES[linktype],
        "family_byte_order": ("file byte order (" + ("little" if e == "<" else "big") + " endian)")
        if linktype == 0 else "network (big endian)",
        "families": {f"0x{k:04x}": v for k, v in families.items()},
        "frames_kept": dict(kept),
        "frames_left_out": dict(left_out),
        "snaplen": h0["snaplen"] - 10,
        "lengths": "caplen and orig_len of every record = source - 10 (14-byte Ethernet -> 4-byte family)",
        "observed": summarize_pcap(dst),
    }  # fmt: skip


def derive_all(outdir: Path, source_dir: Path) -> int:
    """Write every DERIVED file (and its JSON) into ``outdir``; return the number of failures."""
    failed = 0
    for name, (src, linktype, fams) in DERIVED.items():
        try:
            rec = derive_loopback_pcap(source_dir / src, outdir / f"{name}.pcap", linktype, fams)
        except (OSError, ValueError) as e:
            print(f"make_kernel_captures: {name}: {e}", file=sys.stderr)
            failed += 1
            continue
        (outdir / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
        print(f"{name}: {rec['frames_kept']} left out {rec['frames_left_out']}")
    return failed


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    argv = sys.argv[1:] if argv is None else argv
    hidden = {"--_netlink": _netlink_helper, "--_tcbpf": _tcbpf_helper, "--_tun_relay": _tun_relay,
              "--_geneve_relay": _geneve_relay, "--_probe": _probe}  # fmt: skip
    if argv[:1] and argv[0] in hidden:
        return hidden[argv[0]](argv[1:])
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
        help=f"run every GRO-pair scenario and copy {SAMPLE_SOURCE}.rcv.pcap to sample.pcap",
    )
    ap.add_argument(
        "--linktypes",
        action="store_true",
        help="run every linktype scenario (SLL, SLL2, qinq, VXLAN, Geneve, RAW) and derive the NULL/LOOP files",
    )
    ap.add_argument(
        "--derive",
        action="store_true",
        help="only derive the NULL/LOOP files (no root needed)",
    )
    ap.add_argument(
        "--derive-from",
        type=Path,
        default=KERNEL_FIXTURES,
        help=f"directory holding the Ethernet captures the NULL/LOOP files are derived from (default {KERNEL_FIXTURES})",
    )
    ap.add_argument(
        "--bytes",
        type=int,
        default=None,
        help=f"iperf3 -n (default: the scenario's, else {DEFAULT_BYTES})",
    )
    ap.add_argument(
        "--snaplen",
        type=int,
        default=None,
        help=f"tcpdump -s (default: the scenario's, else {DEFAULT_SNAPLEN})",
    )
    ap.add_argument(
        "--pin-cpu",
        type=int,
        default=None,
        metavar="N",
        help="run the iperf3 client and server with taskset -c N (default: unpinned); serializes transmit and "
        "the receiver's NAPI poll on one CPU so the sender timestamps show the poll boundaries",
    )
    ap.add_argument("--server-cpu", type=int, default=None, metavar="N",
                    help="taskset -c N for the iperf3 server only (overrides --pin-cpu for the server)")
    ap.add_argument("--tcpdump-cpu", type=int, default=None, metavar="N",
                    help="run both tcpdumps with taskset -c N (default: unpinned)")
    ap.add_argument("--threaded", type=int, choices=(0, 1), default=None,
                    help="write /sys/class/net/vb/threaded (threaded NAPI) in the receiver namespace (default: leave)")
    ap.add_argument("--trace-napi", action="store_true",
                    help="record every NAPI poll of vb (tracefs napi:napi_poll: time, CPU, context, work) to "
                    "<scenario>.napi.tsv, the kernel's actual poll boundaries")
    args = ap.parse_args(argv)
    cpu = CpuPlan(
        client=args.pin_cpu,
        server=args.server_cpu if args.server_cpu is not None else args.pin_cpu,
        tcpdump=args.tcpdump_cpu,
        threaded=args.threaded,
        trace_napi=args.trace_napi,
    )
    names = [n for n in sorted(SCENARIOS) if SCENARIOS[n].group == "gro"] if args.all else []
    names += [n for n in sorted(SCENARIOS) if SCENARIOS[n].group == "linktype"] if args.linktypes else []
    names += [n for n in args.scenario or [] if n not in names]
    if args.derive and not names:
        args.outdir.mkdir(parents=True, exist_ok=True)
        return 1 if derive_all(args.outdir, args.derive_from) else 0
    if not names:
        ap.error("give --scenario NAME (repeatable), --all, --linktypes or --derive")
    if args.snaplen is not None and args.snaplen < 94:
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
                SCENARIOS[name], args.outdir, args.bytes, args.snaplen, cpu
            ).run()
            print(one_line_summary(info))
        except CaptureError as e:
            print(f"make_kernel_captures: {name}: {e}", file=sys.stderr)
            failed += 1
    if args.all and not failed:
        shutil.copyfile(
            args.outdir / f"{SAMPLE_SOURCE}.rcv.pcap", args.outdir / "sample.pcap"
        )
    if args.linktypes or args.derive:
        failed += derive_all(args.outdir, args.derive_from)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
