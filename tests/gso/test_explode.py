"""``explode``: super-packets (a0's TX GSO skbs, receivers' GRO output) -> wire-sized packets.

Oracles: real tshark (no malformed packets, no expert errors), ``analyze`` (same payload bytes per flow), and the
Linux kernel itself: on the TSO-off pairs b1 shows the kernel's own software segmentation of a0's skbs, and the
exploded a0 must carry the same headers, byte for byte (TCP checksum aside: b1's is CHECKSUM_PARTIAL).
"""

from __future__ import annotations

import collections
import os
import random
import subprocess
import sys
from pathlib import Path

import craft as C
import pytest
from oracle import KERNEL, need_tshark, tshark_fields, write_pcap

import bigtcp_pcap
from bigtcp_pcap.capture.reader import CaptureReader

EGRESS_DIR = KERNEL / "egress"
INPUTS = {
    "a0_v6": EGRESS_DIR / "v6_gso65536.a0.pcap.xz",  # TX GSO, IPv6 HBH jumbo up to 184306 bytes
    "a0_v4": EGRESS_DIR / "v4_segs24.a0.pcap.xz",  # TX GSO, IPv4 tot_len 0
    "a0_qinq": EGRESS_DIR / "v6_qinq_g3.a0.pcap.xz",  # TX GSO under 802.1ad + 802.1Q tags
    "rcv_v6": KERNEL / "v6_185000.rcv.pcap",  # RX GRO super-packets, IPv6 HBH
    "rcv_v4": KERNEL / "v4_185000.rcv.pcap",  # RX GRO super-packets, IPv4 tot_len 0
    "rcv_mixed": KERNEL / "mixed_185000.rcv.pcap",
}


def expert_problems(path: Path) -> list[dict[str, str]]:
    """Frames tshark (default preferences: no TSO/BIG TCP guessing) marks malformed or with an expert error or
    warning about lengths."""
    rows = tshark_fields(path, ["frame.number", "_ws.expert.message", "_ws.expert.severity"],
                         display_filter="_ws.malformed or _ws.expert.severity >= 0x00600000", prefs=[])
    return [r for r in rows if r["_ws.expert.message"] and "length" in r["_ws.expert.message"].lower()
            or "Malformed" in r["_ws.expert.message"]]


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("key", sorted(INPUTS))
def test_tshark_dissects_exploded_output_cleanly(tmp_path, key, fmt):
    need_tshark()
    out = tmp_path / f"x.{fmt}"
    res = bigtcp_pcap.explode(INPUTS[key], out)
    assert res.error is None and res.summary["super_packets"] > 0
    assert expert_problems(out) == []
    # and tshark reads every IP length field as the frame's true length
    for r in tshark_fields(out, ["frame.len", "ip.len", "ipv6.plen", "ipv6.nxt", "vlan.id",
                                         "ieee8021ad.id"], prefs=[]):
        l2 = 14 + 4 * len([v for v in (r["vlan.id"] + "," + r["ieee8021ad.id"]).split(",") if v])
        if r["ip.len"]:
            assert int(r["frame.len"]) == l2 + int(r["ip.len"]), r
        elif r["ipv6.plen"]:
            assert int(r["frame.len"]) == l2 + 40 + int(r["ipv6.plen"]), r
            assert r["ipv6.nxt"] != "0" or int(r["frame.len"]) <= 1514, r  # HBH jumbo only on unexploded frames


@pytest.mark.parametrize("key", sorted(INPUTS))
def test_analyze_counts_the_same_bytes(tmp_path, key):
    out = tmp_path / "x.pcap"
    bigtcp_pcap.explode(INPUTS[key], out)
    cols = ["src", "dst", "sport", "dport", "payload_bytes"]
    a = bigtcp_pcap.analyze(INPUTS[key], audit=False).flows[cols]
    b = bigtcp_pcap.analyze(out, audit=False).flows[cols]
    assert a.sort_values(cols).values.tolist() == b.sort_values(cols).values.tolist()
    assert a.payload_bytes.sum() > 500_000


