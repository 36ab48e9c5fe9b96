"""netlink.py: message encoding and decoding against hand-computed bytes, and against the real kernel (root)."""

from __future__ import annotations

import errno
import json
import subprocess
import sys

import pytest

from tools.kernel_lab import netlink as nl
from tools.kernel_lab.scenarios import Scenario

from .conftest import ROOT, run_in_ns

little_endian = pytest.mark.skipif(sys.byteorder != "little", reason="hand-computed bytes are little-endian")


@little_endian
def test_rtattr_length_excludes_padding_and_pads_to_4():
    # struct rtattr {u16 rta_len = 4 + 5; u16 rta_type = 7}, 5 payload bytes, 3 bytes of padding
    assert nl.nl_attr(7, b"abcde") == bytes.fromhex("0900 0700 6162636465 000000")
    assert nl.nl_attr(3, b"lo\0") == bytes.fromhex("0700 0300 6c6f00 00")
    assert nl.nl_attr(1, b"bpf\0") == bytes.fromhex("0800 0100 62706600")  # already aligned: no padding


@little_endian
def test_link_message_body_is_ifinfomsg_then_u32_attributes():
    body = nl.link_message_body(3, [(nl.IFLA_GSO_IPV4_MAX_SIZE, 100000), (nl.IFLA_GRO_IPV4_MAX_SIZE, 185000)])
    want = bytes.fromhex(
        "00 00 0000 03000000 00000000 00000000"  # ifinfomsg: AF_UNSPEC, pad, type 0, index 3, flags 0, change 0
        "0800 3f00 a0860100"  # rta_len 8, IFLA_GSO_IPV4_MAX_SIZE (63), 100000 = 0x000186a0
        "0800 4000 a8d20200"  # rta_len 8, IFLA_GRO_IPV4_MAX_SIZE (64), 185000 = 0x0002d2a8
    )
    assert body == want


@little_endian
def test_nlmsghdr_length_counts_header_and_body():
    msg = nl.nl_message(nl.RTM_NEWLINK, nl.NLM_F_REQUEST | nl.NLM_F_ACK, 0x01020304, b"\xaa" * 20)
    assert msg[:16] == bytes.fromhex("24000000 1000 0500 04030201 00000000")  # len 36, type 16, flags 5, seq, pid 0
    assert msg[16:] == b"\xaa" * 20


@little_endian
def test_tc_bpf_filter_body_layout():
    body = nl.bpf_filter_body(5, 9, nl.TC_H_CLSACT_EGRESS, "qinq_push")
    # struct tcmsg: family 0, pads, ifindex 5, handle 1, parent ffff:fff3, info = prio 1 << 16 | htons(ETH_P_ALL)
    assert body[:20] == bytes.fromhex("00 00 0000 05000000 01000000 f3ffffff 00030100")
    assert body[20:28] == bytes.fromhex("0800 0100 62706600")  # TCA_KIND "bpf\0"
    opts = body[28:]
    assert opts[:4] == bytes.fromhex("2400 0200")  # TCA_OPTIONS: 4 + 8 + 14 (+2 pad) + 8 = 36 bytes
    assert opts[4:12] == bytes.fromhex("0800 0600 09000000")  # TCA_BPF_FD 9
    assert opts[12:28] == bytes.fromhex("0e00 0700") + b"qinq_push\0" + b"\0\0"  # TCA_BPF_NAME, padded
    assert opts[28:36] == bytes.fromhex("0800 0800 01000000")  # TCA_BPF_FLAGS = TCA_BPF_FLAG_ACT_DIRECT
    assert len(opts) == 0x24


@little_endian
def test_split_replies_walks_aligned_messages_and_raises_the_error():
    ack = bytes.fromhex("24000000 0200 0001 01000000 00000000") + bytes(4) + bytes(16)  # NLMSG_ERROR, error 0
    odd = bytes.fromhex("15000000 1000 0000 02000000 00000000") + b"\x01\x02\x03\x04\x05" + b"\0\0\0"  # len 21
    msgs = nl.split_replies(odd + ack)
    assert [len(m) for m in msgs] == [21, 36]  # the second starts at 24, the 4-aligned end of the first
    einval = bytes.fromhex("24000000 0200 0001 01000000 00000000") + (-errno.EINVAL).to_bytes(4, "little",
                                                                                              signed=True)
    with pytest.raises(OSError) as exc:
        nl.split_replies(einval + bytes(16))
    assert exc.value.errno == errno.EINVAL


