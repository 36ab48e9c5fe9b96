"""Receiver routing (gro/receivers.py) and ACK evidence (gro/evidence.py) against tshark on kernel captures.

* ``acked_ends``: a data segment is flagged exactly when tshark's ``tcp.analysis.acks_frame`` of some later
  frame names it (tshark also names SYN and FIN, which carry no payload and never end a super-packet).
* ``Receivers.assign``: on Ethernet, unicast frames get the same receiver exactly when tshark shows the same
  ``eth.dst``; on cooked captures, everything the capturing host received is one receiver and what it sent goes
  by destination address; a broadcast frame goes to the host its source last sent unicast to.
Small batches make every lookup cross batch boundaries.
"""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import numpy as np
import pytest

from bigtcp_pcap.capture.reader import CaptureReader
from bigtcp_pcap.decode.decode import decode
from bigtcp_pcap.gro import evidence
from bigtcp_pcap.gro.evidence import AckEvidence, acked_ends
from bigtcp_pcap.gro.receivers import Receivers
from tests.oracle import KERNEL, tshark_fields, write_pcap

SENDER_CAPTURES = sorted(KERNEL.glob("*.snd.pcap")) + [KERNEL / "linktypes" / "vxlan.snd.pcap",
                                                       KERNEL / "linktypes" / "qinq.snd.pcap",
                                                       KERNEL / "lost" / "mixed_185000.snd.pcap",  # SACKs
                                                       KERNEL / "late" / "mixed_185000.snd.pcap"]


def _flagged(path: Path, batch_size: int) -> tuple[set[int], dict[int, int]]:
    """(the frames AckEvidence flags, the batch index of every frame)."""
    ev, out, batch_of = AckEvidence(), set(), {}
    for k, rb in enumerate(CaptureReader(path, batch_size=batch_size)):
        batch_of.update(dict.fromkeys(rb.frame.tolist(), k))
        pb, _ = decode(rb)
        for b, _, flags, _ in ev.push(pb):
            out.update(b.frame[flags].tolist())
    for b, _, flags, _ in ev.finish():
        out.update(b.frame[flags].tolist())
    return out, batch_of


def _last(v: str) -> str:
    return v.split(",")[-1]  # the innermost header's value (tunnels)


@pytest.mark.parametrize("path", SENDER_CAPTURES, ids=lambda p: p.name)
def test_acked_ends_are_the_segments_a_later_reverse_ack_acknowledges(path):
    """The definition, computed here over the fields tshark decodes: a data segment is evidenced when a later
    packet of the reverse direction, at most ``evidence.WINDOW`` frames later, has ack = seq + len (mod 2**32),
    or a first SACK block beyond its ack number (not a D-SACK) whose right edge is seq + len.
    The flags do not depend on the batch size (they once did: the lookahead was "the next batch", and a split
    run's parts, whose batches begin elsewhere, could flag other segments than the serial run). tshark's own
    ``tcp.analysis.acks_frame`` names a subset of them (it also names SYN and FIN, which carry no payload)."""
    f = ["frame.number", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "tcp.srcport", "tcp.dstport", "tcp.len",
         "tcp.seq_raw", "tcp.ack_raw", "tcp.flags.ack", "tcp.analysis.acks_frame", "tcp.options.sack_le",
         "tcp.options.sack_re"]
    rows = tshark_fields(path, f, display_filter="tcp", prefs=["-o", "tcp.relative_sequence_numbers:FALSE"])
    pkts = []
    for r in rows:
        src, dst = _last(r["ip.src"]) or _last(r["ipv6.src"]), _last(r["ip.dst"]) or _last(r["ipv6.dst"])
        ack = int(_last(r["tcp.ack_raw"]))
        ends = [ack]
        if r["tcp.options.sack_le"]:  # the first block (RFC 2018: the data that triggered this ACK)
            le, re_ = int(r["tcp.options.sack_le"].split(",")[0]), int(r["tcp.options.sack_re"].split(",")[0])
            if 0 < (le - ack) % 2**32 < 2**31 and 0 < (re_ - ack) % 2**32 < 2**31:
                ends.append(re_)
        pkts.append((int(r["frame.number"]), (src, _last(r["tcp.srcport"])), (dst, _last(r["tcp.dstport"])),
                     int(_last(r["tcp.len"])), int(_last(r["tcp.seq_raw"])), ends,
                     _last(r["tcp.flags.ack"]) in ("1", "True")))
    named = {int(x) for r in rows for x in r["tcp.analysis.acks_frame"].split(",") if x}
    acks: dict[tuple, list[int]] = {}  # (to, from, acked end) -> frames
    for fr, a, b, _, _, ends, is_ack in pkts:
        if is_ack:
            for end in ends:
                acks.setdefault((b, a, end), []).append(fr)
    for window in (40, evidence.WINDOW):  # a window shorter than the batches, and the default
        want = {fr for fr, a, b, ln, seq, _, _ in pkts if ln > 0 and any(
            fr < j <= fr + window for j in acks.get((a, b, (seq + ln) % 2**32), ()))}
        assert len(want) > 20 or window < evidence.WINDOW  # (40 frames is too short on the two-flow slices)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(evidence, "WINDOW", window)
            for batch in (7, 300, 1 << 16):  # windows across batch boundaries, and the whole capture in one
                got, _ = _flagged(path, batch)
                assert got == want, (window, batch)
        if window == evidence.WINDOW:
            assert {x for x in named if any(p[0] == x and p[3] > 0 for p in pkts)} <= got


