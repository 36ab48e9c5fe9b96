"""The audit against oracles it does not use, on every kernel, link-type and tcpdump fixture:

* ``matched`` (and the very frames) equal libpcap's own verdict: the file opened by ``pcap_open_offline``,
  the expression compiled on that handle (exactly what ``tcpdump -r`` does) and run by ``pcap_offline_filter``
  on libpcap's own reading of the records; on the link-type fixtures also the line count of a real
  ``tcpdump -r FILE EXPR``. A false all-clear (the program built for the wrong link type or run on the wrong
  bytes) cannot pass this.
* The audit's truth equals tshark's frame set for a display filter with the same meaning (both TSO preferences
  on). The display filters state libpcap's semantics in tshark terms: a protocol primitive tests the *outer*
  headers (a VXLAN frame is UDP to ``tcp``/``ip6``; an 802.1Q/802.1ad frame is none of them without ``vlan``),
  so they name the layer stack with ``frame.protocols`` (IPv6 extension headers in between are what the
  normalized copy removes). An expression judged on the raw frame (normalize.raw_header_reads) is compared with
  tshark with the TSO preferences off (the header fields as captured) and its normalized count with them on.
* Every suggested expression, run by real ``tcpdump -r``, keeps exactly the truth frames.

tshark evaluates every display filter in one pass over all fixtures merged by ``mergecap -a``: a Lua tap per
filter (``Listener.new(nil, filter)``), the same display-filter engine as ``-Y``.

Oracles missing: skipped, unless BIGTCP_PCAP_REQUIRE_ORACLES is set (CI), then the tests fail.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bigtcp_pcap.audit import normalize as nz
from bigtcp_pcap.audit.cbpf import FALSE_MATCH, MISSED, NOT_AUDITED, FilterAudit
from bigtcp_pcap.audit.libpcap import (
    SAVEFILE_NETMASK,
    BpfProgram,
    FilterError,
    LibpcapMissing,
    PcapPkthdr,
)
from bigtcp_pcap.audit.libpcap import load as load_libpcap

from .conftest import EXTERNAL_DIR, KERNEL_DIR, REPO, TCPDUMP, TSHARK, TSO, tcpdump_frames

REQUIRE_ORACLES = bool(os.environ.get("BIGTCP_PCAP_REQUIRE_ORACLES"))
MERGECAP = shutil.which("mergecap")
TCPDUMP_DIR = REPO / "tests" / "fixtures" / "tcpdump"
NO_TSO = ["-o", "ipv6.tso_support:FALSE", "-o", "ip.tso_support:FALSE"]

# --- the table ----------------------------------------------------------------------------------------------------
LINK = r"^(eth:ethertype:|sll:ethertype:|null:|raw:|)"  # the link layer of every fixture's link type, no VLAN tag
CHAIN = r"(:ipv6[.](hopopts|routing|dstopts)|:ah)*"  # the extension headers the normalized copy removes
ANYCHAIN = r"(:ipv6[.][a-z]+|:ah)*"  # every header protochain walks


def stack(rx: str) -> str:
    """A tshark filter on the layer stack (frame.protocols) matching the regular expression."""
    return f'frame.protocols matches "{rx}"'


def outer(l4: str) -> str:
    """The outer IPv4/IPv6 header carries ``l4`` (after the removable extension headers)."""
    return stack(f"{LINK}(ip|ipv6{CHAIN}):{l4}(:|$)")


OUT4, OUT6 = stack(f"{LINK}ip(:|$)"), stack(f"{LINK}ipv6(:|$)")


@dataclass(frozen=True)
class Row:
    """A pcap expression, the tshark display filter with its meaning; ``raw``: the expression tests the raw
    header, ``raw_filter`` is then its meaning on the frame as captured (tshark with TSO off)."""

    expr: str
    tshark: str
    raw_filter: str | None = None


TABLE = [
    Row("tcp", outer("tcp")),
    Row("udp", outer("udp")),
    Row("not tcp", f"not ({outer('tcp')})"),
    Row("icmp6", stack(f"{LINK}ipv6{CHAIN}:icmpv6(:|$)")),
    Row("icmp", stack(f"{LINK}ip:icmp(:|$)")),
    Row("ip", OUT4),
    Row("ip6", OUT6),
    Row("ip6 and tcp", stack(f"{LINK}ipv6{CHAIN}:tcp(:|$)")),
    Row("ip and tcp", stack(f"{LINK}ip:tcp(:|$)")),
    Row("ip6 and not tcp", f"{OUT6} and not {stack(f'{LINK}ipv6{CHAIN}:tcp(:|$)')}"),
    Row("tcp port 5201", f"{outer('tcp')} and tcp.port == 5201"),
    Row("tcp dst port 5201", f"{outer('tcp')} and tcp.dstport == 5201"),
    Row("tcp src port 5202", f"{outer('tcp')} and tcp.srcport == 5202"),
    Row("tcp portrange 5200-5210", f"{outer('tcp')} and tcp.port in {{5200..5210}}"),
    Row("port 5201 or port 5202", f"({outer('tcp')} and tcp.port in {{5201, 5202}}) or "
                                  f"({outer('udp')} and udp.port in {{5201, 5202}})"),
    Row("udp port 4789", f"{outer('udp')} and udp.port == 4789"),
    Row("udp dst port 6081", f"{outer('udp')} and udp.dstport == 6081"),
    Row("tcp[tcpflags] & tcp-syn != 0", f"{outer('tcp')} and tcp.flags.syn == 1"),
    Row("tcp[13] & 8 != 0 and dst port 5201", f"{outer('tcp')} and tcp.flags.push == 1 and tcp.dstport == 5201"),
    Row("host fd00:b1::1", f"{OUT6} and ipv6.addr#1 == fd00:b1::1"),
    Row("ip6 src net fd00::/8", f"{OUT6} and ipv6.src#1 == fd00::/8"),
    # 'host' without a protocol is ip, arp or rarp host (pcap-filter(7))
    Row("host 10.199.0.1", f"({OUT4} and ip.addr#1 == 10.199.0.1) or arp.src.proto_ipv4 == 10.199.0.1 or "
                           "arp.dst.proto_ipv4 == 10.199.0.1"),
    Row("ip6 multicast", f"{OUT6} and ipv6.dst#1 == ff00::/8"),
    Row("ip broadcast", f"{OUT4} and ip.dst#1 in {{0.0.0.0, 255.255.255.255}}"),  # netmask 0, as tcpdump -r
    Row("greater 1000", "frame.len >= 1000"),
    Row("less 100", "frame.len <= 100"),
    Row("len >= 64 and len <= 1500", "frame.len >= 64 and frame.len <= 1500"),
    Row("len > 65535", "frame.len > 65535"),
    Row("ip6 protochain 6", stack(f"{LINK}ipv6{ANYCHAIN}:tcp(:|$)")),
    Row("ip6 proto 89", stack(f"{LINK}ipv6{CHAIN}:ospf(:|$)")),  # OSPFv3 behind AH
    Row("vlan", stack("^eth:ethertype:(vlan|ieee8021ad)(:|$)")),
    Row("vlan and vlan and tcp", stack(f"^eth:ethertype:(vlan|ieee8021ad):ethertype:(vlan|ieee8021ad):ethertype:"
                                       f"(ip|ipv6{CHAIN}):tcp(:|$)")),
    Row("geneve and tcp", stack(f"{LINK}(ip|ipv6):udp:geneve:eth:ethertype:(ip|ipv6{CHAIN}):tcp(:|$)")),
    # the raw header: judged on the raw frame (TSO off), the normalized meaning side by side (TSO on)
    Row("ip[2:2] > 1500", f"{OUT4} and ip.len#1 > 1500", raw_filter=f"{OUT4} and ip.len#1 > 1500"),
    # with TSO off tshark stops at a total length of 0 (no ip.proto field): the protocol byte says TCP
    Row("tcp and ip[2:2] = 0", f"{OUT4} and ip.len#1 == 0 and ip[9] == 6",
        raw_filter=f"{OUT4} and ip.len#1 == 0 and ip[9] == 6"),
    Row("ip6 and ip6[6] = 0", stack(f"{LINK}ipv6:ipv6[.]hopopts"), raw_filter=stack(f"{LINK}ipv6:ipv6[.]hopopts")),
    Row("ip6 proto 51", stack(f"{LINK}ipv6:ah(:|$)"), raw_filter=stack(f"{LINK}ipv6:ah(:|$)")),
    Row("ip6 protochain 43", stack(f"{LINK}ipv6{ANYCHAIN}:ipv6[.]routing"),
        raw_filter=stack(f"{LINK}ipv6{ANYCHAIN}:ipv6[.]routing")),
]
# The normalized meaning of the raw-header rows, where tshark can state it (TSO on: true lengths). Those whose
# normalized copy has no such field (ip6[6] = 0 after the HBH header is removed, AH and routing headers removed)
# have a normalized truth of 0, asserted as such.
# Legitimate differences, (fixture, frame) -> (rows it applies to, None: all; why)
_V4_IN_228 = ("an IPv6 packet in a LINKTYPE_IPV4 (228) file: libpcap reads it as IPv4 without looking at the "
              "version, tshark hands it to IPv6")
_UDP_LEN_0 = ("outer UDP length 0 (BIG TCP over Geneve): tshark stops at the 'bogus' UDP length, the normalized "
              "copy restores it and libpcap's geneve reads the inner frame")
_LATER_FRAGMENT = ("a later fragment of a UDP datagram: libpcap's 'udp' tests the protocol field of every fragment, "
                   "tshark (reassembly off) shows no UDP header there")
_QUOTED = ("an ICMPv6 Packet Too Big quoting a BIG TCP packet: tshark dissects the quoted IPv6 and TCP headers "
           "(its 'tcp' matches), libpcap and the audit see an ICMPv6 packet")
LEGITIMATE = {
    ("LINKTYPE_IPV4_invalid.pcap", 1): (None, _V4_IN_228),
    ("bigtcp-ipv4-geneve-ipv6.s256.pcap", 1): ({"geneve and tcp"}, _UDP_LEN_0),
    **{("vxlan_frag.pcap", n): ({"udp"}, _LATER_FRAGMENT) for n in (30, 32, 34, 36, 38, 88, 90, 92, 94, 96)},
    **{("router_v46.pcap", n): (None, _QUOTED) for n in (83, 113, 115, 125, 143, 153, 155, 177, 201)},
}
NORMALIZED_ZERO = {"tcp and ip[2:2] = 0", "ip6 and ip6[6] = 0", "ip6 proto 51", "ip6 protochain 43"}


def _require(ok: bool, what: str) -> None:
    if ok:
        return
    if REQUIRE_ORACLES:
        pytest.fail(f"{what} is missing and BIGTCP_PCAP_REQUIRE_ORACLES is set")
    pytest.skip(f"{what} is not installed")


def fixtures() -> list[Path]:
    files = sorted(KERNEL_DIR.glob("*.pcap")) + sorted(KERNEL_DIR.glob("*/*.pcap")) + sorted(TCPDUMP_DIR.glob("*.pcap"))
    if EXTERNAL_DIR.is_dir():
        files += sorted(EXTERNAL_DIR.glob("*.pcap"))
    return files


LINKTYPE_FIXTURES = {p for p in fixtures() if p.parent.name in ("linktypes", "tcpdump")}


# --- libpcap's own reading --------------------------------------------------------------------------------------
def libpcap_offline(path: Path, exprs: list[str]) -> tuple[int, dict[str, set[int] | str]]:
    """(frames, {expr: frame numbers libpcap keeps, or libpcap's error}) with the file opened by libpcap."""
    lib = load_libpcap()
    lib.pcap_next_ex.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.POINTER(PcapPkthdr)),
                                 ctypes.POINTER(ctypes.POINTER(ctypes.c_ubyte))]
    lib.pcap_next_ex.restype = ctypes.c_int
    errbuf = ctypes.create_string_buffer(256)
    h = lib.pcap_open_offline(str(path).encode(), errbuf)
    assert h, errbuf.value
    try:
        pkts = []
        hp, dp = ctypes.POINTER(PcapPkthdr)(), ctypes.POINTER(ctypes.c_ubyte)()
        while lib.pcap_next_ex(h, ctypes.byref(hp), ctypes.byref(dp)) == 1:
            hdr = PcapPkthdr()
            ctypes.memmove(ctypes.byref(hdr), hp, ctypes.sizeof(PcapPkthdr))
            data = (ctypes.c_ubyte * max(hdr.caplen, 1))()
            ctypes.memmove(data, dp, hdr.caplen)
            pkts.append((hdr, data))
        out: dict[str, set[int] | str] = {}
        for expr in exprs:
            prog = BpfProgram()
            if lib.pcap_compile(h, ctypes.byref(prog), expr.encode(), 1, SAVEFILE_NETMASK) != 0:
                out[expr] = lib.pcap_geterr(h).decode()
                continue
            try:
                f = lib.pcap_offline_filter
                out[expr] = {i for i, (hdr, data) in enumerate(pkts, 1)
                             if f(ctypes.byref(prog), ctypes.byref(hdr), data)}
            finally:
                lib.pcap_freecode(ctypes.byref(prog))
        return len(pkts), out
    finally:
        lib.pcap_close(h)


