"""The flow table's sequence bookkeeping (flows/table.py seq_kernel) against tshark's tcp.analysis flags.

Per flow direction the table counts data segments that start below the highest sequence end seen so far:
``out_of_order`` when such a segment fills a hole the capture had opened, ``retransmissions`` otherwise, and
``capture_gap_bytes`` is the sequence space never shown. tshark flags the same segments, but splits them by
time rather than by sequence space: tcp.analysis.out_of_order when the segment comes within its out-of-order
threshold (3 ms without an RTT estimate) of the last one, tcp.analysis.retransmission otherwise. So the test
checks that both flag exactly the same number of segments per flow, that ``out_of_order`` equals the number of
those segments that cover new sequence space (worked out here from tshark's own seq/len fields), and the gap
bytes likewise; and it runs every scenario twice, with 10 us and with 50 ms between packets, so that tshark's
split changes while ours must not.
"""

from __future__ import annotations

from collections import defaultdict

import craft as C
import pytest
from oracle import tshark_fields, write_pcap

from bigtcp_pcap.api import analyze

SYN, ACK, PSH, FIN = 0x02, 0x10, 0x08, 0x01


def _seg(sport: int, seq: int, n: int, flags: int = ACK | PSH, v6: bool = False) -> bytes:
    t = C.tcp(sport=sport, seq=seq, flags=flags) + b"x" * n
    if v6:
        return C.eth(0x86DD) + C.ipv6(len(t), 6) + t
    return C.eth(0x0800) + C.ipv4(len(t)) + t


# (name, sport, [(seq, payload length, flags)], microseconds between packets)
SCENARIOS = [
    ("in_order", 40001, [(1000, 100, ACK), (1100, 100, ACK), (1200, 100, ACK | PSH)], 10),
    ("hole_filled_soon", 40002, [(1000, 100, ACK), (1100, 100, ACK), (1300, 100, ACK), (1200, 100, ACK)], 10),
    ("duplicate", 40003, [(1000, 100, ACK), (1100, 100, ACK), (1200, 100, ACK), (1100, 100, ACK)], 10),
    ("partial_overlap", 40004, [(1000, 100, ACK), (1100, 100, ACK), (1200, 100, ACK), (1150, 100, ACK)], 10),
    ("hole_never_filled", 40005, [(1000, 100, ACK), (1100, 100, ACK), (1400, 100, ACK), (1500, 50, ACK)], 10),
    ("two_holes_one_filled", 40006, [(1000, 100, ACK), (1200, 100, ACK), (1400, 100, ACK), (1100, 100, ACK)], 10),
    ("syn_then_data", 40007, [(999, 0, SYN), (1000, 100, ACK), (1100, 100, ACK), (1000, 100, ACK)], 10),
    ("wraps_2_32", 40008, [(0xFFFFFF00, 200, ACK), (0x00000008, 100, ACK), (0xFFFFFFC0, 100, ACK)], 10),
    ("dup_after_fin", 40009, [(1000, 100, ACK), (1100, 100, ACK | FIN), (1100, 100, ACK | FIN)], 10),
]


def _capture(tmp_path, scenarios, v6: bool = False):
    pk, times, t = [], [], 0
    for _, sport, segs, dt in scenarios:
        for seq, n, flags in segs:
            pk.append(_seg(sport, seq, n, flags, v6))
            times.append(t)
            t += dt
        t += 1_000_000  # flows far apart
    return write_pcap(tmp_path / ("seq6.pcap" if v6 else "seq.pcap"), pk, times_us=times)


def _tshark_per_flow(path):
    rows = tshark_fields(path, ["tcp.srcport", "tcp.seq_raw", "tcp.len", "tcp.flags.syn", "tcp.flags.fin",
                                "tcp.analysis.retransmission", "tcp.analysis.fast_retransmission",
                                "tcp.analysis.spurious_retransmission", "tcp.analysis.out_of_order"])
    out: dict[int, dict] = defaultdict(lambda: {"flagged": 0, "tshark_ooo": 0, "ranges": []})
    for r in rows:
        f = out[int(r["tcp.srcport"])]
        if r["tcp.analysis.retransmission"] or r["tcp.analysis.fast_retransmission"] \
                or r["tcp.analysis.spurious_retransmission"] or r["tcp.analysis.out_of_order"]:
            f["flagged"] += 1
        f["tshark_ooo"] += bool(r["tcp.analysis.out_of_order"])
        n = int(r["tcp.len"]) + (r["tcp.flags.syn"] in ("1", "True")) + (r["tcp.flags.fin"] in ("1", "True"))
        f["ranges"].append((int(r["tcp.seq_raw"]), n))
    return out


