"""The decoder on every link type and tunnel it claims, frame by frame against tshark, on real kernel captures.

The captures are in tests/fixtures/kernel/linktypes (see the README there; scripts/make_kernel_captures.py
``--linktypes``, i.e. tools/kernel_lab, writes them): LINUX_SLL2 and LINUX_SLL from ``tcpdump -i any`` during BIG TCP runs, Ethernet
with stacked 802.1ad/802.1Q tags, VXLAN and Geneve inner frames on the underlay veth, LINKTYPE_RAW from a tun
device, and NULL/LOOP files derived from Ethernet captures (Linux cannot capture those two).

tshark runs with ``ipv6.tso_support`` and ``ip.tso_support`` on (as in test_decode_oracle.py), output as PDML so
that each frame's top-level protocol layers come in order. The decoder describes the innermost IP/L4 layer it
reaches: the last top-level ``ip``/``ipv6``/``tcp`` layer (after a VXLAN/Geneve layer for tunnels; an ICMP
error's quoted header is nested inside the ICMP layer, so it is never taken for the packet's own).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from oracle import KERNEL, TSHARK_PREFS, need_tshark

from bigtcp_pcap.capture import CaptureReader
from bigtcp_pcap.decode import PacketBatch, decode
from bigtcp_pcap.decode.schema import (
    BIGTCP_HBH_JUMBO,
    BIGTCP_NONE,
    BIGTCP_V4_TOTLEN0,
    BIGTCP_V6_PLEN0,
    TUNNEL_GENEVE,
    TUNNEL_NONE,
    TUNNEL_VXLAN,
)

LT_DIR = KERNEL / "linktypes"
# pcap linktype -> Wireshark's WTAP_ENCAP_* number (frame.encap_type)
WTAP_ENCAP = {1: 1, 101: 7, 0: 15, 113: 25, 108: 174, 276: 210}
FIXTURES: dict[str, int] = {
    "sll2_v6_185000.rcv.pcap": 276,
    "sll_v4_185000.rcv.pcap": 113,
    "qinq.snd.pcap": 1,
    "qinq.rcv.pcap": 1,
    "vxlan.snd.pcap": 1,
    "vxlan.rcv.pcap": 1,
    "geneve.rcv.pcap": 1,
    "tun_raw.snd.pcap": 101,
    "tun_raw.rcv.pcap": 101,
    "null_from_v6_185000.pcap": 0,
    "loop_from_v4.pcap": 108,
}
QINQ_OUTER, QINQ_INNER = 100, 200
NON_IP_INNER = "tunnel (non-IP inner frame)"
MAX_FILE_BYTES = 400_000
MAX_DIR_BYTES = 2_000_000

params = pytest.mark.parametrize("name", list(FIXTURES))


def _path(name: str) -> Path:
    p = LT_DIR / name
    if not p.is_file():
        pytest.skip(f"{p} is not there (scripts/make_kernel_captures.py --linktypes makes it)")
    return p


@cache
def _decoded(name: str) -> PacketBatch:
    return PacketBatch.concat([decode(rb)[0] for rb in CaptureReader(_path(name))])


@dataclass
class Layer:
    name: str
    pos: int  # offset of the layer in the frame
    f: dict[str, str] = field(default_factory=dict)  # first 'show' value of each field inside this layer


@cache
def _tshark(name: str, prefs: tuple[str, ...] = tuple(TSHARK_PREFS)) -> list[list[Layer]]:
    """The top-level protocol layers of every frame, in order, from ``tshark -T pdml``."""
    cmd = [need_tshark(), "-r", str(_path(name)), *prefs, "-T", "pdml"]
    out = subprocess.run(cmd, capture_output=True, check=True, timeout=300).stdout
    frames = []
    for pkt in ET.fromstring(out).iter("packet"):
        layers = []
        for proto in pkt.findall("proto"):
            lay = Layer(proto.get("name"), int(proto.get("pos") or 0))
            for fe in proto.iter("field"):
                lay.f.setdefault(fe.get("name"), fe.get("show"))
            layers.append(lay)
        frames.append(layers)
    return frames


def _raw_ip_len(name: str) -> list[int | None]:
    """Per frame, the innermost IPv4 total-length field as found (ip.tso_support off), None without IPv4."""
    prefs = ("-o", "ipv6.tso_support:TRUE", "-o", "ip.tso_support:FALSE")
    out = []
    for layers in _tshark(name, prefs):
        ips = [x for x in layers if x.name in ("ip", "ipv6")]
        out.append(int(ips[-1].f["ip.len"]) if ips and ips[-1].name == "ip" else None)
    return out


@dataclass
class Expect:
    """What the decoder must report for one frame, read from tshark's layers."""

    frame_len: int
    cap_len: int
    ip_version: int = 0
    ip_len: int | None = None
    jumbo: int | None = None
    plen_field: int | None = None
    l4: str | None = None
    sport: int | None = None
    dport: int | None = None
    seq: int | None = None
    tcp_len: int | None = None
    tunnel: int = TUNNEL_NONE  # a VXLAN/Geneve layer is in the frame (tshark's view)
    tunnel_inner_ip: bool = False  # ... and an IP layer follows it (the decoder then describes the inner frame)
    vlan: int = 0xFFFF
    names: list[str] = field(default_factory=list)
    ip: Layer | None = None  # tshark's layer for the decoder's (innermost) IP header
    l4_layer: Layer | None = None