@little_endian
def test_link_sizes_reads_u32_attributes_of_newlink_only():
    attrs = (
        nl.nl_attr(3, b"klva\0")  # IFLA_IFNAME (ignored), padded 9 -> 12
        + nl.nl_attr(41, (65536).to_bytes(4, "little"))  # IFLA_GSO_MAX_SIZE
        + nl.nl_attr(0x8000 | 26, bytes(8))  # a nested attribute (IFLA_AF_SPEC): skipped whole
        + nl.nl_attr(64, (185000).to_bytes(4, "little"))  # IFLA_GRO_IPV4_MAX_SIZE
    )
    newlink = nl.nl_message(nl.RTM_NEWLINK, 0, 1, bytes(16) + attrs)
    other = nl.nl_message(nl.NLMSG_ERROR, 0, 1, bytes(4) + nl.nl_attr(41, (1).to_bytes(4, "little")))
    assert nl.link_sizes([other, newlink]) == {"gso_max_size": 65536, "gro_ipv4_max_size": 185000}


def test_get_link_sizes_agrees_with_iproute2_on_loopback():
    """RTM_GETLINK needs no privileges: our read of ``lo`` against ``ip -d -j link show lo``."""
    ours = json.loads(subprocess.run([sys.executable, str(ROOT / "tools" / "kernel_lab"), "--_netlink", "get", "lo"],
                                     capture_output=True, text=True, check=True, timeout=30, cwd="/").stdout)["sizes"]
    theirs = json.loads(subprocess.run(["ip", "-d", "-j", "link", "show", "lo"], capture_output=True, text=True,
                                       check=True, timeout=10).stdout)[0]
    shown = [k for k in nl.IFLA if k in theirs]
    assert {"gso_max_size", "gso_max_segs"} <= set(shown)
    assert {k: ours[k] for k in shown} == {k: theirs[k] for k in shown}


def _sizes_in_ns(ns: str, code: str = "") -> dict[str, int]:
    cp = run_in_ns(ns, f"import json\nfrom tools.kernel_lab import netlink as nl\n{code}\n"
                       "print(json.dumps(nl.nl_get_link_sizes('klva')))")
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def test_raw_newlink_sets_ipv4_sizes_on_a_real_veth(veth_ns):
    before = _sizes_in_ns(veth_ns)
    assert before["gso_ipv4_max_size"] == before["gro_ipv4_max_size"] == 65536  # the kernel's default
    after = _sizes_in_ns(veth_ns, "nl.nl_set_ipv4_sizes_raw('klva', 100000, 120000)")
    assert after["gso_ipv4_max_size"] == 100000 and after["gro_ipv4_max_size"] == 120000
    assert after["gso_max_size"] == before["gso_max_size"]  # the IPv6 limits are separate attributes
    # the kernel refuses a GSO limit above the device's tso_max_size, and the ack carries the error
    cp = run_in_ns(veth_ns, f"from tools.kernel_lab import netlink as nl\n"
                            f"nl.nl_set_ipv4_sizes_raw('klva', {after['tso_max_size'] + 8}, 65536)")
    assert cp.returncode != 0 and "OSError" in cp.stderr


def test_helper_sets_and_reads_back_like_the_experiment(veth_ns):
    cp = subprocess.run(["ip", "netns", "exec", veth_ns, sys.executable, str(ROOT / "tools" / "kernel_lab"),
                         "--_netlink", "set4", "klva", "185000", "185000"], capture_output=True, text=True,
                        timeout=30, check=True, cwd="/")
    res = json.loads(cp.stdout)
    assert res["sizes"]["gso_ipv4_max_size"] == res["sizes"]["gro_ipv4_max_size"] == 185000
    assert "IFLA 63/64" in res["method"] or "pyroute2" in res["method"]


def test_iproute2_ipv6_limits_read_back_and_the_ipv4_coupling(veth_ns):
    """``ip link set gso_max_size/gro_max_size`` as the setter; our read-back and Scenario.expected_limits."""
    for size in (80000, 60000):  # above 65536 the IPv4 limits stay; at or below they follow (gro-spec 4)
        subprocess.run(["ip", "-n", veth_ns, "link", "set", "dev", "klva", "gso_max_size", str(size),
                        "gro_max_size", str(size)], check=True, capture_output=True, timeout=10)
        got = _sizes_in_ns(veth_ns)
        want = Scenario("x", (6,), size, None, None, None).expected_limits("va")
        assert {k: got[k] for k in want} == want