def test_an_ack_before_the_segment_or_in_its_own_packet_does_not_count(tmp_path):
    """Only later packets count: an old ACK with the same number (before a retransmission) says nothing."""
    from tests.craft import eth, ipv4, tcp

    def frame(sport, dport, seq, ack, payload, src=(10, 0, 0, 1), dst=(10, 0, 0, 2)):
        ip = bytearray(ipv4(20 + payload))
        ip[12:16], ip[16:20] = bytes(src), bytes(dst)
        return eth(0x0800) + bytes(ip) + tcp(sport, dport, seq, ack) + b"x" * payload

    pkts = [frame(5201, 40000, 1, 1100, 0, (10, 0, 0, 2), (10, 0, 0, 1)),  # ACK 1100, before the data
            frame(40000, 5201, 1000, 1, 100),  # ends at 1100: no later ACK
            frame(40000, 5201, 1100, 1, 100),  # ends at 1200, ACKed by the next frame
            frame(5201, 40000, 1, 1200, 0, (10, 0, 0, 2), (10, 0, 0, 1)),
            frame(40000, 5201, 1200, 1300, 100)]  # its own ack number is its own end: not evidence
    # (10 us apart: an ACK after a silence of the whole capture longer than evidence.RESET_GAP_NS is no evidence)
    path = write_pcap(tmp_path / "a.pcap", pkts, times_us=[10 * i for i in range(len(pkts))])
    pb, _ = decode(next(iter(CaptureReader(path))))
    assert acked_ends(pb).tolist() == [False, False, True, False, False]
    assert acked_ends(pb.take(np.arange(3)), pb.take(np.arange(3, 5))).tolist() == [False, False, True]