def _expect(layers: list[Layer]) -> Expect:
    names = [x.name for x in layers]
    fr = layers[names.index("frame")].f
    e = Expect(int(fr["frame.len"]), int(fr["frame.cap_len"]), names=names)
    tags = [x for x in layers if x.name in ("ieee8021ad", "vlan")]
    if tags:
        e.vlan = int(tags[0].f.get("ieee8021ad.id") or tags[0].f["vlan.id"])
    ip_idx = [i for i, n in enumerate(names) if n in ("ip", "ipv6")]
    for tname, code in (("vxlan", TUNNEL_VXLAN), ("geneve", TUNNEL_GENEVE)):
        if tname in names:
            e.tunnel = code
            e.tunnel_inner_ip = bool(ip_idx) and names.index(tname) < ip_idx[-1]
    if not ip_idx:
        return e
    k = ip_idx[-1]
    ip = e.ip = layers[k]
    if ip.name == "ip":
        e.ip_version, e.ip_len = 4, int(ip.f["ip.len"])
    else:
        e.ip_version = 6
        e.plen_field = int(ip.f["ipv6.plen"])
        if "ipv6.opt.jumbo" in ip.f:
            e.jumbo = int(ip.f["ipv6.opt.jumbo"])
        e.ip_len = 40 + e.plen_field if e.plen_field else (40 + e.jumbo if e.jumbo else None)
    if k + 1 < len(layers) and layers[k + 1].name in ("tcp", "udp", "icmpv6", "icmp"):
        l4 = e.l4_layer = layers[k + 1]
        e.l4 = l4.name
        if l4.name == "tcp":
            e.sport, e.dport = int(l4.f["tcp.srcport"]), int(l4.f["tcp.dstport"])
            e.seq, e.tcp_len = int(l4.f["tcp.seq_raw"]), int(l4.f["tcp.len"])
            if e.ip_len is None:  # payload_len 0 without a jumbo option: tshark's TSO length
                e.ip_len = int(ip.f.get("ipv6.plen") or 0) + 40 + int(l4.f["tcp.hdr_len"]) + e.tcp_len
        elif l4.name == "udp":
            e.sport, e.dport = int(l4.f["udp.srcport"]), int(l4.f["udp.dstport"])
    return e


