"""Link types and encapsulations beyond Ethernet, frame by frame against tshark.

Three sets of captures (tests/fixtures/README.md says how each was made):

* ``kernel/encap/``: made by this VM's kernel: NFLOG (``tcpdump -i nflog:N`` with an nftables ``log group`` rule,
  ``make_nflog.sh`` beside it);
* ``wrapped/``: kernel-made BIG TCP Ethernet frames put inside PPP, Cisco HDLC, FDDI, 802.11, radiotap, PPI,
  IPoIB, PKTAP, LLC/SNAP, MPLS, PPPoE, GRE, ERSPAN I/II/III and IP-in-IP headers by
  ``scripts/make_wrapped_captures.py`` (a fixed transform; lengths from the original length);
* ``field/``: excerpts of captures from tcpdump's and Zeek's test suites (real equipment: ERSPAN from a mirror
  port, GRE, MPLS, PPPoE over QinQ, 802.11, PKTAP, PPP, ...), cut to snaplen 256.

For every frame tshark decodes as TCP (its last TCP layer, not one quoted in an ICMP error), the decoder must
decode TCP with the same ports, sequence and acknowledgment numbers, the 12-bit flag word, window, header
length, payload length and IP length; the frames tshark does not take to TCP the decoder must not either; the
``tunnel`` column must name the tunnel tshark shows. IPv4 fragments and the reserved TCP flag bits are
checked on crafted frames against tshark.
"""

from __future__ import annotations

import struct
import subprocess
from functools import cache
from pathlib import Path

import pytest
from craft import eth, ipv4, tcp
from oracle import ROOT, need_tshark, tshark_fields, write_pcap

from bigtcp_pcap.capture import CaptureReader
from bigtcp_pcap.decode import PacketBatch, decode
from bigtcp_pcap.decode.schema import (
    ST_IP_FRAGMENT,
    TUNNEL_ERSPAN,
    TUNNEL_GENEVE,
    TUNNEL_GRE,
    TUNNEL_IP6IP,
    TUNNEL_IPIP,
    TUNNEL_NONE,
    TUNNEL_VXLAN,
)

FIX = ROOT / "tests" / "fixtures"
PREFS = ["-o", "ipv6.tso_support:TRUE", "-o", "ip.tso_support:TRUE", "-o", "ip.defragment:FALSE",
         "-o", "ipv6.defragment:FALSE"]
TFIELDS = ["frame.number", "frame.len", "frame.protocols", "ip.len", "ipv6.plen", "tcp.srcport", "tcp.dstport",
           "tcp.seq_raw", "tcp.ack_raw", "tcp.flags", "tcp.window_size_value", "tcp.hdr_len", "tcp.len"]
