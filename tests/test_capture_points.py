"""Capture points (flows/points.py): a capture that shows the same packets at two places keeps them apart.

The fixtures are kernel captures of ``tcpdump -i any`` on a host that forwards IPv6 BIG TCP (and IPv4) between
two veths, bridging or routing (tests/fixtures/kernel/any/make_any.sh): every forwarded segment is recorded on
its way in and again on its way out, each copy under its interface's ifindex (Linux cooked v2). Counted as one
flow, the second copy of every segment was a retransmission. The oracles: tshark's own counts on the frames of
one interface (``sll.ifindex``), and each interface's frames analysed alone, which must give the same flows and
the same rebuilt super-packets as that point's rows of the whole capture.
"""

from __future__ import annotations

import collections
import shutil
import subprocess

import pandas as pd
import pyarrow.parquet as pq
import pytest
from oracle import KERNEL, need_tshark, tshark_fields

from bigtcp_pcap.api import analyze

ANY = KERNEL / "any"
CAPTURES = ["bridge_v6.pcap", "router_v46.pcap"]
FLAGS = ("tcp.analysis.retransmission", "tcp.analysis.fast_retransmission", "tcp.analysis.spurious_retransmission",
         "tcp.analysis.out_of_order")


def _part(cap, ifindex: int, dest):
    """The frames of one interface (tshark's display filter on the cooked v2 header), as a pcap."""
    subprocess.run([need_tshark(), "-r", str(cap), "-Y", f"sll.ifindex=={ifindex}", "-w", str(dest)], check=True,
                   capture_output=True, timeout=120)
    return dest


def _tshark_flows(path) -> dict[tuple, list[int]]:
    """Per (src, sport, dst, dport): [packets, payload bytes, segments tshark flags as resent or out of order].
    ICMP errors quote a TCP header (tshark then shows its ports): they are not the flow's packets."""
    out: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    rows = tshark_fields(path, ["ip.src", "ipv6.src", "tcp.srcport", "ip.dst", "ipv6.dst", "tcp.dstport", "tcp.len",
                                *FLAGS], display_filter="tcp && !icmp && !icmpv6")
    for r in rows:
        k = (r["ip.src"] or r["ipv6.src"], int(r["tcp.srcport"]), r["ip.dst"] or r["ipv6.dst"], int(r["tcp.dstport"]))
        f = out[k]
        f[0] += 1
        f[1] += int(r["tcp.len"])
        f[2] += any(r[x] for x in FLAGS)
    return dict(out)


def _ours(flows: pd.DataFrame) -> dict[tuple, list[int]]:
    return {(r.src, int(r.sport), r.dst, int(r.dport)): [int(r.packets), int(r.payload_bytes),
                                                         int(r.retransmissions) + int(r.out_of_order)]
            for r in flows.itertuples()}


@pytest.mark.parametrize("name", CAPTURES)
def test_flows_per_interface_match_tshark_on_that_interface(tmp_path, name):
    cap = ANY / name
    res = analyze(cap, outdir=tmp_path / "out", audit=False, gro_max_size=185000)
    flows = res.flows
    points = sorted(int(x) for x in flows.ifindex.unique())
    assert len(points) == 2 and (flows.if_id == 0).all()
    assert [p["ifindex"] for p in res.summary["capture_points"]] == points
    for x in points:
        want = _tshark_flows(_part(cap, x, tmp_path / f"if{x}.pcap"))
        assert _ours(flows[flows.ifindex == x]) == want, x
    # not vacuous: the same connections at both points, with BIG TCP payload, and tshark reading the whole file
    # flags each copy as resent (it does not tell the interfaces apart), which we must not
    conns = collections.Counter((r.src, r.sport, r.dst, r.dport) for r in flows.itertuples())
    assert sum(1 for v in conns.values() if v == 2) >= 4
    assert flows.bigtcp_packets.sum() > 0
    whole = _tshark_flows(cap)
    assert sum(v[2] for v in whole.values()) > flows.retransmissions.sum() + flows.out_of_order.sum() + 30


def _rows(sp: pd.DataFrame) -> collections.Counter:
    """Super-packet rows as a multiset, all columns but the flow ids and frame numbers."""
    cols = [c for c in sp.columns if c not in ("flow_id", "first_frame", "last_frame")]
    return collections.Counter(map(tuple, sp[cols].astype(str).values.tolist()))


