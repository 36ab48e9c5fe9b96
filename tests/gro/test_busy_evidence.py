"""Busy evidence: an ACK that does not yet cover a segment of the running poll, sent after the next packet came,
keeps an idle gap from ending that poll (``evidence.evidence_scan``, ``rules.busy_poll_continues``).

* the engines (both): the rule, its slack, that given poll starts override it, and that the evidence ends with
  the poll it belongs to;
* ``AckEvidence``'s busy times equal the definition, computed here by brute force over the decoded rows, on the
  kernel's sender captures and on a crafted stream with retransmissions, SACK blocks and ACKs that do not
  advance, for batches of 1, 13 and the whole capture, with the default window and a 40-row one;
* the kernel capture pairs: with the evidence, the rebuild from the sender capture matches at least as many of
  the receiver's super-packets on every pair as without it.
"""

from __future__ import annotations

import dataclasses
import decimal
import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bigtcp_pcap import api, compare
from bigtcp_pcap.capture import CaptureReader
from bigtcp_pcap.decode import decode
from bigtcp_pcap.gro import GRO_ENGINES, GroConfig, SuperPacketBatch, evidence
from bigtcp_pcap.gro.evidence import AckEvidence
from bigtcp_pcap.gro.rules import BUSY_SLACK_NS
from bigtcp_pcap.gro.stage import GroStage
from bigtcp_pcap.gro.synth import SynthFlow, build_batch, flow_ids
from tests.craft import eth, ipv4, tcp
from tests.gro import test_kernel_pairs as KP
from tests.oracle import tshark_fields, write_pcap

US = 1000
ENGINES = sorted(GRO_ENGINES)
KERNEL = Path(__file__).resolve().parents[1] / "fixtures" / "kernel"
SENDERS = [KERNEL / "mixed_185000.snd.pcap", KERNEL / "v6_185000.snd.pcap", KERNEL / "v4_185000.snd.pcap",
           KERNEL / "traced" / "v4_snd185000_rcv65536.snd.pcap", KERNEL / "traced" / "v6_80000.snd.pcap"]


def run(engine: str, pkts: list[dict], busy: dict[int, int], acked=(), marks=None, splits=()) -> SuperPacketBatch:
    eng = GRO_ENGINES[engine](GroConfig(gro_max_size=185000))
    b, fid = build_batch(pkts), flow_ids(pkts)
    bz = np.zeros(len(pkts), np.int64)
    for i, v in busy.items():
        bz[i] = v
    ak = np.zeros(len(pkts), bool)
    ak[list(acked)] = True
    m = None if marks is None else np.isin(np.arange(len(pkts)), marks)
    parts = [eng.feed(b.take(slice(a, z)), fid[a:z], None if m is None else m[a:z], acked=ak[a:z], busy=bz[a:z])
             for a, z in itertools.pairwise([0, *splits, len(pkts)])]
    return SuperPacketBatch.concat([*parts, eng.flush()])


def sizes(r: SuperPacketBatch) -> list[int]:
    return r.n_segments.tolist()


def two_bursts(n: int = 3, gap_us: int = 500) -> list[dict]:
    f = SynthFlow()
    pk = f.segments(n)
    f.gap(gap_us * US)
    return pk + f.segments(n)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_busy_receiver_keeps_the_poll_running_across_an_idle_gap(engine):
    pk = two_bursts()
    t3 = pk[3]["ts_ns"]
    assert sizes(run(engine, pk, {})) == [3, 3]  # the gap rule alone: two polls
    assert sizes(run(engine, pk, {2: t3 + 20 * US})) == [6]  # an ACK 20 us after the next packet: one poll
    assert sizes(run(engine, pk, {0: t3 + 20 * US})) == [6]  # any segment of the running poll counts
    assert sizes(run(engine, pk, {2: t3 + 20 * US}, splits=[1, 3, 4])) == [6]  # whatever the batches
    assert sizes(run(engine, pk, {2: t3 + BUSY_SLACK_NS})) == [3, 3]  # not later than the slack: no evidence
    assert sizes(run(engine, pk, {3: t3 + 20 * US})) == [3, 3]  # the next poll's own packet says nothing
    assert sizes(run(engine, pk, {2: t3 + 20 * US}, marks=[0, 3])) == [3, 3]  # known poll starts win