def _mismatches(name: str) -> dict[str, list[str]]:
    """Per field, the frames where the decoder and tshark disagree ('frame N: ours X, tshark Y')."""
    pb = _decoded(name)
    frames = _tshark(name)
    assert len(frames) == len(pb) > 0
    raw_v4 = _raw_ip_len(name)
    bad: dict[str, list[str]] = {}

    def check(fieldname: str, i: int, ours, theirs) -> None:
        if ours != theirs:
            bad.setdefault(fieldname, []).append(f"frame {i + 1}: ours {ours}, tshark {theirs}")

    for i, layers in enumerate(frames):
        e = _expect(layers)
        check("wirelen", i, int(pb.wirelen[i]), e.frame_len)
        check("caplen", i, int(pb.caplen[i]), e.cap_len)
        check("vlan", i, int(pb.vlan[i]), e.vlan)
        check("ip_version", i, int(pb.ip_version[i]), e.ip_version)
        # a tunnel whose inner frame is not IP (ARP through VXLAN/Geneve): see test_tunnel_column_non_ip_inner
        check("tunnel" if e.tunnel_inner_ip or not e.tunnel else NON_IP_INNER, i, int(pb.tunnel[i]), e.tunnel)
        if not e.ip_version:
            continue
        check("ip_len", i, int(pb.ip_len[i]), e.ip_len)
        check("has_jumbo", i, bool(pb.has_jumbo[i]), e.jumbo is not None)
        check("jumbo_len", i, int(pb.jumbo_len[i]), e.jumbo or 0)
        if e.ip_version == 4:
            want = BIGTCP_V4_TOTLEN0 if raw_v4[i] == 0 else BIGTCP_NONE
        else:
            want = (BIGTCP_HBH_JUMBO if e.jumbo else BIGTCP_V6_PLEN0) if e.plen_field == 0 else BIGTCP_NONE
        check("bigtcp", i, int(pb.bigtcp[i]), want)
        if e.l4 in ("tcp", "udp"):
            check("l4_proto", i, int(pb.l4_proto[i]), 6 if e.l4 == "tcp" else 17)
            check("sport", i, int(pb.sport[i]), e.sport)
            check("dport", i, int(pb.dport[i]), e.dport)
        if e.l4 == "tcp":
            check("tcp_seq", i, int(pb.tcp_seq[i]), e.seq)
            check("tcp_payload_len", i, int(pb.tcp_payload_len[i]), e.tcp_len)
        _check_more(check, i, pb, e)
    return bad


def _check_more(check, i: int, pb: PacketBatch, e: Expect) -> None:
    """Header offsets, addresses and the other IP/TCP columns, where tshark shows them."""
    ip, f = e.ip, e.ip.f
    check("l3_off", i, int(pb.l3_off[i]), ip.pos)
    v = 4 if ip.name == "ip" else 6
    src, dst = f[f"{ip.name}.src"], f[f"{ip.name}.dst"]
    n = 4 if v == 4 else 16
    check("src", i, str(ipaddress.ip_address(bytes(pb.src[i, :n]))), str(ipaddress.ip_address(src)))
    check("dst", i, str(ipaddress.ip_address(bytes(pb.dst[i, :n]))), str(ipaddress.ip_address(dst)))
    check("ttl", i, int(pb.ttl[i]), int(f["ip.ttl"] if v == 4 else f["ipv6.hlim"]))
    if v == 4:
        check("ip_hdr_len", i, int(pb.ip_hdr_len[i]), int(f["ip.hdr_len"]))
        check("ip_id", i, int(pb.ip_id[i]), int(f["ip.id"], 16))
        check("df", i, int(pb.df[i]), int(f["ip.flags.df"]))
        check("tos", i, int(pb.tos[i]), int(f["ip.dsfield"], 16))
    else:
        check("tos", i, int(pb.tos[i]), int(f["ipv6.tclass"], 16))
        check("flow_label", i, int(pb.flow_label[i]), int(f["ipv6.flow"], 16))
    if e.l4_layer is None:
        return
    t = e.l4_layer.f
    check("l4_off", i, int(pb.l4_off[i]), e.l4_layer.pos)
    check("ip_hdr_len(l4-l3)", i, int(pb.ip_hdr_len[i]), e.l4_layer.pos - ip.pos)
    if e.l4 != "tcp":
        return
    check("tcp_hdr_len", i, int(pb.tcp_hdr_len[i]), int(t["tcp.hdr_len"]))
    check("tcp_ack", i, int(pb.tcp_ack[i]), int(t["tcp.ack_raw"]))
    check("tcp_flags", i, int(pb.tcp_flags[i]), int(t["tcp.flags"], 16) & 0xFFF)
    check("tcp_win", i, int(pb.tcp_win[i]), int(t["tcp.window_size_value"]))
    check("tcp_has_ts", i, bool(pb.tcp_has_ts[i]), "tcp.options.timestamp.tsval" in t)
    if "tcp.options.timestamp.tsval" in t:
        check("tcp_ts_val", i, int(pb.tcp_ts_val[i]), int(t["tcp.options.timestamp.tsval"]))
        check("tcp_ts_ecr", i, int(pb.tcp_ts_ecr[i]), int(t["tcp.options.timestamp.tsecr"]))
    check("tcp_mss", i, int(pb.tcp_mss[i]), int(t.get("tcp.options.mss_val", 0)))
    check("tcp_wscale", i, int(pb.tcp_wscale[i]), int(t.get("tcp.options.wscale.shift", -1)))
    check("tcp_sack_perm", i, bool(pb.tcp_sack_perm[i]), "tcp.options.sack_perm" in t)