def _tcp_headers(path: Path) -> collections.Counter:
    """(frame bytes up to the end of the TCP header with the TCP checksum zeroed, original length) of TCP frames."""
    out: collections.Counter = collections.Counter()
    for rb in CaptureReader(path):
        for i in range(len(rb)):
            d = rb.packet(i)
            v6 = d[12:14] == b"\x86\xdd"
            l4 = 54 if v6 else 14 + (d[14] & 15) * 4
            if (d[20] if v6 else d[23]) != 6:
                continue
            h = bytearray(d[: l4 + (d[l4 + 12] >> 4) * 4])
            h[l4 + 16: l4 + 18] = b"\0\0"
            out[(bytes(h), int(rb.wirelen[i]))] += 1
    return out


@pytest.mark.parametrize("name", ["v6_tso_off", "v4_tso_off"])
def test_headers_equal_the_kernels_software_segmentation(tmp_path, name):
    """b1 with TSO off transmitted the kernel's skb_segment() output of a0's skbs: IPv6 without the HBH and with
    its payload length, IPv4 tot_len, incremented IDs and header checksum, seq, PSH on the last segment."""
    out = tmp_path / "x.pcap"
    bigtcp_pcap.explode(EGRESS_DIR / f"{name}.a0.pcap.xz", out)
    got, want = _tcp_headers(out), _tcp_headers(EGRESS_DIR / f"{name}.b1.pcap.xz")
    assert sum(want.values()) > 700 and got == want


def test_other_frames_pass_unchanged_and_snaplen_is_kept(tmp_path):
    src = KERNEL / "v6_185000.rcv.pcap"
    out = tmp_path / "x.pcap"
    bigtcp_pcap.explode(src, out)
    cin = [(rb.packet(i), int(rb.wirelen[i]), int(rb.ts_ns[i])) for rb in CaptureReader(src) for i in range(len(rb))]
    cout = [(rb.packet(i), int(rb.wirelen[i]), int(rb.ts_ns[i])) for rb in CaptureReader(out) for i in range(len(rb))]
    snap = int.from_bytes(src.read_bytes()[16:20], "little")
    assert int.from_bytes(out.read_bytes()[16:20], "little") == snap
    assert max(len(d) for d, _, _ in cout) <= snap
    small = [r for r in cin if r[1] <= 1514]
    assert collections.Counter(small) <= collections.Counter(cout)  # every non-super-packet, byte for byte
    ts = [t for _, _, t in cout]
    assert ts == sorted(ts)  # segments spread without reordering the capture
    assert len(cout) > len(cin)


def test_checksums_of_whole_segments_verify(tmp_path):
    """With the payload captured, each segment's TCP checksum (and IPv4 header checksum) is recomputed: tshark's
    own checksum validation says good for every segment."""
    need_tshark()
    rnd = random.Random(7)
    payload = bytes(rnd.randrange(256) for _ in range(10_000))
    th = C.tcp(seq=4000, flags=0x18, options=bytes([1, 1, 8, 10]) + os.urandom(8))
    v6 = C.eth(0x86DD) + C.ipv6(0, 0) + C.hbh(6, C.jumbo_opt(8 + len(th) + len(payload))) + th + payload
    v4 = C.eth(0x0800) + C.ipv4(len(th) + len(payload), ident=500) + th + payload
    cap = write_pcap(tmp_path / "big.pcap", [v6, v4])
    out = tmp_path / "x.pcap"
    res = bigtcp_pcap.explode(cap, out, mss=1448)
    assert res.summary["segments_out"] == 2 * 7
    rows = tshark_fields(out, ["tcp.len", "tcp.checksum.status", "ip.checksum.status", "tcp.flags.push"],
                         prefs=["-o", "tcp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE"])
    assert [r["tcp.len"] for r in rows] == (["1448"] * 6 + ["1312"]) * 2
    assert {r["tcp.checksum.status"] for r in rows} == {"1"}  # 1 = good
    assert {r["ip.checksum.status"] for r in rows[7:]} == {"1"}
    assert [r["tcp.flags.push"] for r in rows[:7]] == ["0"] * 6 + ["1"]