@pytest.mark.parametrize("engine", ENGINES)
def test_busy_evidence_ends_with_its_poll(engine):
    f = SynthFlow()
    pk = f.segments(3)
    f.gap(5 * US)
    pk += f.segments(3)
    f.gap(500 * US)
    pk += f.segments(3)
    far = pk[-1]["ts_ns"] + 1_000 * US
    # segment 2's end was ACKed: that poll ended there, and its busy time does not reach into the next poll
    assert sizes(run(engine, pk, {2: far}, acked=[2])) == [3, 3, 3]
    assert sizes(run(engine, pk, {2: far})) == [9]


def _definition(pb, window: int, max_ns: int) -> list[int]:
    """The busy time of every row, by a plain simulation of the definition (Python lists, no rings or tables):
    per flow direction, the segments taken (an end after the last taken one's, unless that one is more than
    ``window`` rows back) and not yet covered; an ACK of the reverse direction that advances the number drops
    the covered ones (its lag to the newest of them is a sample of the shortest lag) and, without a SACK block,
    the ones sent more than ``max_ns`` before it, then gives the rest its time less the shortest lag (none
    before a first lag, nor after the direction was silent for ``max_ns``); segments more than ``window`` rows
    back are dropped. The backlog estimate (evidence module doc): such an ACK without SACK and the previous one
    of its direction, at most BEHIND_SPAN_NS apart, whose delays (time less lag less the arrival of the last
    segment covered) agree within a factor of two and less BEHIND_MARGIN_NS exceed BEHIND_NS, give each segment
    covered after the previous one's last its arrival plus that wait (at most the ACK's time less the lag)."""
    n = len(pb)
    tcp = ((pb.l4_proto == 6) & (pb.l4_off >= 0) & np.isin(pb.ip_version, (4, 6))).tolist()
    key = [(int(v), bytes(s), bytes(d), int(a), int(b)) for v, s, d, a, b in
           zip(pb.ip_version, pb.src, pb.dst, pb.sport, pb.dport, strict=True)]
    rev = [(v, d, s, b, a) for v, s, d, a, b in key]
    plen, seq, ack, ts = (x.astype(np.int64).tolist() for x in (pb.tcp_payload_len, pb.tcp_seq, pb.tcp_ack,
                                                              pb.ts_ns))
    isack = ((pb.tcp_flags & 0x10) != 0).tolist()
    nosack = (pb.tcp_sack_blocks == 0).tolist()

    def after(a: int, b: int) -> bool:
        d = (a - b) % 2**32
        return 0 < d < 2**31

    st: dict = {}  # direction -> {"wait": [rows], "ack": int|None, "lag": int|None, "last_t", "taken": (row, end)}
    out = [0] * n

    def expire(d: dict, r: int) -> None:
        d["wait"] = [x for x in d["wait"] if r - x <= window]

    for r in range(n):
        if not tcp[r]:
            continue
        if isack[r] and rev[r] in st:
            d = st[rev[r]]
            expire(d, r)
            if d["ack"] is None or after(ack[r], d["ack"]):
                d["ack"] = ack[r]
                covered = [x for x in d["wait"] if not after((seq[x] + plen[x]) % 2**32, ack[r])]
                if covered:
                    lag = ts[r] - ts[covered[-1]]
                    if lag >= 0 and (d["lag"] is None or lag < d["lag"]):
                        d["lag"] = lag
                if covered and nosack[r] and d["lag"] is not None:
                    # the backlog estimate: this ACK and the previous such one both show the receiver well behind
                    s2, last = ts[r] - d["lag"], covered[-1]
                    if d["prev"] is not None:
                        s1, a1, p1 = d["prev"]
                        d1, d2 = s1 - a1, s2 - ts[last]
                        wait = min(d1, d2) - evidence.BEHIND_MARGIN_NS
                        if s1 < s2 <= s1 + evidence.BEHIND_SPAN_NS and last > p1 and wait > evidence.BEHIND_NS \
                                and 2 * min(d1, d2) >= max(d1, d2):
                            for x in covered:
                                if x > p1:
                                    out[x] = max(out[x], min(ts[x] + wait, s2))
                    d["prev"] = (s2, ts[last], last)
                d["wait"] = d["wait"][len(covered):]
                if nosack[r]:
                    while d["wait"] and ts[r] - ts[d["wait"][0]] > max_ns:
                        d["wait"].pop(0)
                    if d["lag"] is not None:
                        for x in d["wait"]:
                            out[x] = ts[r] - d["lag"]
        if plen[r] > 0:
            d = st.setdefault(key[r], {"wait": [], "ack": None, "lag": None, "last_t": None, "taken": None,
                                       "prev": None})
            expire(d, r)
            if d["last_t"] is not None and ts[r] - d["last_t"] > max_ns:
                d["lag"] = None
            d["last_t"] = ts[r]
            end = (seq[r] + plen[r]) % 2**32
            tk = d["taken"]
            if tk is None or r - tk[0] > window or after(end, tk[1]):
                d["taken"] = (r, end)
                d["wait"].append(r)
    return out