# file -> (link type in the file, tunnel code the TCP frames must carry, least number of TCP frames)
WRAPPED = {
    "ppp.pcap": (9, TUNNEL_NONE, 40), "ppp_hdlc.pcap": (50, TUNNEL_NONE, 40),
    "ppp_with_dir.pcap": (204, TUNNEL_NONE, 40), "c_hdlc.pcap": (104, TUNNEL_NONE, 40),
    "fddi.pcap": (10, TUNNEL_NONE, 40), "ieee802_11.pcap": (105, TUNNEL_NONE, 40),
    "radiotap.pcap": (127, TUNNEL_NONE, 40), "ppi.pcap": (192, TUNNEL_NONE, 40),
    "ipoib.pcap": (242, TUNNEL_NONE, 40), "pktap.pcap": (258, TUNNEL_NONE, 40),
    "eth_llc_snap.pcap": (1, TUNNEL_NONE, 20), "mpls.pcap": (1, TUNNEL_NONE, 40),
    "pppoe.pcap": (1, TUNNEL_NONE, 20), "gre_ip.pcap": (1, TUNNEL_GRE, 20),
    "gre_key_seq_ip.pcap": (1, TUNNEL_GRE, 20), "gre_teb.pcap": (1, TUNNEL_GRE, 20),
    "erspan1.pcap": (1, TUNNEL_ERSPAN, 20), "erspan2.pcap": (1, TUNNEL_ERSPAN, 20),
    "erspan3.pcap": (1, TUNNEL_ERSPAN, 20), "ipip.pcap": (1, TUNNEL_IPIP, 5),
    "sit.pcap": (1, TUNNEL_IP6IP, 15), "ip6ip6.pcap": (1, TUNNEL_IP6IP, 15),
}
FIELD = {
    "erspan_zeek.pcap": (1, TUNNEL_GRE, 10), "gre_sample.pcap": (1, TUNNEL_GRE, 20),
    "gre_bypass.pcap": (1, TUNNEL_GRE, 5), "wccp_redirect_gre.pcap": (1, TUNNEL_GRE, 1),
    "gre_udp_4754.pcap": (1, TUNNEL_GRE, 10), "gre_aruba_wlan.pcap": (1, TUNNEL_GRE, 50),
    "mpls_vlan.pcap": (1, TUNNEL_NONE, 10), "pppoe_qinq.pcap": (1, TUNNEL_NONE, 80),
    "cisco_fabricpath.pcap": (1, TUNNEL_NONE, 16), "pbb.pcap": (1, TUNNEL_NONE, 8),
    "ipv4_in_ipv6.pcap": (1, TUNNEL_IPIP, 1), "kday4.pcap": (1, TUNNEL_NONE, 10),
    "fddi_llc.pcap": (10, TUNNEL_NONE, 50), "ipoib.pcap": (242, TUNNEL_NONE, 20),
    "nflog_http.pcap": (239, TUNNEL_NONE, 13), "nflog_tcpdump.pcap": (239, TUNNEL_NONE, 0),
    "ppp_mpls.pcap": (9, TUNNEL_NONE, 3), "ppp_bgp.pcap": (9, TUNNEL_NONE, 1),
    "ppp_hdlc_dns.pcap": (9, TUNNEL_NONE, 0), "chdlc_slarp.pcap": (104, TUNNEL_NONE, 0),
    "wlanmon_80211.pcap": (105, TUNNEL_NONE, 0), "radiotap_mgmt.pcap": (127, TUNNEL_NONE, 0),
    "pktap.pcap": (258, TUNNEL_NONE, 0), "pktap_user2.pcap": (149, TUNNEL_NONE, 0),
}
KERNEL_ENCAP = {"nflog.pcap": (239, TUNNEL_NONE, 8)}
ALL = ([("wrapped", n) for n in WRAPPED] + [("field", n) for n in FIELD]
       + [("kernel/encap", n) for n in KERNEL_ENCAP])
SPEC = {("wrapped", k): v for k, v in WRAPPED.items()} | {("field", k): v for k, v in FIELD.items()} \
    | {("kernel/encap", k): v for k, v in KERNEL_ENCAP.items()}
TUNNEL_OF = {"vxlan": TUNNEL_VXLAN, "geneve": TUNNEL_GENEVE, "erspan": TUNNEL_ERSPAN, "gre": TUNNEL_GRE}


def _path(folder: str, name: str) -> Path:
    p = FIX / folder / name
    if not p.is_file():
        pytest.fail(f"{p} is missing (tests/fixtures/README.md says how it is made)")
    return p


@cache
def _decoded(folder: str, name: str) -> PacketBatch:
    return PacketBatch.concat([decode(rb)[0] for rb in CaptureReader(_path(folder, name))])


@cache
def _tshark(folder: str, name: str) -> list[dict[str, list[str]]]:
    cmd = [need_tshark(), "-n", "-r", str(_path(folder, name)), *PREFS, "-T", "fields", "-E", "separator=\t",
           "-E", "occurrence=a", "-E", "aggregator=|"]
    for f in TFIELDS:
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout
    rows = []
    for line in out.splitlines():
        vals = (line.split("\t") + [""] * len(TFIELDS))[:len(TFIELDS)]
        rows.append({f: v.split("|") if v else [] for f, v in zip(TFIELDS, vals)})
    return rows