@pytest.mark.parametrize("name", CAPTURES)
def test_each_interface_alone_gives_that_points_rows(tmp_path, name):
    """Flows and super-packets (GRO per receiving interface, ACK evidence per point) of one interface's frames
    analysed alone equal that point's rows of the whole capture, all but the ids and frame numbers."""
    cap = ANY / name
    whole = analyze(cap, outdir=tmp_path / "w", audit=False, gro_max_size=185000)
    fl, sp = whole.flows, whole.superpackets
    for x in sorted(int(v) for v in fl.ifindex.unique()):
        alone = analyze(_part(cap, x, tmp_path / f"if{x}.pcap"), outdir=tmp_path / f"o{x}", audit=False,
                        gro_max_size=185000)
        cols = [c for c in alone.flows.columns if c not in ("flow_id", "first_frame")]
        assert fl[fl.ifindex == x][cols].reset_index(drop=True).equals(alone.flows[cols].reset_index(drop=True))
        mine = sp[sp.flow_id.isin(set(fl[fl.ifindex == x].flow_id))]
        assert len(mine) > 20 and _rows(mine) == _rows(alone.superpackets), x
    # one receiver per receiving interface of the capturing host
    assert {"capturing host ifindex 2", "capturing host ifindex 3"} <= set(sp.receiver.astype(str))


def test_pcapng_interfaces_are_capture_points(tmp_path):
    """A pcapng merged from a sender's and a receiver's capture of the same transfer holds every segment twice,
    under two interfaces (`-I none`: mergecap would otherwise make them one): each interface's flows equal those of its file analysed alone."""
    if shutil.which("mergecap") is None:
        pytest.fail("mergecap (Wireshark) is not installed (the README's test command installs it)")
    snd, rcv = KERNEL / "v6_185000.snd.pcap", KERNEL / "v6_185000.rcv.pcap"
    both = tmp_path / "both.pcapng"
    subprocess.run(["mergecap", "-F", "pcapng", "-I", "none", "-w", str(both), str(snd), str(rcv)], check=True,
                   capture_output=True)
    got = analyze(both, outdir=tmp_path / "both", audit=False)
    assert sorted(got.flows.if_id.unique()) == [0, 1] and got.flows.ifindex.isna().all()
    for if_id, part in ((0, snd), (1, rcv)):  # mergecap numbers the interfaces in the order of its inputs
        alone = analyze(part, outdir=tmp_path / f"alone{if_id}", audit=False).flows
        cols = ["src", "dst", "sport", "dport", "packets", "payload_bytes", "bigtcp_packets", "retransmissions",
                "out_of_order", "capture_gap_bytes", "max_payload_len"]
        mine = got.flows[got.flows.if_id == if_id][cols].reset_index(drop=True)
        assert len(mine) >= 2 and mine.equals(alone[cols].reset_index(drop=True)), if_id
    assert pq.read_schema(tmp_path / "both" / "flows.parquet").field("ifindex").nullable


def test_pcapng_sections_are_capture_points(tmp_path):
    """A pcapng of two sections (``cat`` of two pcapng files, each with its interface 0) holds two captures: the
    interfaces are numbered across sections (``if_gid``), so each section's flows equal those of its file
    analysed alone. packets.parquet ``if_id`` stays the section's own number, as tshark's frame.interface_id."""
    if shutil.which("editcap") is None:
        pytest.fail("editcap (Wireshark) is not installed (the README's test command installs it)")
    parts = []
    for name in ("v6_185000.snd", "v6_185000.rcv"):
        p = tmp_path / f"{name}.pcapng"
        subprocess.run(["editcap", "-F", "pcapng", str(KERNEL / f"{name}.pcap"), str(p)], check=True,
                       capture_output=True)
        parts.append(p)
    both = tmp_path / "sections.pcapng"
    both.write_bytes(b"".join(p.read_bytes() for p in parts))
    got = analyze(both, outdir=tmp_path / "both", audit=False, packets=True)
    assert sorted(got.flows.if_id.unique()) == [0, 1]
    cols = ["src", "dst", "sport", "dport", "packets", "payload_bytes", "retransmissions", "out_of_order",
            "capture_gap_bytes", "superpackets", "max_superpacket_len"]
    for if_gid, part in enumerate(parts):
        alone = analyze(part, outdir=tmp_path / f"alone{if_gid}", audit=False).flows
        mine = got.flows[got.flows.if_id == if_gid][cols].reset_index(drop=True)
        assert len(mine) >= 2 and mine.equals(alone[cols].reset_index(drop=True)), if_gid
    want = [int(r["frame.interface_id"]) for r in tshark_fields(both, ["frame.interface_id"])]
    assert got.packets.if_id.tolist() == want