def _sequence_facts(ranges: list[tuple[int, int]]) -> tuple[int, int]:
    """(segments below the highest end that cover new space, sequence bytes never covered) of one flow,
    from its (raw seq, length) list in capture order, relative to the first segment (mod 2**32)."""
    base = ranges[0][0]
    covered: list[tuple[int, int]] = []
    fills, hi = 0, None
    for s, n in ranges:
        s = ((s - base) % 2**32 + 2**31) % 2**32 - 2**31
        e = s + n
        if hi is not None and n and s < hi:
            new = (e - s) - sum(max(0, min(e, b) - max(s, a)) for a, b in covered)
            fills += new > 0
        if n:
            covered.append((s, e))
        hi = e if hi is None else max(hi, e)
    lo = min(a for a, _ in covered)
    merged, end = 0, lo
    for a, b in sorted(covered):
        if b > end:
            merged += b - max(a, end)
            end = b
    return fills, (hi - lo) - merged


def _check_against_tshark(flows, want: dict, scenarios) -> None:
    """Per scenario flow: our flagged segments are tshark's, out_of_order the ones covering new space, and the
    gap bytes the space never covered (``flows`` indexed by sport, ``want`` from ``_tshark_per_flow``)."""
    for name, sport, _, _ in scenarios:
        got, w = flows.loc[sport], want[sport]
        fills, gap = _sequence_facts(w["ranges"])
        assert int(got.retransmissions) + int(got.out_of_order) == w["flagged"], name
        assert int(got.out_of_order) == fills, name
        assert int(got.capture_gap_bytes) == gap, name


@pytest.mark.parametrize("dt_us", [10, 50_000], ids=["10us", "50ms"])
@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_retransmissions_out_of_order_and_gaps_match_tshark(tmp_path, v6, dt_us):
    cap = _capture(tmp_path, [(n, p, segs, dt_us) for n, p, segs, _ in SCENARIOS], v6)
    flows = analyze(cap, audit=False).flows.set_index("sport")
    want = _tshark_per_flow(cap)
    assert sorted(flows.index) == sorted(want)
    _check_against_tshark(flows, want, SCENARIOS)
    # not vacuous: every kind of event happens, and tshark's time-based split differs between the two spacings
    assert flows.retransmissions.sum() >= 4 and flows.out_of_order.sum() >= 2 and flows.capture_gap_bytes.sum() > 0
    tshark_ooo = sum(w["tshark_ooo"] for w in want.values())
    assert (tshark_ooo > 0) if dt_us == 10 else (tshark_ooo == 0)


def test_open_holes_survive_the_table_growing(tmp_path, monkeypatch):
    """Holes opened before the flow table grows (3,000 one-packet flows in between, read in 1,000-record batches:
    the slots double twice) are still there when they are filled: the same counts as tshark's."""
    from bigtcp_pcap import api
    from bigtcp_pcap.capture.reader import CaptureReader
    from bigtcp_pcap.flows.table import FlowTable

    pk, times, t = [], [], 0
    scen = [s for s in SCENARIOS if s[0] != "wraps_2_32"]
    for part in ("head", "fillers", "tail"):
        if part == "fillers":
            for k in range(3000):
                pk.append(_seg(20000 + k, 5000, 10))
                times.append(t)
                t += 10
            continue
        for _, sport, segs, _ in scen:
            for seq, n, flags in (segs[:-1] if part == "head" else segs[-1:]):
                pk.append(_seg(sport, seq, n, flags))
                times.append(t)
                t += 10
    cap = write_pcap(tmp_path / "grow.pcap", pk, times_us=times)
    grown = []
    real = FlowTable._grow_slots
    monkeypatch.setattr(FlowTable, "_grow_slots", lambda self, c: (grown.append(c), real(self, c))[1])
    monkeypatch.setattr(api, "CaptureReader", lambda src, **kw: CaptureReader(src, batch_size=1000, **kw))
    flows = analyze(cap, audit=False).flows.set_index("sport")
    assert len(grown) >= 3, "the table should grow while the holes are open"
    want = _tshark_per_flow(cap)
    _check_against_tshark(flows, want, scen)
    assert flows.loc[[s[1] for s in scen]].out_of_order.sum() >= 2