def tcp_path(protocols: str) -> list[str] | None:
    """tshark's layers up to its last TCP layer; None without TCP or when that TCP is quoted in ICMP."""
    names = protocols.split(":")
    if "tcp" not in names:
        return None
    path = names[:len(names) - names[::-1].index("tcp")]
    return None if "icmp" in path or "icmpv6" in path else path


def expected_tunnel(path: list[str]) -> int:
    """The innermost tunnel on tshark's path, in the decoder's vocabulary."""
    code = TUNNEL_NONE
    prev = None
    for n in path:
        if n in TUNNEL_OF:
            code = TUNNEL_OF[n]
        elif n in ("ip", "ipv6") and prev in ("ip", "ipv6"):
            code = TUNNEL_IPIP if n == "ip" else TUNNEL_IP6IP
        if n not in ("ipv6.hopopts", "ipv6.dstopts"):
            prev = n
    return code


def mismatches(folder: str, name: str) -> tuple[int, dict[str, list[str]]]:
    """(TCP frames compared, per field the frames where the decoder and tshark disagree)."""
    pb = _decoded(folder, name)
    rows = _tshark(folder, name)
    assert len(rows) == len(pb)
    bad: dict[str, list[str]] = {}
    ours_tcp = (pb.l4_proto == 6) & (pb.l4_off >= 0)
    n_tcp = 0

    def check(field: str, i: int, ours, theirs) -> None:
        if theirs is not None and ours != theirs:
            bad.setdefault(field, []).append(f"frame {i + 1}: ours {ours}, tshark {theirs}")

    for i, d in enumerate(rows):
        # Wireshark counts PPP_WITH_DIR's direction byte as a pseudo-header, outside frame.len
        check("wirelen", i, int(pb.wirelen[i]), int(d["frame.len"][0]) + (1 if pb.linktype[i] == 204 else 0))
        path = tcp_path(d["frame.protocols"][0])
        check("is_tcp", i, bool(ours_tcp[i]), path is not None)
        if path is None or not ours_tcp[i]:
            continue
        n_tcp += 1
        t = path.count("tcp") - 1

        def their(field: str, k: int = t, base: int = 10, d: dict = d) -> int | None:
            vals = d[field]
            return int(vals[k], base) if k < len(vals) and vals[k] else None

        check("tunnel", i, int(pb.tunnel[i]), expected_tunnel(path))
        check("sport", i, int(pb.sport[i]), their("tcp.srcport"))
        check("dport", i, int(pb.dport[i]), their("tcp.dstport"))
        check("seq", i, int(pb.tcp_seq[i]), their("tcp.seq_raw"))
        check("ack", i, int(pb.tcp_ack[i]), their("tcp.ack_raw"))
        check("flags", i, int(pb.tcp_flags[i]), (their("tcp.flags", base=16) or 0) & 0xFFF)
        check("win", i, int(pb.tcp_win[i]), their("tcp.window_size_value"))
        check("tcp_hdr_len", i, int(pb.tcp_hdr_len[i]), their("tcp.hdr_len"))
        if (their("tcp.hdr_len") or 0) >= 20:  # a data offset under 5 is malformed: tshark's tcp.len is moot
            check("tcp_payload_len", i, int(pb.tcp_payload_len[i]), their("tcp.len"))
        ips = [x for x in path if x in ("ip", "ipv6")]
        v = 4 if ips[-1] == "ip" else 6
        check("ip_version", i, int(pb.ip_version[i]), v)
        field = "ip.len" if v == 4 else "ipv6.plen"
        theirs = their(field, path.count(ips[-1]) - 1)
        # the raw field, or for a zero field the length tshark substitutes (ip/ipv6.tso_support); a jumbogram's
        # payload length stays 0 in both (its length is checked through the TCP payload length)
        if pb.ip_len_field[i] or pb.has_jumbo[i]:
            ours = int(pb.ip_len_field[i])
        else:
            ours = int(pb.ip_len[i]) - (40 if v == 6 else 0)
        check("ip_len", i, ours, theirs)
    return n_tcp, bad


