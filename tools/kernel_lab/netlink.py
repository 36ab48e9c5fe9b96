"""A small rtnetlink client (stdlib only): the GSO/GRO/TSO size limits of a link, and a tc bpf filter.

iproute2 6.1 can neither set nor show the IPv4 BIG TCP limits (``gso_ipv4_max_size``/``gro_ipv4_max_size``,
IFLA 63/64), so they are set and every limit is read back here. Message layouts are the kernel's uapi ones
(include/uapi/linux/netlink.h, rtnetlink.h, if_link.h, pkt_cls.h), in host byte order. The encoders and
decoders are pure functions; ``nl_send`` is the only socket I/O. Everything works in the caller's network
namespace: the experiment runs ``--_netlink`` (``netlink_helper``) inside a namespace with ``ip netns exec``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from typing import Any

# rtnetlink constants (include/uapi/linux/rtnetlink.h, if_link.h, netlink.h)
RTM_NEWLINK, RTM_GETLINK = 16, 18
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
NLMSGHDR = struct.Struct("=IHHII")  # struct nlmsghdr {u32 len; u16 type; u16 flags; u32 seq; u32 pid}
IFINFOMSG = struct.Struct("=BxHiII")  # struct ifinfomsg {u8 family; u8 pad; u16 type; s32 index; u32 flags, change}
TCMSG = struct.Struct("=BxHiIII")  # struct tcmsg {u8 family; u8, u16 pad; s32 ifindex; u32 handle, parent, info}
NLA_TYPE_MASK = 0x3FFF  # ~(NLA_F_NESTED | NLA_F_NET_BYTEORDER)
IFLA = {
    "gso_max_segs": 40,
    "gso_max_size": 41,
    "gro_max_size": 58,
    "tso_max_size": 59,
    "tso_max_segs": 60,
    "gso_ipv4_max_size": 63,
    "gro_ipv4_max_size": 64,
}
IFLA_XDP, IFLA_XDP_FD, IFLA_XDP_FLAGS, XDP_FLAGS_DRV_MODE, NLA_F_NESTED = 43, 1, 3, 4, 0x8000
IFLA_GSO_IPV4_MAX_SIZE = IFLA["gso_ipv4_max_size"]
IFLA_GRO_IPV4_MAX_SIZE = IFLA["gro_ipv4_max_size"]

# tc filters (include/uapi/linux/rtnetlink.h, pkt_cls.h, pkt_sched.h)
RTM_NEWTFILTER = 44
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS, TCA_BPF_FLAG_ACT_DIRECT = 6, 7, 8, 1
TC_H_CLSACT_INGRESS, TC_H_CLSACT_EGRESS = 0xFFFFFFF2, 0xFFFFFFF3
ETH_P_ALL = 0x0003


# -- encoding / decoding (pure) --------------------------------------------------------------------------------


def nl_attr(typ: int, payload: bytes) -> bytes:
    """One struct rtattr {u16 len; u16 type} + payload, padded to 4 bytes (the length excludes the padding)."""
    n = 4 + len(payload)
    return struct.pack("=HH", n, typ) + payload + b"\0" * (-n % 4)


def nl_message(msg_type: int, flags: int, seq: int, body: bytes, pid: int = 0) -> bytes:
    """One netlink message: struct nlmsghdr (its length counts the header) followed by ``body``."""
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), msg_type, flags, seq, pid) + body


def link_message_body(ifindex: int, attrs: list[tuple[int, int]]) -> bytes:
    """struct ifinfomsg (AF_UNSPEC, ``ifindex``) followed by one u32 rtattr per ``(type, value)``."""
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, ifindex, 0, 0)
    return body + b"".join(nl_attr(typ, struct.pack("=I", val)) for typ, val in attrs)


def split_replies(data: bytes) -> list[bytes]:
    """The netlink messages of one received datagram; OSError(errno) for an NLMSG_ERROR with a non-zero error."""
    replies = []
    off = 0
    while off + NLMSGHDR.size <= len(data):
        ln, typ, _fl, _seq, _pid = NLMSGHDR.unpack_from(data, off)
        replies.append(data[off : off + ln])
        if typ == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", data, off + NLMSGHDR.size)
            if err != 0:
                raise OSError(-err, f"rtnetlink: {os.strerror(-err)}")
        if ln < NLMSGHDR.size:
            break
        off += (ln + 3) & ~3
    return replies


def link_sizes(replies: list[bytes]) -> dict[str, int]:
    """The IFLA size attributes (names of ``IFLA``) of the RTM_NEWLINK messages among ``replies``."""
    out: dict[str, int] = {}
    names = {v: k for k, v in IFLA.items()}
    for rep in replies:
        (typ,) = struct.unpack_from("=H", rep, 4)
        if typ != RTM_NEWLINK:
            continue
        off = NLMSGHDR.size + IFINFOMSG.size
        while off + 4 <= len(rep):
            alen, atyp = struct.unpack_from("=HH", rep, off)
            if alen < 4:
                break
            atyp &= NLA_TYPE_MASK
            if atyp in names and alen >= 8:
                out[names[atyp]] = struct.unpack_from("=I", rep, off + 4)[0]
            off += (alen + 3) & ~3
    return out


def bpf_filter_body(ifindex: int, fd: int, parent: int, name: str) -> bytes:
    """RTM_NEWTFILTER body of ``tc filter add dev IF parent P prio 1 protocol all bpf da fd FD name NAME``."""
    info = (1 << 16) | socket.htons(ETH_P_ALL)  # TC_H_MAKE(prio 1 << 16, htons(ETH_P_ALL))
    tcm = TCMSG.pack(socket.AF_UNSPEC, 0, ifindex, 1, parent, info)
    opts = (
        nl_attr(TCA_BPF_FD, struct.pack("=I", fd))
        + nl_attr(TCA_BPF_NAME, name.encode() + b"\0")
        + nl_attr(TCA_BPF_FLAGS, struct.pack("=I", TCA_BPF_FLAG_ACT_DIRECT))
    )
    return tcm + nl_attr(TCA_KIND, b"bpf\0") + nl_attr(TCA_OPTIONS, opts)


# -- socket I/O (current network namespace) --------------------------------------------------------------------


def nl_send(msg_type: int, flags: int, body: bytes) -> list[bytes]:
    """Send one rtnetlink message (header + ``body``) in the current netns; return the replies."""
    msg = nl_message(msg_type, flags, int(time.time()) & 0xFFFFFFFF, body)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.settimeout(5)
        s.bind((0, 0))
        s.send(msg)
        data = s.recv(1 << 17)
    return split_replies(data)


def nl_request(msg_type: int, flags: int, ifindex: int, attrs: list[tuple[int, int]]) -> list[bytes]:
    """Send one rtnetlink link message with u32 attributes in the current netns; return the reply messages."""
    return nl_send(msg_type, flags, link_message_body(ifindex, attrs))


def nl_get_link_sizes(ifname: str) -> dict[str, int]:
    """Read the GSO/GRO/TSO size attributes of ``ifname`` (current netns) via RTM_GETLINK."""
    return link_sizes(nl_request(RTM_GETLINK, NLM_F_REQUEST, socket.if_nametoindex(ifname), []))


def nl_set_ipv4_sizes_raw(ifname: str, gso: int, gro: int) -> None:
    """Set gso_ipv4_max_size/gro_ipv4_max_size of ``ifname`` with one raw RTM_NEWLINK (IFLA 63/64), acked."""
    nl_request(
        RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, socket.if_nametoindex(ifname),
        [(IFLA_GSO_IPV4_MAX_SIZE, gso), (IFLA_GRO_IPV4_MAX_SIZE, gro)],
    )  # fmt: skip


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
            ipr.link("set", index=socket.if_nametoindex(ifname), gso_ipv4_max_size=gso, gro_ipv4_max_size=gro)
        return f"pyroute2 {ver} link set gso_ipv4_max_size/gro_ipv4_max_size"
    nl_set_ipv4_sizes_raw(ifname, gso, gro)
    why = f"pyroute2 {ver} nla_map lacks IFLA 63/64" if ver else "pyroute2 not importable"
    return f"raw RTM_NEWLINK with IFLA 63/64 ({why})"


def tc_attach_bpf(ifname: str, fd: int, parent: int, name: str) -> None:
    """``tc filter add dev IF {egress|ingress} prio 1 handle 1 bpf da fd FD`` as one RTM_NEWTFILTER."""
    body = bpf_filter_body(socket.if_nametoindex(ifname), fd, parent, name)
    nl_send(RTM_NEWTFILTER, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)


def xdp_attach(ifname: str, fd: int) -> None:
    """``ip link set dev IF xdpdrv fd FD`` as one RTM_NEWLINK with a nested IFLA_XDP {FD, FLAGS=DRV_MODE}."""
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, socket.if_nametoindex(ifname), 0, 0)
    nest = nl_attr(IFLA_XDP_FD, struct.pack("=i", fd)) + nl_attr(IFLA_XDP_FLAGS, struct.pack("=I", XDP_FLAGS_DRV_MODE))
    nl_send(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, body + nl_attr(IFLA_XDP | NLA_F_NESTED, nest))


def netlink_helper(argv: list[str]) -> int:
    """Hidden entry point ``--_netlink {get IF | set4 IF GSO GRO}``, run inside a namespace: prints JSON."""
    op, ifname = argv[0], argv[1]
    res: dict[str, Any] = {}
    if op == "set4":
        res["method"] = nl_set_ipv4_sizes(ifname, int(argv[2]), int(argv[3]))
    res["sizes"] = nl_get_link_sizes(ifname)
    print(json.dumps(res))
    return 0
