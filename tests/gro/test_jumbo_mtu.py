"""A jumbo-frame link without the SYN in the capture (rules.r2_capture_mtu, ``fallback_mtu`` None).

R2 tells a plain segment from an aggregated one by the flow's MSS; without a SYN the engine falls back on an
MTU. At a fixed 1500 every 9000-byte segment of a jumbo-frame link (where BIG TCP hosts usually are) was an
"observed super-packet": a sender capture started on a running transfer was called post-GRO and the rebuild
reproduced 0 to 1 % of the receiver's super-packets. The link's MTU is read off the capture's first batch where
the segments show it. Kernel captures (tests/fixtures/kernel/jumbo/make_jumbo.sh: a veth pair at MTU 9000, TSO
off, both ends captured from 1 s into the transfer); the oracle is the receiver's own capture (``compare``)
and, for the lengths, tshark.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle import KERNEL, tshark_fields

from bigtcp_pcap.api import analyze
from bigtcp_pcap.compare import compare
from bigtcp_pcap.gro import rules
from bigtcp_pcap.gro.config import GroConfig

JUMBO = KERNEL / "jumbo"
PAIRS = ["v4_mtu9000", "v6_mtu9000"]


@pytest.mark.parametrize("name", PAIRS)
def test_the_mtu_is_read_off_a_jumbo_sender_capture(name, tmp_path):
    snd = JUMBO / f"{name}.snd.pcap"
    rows = tshark_fields(snd, ["ip.len", "ipv6.plen", "tcp.len", "tcp.flags.syn"], display_filter="tcp.len > 0")
    lens = [int(r["ip.len"]) if r["ip.len"] else int(r["ipv6.plen"]) + 40 for r in rows]
    assert max(lens) == 9000 and 2 * lens.count(9000) > len(lens) and not any(r["tcp.flags.syn"] == "1" for r in rows)
    a = analyze(snd, outdir=tmp_path / "o", gro_max_size=185000)
    assert a.summary["gro"]["fallback_mtu"] == 9000 and a.summary["gro"]["fallback_mtu_from"] == "capture"
    assert a.params["gro"]["fallback_mtu"] == 9000
    assert a.summary["capture_kind"]["post_gro"] is False
    assert "observed" not in a.superpackets["flush_reason"].astype(str).tolist()


@pytest.mark.parametrize("name", PAIRS)
def test_the_rebuild_reproduces_the_jumbo_receiver(name):
    snd, rcv = JUMBO / f"{name}.snd.pcap", JUMBO / f"{name}.rcv.pcap"
    got = compare(snd, rcv, gro=GroConfig(gro_max_size=185000))
    assert got.receiver_superpackets > 150
    assert got.share >= 0.95  # 100 % on both when made
    old = compare(snd, rcv, gro=GroConfig(gro_max_size=185000, fallback_mtu=1500))
    assert old.share < 0.05 and old.causes["rule"] > 0.9 * old.receiver_superpackets


@pytest.mark.parametrize("cap", [JUMBO / "v4_mtu9000.rcv.pcap", JUMBO / "v6_mtu9000.rcv.pcap",
                                 KERNEL / "v6_185000.snd.pcap", KERNEL / "v4_65536.snd.pcap",
                                 KERNEL / "v6_185000.rcv.pcap", KERNEL / "mixed_185000.rcv.pcap",
                                 KERNEL / "any" / "router_v46.pcap"], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_mtu_is_read_off_other_captures(cap, tmp_path):
    """A receiver's capture (super-packets of many sizes, past 9216 bytes) and a 1500-byte link's: 1500 stays."""
    a = analyze(cap, outdir=tmp_path / "o")
    assert a.summary["gro"]["fallback_mtu"] == 1500 and a.summary["gro"]["fallback_mtu_from"] == "default"


def test_an_mtu_given_is_kept(tmp_path):
    a = analyze(JUMBO / "v4_mtu9000.snd.pcap", outdir=tmp_path / "o", fallback_mtu=1500)
    assert a.summary["gro"]["fallback_mtu"] == 1500 and a.summary["gro"]["fallback_mtu_from"] == "option"


def test_r2_capture_mtu_needs_most_segments_at_one_largest_length():
    n = 40
    flags = np.full(n, 0x10, np.int64)
    proto = np.full(n, 6, np.int64)
    pay = np.full(n, 100, np.int64)
    full = np.full(n, 9000, np.int64)
    assert rules.r2_capture_mtu(full, pay, flags, proto) == 9000
    half = full.copy()
    half[: n // 2 + 1] = 4000  # fewer than half at the largest length
    assert rules.r2_capture_mtu(half, pay, flags, proto) is None
    assert rules.r2_capture_mtu(np.full(n, 1500, np.int64), pay, flags, proto) is None  # a 1500-byte link
    assert rules.r2_capture_mtu(np.full(n, 9217, np.int64), pay, flags, proto) is None  # past a jumbo MTU
    assert rules.r2_capture_mtu(full[:15], pay[:15], flags[:15], proto[:15]) is None  # too few segments
    syn = flags.copy()
    syn[:] |= 0x02  # SYNs do not count
    assert rules.r2_capture_mtu(full, pay, syn, proto) is None
    psh = flags | 0x08  # an application's fixed-size writes (8 KiB TSO skbs or GRO super-packets): PSH on each
    assert rules.r2_capture_mtu(np.full(n, 8244, np.int64), pay, psh, proto) is None
    some = flags.copy()
    some[::4] |= 0x08  # a bulk sender: PSH only on each write's last segment
    assert rules.r2_capture_mtu(full, pay, some, proto) == 9000


def test_a_tso_sender_without_syn_is_told_to_give_the_mtu(tmp_path):
    """A TSO sender's capture of the jumbo link (its super-packets, no SYN, no plain 9000-byte segment to read the
    MTU off): the segment counts assume 1500's MSS, and the summary says so and what to pass. With the MTU given,
    each super-packet's segment count is its payload over the link's MSS (9000 less 40 + 20 + 12 bytes of IPv6,
    TCP and timestamp headers)."""
    cap = JUMBO / "v6_mtu9000_tso.snd.pcap"
    a = analyze(cap, outdir=tmp_path / "a", gro_max_size=185000)
    ck = a.summary["capture_kind"]
    assert ck["post_gro"] and a.summary["gro"]["fallback_mtu_from"] == "default"
    assert any("no SYN" in e and "--fallback-mtu" in e for e in ck["evidence"])
    b = analyze(cap, outdir=tmp_path / "b", gro_max_size=185000, fallback_mtu=9000)
    assert not any("no SYN" in e for e in b.summary["capture_kind"]["evidence"])
    sp = b.superpackets
    big = sp[sp.payload_len > 9000]
    assert len(big) > 20
    mss = 9000 - 40 - 20 - 12
    assert ((big.payload_len.astype(int) + mss - 1) // mss == big.n_segments.astype(int)).all()
    assert (a.superpackets.n_segments.max() > 5 * b.superpackets.n_segments.max())  # the counts it warned of