@pytest.mark.parametrize("folder,name", ALL, ids=[f"{f}/{n}" for f, n in ALL])
def test_every_tcp_frame_matches_tshark(folder, name):
    lt, tunnel, least = SPEC[(folder, name)]
    pb = _decoded(folder, name)
    assert set(pb.linktype.tolist()) == {lt}
    n_tcp, bad = mismatches(folder, name)
    assert n_tcp >= least
    assert not bad, {k: (len(v), v[:4]) for k, v in bad.items()}
    if least:
        tcp = (pb.l4_proto == 6) & (pb.l4_off >= 0)
        assert (pb.tunnel[tcp] == tunnel).any()


def test_wrapped_keep_the_big_tcp_lengths():
    """The wrapped files carry the source's super-packets: jumbo and tot_len-0 lengths survive every L2 wrapper."""
    src = PacketBatch.concat([decode(rb)[0] for rb in CaptureReader(FIX / "kernel" / "mixed_185000.rcv.pcap")])
    big_src = sorted(int(x) for x in src.tcp_payload_len[src.ip_len > 65535])
    for name in ("ppp.pcap", "radiotap.pcap", "pktap.pcap", "mpls.pcap", "ipoib.pcap"):
        pb = _decoded("wrapped", name)
        big = pb.ip_len > 65535
        assert big.sum() >= 15, name
        assert set(pb.tcp_payload_len[big].tolist()) <= set(big_src), name