@pytest.mark.parametrize("seed", range(3))
def test_acked_ends_hold_the_definition_on_repeats_across_generations(seed, tmp_path):
    """A crafted stream the kernel captures lack: three connections, segments whose ends repeat (retransmissions,
    near and far apart), ACK numbers drawn from earlier ends and from nowhere, data in both directions. With a
    window of 40 rows the scan's generations are 64 rows, so chains of one key cross generations; the flags
    equal the definition (some later reverse packet within the window ACKs the end), counted here by brute
    force over the decoded rows, for batches of 1, 13 and the whole stream."""
    from tests.craft import eth, ipv4, tcp

    rng = np.random.default_rng(seed)
    hosts = [((10, 0, 0, 1), (10, 0, 0, 2), 40000 + c, 5201) for c in range(3)]
    ends: list[int] = [1000]
    pkts = []
    for _ in range(1500):
        src, dst, sp, dp = hosts[rng.integers(3)]
        if rng.random() < 0.5:
            src, dst, sp, dp = dst, src, dp, sp
        plen = int(rng.choice([0, 0, 100, 200]))
        seq = int(rng.choice(ends)) if rng.random() < 0.6 else int(rng.integers(0, 5000))
        ack = int(rng.choice(ends)) if rng.random() < 0.7 else int(rng.integers(0, 5000))
        if plen:
            ends.append((seq + plen) % 2**32)
            ends = ends[-30:]
        ip = bytearray(ipv4(20 + plen))
        ip[12:16], ip[16:20] = bytes(src), bytes(dst)
        pkts.append(eth(0x0800) + bytes(ip) + tcp(sp, dp, seq, ack) + b"x" * plen)
    path = write_pcap(tmp_path / "r.pcap", pkts, times_us=[10 * i for i in range(len(pkts))])
    pb, _ = decode(next(iter(CaptureReader(path, batch_size=1 << 16))))
    key = list(zip(pb.sport.tolist(), pb.dport.tolist(), pb.src[:, 12:].tolist(), pb.dst[:, 12:].tolist()))
    plen, seq, ack = pb.tcp_payload_len.tolist(), pb.tcp_seq.tolist(), pb.tcp_ack.tolist()
    window = 40
    want = [plen[i] > 0 and any(
        key[j] == (key[i][1], key[i][0], key[i][3], key[i][2]) and ack[j] == (seq[i] + plen[i]) % 2**32
        for j in range(i + 1, min(len(pb), i + window + 1))) for i in range(len(pb))]
    assert 50 < sum(want) < len(pb) // 2
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(evidence, "WINDOW", window)
        for batch in (1, 13, 1 << 16):
            got = []
            ev = AckEvidence()
            for rb in CaptureReader(path, batch_size=batch):
                got += [f for _, _, fl, _ in ev.push(decode(rb)[0]) for f in fl.tolist()]
            got += [f for _, _, fl, _ in ev.finish() for f in fl.tolist()]
            assert got == want, batch


def _receivers(path: Path, batch_size: int) -> tuple[np.ndarray, list[str]]:
    rx, out = Receivers(), []
    for rb in CaptureReader(path, batch_size=batch_size):
        pb, _ = decode(rb)
        out.append(rx.assign(rb, pb))
    return np.concatenate(out), rx.labels


def _same_partition(a: list, b: list) -> bool:
    """a and b group the same positions together (a bijection between their values)."""
    return len(set(a)) == len(set(b)) == len(set(zip(a, b, strict=True)))


@pytest.mark.parametrize("path", SENDER_CAPTURES, ids=lambda p: p.name)
def test_ethernet_receiver_is_the_destination_mac(path):
    rows = [{k: v.split(",")[0] for k, v in r.items()}  # the outer Ethernet header (VXLAN has two)
            for r in tshark_fields(path, ["eth.dst", "eth.dst.ig"], prefs=[])]
    got, labels = _receivers(path, 100)
    uni = [i for i, r in enumerate(rows) if r["eth.dst.ig"] in ("0", "False")]
    assert len(uni) > 100
    assert _same_partition([rows[i]["eth.dst"] for i in uni], got[uni].tolist())
    assert all(labels[got[i]] == rows[i]["eth.dst"] for i in uni)


@pytest.mark.parametrize("name", ["sll_v4_185000.rcv.pcap", "sll2_v6_185000.rcv.pcap"])
def test_cooked_capture_receiver_is_the_capturing_host_or_the_destination(name):
    path = KERNEL / "linktypes" / name
    field = "sll.pkttype"
    rows = tshark_fields(path, [field, "ip.dst", "ipv6.dst", "sll.ifindex"], prefs=[])
    got, labels = _receivers(path, 50)
    sent = [i for i, r in enumerate(rows) if r[field] == "4" and (r["ip.dst"] or r["ipv6.dst"])]
    received = [i for i, r in enumerate(rows) if r[field] not in ("4", "")]
    assert sent and received
    # SLL2 names the receiving interface: one receiver per interface of the capturing host (its own NAPI)
    assert all(labels[got[i]] == ("capturing host" + (f" ifindex {rows[i]['sll.ifindex']}" if rows[i]["sll.ifindex"]
                                                      else "")) for i in received)
    assert all(labels[got[i]] == (rows[i]["ip.dst"] or rows[i]["ipv6.dst"]) for i in sent)