def test_cooked_v1_copies_are_told_apart_by_direction(tmp_path):
    """Linux cooked v1 (``dumpcap -i any``'s default, ``tcpdump -y LINUX_SLL``) names no interface, but its packet
    type says whether the capturing host received or sent the frame: a bridged packet is received on one port and
    sent on the other. Each direction's flows equal tshark's counts on those frames (``sll.pkttype``), and equal
    the cooked v2 capture's per-interface rows of the same setup in shape (no copy counted as a resend)."""
    cap = ANY / "bridge_v6_sll1.pcap"
    res = analyze(cap, outdir=tmp_path / "out", audit=False, gro_max_size=185000)
    flows = res.flows
    assert flows.ifindex.isna().all() and sorted(flows.direction.unique()) == [1, 2]
    for d, filt in ((1, "sll.pkttype != 4"), (2, "sll.pkttype == 4")):
        part = tmp_path / f"d{d}.pcap"
        subprocess.run([need_tshark(), "-r", str(cap), "-Y", filt, "-w", str(part)], check=True, capture_output=True)
        assert _ours(flows[flows.direction == d]) == _tshark_flows(part), d
    conns = collections.Counter((r.src, r.sport, r.dst, r.dport) for r in flows.itertuples())
    assert sum(1 for v in conns.values() if v == 2) >= 4 and flows.bigtcp_packets.sum() > 0
    assert flows.retransmissions.sum() == 0 and flows.out_of_order.sum() == 0
    assert sum(v[2] for v in _tshark_flows(cap).values()) > 30  # tshark on the whole file flags the copies


def _as_cooked_v1(src, eth_dest, dest, sender_mac: bytes, ethertype: int):
    """The Ethernet records of a pcap of one ``ethertype`` (into ``eth_dest``), and the same as Linux cooked v1
    ones (into ``dest``), as the sender's ``tcpdump -i any`` would have written them: frames from ``sender_mac``
    sent (packet type 4), the others received (0); timestamps and lengths kept."""
    import struct

    data = src.read_bytes()
    eth, out = [data[:24]], [data[:20] + struct.pack("<I", 113)]
    pos = 24
    while pos < len(data):
        sec, frac, cap, wire = struct.unpack_from("<IIII", data, pos)
        frame = data[pos + 16:pos + 16 + cap]
        pos += 16 + cap
        if int.from_bytes(frame[12:14], "big") != ethertype:
            continue
        eth.append(data[pos - 16 - cap:pos])
        pkttype = 4 if frame[6:12] == sender_mac else 0
        sll = struct.pack("!HHH8sH", pkttype, 1, 6, frame[6:12] + b"\0\0", ethertype)
        rec = sll + frame[14:]
        out.append(struct.pack("<IIII", sec, frac, len(rec), wire + 2) + rec)
    eth_dest.write_bytes(b"".join(eth))
    dest.write_bytes(b"".join(out))
    return eth_dest, dest


def test_ack_evidence_pairs_the_reverse_direction_where_it_was_seen(tmp_path):
    """The receiver's ACKs are evidence for the data they answer at the same point: a frame the host sent is
    answered by one it received (the reverse direction's point has the other direction). A kernel sender capture
    (both directions, pre-GRO segments) rewritten as the sender's cooked v1 capture gives the super-packets of
    the Ethernet original, their ACK-evidenced poll ends included."""
    src = KERNEL / "lost" / "mixed_185000.snd.pcap"
    mac = src.read_bytes()[24 + 16 + 6:24 + 16 + 12]  # the first frame's source: the sender opens the connection
    # its IPv6 flow alone (the IPv4 one goes to the same receiving host: one NAPI model by MAC, two by address)
    eth, v1 = _as_cooked_v1(src, tmp_path / "eth.pcap", tmp_path / "v1.pcap", mac, 0x86DD)
    base = analyze(eth, outdir=tmp_path / "eth", audit=False, gro_max_size=185000)
    big = base.flows.sort_values("payload_bytes").iloc[-1]
    cooked = analyze(v1, outdir=tmp_path / "v1", audit=False, gro_max_size=185000)
    assert sorted(cooked.flows.direction.unique()) == [1, 2]
    sent = cooked.flows[cooked.flows.direction == 2]
    assert int(sent.payload_bytes.max()) == int(big.payload_bytes)
    cols = ["sport", "dport", "seq_first", "payload_len", "n_segments", "flush_reason", "poll_end"]
    a, b = base.superpackets[cols].astype(str), cooked.superpackets[cols].astype(str)
    assert (a.poll_end == "ack").sum() > 20
    assert collections.Counter(map(tuple, a.values.tolist())) == collections.Counter(map(tuple, b.values.tolist()))