# --- tshark, one pass -----------------------------------------------------------------------------------------------
LUA = """
local filters = {}
for line in io.lines(os.getenv("BIGTCP_ORACLE_FILTERS")) do filters[#filters + 1] = line end
local out = assert(io.open(os.getenv("BIGTCP_ORACLE_OUT"), "w"))
for i, f in ipairs(filters) do
  local tap = Listener.new(nil, f)
  function tap.packet(pinfo) out:write(i, " ", pinfo.number, "\\n") end
  function tap.draw() out:flush() end
end
"""


def tshark_sets(merged: Path, filters: list[str], prefs: list[str], tmp: Path) -> list[set[int]]:
    """For each display filter, the frame numbers of ``merged`` it selects (one tshark pass)."""
    (tmp / "filters.txt").write_text("\n".join(filters) + "\n")
    (tmp / "taps.lua").write_text(LUA)
    out = tmp / "out.txt"
    env = dict(os.environ, BIGTCP_ORACLE_FILTERS=str(tmp / "filters.txt"), BIGTCP_ORACLE_OUT=str(out))
    r = subprocess.run([TSHARK, "-q", "-r", str(merged), *prefs, "-X", f"lua_script:{tmp / 'taps.lua'}"], env=env,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0 and "rror" not in r.stderr.replace("Running as user", ""), r.stderr
    sets: list[set[int]] = [set() for _ in filters]
    for line in out.read_text().split("\n"):
        if line:
            i, n = line.split()
            sets[int(i) - 1].add(int(n))
    return sets


@dataclass
class Corpus:
    files: list[Path]
    frames: dict[Path, int]
    batches: dict[Path, list]
    libpcap: dict[Path, dict[str, set[int] | str]]
    tshark: dict[str, dict[Path, set[int]]]  # display filter -> file -> frames (TSO on)
    tshark_raw: dict[str, dict[Path, set[int]]]  # TSO off


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    from bigtcp_pcap.capture import read_batches
    from bigtcp_pcap.decode import decode

    try:
        load_libpcap()
        have_libpcap = True
    except LibpcapMissing:
        have_libpcap = False
    _require(have_libpcap, "libpcap")
    _require(TSHARK is not None and MERGECAP is not None, "tshark/mergecap")
    _require(TCPDUMP is not None, "tcpdump")
    tmp = tmp_path_factory.mktemp("oracle")
    files = fixtures()
    assert len(files) >= 40
    exprs = [r.expr for r in TABLE]
    frames, libpcap, batches = {}, {}, {}
    for f in files:
        frames[f], libpcap[f] = libpcap_offline(f, exprs)
        batches[f] = [(rb, decode(rb)[0]) for rb in read_batches(f)]
        assert sum(len(rb) for rb, _ in batches[f]) == frames[f], f
    merged = tmp / "all.pcapng"
    subprocess.run([MERGECAP, "-a", "-F", "pcapng", "-w", str(merged), *map(str, files)], check=True, timeout=120)
    starts, pos = {}, 0
    for f in files:
        starts[f] = pos
        pos += frames[f]

    def split(sets: list[set[int]], filters: list[str]) -> dict[str, dict[Path, set[int]]]:
        out = {}
        for flt, s in zip(filters, sets):
            arr = np.asarray(sorted(s), np.int64)
            out[flt] = {f: set((arr[(arr > starts[f]) & (arr <= starts[f] + frames[f])] - starts[f]).tolist())
                        for f in files}
        return out

    on_filters = [r.tshark for r in TABLE]
    raw_filters = [r.raw_filter for r in TABLE if r.raw_filter]
    tshark = split(tshark_sets(merged, on_filters, TSO, tmp), on_filters)
    tshark_raw = split(tshark_sets(merged, raw_filters, NO_TSO, tmp), raw_filters)
    # the taps are tshark's display-filter engine: spot-check one against -Y
    y = subprocess.run([TSHARK, "-r", str(merged), *TSO, "-Y", TABLE[10].tshark, "-T", "fields", "-e",
                        "frame.number"], capture_output=True, text=True, timeout=300, check=True).stdout.split()
    assert sum(len(s) for s in tshark[TABLE[10].tshark].values()) == len(y) > 0
    return Corpus(files, frames, batches, libpcap, tshark, tshark_raw)


def audit_file(c: Corpus, f: Path, expr: str):
    a = FilterAudit(expr)
    for rb, pb in c.batches[f]:
        a.feed(rb, pb)
    return a.result()


def frames_of(r, verdict: int) -> set[int]:
    return set(r.frame[r.verdict == verdict].astype(np.int64).tolist())


@pytest.mark.parametrize("row", TABLE, ids=[r.expr for r in TABLE])
def test_audit_equals_libpcap_tshark_and_tcpdump(corpus, row):
    problems: list[str] = []
    checked = 0
    for f in corpus.files:
        name = f.relative_to(REPO) if f.is_relative_to(REPO) else f.name
        kept = corpus.libpcap[f][row.expr]
        if isinstance(kept, str):  # libpcap rejects the expression for this link type: so must the audit
            try:
                audit_file(corpus, f, row.expr)
                problems.append(f"{name}: libpcap rejects it ({kept}), the audit did not")
            except FilterError as e:
                if e.message != kept:
                    problems.append(f"{name}: audit error {e.message!r} != libpcap's {kept!r}")
            continue
        r = audit_file(corpus, f, row.expr)
        missed, false, na = frames_of(r, MISSED), frames_of(r, FALSE_MATCH), frames_of(r, NOT_AUDITED)
        na |= {n for (fname, n), (rows, _why) in LEGITIMATE.items()
               if fname == f.name and (rows is None or row.expr in rows)}
        if r.matched != len(kept):
            problems.append(f"{name}: matched {r.matched}, libpcap keeps {len(kept)}")
            continue
        if missed & kept or not false <= kept:
            problems.append(f"{name}: missed/false frames inconsistent with libpcap's verdicts")
        truth = (kept - false - na) | missed
        if row.raw_filter:
            assert r.judged_on == "raw" and r.clean, (name, r.judged_on)
            want = corpus.tshark_raw[row.raw_filter][f] - na
            want_norm = corpus.tshark[row.tshark][f] - na
            if truth != want:
                problems.append(f"{name}: raw truth differs from tshark (TSO off): audit-only "
                                f"{sorted(truth - want)[:5]}, tshark-only {sorted(want - truth)[:5]}")
            norm_truth = 0 if row.expr in NORMALIZED_ZERO else len(want_norm)
            if r.normalized["truth"] != norm_truth:
                problems.append(f"{name}: normalized truth {r.normalized['truth']}, tshark (TSO on) {norm_truth}")
            sugg_want = want_norm
        else:
            assert r.judged_on == "normalized"
            want = corpus.tshark[row.tshark][f] - na
            if truth != want:
                problems.append(f"{name}: truth differs from tshark: audit-only {sorted(truth - want)[:5]}, "
                                f"tshark-only {sorted(want - truth)[:5]} (not audited {len(na)})")
            sugg_want = want
        if r.suggestion is not None and r.suggestion_verified:
            got = tcpdump_frames(f, r.suggestion) - na
            if got != sugg_want:
                problems.append(f"{name}: tcpdump with the suggestion {r.suggestion!r} keeps {len(got)}, truth "
                                f"{len(sugg_want)}")
        if f in LINKTYPE_FIXTURES:
            out = subprocess.run([TCPDUMP, "-n", "-q", "-r", str(f), row.expr], capture_output=True, text=True,
                                 timeout=60, check=True).stdout
            if len(out.splitlines()) != r.matched:
                problems.append(f"{name}: tcpdump -r keeps {len(out.splitlines())}, matched {r.matched}")
        checked += corpus.frames[f] - len(na)
    assert not problems, "\n".join(problems)
    assert checked > 30000


def test_raw_header_expressions_are_the_ones_in_the_table():
    """The table's raw rows are exactly those normalize.raw_header_reads flags."""
    assert {r.expr for r in TABLE if r.raw_filter} == {r.expr for r in TABLE if nz.raw_header_reads(r.expr)}
