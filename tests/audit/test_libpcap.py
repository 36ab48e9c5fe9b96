"""The ctypes binding runs the system libpcap: same bytecode as tcpdump, the true wire length, its own errors."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from bigtcp_pcap.audit.libpcap import CompiledFilter, FilterError, LibpcapMissing

from .conftest import TCPDUMP, needs_tcpdump, tcpdump_error, v4_tcp, v6_hbh_tcp, v6_tcp


@needs_tcpdump
@pytest.mark.parametrize("expr", ["tcp port 5201", "ip6 and tcp", "ip6 protochain 6", "tcp[tcpflags] & tcp-syn != 0",
                                  "portrange 5000-5300", "len > 65535"])
def test_bytecode_is_what_tcpdump_compiles(expr):
    out = subprocess.run([TCPDUMP, "-y", "EN10MB", "-ddd", expr], capture_output=True, text=True, check=True).stdout
    lines = out.split("\n")
    expected = [tuple(int(x) for x in ln.split()) for ln in lines[1:int(lines[0]) + 1]]
    assert CompiledFilter(expr, 1).instructions == expected


def test_fixed_offset_filter_misses_the_hbh_jumbo_frame():
    f = CompiledFilter("tcp port 5201", 1)
    assert f.matches(*v6_tcp(100))
    assert not f.matches(*v6_hbh_tcp(80000))


def test_len_uses_the_wire_length_not_the_captured_length():
    data, wirelen = v6_hbh_tcp(80000, snap=96)
    f = CompiledFilter("greater 65536", 1)
    assert f.matches(data, wirelen)
    assert not f.matches(data)  # wirelen defaults to the captured length


def test_batch_gives_the_per_packet_verdicts():
    pkts = [v6_tcp(10), v6_hbh_tcp(70000), v4_tcp(100), v6_tcp(10, dport=80), v4_tcp(10, dport=5201)]
    buf = np.frombuffer(b"".join(d for d, _ in pkts), np.uint8)
    caps = np.array([len(d) for d, _ in pkts])
    offs = np.concatenate([[0], np.cumsum(caps)[:-1]])
    wires = np.array([w for _, w in pkts])
    for expr in ("tcp port 5201", "greater 1000", "ip", "not tcp port 80"):
        f = CompiledFilter(expr, 1)
        assert f.match_batch(buf, offs, caps, wires).tolist() == [f.matches(d, w) for d, w in pkts]


def test_compiles_per_linktype_raw_ip():
    data, wirelen = v6_tcp(10)
    assert CompiledFilter("tcp port 5201", 101).matches(data[14:], wirelen - 14)  # LINKTYPE_RAW -> DLT_RAW
    assert CompiledFilter("tcp port 5201", 1).matches(data, wirelen)


def test_protochain_is_not_kernel_compatible():
    assert not CompiledFilter("ip6 protochain 6", 1).kernel_compatible
    assert CompiledFilter("tcp port 5201", 1).kernel_compatible


@needs_tcpdump
@pytest.mark.parametrize("expr", ["tcp port", "ip6 and tcp[13] & 2 != 0", "host 300.1.1.1", "ether host 1"])
def test_bad_expression_carries_libpcaps_text(expr):
    with pytest.raises(FilterError) as e:
        CompiledFilter(expr, 1)
    assert e.value.message == tcpdump_error(expr)
    assert str(e.value) == e.value.message


@pytest.mark.usefixtures("no_libpcap")
def test_missing_library_says_how_to_install():
    with pytest.raises(LibpcapMissing) as e:
        CompiledFilter("tcp", 1)
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith("install it with: apt-get install libpcap0.8")


@pytest.mark.usefixtures("no_libpcap")
def test_audit_construction_fails_early_without_libpcap():
    from bigtcp_pcap.audit import FilterAudit

    with pytest.raises(LibpcapMissing):
        FilterAudit("tcp")