def test_egress_summary_names_each_point(tmp_path):
    """The egress model's per-flow summary keeps the two copies of a bridged flow apart and says where each is
    (they were two rows with the same name); each copy's bytes equal tshark's on its interface."""
    from bigtcp_pcap.gso.api import egress

    cap = ANY / "bridge_v6.pcap"
    rows = egress(cap, outdir=tmp_path / "eg", gso_max_size=65536).summary["flows"]
    big = [r for r in rows if r["payload_in"] > 1_000_000]
    assert sorted((r["ifindex"], r["direction"]) for r in big) == [(2, 1), (3, 2)]
    for r in big:
        want = _tshark_flows(_part(cap, r["ifindex"], tmp_path / f"if{r['ifindex']}.pcap"))
        assert r["payload_in"] == want[(r["src"], r["sport"], r["dst"], r["dport"])][1]


def test_flow_name_reads_rows_with_missing_points(tmp_path):
    """Flow names from ``Analysis.flows`` rows (pandas nullable integers: ``<NA>`` where no ifindex or direction
    is known) and from plain Parquet reads (NaN) both leave the point out; a row with one names it."""
    from bigtcp_pcap.output.summary import flow_name

    res = analyze(KERNEL / "v6_185000.rcv.pcap", outdir=tmp_path / "o", audit=False)
    row = next(res.flows.itertuples())
    assert flow_name(row) == f"{row.src}.{row.sport} > {row.dst}.{row.dport}"
    plain = next(pd.read_parquet(tmp_path / "o" / "flows.parquet").itertuples())
    assert flow_name(plain) == f"{plain.src}.{plain.sport} > {plain.dst}.{plain.dport}"
    both = analyze(ANY / "bridge_v6.pcap", outdir=tmp_path / "b", audit=False).flows
    r = next(both[both.ifindex == 3].itertuples())
    assert flow_name(r).endswith(f" @ifindex 3 ({'received' if r.direction == 1 else 'sent'})")


@pytest.mark.parametrize("name", CAPTURES)
def test_every_received_byte_is_in_its_interfaces_superpackets(tmp_path, name):
    """Data captured on its way in (Linux packet type host/broadcast/multicast/other host) reached that interface's
    NAPI, whatever the far end's SACKs later say of it: each "capturing host ifindex N" receiver's super-packets
    hold exactly the TCP payload tshark counts on the frames received on ifindex N. (On the router the far end's
    SACKs showed a hole where the router had refused a forwarded BIG TCP super-packet with an ICMPv6 Packet Too
    Big, and the received copy was once left out as lost on the way.) The frames sent on an interface go to the
    receivers named by their destination, and hold all of its sent payload."""
    cap = ANY / name
    rows = tshark_fields(cap, ["sll.ifindex", "sll.pkttype", "tcp.len"],
                         display_filter="tcp.len > 0 && !icmp && !icmpv6")
    received: collections.Counter = collections.Counter()
    sent = 0
    for r in rows:
        if int(r["sll.pkttype"]) == 4:
            sent += int(r["tcp.len"])
        else:
            received[int(r["sll.ifindex"])] += int(r["tcp.len"])
    sp = analyze(cap, outdir=tmp_path / "o").superpackets
    by_rx = sp.groupby(sp["receiver"].astype(str))["payload_len"].sum()
    mine = {int(k.rsplit(" ", 1)[1]): int(v) for k, v in by_rx.items() if k.startswith("capturing host ifindex ")}
    assert mine == dict(received)
    assert int(by_rx[[not k.startswith("capturing host") for k in by_rx.index]].sum()) == sent