def test_explode_cli(tmp_path):
    out = tmp_path / "x.pcapng"
    r = subprocess.run([sys.executable, "-m", "bigtcp_pcap.cli", "explode", str(INPUTS["a0_v6"]), str(out), "--json"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert '"format": "pcapng"' in r.stdout and out.read_bytes()[:4] == b"\x0a\x0d\x0d\x0a"
    r = subprocess.run([sys.executable, "-m", "bigtcp_pcap.cli", "explode", str(tmp_path / "none.pcap"), str(out)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1


def _payload_by_port(path: Path) -> collections.Counter:
    """TCP payload bytes per (sport, dport) as tshark reads them (BIG TCP preferences on), and frames."""
    out: collections.Counter = collections.Counter()
    for r in tshark_fields(path, ["tcp.srcport", "tcp.dstport", "tcp.len"], "tcp"):
        out[r["tcp.srcport"], r["tcp.dstport"]] += int(r["tcp.len"].split(",")[-1] or 0)
    return out


def test_tunnelled_super_packets_are_copied_once(tmp_path):
    # a kernel VXLAN receiver: GRO super-packets inside the tunnel; explode cannot rewrite inner headers, so each
    # is copied unchanged, once (each was written as many times as it had segments: 150 frames -> 695)
    src = KERNEL / "linktypes" / "vxlan.rcv.pcap"
    out = tmp_path / "x.pcap"
    res = bigtcp_pcap.explode(src, out)
    assert res.summary["frames_out"] == res.summary["frames_in"] == len(tshark_fields(src, ["frame.number"]))
    cin = [(rb.packet(i), int(rb.wirelen[i])) for rb in CaptureReader(src) for i in range(len(rb))]
    cout = [(rb.packet(i), int(rb.wirelen[i])) for rb in CaptureReader(out) for i in range(len(rb))]
    assert cout == cin and _payload_by_port(out) == _payload_by_port(src)


def test_a_longer_hop_by_hop_header_is_copied_unchanged(tmp_path):
    # the kernel removes only an 8-byte HBH holding just the jumbo option: one padded to 16 bytes stays, so the
    # frame cannot be cut by removing 8 bytes (the PadN bytes were read as the TCP header)
    payload = bytes(9000)
    th = C.tcp(seq=1, flags=0x18)
    opts = C.jumbo_opt(16 + len(th) + len(payload)) + bytes([1, 6]) + bytes(6)
    big = C.eth(0x86DD) + C.ipv6(0, 0) + C.hbh(6, opts) + th + payload
    assert big[14 + 41] == 1  # Hdr Ext Len 1: 16 bytes
    cap = write_pcap(tmp_path / "hbh16.pcap", [C.eth(0x86DD) + C.ipv6(20, 6) + th, big])
    out = tmp_path / "x.pcap"
    res = bigtcp_pcap.explode(cap, out, mss=1448)
    assert res.summary["frames_out"] == 2 and res.summary["super_packets"] == 0
    cin = [rb.packet(i) for rb in CaptureReader(cap) for i in range(len(rb))]
    assert [rb.packet(i) for rb in CaptureReader(out) for i in range(len(rb))] == cin
    assert _payload_by_port(out) == _payload_by_port(cap)


def test_segments_never_pass_the_next_frame_across_batches(tmp_path, monkeypatch):
    # the last super-packet of a read batch took the next frame's time from nowhere (+65 ms): its segments ran
    # past the first frame of the next batch
    import functools

    from bigtcp_pcap.gso import explode as X

    monkeypatch.setattr(X, "CaptureReader", functools.partial(CaptureReader, batch_size=7))
    src = KERNEL / "v6_185000.rcv.pcap"
    out = tmp_path / "x.pcap"
    res = X.explode(src, out)
    assert res.summary["super_packets"] > 10
    ts = [float(r["frame.time_epoch"]) for r in tshark_fields(out, ["frame.time_epoch"])]
    assert ts == sorted(ts) and len(ts) == res.summary["frames_out"]
    assert _payload_by_port(out) == _payload_by_port(src)


def test_multi_section_pcapng_keeps_each_sections_interfaces(tmp_path):
    # interface ids restart at 0 in every section: the second section's raw-IP frames went out under the first
    # section's Ethernet interface (tshark then read junk ports)
    parts = []
    for i, src in enumerate((KERNEL / "v4_65536.rcv.pcap", KERNEL / "linktypes" / "tun_raw.rcv.pcap")):
        parts.append(tmp_path / f"s{i}.pcapng")
        subprocess.run(["editcap", "-F", "pcapng", str(src), str(parts[-1])], check=True, capture_output=True)
    cat = tmp_path / "two_sections.pcapng"
    cat.write_bytes(b"".join(p.read_bytes() for p in parts))
    out = tmp_path / "x.pcapng"
    res = bigtcp_pcap.explode(cat, out)
    assert res.error is None and res.summary["super_packets"] > 0
    encaps = collections.Counter(r["frame.encap_type"] for r in tshark_fields(out, ["frame.encap_type"]))
    want = collections.Counter(r["frame.encap_type"] for r in tshark_fields(cat, ["frame.encap_type"]))
    assert set(encaps) == set(want) == {"1", "7"}  # Ethernet and raw IP
    assert _payload_by_port(out) == _payload_by_port(cat)


def test_out_may_be_a_fifo_a_symlink_or_stdout(tmp_path):
    # OUT.part renamed over OUT replaced a FIFO (its reader got nothing), a symlink, even /dev/stdout
    src = KERNEL / "v6_185000.rcv.pcap"
    ref = tmp_path / "ref.pcap"
    bigtcp_pcap.explode(src, ref)
    want = ref.read_bytes()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = tmp_path / "from_fifo.pcap"
    with open(got, "wb") as sink:
        reader = subprocess.Popen(["cat", str(fifo)], stdout=sink)
        bigtcp_pcap.explode(src, fifo)
        assert reader.wait(timeout=60) == 0
    assert got.read_bytes() == want and fifo.is_fifo()
    target, link = tmp_path / "target.pcap", tmp_path / "link.pcap"
    target.write_bytes(b"")
    link.symlink_to(target)
    bigtcp_pcap.explode(src, link)
    assert link.is_symlink() and target.read_bytes() == want
    r = subprocess.run([sys.executable, "-m", "bigtcp_pcap.cli", "explode", str(src), "-", "--json"],
                       capture_output=True, timeout=120, check=False)
    assert r.returncode == 0 and r.stdout == want and b'"frames_out"' in r.stderr  # the counts on stderr


def test_mixed_link_types_to_stdout_write_nothing_as_pcap_and_all_as_pcapng(tmp_path):
    # two link types cannot go into one pcap file: the refusal wrote the pcap header to stdout first, and stdout
    # had no way to ask for pcapng. One section, an Ethernet and a raw-IP interface, their frames interleaved
    from oracle import pcapng_epb, pcapng_idb, pcapng_shb, read_pcap_records

    eth = read_pcap_records(KERNEL / "v4_65536.rcv.pcap")[:40]
    raw = read_pcap_records(KERNEL / "linktypes" / "tun_raw.rcv.pcap")[:40]
    blocks = [pcapng_shb(), pcapng_idb(1, 0, tsresol=9), pcapng_idb(101, 0, tsresol=9)]
    t0 = 1_700_000_000 * 10**9
    for k in range(40):
        blocks += [pcapng_epb(0, t0 + 2000 * k, *eth[k]), pcapng_epb(1, t0 + 2000 * k + 1000, *raw[k])]
    cat = tmp_path / "mixed.pcapng"
    cat.write_bytes(b"".join(blocks))
    cli = [sys.executable, "-m", "bigtcp_pcap.cli", "explode", str(cat), "-"]
    r = subprocess.run(cli, capture_output=True, timeout=120, check=False)
    assert r.returncode == 2 and r.stdout == b"" and b"--pcapng" in r.stderr
    r = subprocess.run([*cli, "--pcapng"], capture_output=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "from_stdout.pcapng"
    out.write_bytes(r.stdout)
    ref = tmp_path / "ref.pcapng"
    res = bigtcp_pcap.explode(cat, ref)
    assert res.summary["super_packets"] > 0 and out.read_bytes() == ref.read_bytes()
    assert _payload_by_port(out) == _payload_by_port(cat)
