"""Link types, libpcap's savefile rules and frames the audit cannot judge, each against real tcpdump -r.

The filter is compiled as ``tcpdump -r`` compiles it (a savefile handle): NULL/LOOP ``ip6`` tests the three BSD
AF_INET6 values, NULL's family is compared in the writer's byte order, ``inbound``/``outbound`` are refused where
tcpdump refuses them and ``ip broadcast`` is accepted (netmask 0). A filter libpcap rejects for one link type of
a capture leaves the others audited; the default audit inside ``analyze`` never turns that into a usage error.
"""

from __future__ import annotations

import struct
import subprocess

import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from bigtcp_pcap.audit import audit_capture
from bigtcp_pcap.audit.cbpf import NOT_AUDITED
from bigtcp_pcap.audit.libpcap import CompiledFilter, FilterError

from .conftest import (
    REPO,
    TCPDUMP,
    eth,
    hbh_jumbo,
    ipv4_hdr,
    ipv6_hdr,
    needs_tcpdump,
    tcp_hdr,
    tcpdump_count,
    udp_hdr,
    v6_hbh_tcp,
    v6_tcp,
)
from .test_suggest import write_pcapng

TCPDUMP_DIR = REPO / "tests" / "fixtures" / "tcpdump"


def write_pcap(path, packets, linktype: int, big_endian: bool = False):
    """A classic pcap written by a little- or big-endian host."""
    e = ">" if big_endian else "<"
    out = [struct.pack(e + "IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, linktype)]
    for i, (data, wirelen) in enumerate(packets):
        out.append(struct.pack(e + "IIII", 1_700_000_000 + i, i, len(data), wirelen) + data)
    path.write_bytes(b"".join(out))
    return path


def null_frames(families: list[int], big_endian: bool) -> list[tuple[bytes, int]]:
    """IPv6 TCP frames (one plain, one HBH jumbo per family) behind a DLT_NULL family word."""
    out = []
    for fam in families:
        for data, wire in (v6_tcp(100), v6_hbh_tcp(70000)):
            hdr = struct.pack(">I" if big_endian else "<I", fam)
            out.append((hdr + data[14:], wire - 10))
    return out


@needs_tcpdump
@pytest.mark.parametrize("big_endian", [False, True])
@pytest.mark.parametrize("expr", ["ip6", "tcp", "ip6 and tcp", "tcp port 5201", "not ip6", "ip"])
def test_null_all_three_ipv6_families_in_the_writers_byte_order(tmp_path, big_endian, expr):
    cap = write_pcap(tmp_path / "null.pcap", null_frames([24, 28, 30], big_endian), 0, big_endian)
    r = audit_capture(expr, cap)
    assert r.matched == tcpdump_count(cap, expr)
    if expr in ("ip6", "not ip6", "ip"):
        assert r.clean
    else:  # the HBH jumbo frames, one per family, are missed (they are TCP)
        assert r.truth == 6 and r.missed == 3


@needs_tcpdump
@pytest.mark.parametrize("expr", ["ip6", "tcp", "icmp6", "ip6 multicast"])
def test_loop_family_in_network_order(expr):
    cap = REPO / "tests" / "fixtures" / "kernel" / "linktypes" / "loop_from_v4.pcap"
    r = audit_capture(expr, cap)
    assert r.matched == tcpdump_count(cap, expr) and r.matched > 0


def tcpdump_stderr(cap, expr: str) -> tuple[int, str]:
    p = subprocess.run([TCPDUMP, "-r", str(cap), expr], capture_output=True, text=True, timeout=60, check=False)
    return p.returncode, p.stderr.strip().splitlines()[-1].removeprefix("tcpdump: ")


@pytest.fixture
def app():
    from bigtcp_pcap.audit.cli import register

    app = typer.Typer()
    register(app)

    @app.callback()
    def main() -> None:
        pass

    return app


@needs_tcpdump
@pytest.mark.parametrize("expr", ["inbound", "outbound", "tcp and inbound"])
def test_inbound_outbound_refused_on_ethernet_savefiles_as_tcpdump(app, tmp_path, expr):
    cap = write_pcap(tmp_path / "eth.pcap", [v6_tcp(10)], 1)
    rc, msg = tcpdump_stderr(cap, expr)
    assert rc != 0
    res = CliRunner().invoke(app, ["audit-filter", expr, str(cap)])
    assert res.exit_code == 2 and msg in res.stderr and "linktype 1 (EN10MB)" in res.stderr


@needs_tcpdump
def test_inbound_on_sll2_is_audited_like_tcpdump():
    cap = REPO / "tests" / "fixtures" / "kernel" / "linktypes" / "sll2_v6_185000.rcv.pcap"
    for expr in ("inbound", "outbound"):
        r = audit_capture(expr, cap)
        assert r.matched == tcpdump_count(cap, expr)
    assert audit_capture("inbound", cap).matched + audit_capture("outbound", cap).matched == r.frames_total


@needs_tcpdump
def test_ip_broadcast_is_accepted_as_tcpdump_r_accepts_it(tmp_path):
    seg = udp_hdr(68, 67, 8)
    bcast = eth(0x0800) + ipv4_hdr(28, 17)[:16] + bytes([255, 255, 255, 255]) + seg
    cap = write_pcap(tmp_path / "b.pcap", [(bcast, len(bcast)), v6_tcp(10)], 1)
    assert tcpdump_stderr(cap, "ip broadcast")[0] == 0
    r = audit_capture("ip broadcast", cap)
    assert r.matched == tcpdump_count(cap, "ip broadcast") == 1


@needs_tcpdump
@pytest.mark.parametrize("linktype,expr", [(0, "ip6"), (108, "ip6"), (1, "tcp port 5201"), (276, "inbound"),
                                           (101, "ip broadcast"), (113, "ip6 protochain 6")])
def test_bytecode_is_what_tcpdump_r_compiles(tmp_path, linktype, expr):
    cap = write_pcap(tmp_path / "empty.pcap", [], linktype)
    out = subprocess.run([TCPDUMP, "-r", str(cap), "-ddd", expr], capture_output=True, text=True, check=True).stdout
    lines = out.split("\n")
    assert CompiledFilter(expr, linktype).instructions == [tuple(int(x) for x in ln.split())
                                                           for ln in lines[1:int(lines[0]) + 1]]


def mixed_capture(tmp_path):
    """Ethernet and raw-IPv4 (228) interfaces in one pcapng: two IPv6 frames, two IPv4 frames."""
    seg = tcp_hdr() + bytes(20)
    v4 = ipv4_hdr(20 + len(seg)) + seg
    pkts = [(0, *v6_tcp(10)), (0, *v6_hbh_tcp(70000)), (1, v4, len(v4)), (1, v4, len(v4))]
    return write_pcapng(tmp_path / "mixed.pcapng", [1, 228], pkts)


def v4_then_v6_capture(tmp_path, v6: bool = True):
    """Two raw-IPv4 (228) frames, then two Ethernet IPv6 frames, one an HBH jumbogram, in one pcapng; without
    ``v6`` only the IPv4 frames, as BIG TCP ones (tot_len 0, 70,000 bytes on the wire, the first 60 captured)."""
    seg = tcp_hdr() + bytes(20)
    v4 = ipv4_hdr(20 + len(seg)) + seg
    pkts = [(1, v4, len(v4)), (1, v4, len(v4))] + [(0, *v6_tcp(10)), (0, *v6_hbh_tcp(70000))] if v6 else \
        [(1, ipv4_hdr(0) + seg, 70000)] * 2
    return write_pcapng(tmp_path / "v4_then_v6.pcapng", [1, 228], pkts)


def test_mixed_linktypes_rejected_for_one_are_audited_on_the_other(app, tmp_path):
    cap = mixed_capture(tmp_path)
    r = audit_capture("ip6 and tcp", cap)
    assert r.rejected == {228: "expression rejects all packets"}
    assert r.matched == 1 and r.truth == 2 and r.missed == 1
    assert r.not_audited == {"filter_rejected_for_linktype": 2} and r.not_audited_frames == 2
    assert sorted(r.frame[r.verdict == NOT_AUDITED].tolist()) == [3, 4]
    assert any("linktype 228 (IPV4)" in n for n in r.notes)
    res = CliRunner().invoke(app, ["audit-filter", "ip6 and tcp", str(cap)])
    assert res.exit_code == 1 and "linktype 228 (IPV4)" in res.stdout


def test_rejected_for_every_linktype_is_a_usage_error_naming_it(app):
    cap = TCPDUMP_DIR / "LINKTYPE_IPV4_invalid.pcap"
    with pytest.raises(FilterError):
        audit_capture("ip6 and tcp", cap)
    res = CliRunner().invoke(app, ["audit-filter", "ip6 and tcp", str(cap)])
    assert res.exit_code == 2
    assert res.stderr.strip() == ("bigtcp-pcap: bad filter expression 'ip6 and tcp': expression rejects all packets "
                                  "(linktype 228 (IPV4))")


@pytest.mark.parametrize("name", ["LINKTYPE_IPV4_invalid.pcap", "raw228_over_ipv6"])
def test_default_audit_never_turns_a_capture_problem_into_a_usage_error(tmp_path, name):
    """tcpdump's LINKTYPE_IPV4_invalid.pcap, and a raw-IPv4 header over other bytes: analyze finishes, writes the
    flows table, and reports the default filter libpcap rejects for the link type."""
    from bigtcp_pcap.api import analyze
    from bigtcp_pcap.cli import app as main_app

    cap = TCPDUMP_DIR / name
    if not cap.exists():
        cap = write_pcap(tmp_path / "raw228.pcap", [(v6_tcp(10)[0][14:], 70)], 228)
    out = tmp_path / "out"
    res = CliRunner().invoke(main_app, ["analyze", str(cap), "-o", str(out), "--json"])
    assert res.exit_code in (0, 1), res.output
    assert (out / "flows.parquet").exists()
    assert "linktype 228 (IPV4)" in res.stdout
    fa = analyze(cap, outdir=tmp_path / "api").summary["filter_audit"]
    assert "ip6 and tcp" not in fa["audited"] and "tcp" in fa["audited"]
    assert fa["note"] == ("filter 'ip6 and tcp' not audited: libpcap: expression rejects all packets (linktype 228 "
                          "(IPV4))")


def test_explicit_filter_rejected_everywhere_stays_a_usage_error(tmp_path):
    from bigtcp_pcap.cli import app as main_app

    res = CliRunner().invoke(main_app, ["analyze", str(TCPDUMP_DIR / "LINKTYPE_IPV4_invalid.pcap"), "-o",
                                        str(tmp_path / "o"), "--filter", "ip6 and tcp"])
    assert res.exit_code == 2 and "linktype 228 (IPV4)" in res.stderr


def test_parquet_holds_every_frame_that_is_not_ok(app, tmp_path):
    cap = mixed_capture(tmp_path)
    res = CliRunner().invoke(app, ["audit-filter", "ip6 and tcp", str(cap), "--parquet", str(tmp_path / "a.parquet")])
    t = pq.read_table(tmp_path / "a.parquet").to_pydict()
    assert t["frame"] == [2, 3, 4] and t["verdict"] == ["missed", "not_audited", "not_audited"]
    assert "not ok" in CliRunner().invoke(app, ["audit-filter", "--help"]).stdout.replace("\n", " ")
    assert res.exit_code == 1


def vxlan_over_v6_with_hbh(inner: bytes) -> bytes:
    """Ethernet/IPv6 + Hop-by-Hop/UDP 4789/VXLAN: an outer header the normalized copy does not rewrite."""
    vx = struct.pack("!BBHI", 0x08, 0, 0, 0x100 << 8) + inner
    udp = udp_hdr(50000, 4789, 8 + len(vx))
    hbh = bytes([17, 0, 1, 4, 0, 0, 0, 0])  # PadN
    return eth(0x86DD) + ipv6_hdr(len(hbh) + len(udp) + len(vx), 0) + hbh + udp + vx


def test_tunnel_that_cannot_be_normalized_is_counted_apart_never_as_correct(app, tmp_path):
    seg = tcp_hdr() + bytes(100)
    inner = eth(0x86DD) + ipv6_hdr(0, 0) + hbh_jumbo(6, 8 + len(seg)) + seg
    fr = vxlan_over_v6_with_hbh(inner)
    cap = write_pcap(tmp_path / "t.pcap", [(fr, len(fr)), v6_tcp(10)], 1)
    r = audit_capture("udp", cap)
    assert r.not_audited == {"tunnel_not_normalized": 1} and r.not_audited_frames == 1 and not r.complete
    res = CliRunner().invoke(app, ["audit-filter", "udp", str(cap)])
    assert res.exit_code == 1 and "every audited packet (1 of 2)" in res.stdout
    assert "no change needed" not in res.stdout