@cache
def _all_mismatches(name: str) -> dict[str, list[str]]:
    return _mismatches(name)


# ---------------------------------------------------------------------------------------------------------------


def test_fixtures_present_and_small():
    missing = [n for n in FIXTURES if not (LT_DIR / n).is_file()]
    if len(missing) == len(FIXTURES):
        pytest.skip(f"no linktype captures in {LT_DIR}")
    assert not missing
    sizes = {p.name: p.stat().st_size for p in LT_DIR.iterdir() if p.is_file()}
    assert all(sizes[n] <= MAX_FILE_BYTES for n in FIXTURES), sizes
    assert sum(sizes.values()) < MAX_DIR_BYTES, sizes


@params
def test_linktype(name):
    want = FIXTURES[name]
    raw = _path(name).read_bytes()[:24]
    endian = "<" if raw[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    assert int.from_bytes(raw[20:24], "little" if endian == "<" else "big") == want
    pb = _decoded(name)
    assert (pb.linktype == want).all()
    encaps = {int(layers[[x.name for x in layers].index("frame")].f["frame.encap_type"]) for layers in _tshark(name)}
    assert encaps == {WTAP_ENCAP[want]}


@params
def test_every_frame_matches_tshark(name):
    bad = {k: v for k, v in _all_mismatches(name).items() if k != NON_IP_INNER}
    assert not bad, json.dumps({k: (len(v), v[:5]) for k, v in bad.items()}, indent=1)


TUNNELED = ["vxlan.snd.pcap", "vxlan.rcv.pcap", "geneve.rcv.pcap"]


@pytest.mark.parametrize("name", TUNNELED)
def test_tunnel_column_non_ip_inner(name):
    frames = [_expect(x) for x in _tshark(name)]
    non_ip = [i for i, e in enumerate(frames) if e.tunnel and not e.tunnel_inner_ip]
    assert non_ip, "the fixture holds no tunneled non-IP frame any more: drop this test"
    bad = _all_mismatches(name).get(NON_IP_INNER, [])
    assert not bad, f"{len(bad)} of {len(non_ip)} frames: {bad[:5]}"


@pytest.mark.parametrize("name", TUNNELED)
def test_tunnel_non_ip_inner_frames_are_there(name):
    """Tunneled ARP frames exist, carry an ARP inner frame, and the decoder stops at the outer UDP."""
    pb = _decoded(name)
    frames = _tshark(name)
    rows = [i for i, x in enumerate(frames) if _expect(x).tunnel and not _expect(x).tunnel_inner_ip]
    assert len(rows) >= 2
    for i in rows:
        assert [x.name for x in frames[i]][-1] == "arp"
        assert pb.l4_proto[i] == 17 and pb.dport[i] in (4789, 6081) and pb.status[i] == 0


@params
def test_every_tcp_frame_is_decoded(name):
    """tshark's TCP frames are exactly the decoder's TCP rows (inner TCP for tunnels)."""
    pb = _decoded(name)
    tshark_tcp = np.array([_expect(layers).l4 == "tcp" for layers in _tshark(name)])
    ours = (pb.l4_proto == 6) & (pb.l4_off >= 0)
    assert tshark_tcp.sum() > 0
    assert (ours == tshark_tcp).all()


@params
def test_counts_match_the_capture_summary(name):
    """The script's stdlib summary (JSON beside the capture) and the decoder count the same BIG TCP/tunnel frames."""
    pb = _decoded(name)
    stem = name.removesuffix(".pcap")
    side = {"snd": "sender", "rcv": "receiver"}.get(stem.rsplit(".", 1)[-1])
    js = _path(name).with_name((stem.rsplit(".", 1)[0] if side else stem) + ".json")
    meta = json.loads(js.read_text())
    obs = meta["observed"][side] if side else meta["observed"]
    tcp = (pb.l4_proto == 6) & (pb.l4_off >= 0)
    assert obs["linktype"] == FIXTURES[name]
    assert obs["packets"] == len(pb)
    assert obs["tcp_packets"] == int(tcp.sum())
    assert obs["ipv6_hbh_jumbo"] == int((pb.has_jumbo & tcp).sum())
    assert obs["ipv4_tot_len_0"] == int(((pb.bigtcp == BIGTCP_V4_TOTLEN0) & tcp).sum())
    assert obs["tunneled_tcp_packets"].get("vxlan", 0) == int(((pb.tunnel == TUNNEL_VXLAN) & tcp).sum())
    assert obs["tunneled_tcp_packets"].get("geneve", 0) == int(((pb.tunnel == TUNNEL_GENEVE) & tcp).sum())
    assert obs["largest_frame"] == int(pb.wirelen[tcp].max())


# --- what each fixture is there for ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sll2_v6_185000.rcv.pcap", "null_from_v6_185000.pcap"])
def test_hbh_jumbo_beyond_64k(name):
    pb = _decoded(name)
    big = pb.bigtcp == BIGTCP_HBH_JUMBO
    assert big.sum() >= 10
    assert (pb.ip_len[big] > 65535 + 40).all()
    assert (pb.ip_len[big].astype(np.int64) == 40 + pb.jumbo_len[big].astype(np.int64)).all()
    l2 = pb.l3_off[big].astype(np.int64)
    assert (pb.wirelen[big].astype(np.int64) == l2 + pb.ip_len[big].astype(np.int64)).all()
    assert set(l2.tolist()) == {20 if name.startswith("sll2") else 4}


@pytest.mark.parametrize("name", ["sll_v4_185000.rcv.pcap", "loop_from_v4.pcap"])
def test_ipv4_totlen0_beyond_64k(name):
    pb = _decoded(name)
    big = pb.bigtcp == BIGTCP_V4_TOTLEN0
    assert big.sum() >= 10
    assert (pb.ip_len_field[big] == 0).all()
    assert (pb.ip_len[big] > 65535).all()
    l2 = pb.l3_off[big].astype(np.int64)
    assert (pb.wirelen[big].astype(np.int64) == l2 + pb.ip_len[big].astype(np.int64)).all()
    assert set(l2.tolist()) == {16 if name.startswith("sll") else 4}


@pytest.mark.parametrize("name", ["qinq.snd.pcap", "qinq.rcv.pcap"])
def test_qinq_outer_tag(name):
    """Every frame carries 802.1ad 100 then 802.1Q 200; the vlan column is the outer id."""
    pb = _decoded(name)
    frames = _tshark(name)
    for layers in frames:
        names = [x.name for x in layers]
        assert names[names.index("eth") + 1 : names.index("eth") + 3] == ["ieee8021ad", "vlan"]
        assert layers[names.index("ieee8021ad")].f["ieee8021ad.id"] == str(QINQ_OUTER)
        assert layers[names.index("vlan")].f["vlan.id"] == str(QINQ_INNER)
    assert (pb.vlan == QINQ_OUTER).all()
    assert (pb.l2_len == 22).all()
    assert ((pb.ip_version == 4).sum() > 100) and ((pb.ip_version == 6).sum() > 100)


def test_qinq_sender_keeps_hbh_in_segments():
    """Kernel behaviour this capture recorded (see the README): IPv6 BIG TCP GSO packets, software-segmented after
    tc pushed the tags, keep the 8-byte HBH jumbo header in every segment, with payload_len set (RFC 2675 calls
    that malformed; both tools show the jumbo option, neither calls it BIG TCP). The full-size segments are then
    8 bytes over what the veth forwards and never reach the receiver; a shorter tail segment does."""
    snd, rcv = _decoded("qinq.snd.pcap"), _decoded("qinq.rcv.pcap")
    hbh = snd.has_jumbo & (snd.ip_len_field != 0)
    assert hbh.sum() >= 10
    assert (snd.bigtcp[hbh] == BIGTCP_NONE).all()
    assert (snd.jumbo_len[hbh] > 65535).all()
    full = hbh & (snd.tcp_payload_len == 1428)
    assert full.sum() >= 10
    assert (snd.wirelen[full] == 14 + 8 + 40 + 8 + 32 + 1428).all()
    assert rcv.wirelen.max() == 14 + 8 + 1500
    assert not (rcv.has_jumbo & (rcv.tcp_payload_len == 1428)).any()


@pytest.mark.parametrize("name,code", [("vxlan.snd.pcap", TUNNEL_VXLAN), ("vxlan.rcv.pcap", TUNNEL_VXLAN),
                                       ("geneve.rcv.pcap", TUNNEL_GENEVE)])
def test_tunnel_column_on_inner_tcp(name, code):
    pb = _decoded(name)
    frames = _tshark(name)
    inner_tcp = np.array([_expect(x).tunnel == code and _expect(x).l4 == "tcp" for x in frames])
    assert inner_tcp.sum() > 100 if name != "vxlan.rcv.pcap" else inner_tcp.sum() > 20
    assert (pb.tunnel[inner_tcp] == code).all()
    assert (pb.l4_proto[inner_tcp] == 6).all()
    # the inner IP is the overlay's (10.198.x / fd00:b2::, fd00:b3::), not the underlay's
    inner_src = pb.src[inner_tcp]
    v4 = pb.ip_version[inner_tcp] == 4
    assert (inner_src[v4, 0] == 10).all() and (inner_src[v4, 1] == 198).all()
    assert (inner_src[~v4, :4] == [0xFD, 0x00, 0x00, 0xB2 if code == TUNNEL_VXLAN else 0xB3]).all()


def test_gro_over_vxlan_stops_below_64k():
    """gro-spec R19: the receiver merged the inner TCP segments, but never past 64 KiB (outer lengths are 16-bit)."""
    pb = _decoded("vxlan.rcv.pcap")
    t = (pb.tunnel == TUNNEL_VXLAN) & (pb.l4_proto == 6)
    assert (pb.tcp_payload_len[t] > 3 * 1398).sum() >= 5  # super-packets: GRO ran through the tunnel
    assert pb.wirelen[t].max() <= 14 + 65535
    assert pb.ip_len[t].max() <= 65535 - 50
    assert (pb.bigtcp == BIGTCP_NONE).all()


def test_raw_tun_carries_gso_packets():
    pb = _decoded("tun_raw.rcv.pcap")
    assert (pb.l2_len == 0).all() and (pb.l3_off == 0).all()
    assert set(pb.ip_version.tolist()) == {4, 6}
    assert (pb.wirelen.astype(np.int64) == pb.ip_len.astype(np.int64)).all()
    assert pb.ip_len.max() > 60000