def test_broadcast_goes_to_the_host_its_source_last_sent_unicast_to(tmp_path):
    """300 sources (the peer map grows and rehashes several times), each sending unicast to its own peer, then
    an ARP broadcast; a source never seen sending unicast gets a group receiver of its own."""
    def mac(i: int) -> bytes:
        return bytes([2, 0, 0, 0]) + struct.pack(">H", i)

    arp = struct.pack(">H", 0x0806) + bytes(28)
    pkts, want = [], []
    for i in range(300):
        pkts.append(mac(1000 + i) + mac(i) + arp)  # unicast i -> 1000 + i
        want.append(f"02:00:00:00:{(1000 + i) >> 8:02x}:{(1000 + i) & 0xFF:02x}")
    for i in range(300):
        pkts.append(b"\xff" * 6 + mac(i) + arp)
        want.append(want[i])
    pkts.append(b"\xff" * 6 + mac(5000) + arp)
    want.append("group ff:ff:ff:ff:ff:ff")
    path = write_pcap(tmp_path / "bcast.pcap", pkts)
    got, labels = _receivers(path, 37)
    assert [labels[g] for g in got] == want


def _stage_rows(path: Path, batch_size: int) -> list[tuple]:
    from bigtcp_pcap.flows.table import FlowTable
    from bigtcp_pcap.gro import GroConfig, SuperPacketBatch
    from bigtcp_pcap.gro.stage import GroStage

    stage, flows, out = GroStage(GroConfig()), FlowTable(), []
    for rb in CaptureReader(path, batch_size=batch_size):
        pb, _ = decode(rb)
        out.append(stage.feed(rb, pb, flows.assign(pb)))
    out.append(stage.finish())
    rows = SuperPacketBatch.concat(out).to_dict()
    return sorted(zip(*(rows[c].tolist() for c in ("first_frame", "last_frame", "payload_len", "flush_reason",
                                                   "poll_end", "receiver")), strict=True))