@pytest.mark.parametrize("name,snaplen", [("v6_185000.snd", 80), ("mixed_185000.rcv", 90),
                                          ("mixed_185000.rcv", 54)])
def test_flows_of_a_capture_whose_tcp_options_are_cut(tmp_path, name, snaplen):
    # a TCP header with its 20 fixed bytes captured but its options cut by the snaplen was no flow packet: an
    # IPv6 sender capture at snaplen 80 had no flows at all (exit 0); per direction, packets and payload bytes now
    # equal tshark's
    import collections
    import subprocess

    from oracle import KERNEL

    cut = tmp_path / f"s{snaplen}.pcap"
    subprocess.run(["editcap", "-s", str(snaplen), str(KERNEL / f"{name}.pcap"), str(cut)], check=True,
                   capture_output=True)
    want: collections.Counter = collections.Counter()
    packets: collections.Counter = collections.Counter()
    for r in tshark_fields(cut, ["tcp.srcport", "tcp.dstport", "tcp.len"], "tcp"):
        k = (int(r["tcp.srcport"]), int(r["tcp.dstport"]))
        packets[k] += 1
        want[k] += int(r["tcp.len"].split(",")[-1] or 0)
    fl = analyze(cut, outdir=tmp_path / "o", audit=False).flows
    got = {(int(r.sport), int(r.dport)): (int(r.packets), int(r.payload_bytes)) for r in fl.itertuples()}
    assert got == {k: (packets[k], want[k]) for k in packets} and sum(want.values()) > 10**6


def test_flow_times_span_earliest_to_latest_when_the_clock_steps_back():
    # a field capture whose timestamps go backwards (capinfos: not in strict time order) gave a flow whose
    # ts_first_ns came after its ts_last_ns (first and last record, not earliest and latest)
    import collections

    from oracle import ROOT

    cap = ROOT / "tests" / "fixtures" / "field" / "kday4.pcap"
    times = collections.defaultdict(list)
    for r in tshark_fields(cap, ["ip.src", "ip.dst", "tcp.srcport", "tcp.dstport", "frame.time_epoch"], "tcp"):
        times[r["ip.src"], r["ip.dst"], int(r["tcp.srcport"]), int(r["tcp.dstport"])].append(
            round(float(r["frame.time_epoch"]) * 1e6))
    fl = analyze(cap, audit=False).flows
    rows = collections.Counter((str(r.src), str(r.dst), int(r.sport), int(r.dport)) for r in fl.itertuples())
    checked = 0
    for r in fl.itertuples():
        k = (str(r.src), str(r.dst), int(r.sport), int(r.dport))
        if rows[k] == 1:  # (a 5-tuple seen again after its idle timeout is two rows)
            assert (r.ts_first_ns.value // 1000, r.ts_last_ns.value // 1000) == (min(times[k]), max(times[k]))
            checked += 1
    assert checked >= 4 and (fl.ts_last_ns >= fl.ts_first_ns).all()
    assert any(ts != sorted(ts) for ts in times.values())  # the shape that was wrong


def test_ports_are_null_when_the_snaplen_cut_them(tmp_path):
    # at snaplen 54 an IPv6 frame ends with its IP header: packets.parquet said sport 0, dport 0 (tcp_seq was null)
    import subprocess

    import pandas as pd
    from oracle import KERNEL

    cut = tmp_path / "s54.pcap"
    subprocess.run(["editcap", "-s", "54", str(KERNEL / "mixed_185000.rcv.pcap"), str(cut)], check=True,
                   capture_output=True)
    pk = analyze(cut, outdir=tmp_path / "o", audit=False, packets=True).packets
    want = {int(r["frame.number"]): r["tcp.srcport"] for r in tshark_fields(cut, ["frame.number", "tcp.srcport"])}
    got = {int(f): (None if pd.isna(s) else str(int(s))) for f, s in zip(pk.frame, pk.sport)}
    assert {f for f, s in got.items() if s is None} == {f for f, s in want.items() if not s} != set()
    assert all(got[f] == s for f, s in want.items() if s)
