"""bigtcp.lua under the real tshark, headless (-X lua_script:..., -T fields -e bigtcp.*).

Checked against independent references: tcpdump's golden output for its BIG TCP test captures, tshark's own
fields (tcp.len, ip.len, ipv6.plen, ipv6.opt.jumbo with the TSO preferences on), and the JSON summary that
the capture tool writes beside each kernel capture (tools/kernel_lab/pcapsummary.py, its own stdlib pcap reader).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from .conftest import (
    EXTERNAL_DIR,
    count,
    fields,
    kernel_params,
    kernel_summary,
    needs_tshark,
    run_tshark,
    summarized_params,
)

pytestmark = needs_tshark

# tcpdump test captures: (file, kind, ip_len, tcp_len); lengths from the .out files beside them
# (bigtcp-ipv6-hbh: "HBH (jumbo: 80040)", length 80000; bigtcp-ipv6: "real length 80040", length 79968;
# bigtcp-ipv4: "length 80052 [was 0, presumed BIG TCP]", length 80000; ipv6_jumbogram_1: jumbo 65536, ICMPv6).
EXTERNAL = [
    ("bigtcp-ipv6-hbh.pcap", "hbh_jumbo", 40 + 80040, 80000),
    ("bigtcp-ipv6.pcap", "v6_plen0", 40 + 80000, 79968),
    ("bigtcp-ipv4.pcap", "v4_totlen0", 80052, 80000),
    ("gso-ipv4.pcap", "", 7292, 7240),
    ("gso-ipv6.pcap", "", 7212, 7140),
    ("ipv4_tcp_http_xml_tso.pcap", "v4_totlen0", 2016, 1976),
    ("ipv6_jumbogram_1.pcap", "hbh_jumbo", 40 + 65536, None),
]


def _external(name: str) -> Path:
    p = EXTERNAL_DIR / name
    if not p.is_file():
        pytest.skip(f"external fixture {p} not present")
    return p


@pytest.mark.parametrize("name,kind,ip_len,tcp_len", EXTERNAL, ids=[e[0] for e in EXTERNAL])
@pytest.mark.parametrize("tso", [True, False], ids=["tso_prefs", "default_prefs"])
def test_external_captures_match_tcpdump_golden_output(ws_home, name, kind, ip_len, tcp_len, tso):
    rows = fields(ws_home, _external(name), ["bigtcp.kind", "bigtcp.ip_len", "bigtcp.tcp_len"], tso=tso)
    assert rows == [[kind, str(ip_len), "" if tcp_len is None else str(tcp_len)]]


def test_v6_plen0_without_tso_support_is_detected_and_explained(ws_home):
    cap = _external("bigtcp-ipv6.pcap")
    # Wireshark's default: Malformed, no TCP layer; the plugin still finds the lengths and says why
    rows = fields(ws_home, cap, ["tcp.len", "bigtcp.kind", "bigtcp.tcp_len", "bigtcp.v6_plen0.no_tso_support"],
                  tso=False)
    assert rows == [["", "v6_plen0", "79968", "1"]]
    r = run_tshark(ws_home, cap, ["-T", "fields", "-e", "_ws.expert.message", "-e", "bigtcp.ip_len"], tso=False)
    msg, ip_len = r.stdout.rstrip("\n").split("\t")
    # the message names the same IP length as the tree (80040 = 40 + the 80000 bytes tcpdump calls the payload)
    assert ip_len == "80040"
    assert "ipv6.tso_support" in msg and "presumed BIG TCP (IP length 80040, payload 80000)" in msg
    # with the preference on, tshark agrees and the hint is not given
    rows = fields(ws_home, cap, ["tcp.len", "bigtcp.tcp_len", "bigtcp.v6_plen0.no_tso_support"], tso=True)
    assert rows == [["79968", "79968", ""]]


@pytest.mark.parametrize("capture", kernel_params())
def test_kernel_lengths_equal_tsharks_own_fields(ws_home, capture):
    names = ["frame.number", "bigtcp.kind", "bigtcp.ip_len", "bigtcp.tcp_len", "ip.len", "ipv6.plen",
             "ipv6.opt.jumbo", "tcp.len", "icmp", "icmpv6"]
    rows = fields(ws_home, capture, names)
    assert rows
    checked_tcp = 0
    for fr, kind, ip_len, tcp_len, v4len, v6plen, jumbo, tlen, icmp, icmp6 in rows:
        if icmp:  # ICMP errors quote an inner IP header: tshark lists both, the plugin uses the outer
            v4len = v4len.split(",")[0]
        if ip_len == "":  # no bigtcp tree: an ordinary frame of at most one segment (MTU 1500 here)
            assert not kind and not jumbo, f"frame {fr}"
            assert not v4len or int(v4len.split(",")[0]) <= 1500, f"frame {fr}"
            assert not v6plen or 40 + int(v6plen.split(",")[0]) <= 1500, f"frame {fr}"
            continue
        if v4len:
            assert ip_len == v4len.split(",")[0], f"frame {fr}"
        elif jumbo:
            assert kind == "hbh_jumbo" and int(ip_len) == 40 + int(jumbo), f"frame {fr}"
        elif v6plen:
            assert int(ip_len) == 40 + int(v6plen.split(",")[0]), f"frame {fr}"
        else:
            assert ip_len == "", f"frame {fr}: no IP but bigtcp.ip_len {ip_len}"
        if tlen and not icmp and not icmp6:
            assert tcp_len == tlen, f"frame {fr}"
            checked_tcp += 1
        elif not tlen:
            assert tcp_len == "", f"frame {fr}"
    # a sender capture (TSO/GSO off) has only single segments: nothing for the plugin to say
    assert checked_tcp > 0 or capture.name.endswith(".snd.pcap")


@pytest.mark.parametrize("capture", summarized_params())
def test_kernel_kind_counts_equal_capture_summary(ws_home, capture):
    summary = kernel_summary(capture)
    got = {k: count(ws_home, capture, f'bigtcp.kind == "{k}"') for k in ("hbh_jumbo", "v6_plen0", "v4_totlen0")}
    assert got["hbh_jumbo"] == summary["ipv6_hbh_jumbo"]
    assert got["v4_totlen0"] == summary["ipv4_tot_len_0"]
    # the summary's ipv6_payload_len_0 counts every payload_len 0 packet (HBH jumbo ones included)
    assert got["v6_plen0"] == summary["ipv6_payload_len_0"] - summary["ipv6_hbh_jumbo"]
    assert count(ws_home, capture, "bigtcp.kind") == sum(got.values())
    # tshark's own view of the HBH jumbo packets
    assert got["hbh_jumbo"] == count(ws_home, capture, "ipv6.opt.jumbo")
    # every BIG TCP packet is larger than 16 bits can say, or was sent with a zero length field
    assert count(ws_home, capture, "bigtcp.ip_len > 65535") == summary["l3_over_65535"]


@pytest.mark.parametrize("capture", summarized_params())
def test_kernel_gso_segs_histogram_equals_capture_summary(ws_home, capture):
    summary = kernel_summary(capture)
    rows = fields(ws_home, capture, ["ip.src", "ipv6.src", "tcp.srcport", "ip.dst", "ipv6.dst", "tcp.dstport",
                                     "bigtcp.gso_segs", "bigtcp.tcp_len", "bigtcp.mss", "bigtcp.mss_source"],
                  extra=["-Y", "bigtcp.gso_segs"])
    hist: dict[str, Counter] = {}
    for s4, s6, sp, d4, d6, dp, segs, tlen, mss, src in rows:
        flow = f"{s4 or s6}.{sp} > {d4 or d6}.{dp}"
        hist.setdefault(flow, Counter())[segs] += 1
        assert int(segs) == math.ceil(int(tlen) / int(mss))
        assert src in ("syn_peer", "syn_own", "observed")
    for fl in summary["flows"]:
        if fl["data_packets"] == 0:
            continue
        # single-segment packets get no bigtcp tree (nothing to say): compare the aggregates
        want = {k: v for k, v in fl["segments_histogram"].items() if k != "1"}
        assert dict(hist.get(fl["flow"], {})) == want, fl["flow"]


@pytest.mark.parametrize("capture", kernel_params())
def test_kernel_fields_are_filterable(ws_home, capture):
    rows = fields(ws_home, capture, ["bigtcp.gso_segs", "bigtcp.kind", "bigtcp.tcp_len"])
    segs = [int(r[0]) for r in rows if r[0]]
    assert count(ws_home, capture, "bigtcp.gso_segs > 45") == sum(1 for s in segs if s > 45)
    assert count(ws_home, capture, "bigtcp.gso_segs") == len(segs)
    assert count(ws_home, capture, 'bigtcp.kind == "hbh_jumbo" || bigtcp.kind == "v4_totlen0"') == sum(
        1 for r in rows if r[1] in ("hbh_jumbo", "v4_totlen0"))
    assert count(ws_home, capture, "bigtcp.tcp_len >= 100000") == sum(1 for r in rows if r[2] and int(r[2]) >= 100000)


def test_fields_usable_as_columns(ws_home):
    cap = _external("bigtcp-ipv6-hbh.pcap")
    cols = ('gui.column.format:"No.","%m","Kind","%Cus:bigtcp.kind","IP len",'
            '"%Cus:bigtcp.ip_len","TCP len","%Cus:bigtcp.tcp_len"')
    r = run_tshark(ws_home, cap, ["-o", cols])
    assert r.stdout.split() == ["1", "hbh_jumbo", "80080", "80000"]


def test_two_pass_gives_the_same_values(ws_home):
    from .conftest import kernel_captures

    caps = [c for c in kernel_captures() if c.name.endswith(".rcv.pcap")]
    if not caps:
        pytest.skip("no kernel receiver captures")
    names = ["frame.number", "bigtcp.kind", "bigtcp.ip_len", "bigtcp.tcp_len", "bigtcp.gso_segs", "bigtcp.mss"]
    one = fields(ws_home, caps[0], names)
    two = fields(ws_home, caps[0], names, extra=["-2"])
    assert one == two


@pytest.mark.parametrize("capture", summarized_params())
def test_bigtcp_filter_means_big_tcp_and_aggregated_frames(ws_home, capture):
    """-Y bigtcp matches only the frames the plugin has something to say about: BIG TCP encodings and packets of
    more than one MSS segment (tshark's own tcp.len against the MSS the capture script measured), and those
    frames say so in the Info column."""
    rec = json.loads(capture.with_name(capture.name.split(".")[0] + ".json").read_text())
    mss6, mss4 = rec["mss_seen"].get("ipv6") or 10**6, rec["mss_seen"].get("ipv4") or 10**6
    want = count(ws_home, capture, f"(ipv6 and tcp.len > {mss6}) or (ip and tcp.len > {mss4}) or ipv6.opt.jumbo")
    total = count(ws_home, capture, "ip or ipv6")
    got = count(ws_home, capture, "bigtcp")
    assert got == want < total
    rows = fields(ws_home, capture, ["bigtcp.kind", "_ws.col.Info"], extra=["-Y", "bigtcp"])
    for kind, info in rows:
        assert ("[BIG TCP " + kind + ", IP length" in info) if kind else ("[GRO/TSO aggregate of " in info)