@pytest.fixture(scope="module")
def many_flows(tmp_path_factory) -> Path:
    """A 20k-packet many-flows capture (scripts/make_field_captures.py: both directions, ACKs every other
    segment, 100 connections alive at once), where batches end between ACKed segments and their next ones."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("many") / "many.pcap"
    script = Path(__file__).resolve().parents[2] / "scripts" / "make_field_captures.py"
    subprocess.run([sys.executable, str(script), str(out), "--packets", "20000", "--alive", "100", "--v6-every", "3",
                    "--big-every", "5", "--seed", "8"], check=True, capture_output=True)
    return out


@pytest.mark.parametrize("path", [KERNEL / "v6_snd185000_rcv80000.snd.pcap", KERNEL / "linktypes" / "qinq.snd.pcap",
                                  "many"], ids=lambda p: getattr(p, "name", p))
def test_gro_rows_do_not_depend_on_where_batches_end(path, many_flows):
    """The ACK-evidence rule looks at the flow's next segment; when a batch ends between the two the stage feeds
    the engine only up to the ACKed segment (``GroStage._hold_back``), so the rows, their flush reasons and
    poll ends, are the same whatever the reader's batch size (they once changed with it: an ACKed segment
    whose next one was in the next batch always ended the poll)."""
    path = many_flows if path == "many" else path
    ref = _stage_rows(path, 1 << 20)
    assert any(r[4] == 1 for r in ref)  # rows whose poll ended at an ACKed segment ("ack")
    for bs in (97, 1000):
        assert _stage_rows(path, bs) == ref, bs


@pytest.mark.parametrize("case", ["in_time", "after_silence", "other_flow_between"])
def test_an_ack_after_a_long_silence_of_the_whole_capture_is_no_evidence(case, tmp_path):
    """evidence.RESET_GAP_NS: after the whole capture was silent that long, an ACK says nothing of the data before
    the silence (so a capture cut at such a gap, split.py, gives its parts the serial run's evidence). A silence of
    one flow while another flow's packets keep coming is no such gap."""
    from tests.craft import eth, ipv4, tcp

    def frame(sport, dport, seq, ack, payload, src=(10, 0, 0, 1), dst=(10, 0, 0, 2)):
        ip = bytearray(ipv4(20 + payload))
        ip[12:16], ip[16:20] = bytes(src), bytes(dst)
        return eth(0x0800) + bytes(ip) + tcp(sport, dport, seq, ack) + b"x" * payload

    gap_us = evidence.RESET_GAP_NS // 1000
    late = gap_us - 10 if case == "in_time" else gap_us + 10
    pkts = [frame(40000, 5201, 1000, 1, 100), frame(40000, 5201, 1100, 1, 100)]
    times = [0, 10]
    if case == "other_flow_between":
        pkts.append(frame(40001, 5201, 7000, 1, 100))
        times.append(gap_us // 2)
    pkts.append(frame(5201, 40000, 1, 1100, 0, (10, 0, 0, 2), (10, 0, 0, 1)))  # ACKs the first segment's end
    times.append(10 + late)
    pb, _ = decode(next(iter(CaptureReader(write_pcap(tmp_path / "a.pcap", pkts, times_us=times)))))
    assert acked_ends(pb).tolist()[:2] == [case != "after_silence", False]


def _evidence_rows(path: Path, batch: int) -> tuple[list[bool], list[int], list[int]]:
    """(flags, busy, move) of every row of ``path``, fed in batches of ``batch`` rows."""
    flags: list[bool] = []
    busy: list[int] = []
    move: list[int] = []
    ev = AckEvidence()
    out = []
    for rb in CaptureReader(path, batch_size=batch):
        out += ev.push(decode(rb)[0])
    out += ev.finish()
    for _, _, fl, rv in out:
        flags += fl.tolist()
        busy += rv.busy.tolist()
        move += rv.move.tolist()
    return flags, busy, move


@pytest.mark.parametrize("seed", range(4))
def test_evidence_after_a_long_silence_does_not_depend_on_what_came_before(seed, tmp_path):
    """Cut at every silence of the whole capture longer than evidence.RESET_GAP_NS, each part alone gives the rows
    the whole stream gives (flags, busy times, late/lost marks), as a split run relies on (split.py). Crafted
    streams the kernel captures lack: two connections with data both ways, ACK numbers and SACK blocks drawn from
    recent segment ends (so ends repeat across the silences), retransmissions, 10 us apart with three silences
    of 300 ms. Two faults a review found this way: an ACK key held only by rows before the silence stayed cached
    as absent once a segment took it again, and a direction known only before the silence was revived by an
    ACK after it."""
    from tests.craft import eth, ipv4, tcp

    rng = np.random.default_rng(100 + seed)
    hosts = [((10, 0, 0, 1), (10, 0, 0, 2), 40000 + c, 5201) for c in range(2)]
    ends = [1000, 1100, 1200]
    pkts, times, t, cuts = [], [], 0, []
    n = 900
    gaps = sorted(rng.choice(np.arange(50, n - 50), 3, replace=False).tolist())
    for i in range(n):
        if i in gaps:
            t += 300_000
            cuts.append(i)
        t += 10
        src, dst, sp, dp = hosts[rng.integers(2)]
        if rng.random() < 0.4:
            src, dst, sp, dp = dst, src, dp, sp
        plen = int(rng.choice([0, 0, 100, 100]))
        seq = int(rng.choice(ends)) - (plen if rng.random() < 0.7 else 0)
        ack = int(rng.choice(ends))
        opts = b""
        if plen == 0 and rng.random() < 0.3:  # a SACK block beginning at a recent end
            left = int(rng.choice(ends))
            opts = b"\x01\x01\x05\x0a" + struct.pack(">II", left, left + 100)
        if plen:
            ends.append(seq + plen)
            ends = ends[-6:]
        ip = bytearray(ipv4(20 + len(opts) + (-len(opts) % 4) + plen))
        ip[12:16], ip[16:20] = bytes(src), bytes(dst)
        pkts.append(eth(0x0800) + bytes(ip) + tcp(sp, dp, seq, ack, options=opts) + b"x" * plen)
        times.append(t)
    whole = write_pcap(tmp_path / "whole.pcap", pkts, times_us=times)
    bounds = [0, *cuts, n]
    for batch in (7, 1 << 16):
        want = _evidence_rows(whole, batch)
        got: tuple[list, list, list] = ([], [], [])
        for a, b in itertools.pairwise(bounds):
            part = write_pcap(tmp_path / f"p{a}.pcap", pkts[a:b], times_us=times[a:b])
            fl, bu, mv = _evidence_rows(part, batch)
            got[0].extend(fl)
            got[1].extend(bu)
            got[2].extend([m + a if m >= 0 else m for m in mv])  # (part rows renumbered as the whole's)
        assert got[0] == want[0], batch
        assert got[1] == want[1], batch
        assert got[2] == want[2], batch
    assert sum(want[0]) > 20 and sum(b > 0 for b in want[1]) > 5  # (the stream exercises the evidence)