def _scan(path: Path, batch: int) -> list[int]:
    ev, got = AckEvidence(), []
    for rb in CaptureReader(path, batch_size=batch):
        got += [int(x) for *_, e in ev.push(decode(rb)[0]) for x in e.busy.tolist()]
    return got + [int(x) for *_, e in ev.finish() for x in e.busy.tolist()]


@pytest.mark.parametrize("path", SENDERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_busy_times_are_the_definition_on_kernel_sender_captures(path):
    pb, _ = decode(next(iter(CaptureReader(path, batch_size=1 << 20))))
    want = _definition(pb, evidence.WINDOW, evidence.BUSY_MAX_NS)
    assert sum(v > 0 for v in want) > 20  # the receivers were busy now and then
    for batch in (13, 1 << 16):
        assert _scan(path, batch) == want, batch


def test_the_backlog_estimate_acts_on_kernel_captures(monkeypatch):
    """The definition test above covers the backlog estimate: on two of its captures (the receiver well behind
    between ACKs) the estimate gives rows busy times they would not have had, and only later ones."""
    changed = {}
    for path in SENDERS:
        pb, _ = decode(next(iter(CaptureReader(path, batch_size=1 << 20))))
        with_estimate = _definition(pb, evidence.WINDOW, evidence.BUSY_MAX_NS)
        with monkeypatch.context() as m:
            m.setattr(evidence, "BEHIND_NS", 10**15)
            without = _definition(pb, evidence.WINDOW, evidence.BUSY_MAX_NS)
        assert all(a >= b for a, b in zip(with_estimate, without, strict=True))
        changed[path.name] = sum(a != b for a, b in zip(with_estimate, without, strict=True))
    assert changed["v4_185000.snd.pcap"] > 10 and changed["v6_80000.snd.pcap"] > 100, changed


@pytest.mark.parametrize("seed", range(3))
def test_busy_times_are_the_definition_on_a_crafted_stream(seed, tmp_path, monkeypatch):
    """Three connections, both directions carrying data, retransmitted segments, ACKs that do not advance or go
    back, SACK blocks (option kind 5), 1-50 us between packets; a window of 40 rows (generations of 64, so a
    direction's waiting segments cross generations and expire) and a 300 us time limit."""
    rng = np.random.default_rng(seed)
    hosts = [((10, 0, 0, 1), (10, 0, 0, 2), 40000 + c, 5201) for c in range(3)]
    nxt = {}
    pkts, times = [], []
    t = 0
    sack = bytes([1, 1, 5, 10]) + b"\0" * 8
    for _ in range(1200):
        src, dst, sp, dp = hosts[rng.integers(3)]
        if rng.random() < 0.45:
            src, dst, sp, dp = dst, src, dp, sp
        d = (src, sp)
        plen = int(rng.choice([0, 0, 100, 200]))
        base = nxt.get(d, 1000)
        seq = base if rng.random() < 0.85 else max(0, base - int(rng.integers(1, 4)) * 100)
        if plen and seq == base:
            nxt[d] = base + plen
        peer = nxt.get((dst, dp), 1000)
        ack = peer - int(rng.choice([0, 0, 0, 100, 200, 300]))
        opts = sack if rng.random() < 0.1 else b""
        ip = bytearray(ipv4(20 + len(opts) + plen))
        ip[12:16], ip[16:20] = bytes(src), bytes(dst)
        th = bytearray(tcp(sp, dp, seq, max(0, ack), options=opts))
        pkts.append(eth(0x0800) + bytes(ip) + bytes(th) + b"x" * plen)
        t += int(rng.integers(1, 50))
        times.append(t)
    path = write_pcap(tmp_path / "r.pcap", pkts, times_us=times)
    monkeypatch.setattr(evidence, "WINDOW", 40)
    monkeypatch.setattr(evidence, "BUSY_MAX_NS", 300_000)
    pb, _ = decode(next(iter(CaptureReader(path, batch_size=1 << 16))))
    assert (pb.tcp_sack_blocks > 0).sum() > 50
    want = _definition(pb, 40, 300_000)
    assert 50 < sum(v > 0 for v in want) < len(pb) // 2
    for batch in (1, 13, 1 << 16):
        assert _scan(path, batch) == want, batch


PAIRS = [p for p in KP.PAIRS if KP._drop_free(json.loads((KERNEL / f"{p}.json").read_text()))]


@pytest.mark.parametrize("name", PAIRS)
def test_busy_evidence_never_costs_a_kernel_pair_a_super_packet(name):
    meta = json.loads((KERNEL / f"{name}.json").read_text())
    cfg = KP.pair_config(meta)
    snd, rcv = KERNEL / f"{name}.snd.pcap", KERNEL / f"{name}.rcv.pcap"
    with_busy = compare.compare(snd, rcv, gro=cfg).reproduced
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(evidence, "BUSY_MAX_NS", -1)  # no ACK is ever recent enough: no busy evidence
        without = compare.compare(snd, rcv, gro=cfg).reproduced
    assert with_busy >= without
    assert dataclasses.replace(cfg).ack_evidence



def _frame(rev: bool, seq: int, ack: int, plen: int, opts: bytes = b"", flags: int = 0x10) -> bytes:
    from tests.craft import MAC

    ip = bytearray(ipv4(20 + len(opts) + (-len(opts) % 4) + plen))
    if rev:
        ip[12:16], ip[16:20] = ip[16:20], ip[12:16]
    sp, dp = (5201, 40000) if rev else (40000, 5201)
    return (MAC[6:] + MAC[:6] if rev else MAC) + b"\x08\x00" + bytes(ip) + tcp(sp, dp, seq, ack, flags=flags,
                                                                               options=opts) + b"x" * plen


def _sack(left: int, right: int) -> bytes:
    return bytes([1, 1, 5, 10]) + left.to_bytes(4, "big") + right.to_bytes(4, "big")


def _late_segment_capture(tmp_path: Path) -> Path:
    """Ten 100-byte segments 1 us apart, the fourth (P) reaching the receiver late: after the seventh, the
    receiver SACKs (ack = P's start, one SACK block from P's end to the seventh's) and, still before any copy
    of P is sent again, ACKs up to the seventh's end. Reverse frames swap the MACs and addresses."""
    seg = [_frame(False, 1000 + 100 * k, 1, 100) for k in range(10)]
    pkts = seg[:7] + [_frame(True, 1, 1300, 0, _sack(1400, 1700)), _frame(True, 1, 1700, 0)] + seg[7:]  # P: 1300-1400
    return write_pcap(tmp_path / "late.pcap", pkts, times_us=list(range(len(pkts))))


def _stage_run(path: Path, batch: int, cfg: GroConfig) -> SuperPacketBatch:
    """Every row ``GroStage`` builds from ``path`` read ``batch`` records at a time (a flow id per port pair)."""
    from bigtcp_pcap.gro.stage import GroStage

    stage = GroStage(cfg)
    ids: dict[tuple[int, int], int] = {}
    parts = []
    for rb in CaptureReader(path, batch_size=batch):
        pb, _ = decode(rb)
        fid = np.array([ids.setdefault(k, len(ids)) for k in zip(pb.sport.tolist(), pb.dport.tolist())], np.int64)
        fid[pb.l4_proto != 6] = -1
        parts.append(stage.feed(rb, pb, fid))
    parts.append(stage.finish())
    return SuperPacketBatch.concat(parts)


def _stage_rows(path: Path, batch: int):
    rows = _stage_run(path, batch, GroConfig(gro_max_size=185000))
    data = rows.payload_len > 0
    return list(zip(rows.first_frame[data].tolist(), rows.n_segments[data].tolist(), strict=True))


def test_a_late_segment_is_fed_where_the_receiver_got_it(tmp_path):
    """P (frame 4) goes after the seventh segment (frame 7), as the receiver's SACK and ACK say, whatever the
    batches (P and the row it goes after in one batch or in different ones): GRO then builds what the kernel
    built from that ring order, 1-3, 5-7 (the hole ends the first), P alone, 8-10."""
    path = _late_segment_capture(tmp_path)
    pb, _ = decode(next(iter(CaptureReader(path, batch_size=1 << 16))))
    ev = AckEvidence()
    *_, e = (ev.push(pb) + ev.finish())[0]
    assert e.move.tolist() == [-1, -1, -1, 6, -1, -1, -1, -1, -1, -1, -1, -1]
    want = [(1, 3), (5, 3), (4, 1), (10, 3)]
    for batch in (1, 3, 5, 1 << 16):
        assert _stage_rows(path, batch) == want, batch


def _moves(tmp_path: Path, name: str, pkts: list[bytes]) -> np.ndarray:
    """``AckEvidence``'s move of each row of these frames (1 us apart)."""
    cap = write_pcap(tmp_path / name, pkts, times_us=list(range(len(pkts))))
    pb, _ = decode(next(iter(CaptureReader(cap, batch_size=1 << 16))))
    ev = AckEvidence()
    *_, e = (ev.push(pb) + ev.finish())[0]
    return e.move


def _p_sent_again(dsack: bool) -> list[bytes]:
    """Ten 100-byte segments; the receiver SACKs 1400-1700 (P, 1300-1400, missing), P is sent again, the ACK
    covers 1700; with ``dsack`` the receiver then reports 1300-1400 received twice."""
    seg = [_frame(False, 1000 + 100 * k, 1, 100) for k in range(10)]
    pkts = seg[:7] + [_frame(True, 1, 1300, 0, _sack(1400, 1700)), seg[3], _frame(True, 1, 1700, 0)]
    if dsack:
        pkts.append(_frame(True, 1, 1700, 0, _sack(1300, 1400)))
    return pkts + seg[7:]


def test_a_segment_sent_again_is_lost(tmp_path):
    """P marked missing by a SACK, then sent again, then covered, and no D-SACK: the copy filled the hole, the
    first P never reached the receiver. P is marked lost (the GRO stage leaves it out); nothing is moved."""
    move = _moves(tmp_path, "lost.pcap", _p_sent_again(dsack=False))
    assert move[3] == evidence.LOST
    assert (np.delete(move, 3) == -1).all()


def test_a_segment_sent_again_and_reported_twice_came_late(tmp_path):
    """The same, and the receiver then reports 1300-1400 received twice (a D-SACK): the first P came after all,
    late, and is moved after the seventh segment (row 6), where the ACK that covered it ends, as without a copy."""
    move = _moves(tmp_path, "dsack.pcap", _p_sent_again(dsack=True))
    assert move[3] == 6
    assert (np.delete(move, 3) == -1).all()


def test_a_dsack_is_not_a_late_segment(tmp_path):
    """The same stream with the SACK block below the ACK number (a D-SACK: the receiver got some data twice):
    the segment at the ACK number is merely next, not late."""
    path = _late_segment_capture(tmp_path)
    raw = bytearray(path.read_bytes())
    i = raw.find((1400).to_bytes(4, "big") + (1700).to_bytes(4, "big"))
    raw[i:i + 8] = (1100).to_bytes(4, "big") + (1200).to_bytes(4, "big")
    path.write_bytes(bytes(raw))
    pb, _ = decode(next(iter(CaptureReader(path, batch_size=1 << 16))))
    assert pb.tcp_sack_left.tolist().count(1100) == 1
    ev = AckEvidence()
    *_, e = (ev.push(pb) + ev.finish())[0]
    assert (e.move < 0).all()


LATE = KERNEL / "late"


def _receiver_late(rcv_path: Path) -> set[tuple[int, int]]:
    """(source port, raw seq) of the data the receiver's own capture shows arriving after later data of its
    flow (its first copy, not a retransmission's)."""
    pb, _ = decode(next(iter(CaptureReader(rcv_path, batch_size=1 << 20))))
    top: dict[int, int] = {}
    seen, late = set(), set()
    for i in np.flatnonzero(pb.tcp_payload_len > 0).tolist():
        sp, sq, ln = int(pb.sport[i]), int(pb.tcp_seq[i]), int(pb.tcp_payload_len[i])
        end = (sq + ln) % 2**32
        hi = top.setdefault(sp, end)
        if 0 < (hi - end) % 2**32 < 2**31:  # ends before data already delivered
            if (sp, sq) not in seen:
                late.add((sp, sq))
        else:
            top[sp] = end
        seen.add((sp, sq))
    return late


def test_late_segments_found_in_the_sender_capture_are_late_at_the_kernel_receiver():
    """A slice of a kernel-made pair (``late/``: an IPv4 and an IPv6 flow into one veth, pfifo on the sender's
    side; see the fixtures README) in which the receiver got single segments after later data. Every segment
    the sender's capture alone marks as late (its SACKs, then its ACK before any copy is sent again) is one the
    receiver's capture shows arriving late, and most of those are found; fed in the receiver's order, the
    rebuild matches more of the receiver's super-packets than in capture order: one more for most of the late
    segments (not all: the SACK blocks that reveal a late segment also end the super-packet before it, in either
    order)."""
    snd, rcv = LATE / "mixed_185000.snd.pcap", LATE / "mixed_185000.rcv.pcap"
    pb, _ = decode(next(iter(CaptureReader(snd, batch_size=1 << 20))))
    ev = AckEvidence()
    *_, e = (ev.push(pb) + ev.finish())[0]
    found = {(int(pb.sport[i]), int(pb.tcp_seq[i])) for i in np.flatnonzero(e.move >= 0).tolist()}
    late = _receiver_late(rcv)
    assert len(late) >= 8
    assert found <= late
    assert len(found) >= 0.7 * len(late)
    assert all(e.move[i] > i for i in np.flatnonzero(e.move >= 0).tolist())
    cfg = GroConfig(gro_max_size=185000, gro_ipv4_max_size=185000)
    moved = compare.compare(snd, rcv, gro=cfg).reproduced
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("bigtcp_pcap.gro.stage.GroStage._feed", _feed_in_capture_order)
        unmoved = compare.compare(snd, rcv, gro=cfg).reproduced
    assert moved - unmoved >= 0.75 * len(found)


def _feed_in_capture_order(self, pb, fid, rx, acked, ev):
    return self.engine.feed(pb, fid, acked=acked, receiver=rx, busy=ev.busy)


def test_two_late_segments_at_once(tmp_path):
    """Two segments missing at the same time: the receiver's ACK number stays at the first one while the SACK
    block it sends next begins right after the second. Each is moved after the last segment ending at the ACK
    number that covers it (the first after the sixth segment, the second after the eighth)."""
    seg = [_frame(False, 1000 + 100 * k, 1, 100) for k in range(10)]
    pkts = [*seg[:5], _frame(True, 1, 1300, 0, _sack(1400, 1500)), seg[5], seg[6], seg[7],
            _frame(True, 1, 1300, 0, _sack(1700, 1800)), _frame(True, 1, 1600, 0, _sack(1700, 1800)),
            _frame(True, 1, 1800, 0), seg[8], seg[9]]
    assert _moves(tmp_path, "two.pcap", pkts).tolist() == [-1, -1, -1, 6, -1, -1, -1, 8, -1, -1, -1, -1, -1, -1]


def _rtt_capture(tmp_path: Path, name: str, ack_times: list[tuple[int, int]]) -> Path:
    """Twelve 100-byte segments, six at 0-5 us and six at 35-40 us (a 30 us idle gap: a poll end by the gap
    rule), and the receiver's ACKs at the given (time us, acknowledged segments) as seen at the sender."""
    from tests.craft import MAC

    def frame(rev: bool, seq: int, ack: int, plen: int) -> bytes:
        ip = bytearray(ipv4(20 + plen))
        if rev:
            ip[12:16], ip[16:20] = ip[16:20], ip[12:16]
        sp, dp = (5201, 40000) if rev else (40000, 5201)
        return (MAC[6:] + MAC[:6] if rev else MAC) + b"\x08\x00" + bytes(ip) + tcp(sp, dp, seq, ack) + b"x" * plen

    recs = [(t, frame(False, 1000 + 100 * k, 1, 100)) for k, t in enumerate([0, 1, 2, 3, 4, 5, 35, 36, 37, 38, 39, 40])]
    recs += [(t, frame(True, 1, 1000 + 100 * n, 0)) for t, n in ack_times]
    recs.sort(key=lambda x: x[0])
    return write_pcap(tmp_path / name, [f for _, f in recs], times_us=[t for t, _ in recs])


def _busy_rows(path: Path) -> tuple[list[int], list[int]]:
    """(busy - next packet's time, in us, of the sixth segment; the engine's super-packet sizes fed the
    segments with their busy times and no other evidence)."""
    pb, _ = decode(next(iter(CaptureReader(path, batch_size=1 << 16))))
    ev = AckEvidence()
    *_, e = (ev.push(pb) + ev.finish())[0]
    data = np.flatnonzero(pb.tcp_payload_len > 0)
    seg = pb.take(data)
    lead = int(e.busy[data[5]] - seg.ts_ns[6]) // 1000
    eng = GRO_ENGINES["compiled"](GroConfig(gro_max_size=185000))
    rows = SuperPacketBatch.concat([eng.feed(seg, np.zeros(len(seg), np.int64), busy=e.busy[data]), eng.flush()])
    return lead, rows.n_segments.tolist()


def test_an_ack_on_its_way_back_is_not_busy_evidence(tmp_path):
    """A sender capture 100 us of round trip from an idle receiver: the receiver's ACKs for the first burst
    reach the capture after the second burst was sent, yet it had been handed everything; less the shortest lag
    (100 us) they were sent long before the second burst, and the gap still ends the poll. With a receiver that
    is really behind (ACKs far later than that lag), the gap does not."""
    idle = _rtt_capture(tmp_path, "idle.pcap", [(101, 2), (103, 4), (105, 6), (137, 8), (139, 10), (141, 12)])
    assert _busy_rows(idle) == (3 - 35, [6, 6])  # s6's last uncovering ACK (103 us) was sent by 3 us
    behind = _rtt_capture(tmp_path, "behind.pcap", [(101, 2), (180, 4), (190, 6), (200, 8), (210, 12)])
    assert _busy_rows(behind) == (80 - 35, [12])  # the ACK at 180 us was sent by 80 us: still busy at 35 us


LOST_DIR = KERNEL / "lost"
_GROSTAGE_FEED = GroStage._feed


def _feed_lost_in_place(self, pb, fid, rx, acked, ev):
    """GroStage._feed with the lost marks read as none: every segment fed where the sender's capture has it."""
    move = np.where(ev.move == evidence.LOST, -1, ev.move)
    return _GROSTAGE_FEED(self, pb, fid, rx, acked, dataclasses.replace(ev, move=move))


def test_lost_segments_found_in_the_sender_capture_never_reached_the_kernel_receiver():
    """A slice of a kernel-made pair (``lost/``: an IPv4 and an IPv6 flow into one veth with no qdisc on the
    sender's side, so a full ring drops after the sender's capture; see the fixtures README). Every segment the
    sender's capture alone marks as lost (its SACKs show the hole, then it is sent again, and the receiver never
    reports that data twice) is one whose data the receiver's capture, read by tshark, holds once, after the copy
    was sent: only the copy arrived. The GRO stage leaves them out, counts them in the summary, and the
    rebuild then matches more of the receiver's super-packets than with them fed where they were captured."""
    snd, rcv = LOST_DIR / "mixed_185000.snd.pcap", LOST_DIR / "mixed_185000.rcv.pcap"
    pb, _ = decode(next(iter(CaptureReader(snd, batch_size=1 << 20))))
    ev = AckEvidence()
    *_, e = (ev.push(pb) + ev.finish())[0]
    lost = np.flatnonzero(e.move == evidence.LOST).tolist()
    assert len(lost) >= 10
    got = tshark_fields(rcv, ["tcp.srcport", "tcp.seq_raw", "tcp.len", "frame.time_epoch"], "tcp.len > 0")
    rx = [(int(r["tcp.srcport"]), int(r["tcp.seq_raw"]), int(r["tcp.len"]),
           int(decimal.Decimal(r["frame.time_epoch"]) * 10**9)) for r in got]
    for i in lost:
        sp, sq = int(pb.sport[i]), int(pb.tcp_seq[i])
        copies = [j for j in range(i + 1, len(pb)) if int(pb.sport[j]) == sp and int(pb.tcp_seq[j]) == sq]
        assert copies, (i, sp, sq)
        seen = [t for p, s, ln, t in rx if p == sp and (sq - s) % 2**32 < ln]
        assert len(seen) == 1 and seen[0] > int(pb.ts_ns[copies[0]]), (i, sp, sq, seen)  # the copy, alone
    cfg = GroConfig(gro_max_size=185000, gro_ipv4_max_size=185000)
    left_out = compare.compare(snd, rcv, gro=cfg).reproduced
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("bigtcp_pcap.gro.stage.GroStage._feed", _feed_lost_in_place)
        fed = compare.compare(snd, rcv, gro=cfg).reproduced
    assert left_out > fed
    summary = api.analyze(snd, gro=cfg, audit=False).summary
    assert summary["superpackets"]["lost_segments"] == len(lost)


def test_two_segments_sent_again_are_each_judged(tmp_path):
    """Two marked segments of one direction (P1 at 1300, P2 at 1500, each SACKed as missing) both sent again and
    covered by one ACK: a D-SACK for each moves each after the seventh segment (row 6); with a D-SACK for P2 only,
    P1 stays lost (each lost row is judged on its own evidence, not only the last one of its direction)."""
    seg = [_frame(False, 1000 + 100 * k, 1, 100) for k in range(10)]
    head = seg[:7] + [_frame(True, 1, 1300, 0, _sack(1400, 1500)), _frame(True, 1, 1300, 0, _sack(1600, 1700)),
                      seg[3], seg[5], _frame(True, 1, 1700, 0)]
    both = _moves(tmp_path, "both.pcap", head + [_frame(True, 1, 1700, 0, _sack(1300, 1400)),
                                                  _frame(True, 1, 1700, 0, _sack(1500, 1600))] + seg[7:])
    assert both[3] == 6 and both[5] == 6
    assert (np.delete(both, [3, 5]) == -1).all()
    one = _moves(tmp_path, "one.pcap", head + [_frame(True, 1, 1700, 0, _sack(1500, 1600))] + seg[7:])
    assert one[3] == evidence.LOST and one[5] == 6
    assert (np.delete(one, [3, 5]) == -1).all()


def test_a_copy_sent_after_a_timeout_is_no_evidence_and_a_split_run_equals_the_serial_one(tmp_path):
    """P marked missing by a SACK and sent again 300 ms later (a retransmission timeout, beyond the 10 ms the
    evidence lasts): no lost mark, the segment is fed where it was captured, and a run split at that idle gap
    (the part with P never sees its copy) gives the serial run's super-packets."""
    from bigtcp_pcap.many import analyze_split

    seg = [_frame(False, 1000 + 100 * k, 1, 100, flags=0x18 if k in (6, 9) else 0x10) for k in range(10)]
    gap = 300_000
    pkts = seg[:7] + [_frame(True, 1, 1300, 0, _sack(1400, 1700)), seg[3], _frame(True, 1, 1700, 0)] + seg[7:]
    cap = write_pcap(tmp_path / "rto.pcap", pkts, times_us=list(range(8)) + [gap + k for k in (0, 30, 31, 32, 33)])
    serial = api.analyze(cap, outdir=tmp_path / "serial", audit=False)
    split = analyze_split(cap, tmp_path / "split", jobs=1, parts=8, audit=False)
    assert split.params["parts"] == 2
    assert serial.summary["superpackets"]["lost_segments"] == split.summary["superpackets"]["lost_segments"] == 0
    cols = ["first_frame", "n_segments", "payload_len"]
    a = pd.read_parquet(tmp_path / "serial" / "superpackets.parquet")[cols]
    b = pd.read_parquet(tmp_path / "split" / "superpackets.parquet")[cols]
    pd.testing.assert_frame_equal(a, b)
    assert a.values.tolist() == [[1, 3, 300], [4, 4, 400], [9, 1, 100], [11, 3, 300]]


def _stage_rows_by_flow(path: Path, batch: int) -> list[tuple[int, int, int]]:
    """(first frame, segments, payload) of every row, sorted, both BIG TCP limits at 185000."""
    rows = _stage_run(path, batch, GroConfig(gro_max_size=185000, gro_ipv4_max_size=185000))
    return sorted(zip(rows.first_frame.tolist(), rows.n_segments.tolist(), rows.payload_len.tolist(), strict=True))


def test_rows_do_not_depend_on_where_batches_end_around_a_late_segment():
    """``late/mixed_185000_edge.snd.pcap`` (a kernel pair's slice, see the fixtures README): the segment at frame
    786 reached the receiver after frame 826, and the ACK evidence marks frame 784's end. Cut between the two,
    the rows after the cut are read as lookahead; in capture order the late segment looked like the flow's next
    segment there and 6 rows changed with the cut. The lookahead is in feed order now: every cut gives the rows
    of one whole batch."""
    path = LATE / "mixed_185000_edge.snd.pcap"
    whole = _stage_rows_by_flow(path, 1 << 16)
    assert len(whole) > 40
    for batch in (785, 157, 97):
        assert _stage_rows_by_flow(path, batch) == whole, batch
