"""Userspace relays for the linktype topologies: a tun pair across two namespaces, a Geneve endpoint, a probe.

Each is a hidden entry point of the package (``--_tun_relay``, ``--_geneve_relay``, ``--_probe``) that the
experiment starts inside a namespace with ``ip netns exec``; the relays print one JSON "ready" line when they
run and one "stats" line when they are stopped (SIGTERM).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import select
import signal
import socket
import struct
from collections import Counter

from .scenarios import GENEVE_PORT

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


def tun_relay(argv: list[str]) -> int:
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


def geneve_relay(argv: list[str]) -> int:
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
    hdr = geneve_header(vni)
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
                frame = geneve_inner_frame(data, vni)
                if frame is None:
                    stats["bad_geneve"] += 1
                    continue
                try:
                    os.write(tap, frame)
                    stats["udp_to_tap"] += 1
                except OSError as e:
                    stats[f"write_error_{e.errno}"] += 1
    finally:
        print(json.dumps({"stats": dict(stats)}), flush=True)


def geneve_header(vni: int) -> bytes:
    """The 8-byte Geneve header (RFC 8926 3.4): version 0, no options, protocol 0x6558 (Ethernet), ``vni``."""
    return struct.pack("!BBHI", 0, 0, 0x6558, vni << 8)


def geneve_inner_frame(data: bytes, vni: int) -> bytes | None:
    """The Ethernet frame inside Geneve datagram ``data`` (options skipped); None unless version 0, protocol
    0x6558 and VNI ``vni``."""
    optlen = (data[0] & 0x3F) * 4 if data else 0
    if len(data) < 8 + optlen or data[0] >> 6 != 0 or data[2:4] != b"\x65\x58" or data[4:7] != geneve_header(vni)[4:7]:
        return None
    return data[8 + optlen :]


PROBE_PORT = 9  # discard: nothing listens, so a reachable peer answers a SYN with an RST


def probe(argv: list[str]) -> int:
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