def test_first_fragments_carry_tcp_and_later_ones_do_not(tmp_path):
    """An IPv4 first fragment holding a whole TCP header is decoded to TCP (status keeps ip_fragment), a later
    fragment is not; tshark with reassembly off agrees frame by frame."""
    payload = bytes(range(256)) * 4
    seg = tcp(seq=7000, flags=0x18) + payload  # 20 + 1024 bytes, cut into fragments of 512 + 512 + 20
    frames = []
    for off, chunk, more in ((0, seg[:512], True), (512, seg[512:1024], True), (1024, seg[1024:], False)):
        h = bytearray(ipv4(len(chunk), df=False))
        struct.pack_into(">H", h, 6, (0x2000 if more else 0) | (off // 8))
        frames.append(eth(0x0800) + bytes(h) + chunk)
    path = write_pcap(tmp_path / "frag.pcap", frames)
    pb = PacketBatch.concat([decode(rb)[0] for rb in CaptureReader(path)])
    rows = tshark_fields(path, ["frame.protocols", "tcp.srcport", "tcp.seq_raw", "tcp.len", "tcp.flags"],
                         prefs=PREFS)
    assert [("tcp" in r["frame.protocols"].split(":")) for r in rows] == [True, False, False]
    assert (pb.status & ST_IP_FRAGMENT != 0).all()
    assert pb.l4_off[0] == 34 and pb.l4_proto[0] == 6 and (pb.l4_off[1:] == -1).all()
    assert pb.sport[0] == int(rows[0]["tcp.srcport"]) and pb.tcp_seq[0] == int(rows[0]["tcp.seq_raw"])
    assert rows[0]["tcp.len"] == ""  # tshark does not know a fragment's TCP length; it is what the fragment holds
    assert pb.tcp_payload_len[0] == 512 - 20
    assert pb.tcp_flags[0] == int(rows[0]["tcp.flags"], 16)


def test_a_first_fragment_of_a_mirror_copy_carries_its_inner_tcp(tmp_path):
    """A GRE (transparent Ethernet bridging) copy of a 1514-byte frame, fragmented on its way as Zeek's erspan.pcap
    shows: the first fragment holds the inner Ethernet, IPv4 and TCP headers and is decoded to them, at the inner
    headers' true lengths (tshark gives the same once it reassembles the datagram; with reassembly off, what the
    fragment holds: once ours too, so every full-size segment of a mirrored flow lost 38 bytes and left a
    sequence hole); the last fragment carries none. Three such segments in a row: the flow has no capture gap."""
    frames = []
    for k in range(3):
        inner = eth(0x0800) + ipv4(20 + 1460) + tcp(seq=4242 + 1460 * k, flags=0x10) + bytes(1460)  # 1514 bytes
        gre = struct.pack(">HH", 0, 0x6558) + inner
        for off, chunk, more in ((0, gre[:1480], True), (1480, gre[1480:], False)):
            h = bytearray(ipv4(len(chunk), proto=47, df=False, ident=100 + k))
            struct.pack_into(">H", h, 6, (0x2000 if more else 0) | (off // 8))
            frames.append(eth(0x0800) + bytes(h) + chunk)
    path = write_pcap(tmp_path / "gre_frag.pcap", frames)
    pb = PacketBatch.concat([decode(rb)[0] for rb in CaptureReader(path)])
    rows = tshark_fields(path, ["frame.protocols", "tcp.srcport", "tcp.seq_raw", "tcp.len", "ip.len"], prefs=PREFS)
    assert [("tcp" in r["frame.protocols"].split(":")) for r in rows] == [True, False] * 3
    whole = tshark_fields(path, ["tcp.seq_raw", "tcp.len"], display_filter="tcp",
                          prefs=PREFS[:4])  # reassembled (the default), in the last fragments
    assert [int(r["tcp.seq_raw"]) for r in whole] == pb.tcp_seq[::2].tolist() == [4242, 5702, 7162]
    assert [int(r["tcp.len"]) for r in whole] == pb.tcp_payload_len[::2].tolist() == [1460] * 3
    assert (pb.tunnel[::2] == TUNNEL_GRE).all() and (pb.l4_proto[::2] == 6).all() and (pb.l4_off[1::2] == -1).all()
    assert (pb.status[::2] & ST_IP_FRAGMENT).all()
    assert pb.sport[0] == int(rows[0]["tcp.srcport"]) and pb.tcp_seq[0] == int(rows[0]["tcp.seq_raw"]) == 4242
    assert pb.ip_len[0] == pb.ip_len_field[0] == 1500
    import bigtcp_pcap

    a = bigtcp_pcap.analyze(path, audit=False)
    assert not {"ipv4.len_exceeds_frame", "frame.truncated.l4"} & set(a.findings.code)
    assert a.flows.payload_bytes.tolist() == [3 * 1460] and a.flows.capture_gap_bytes.tolist() == [0]


def test_reserved_flag_bits_are_kept(tmp_path):
    """The 12-bit flag word: reserved bits and AE as tshark shows them in tcp.flags."""
    frames = [eth(0x0800) + ipv4(20) + tcp(flags=0x10) for _ in range(4)]
    for k, hi in enumerate((0x0, 0x1, 0x2, 0xE)):
        b = bytearray(frames[k])
        b[14 + 20 + 12] = 0x50 | hi
        frames[k] = bytes(b)
    path = write_pcap(tmp_path / "flags.pcap", frames)
    pb = PacketBatch.concat([decode(rb)[0] for rb in CaptureReader(path)])
    rows = tshark_fields(path, ["tcp.flags"], prefs=PREFS)
    assert [int(r["tcp.flags"], 16) for r in rows] == pb.tcp_flags.tolist() == [0x010, 0x110, 0x210, 0xE10]


def test_length_never_exceeds_the_wire():
    """tcpdump's kday4.pcap frame 10: a 66-byte frame whose IPv4 header claims 820 bytes."""
    pb = _decoded("field", "kday4.pcap")
    i = 9
    assert pb.wirelen[i] == 66 and pb.ip_len_field[i] == 820
    assert pb.ip_len[i] == 66 - 14
    assert pb.tcp_payload_len[i] == 0
    over = pb.ip_len.astype(int) > pb.wirelen.astype(int) - pb.l3_off.astype(int)
    assert not over[pb.l3_off >= 0].any()


def test_vxlan_in_first_fragments_has_its_inner_tcp_at_its_true_length():
    """VXLAN over an underlay that fragments it (kernel/encap/vxlan_frag.pcap, made by the kernel: a VXLAN device
    at MTU 1500 over a 1500 veth): each full-size inner frame leaves as an outer IPv4 first fragment and a second
    one. The first fragment's tunnel and inner TCP are decoded (they were not: a UDP tunnel was followed only in
    unfragmented packets, and its UDP length, the whole datagram's, was reported as wrong). The UDP length bounds
    the datagram, so the inner lengths are the inner headers' (tshark, reassembly off, gives what the fragment
    holds: 50 bytes less), and the flow's bytes have no sequence gap. Every other field, and every other frame,
    as tshark has it."""
    name = ("kernel/encap", "vxlan_frag.pcap")
    pb = _decoded(*name)
    first = [i for i, r in enumerate(_tshark(*name)) if r["frame.protocols"] and "vxlan" in r["frame.protocols"][0]
             and pb.status[i] & ST_IP_FRAGMENT]
    assert len(first) >= 8
    n_tcp, bad = mismatches(*name)
    assert n_tcp > 60
    assert set(bad) <= {"tcp_payload_len"}, {k: v[:4] for k, v in bad.items()}
    # exactly the frames of inner IPv4 (behind inner IPv6 tshark gives no TCP length for a fragment)
    inner = tshark_fields(_path(*name), ["ip.len", "ip.hdr_len", "ipv6.plen", "tcp.hdr_len", "tcp.len"],
                          prefs=PREFS)
    for i in first:
        r = inner[i]
        assert pb.tunnel[i] == TUNNEL_VXLAN and pb.l4_proto[i] == 6
        if r["ipv6.plen"]:  # inner IPv6
            want = int(r["ipv6.plen"].split(",")[-1]) - int(r["tcp.hdr_len"])
        else:
            want = int(r["ip.len"].split(",")[-1]) - int(r["ip.hdr_len"].split(",")[-1]) - int(r["tcp.hdr_len"])
        assert int(pb.tcp_payload_len[i]) == want and (not r["tcp.len"] or want > int(r["tcp.len"]))
    v4 = [i for i in first if not inner[i]["ipv6.plen"]]
    assert v4 and [f"frame {i + 1}" for i in v4] == [x.split(":")[0] for x in bad.get("tcp_payload_len", [])]
    # no finding from the fragments, and each data direction's bytes run without a gap
    import bigtcp_pcap

    a = bigtcp_pcap.analyze(_path(*name), audit=False)
    assert not {"udp.bad_length", "ipv4.len_exceeds_frame"} & set(a.findings.code)
    data = a.flows[a.flows.payload_bytes > 10_000]
    assert len(data) >= 1 and (data.capture_gap_bytes == 0).all()


def test_a_length_of_zero_behind_a_first_fragment_is_bounded_by_the_fragment(tmp_path):
    """Behind GRE in a first fragment the inner lengths are the inner headers' (above), but an inner IPv4 total
    length of 0 (presumed GSO, from the frame) has only the fragment to go by: not the largest datagram's 64 KiB
    of made-up bytes. tshark (TSO guessing on, reassembly off) gives the same TCP length."""
    inner = bytearray(eth(0x0800) + ipv4(20 + 1460) + tcp(seq=4242, flags=0x10) + bytes(1460))
    inner[14 + 2:14 + 4] = b"\x00\x00"  # IPv4 total length 0
    gre = struct.pack(">HH", 0, 0x6558) + bytes(inner)
    h = bytearray(ipv4(1480, proto=47, df=False))
    struct.pack_into(">H", h, 6, 0x2000)  # MF, offset 0
    path = write_pcap(tmp_path / "gre_len0.pcap", [eth(0x0800) + bytes(h) + gre[:1480]])
    pb = PacketBatch.concat([decode(rb)[0] for rb in CaptureReader(path)])
    rows = tshark_fields(path, ["tcp.len"], prefs=PREFS)
    assert pb.tunnel[0] == TUNNEL_GRE and pb.l4_proto[0] == 6
    assert int(pb.tcp_payload_len[0]) == int(rows[0]["tcp.len"]) == 1480 - 4 - 14 - 20 - 20
