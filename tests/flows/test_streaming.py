"""Flows end on their timeouts and leave memory; the rows are what a run without timeouts gives; addresses are
written as Python's ipaddress writes them; the GRO engine forgets keys of ended flows without changing a row."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bigtcp_pcap.api import analyze, iter_batches
from bigtcp_pcap.flows.table import FlowTable, address_strings
from bigtcp_pcap.gro import make_engine
from bigtcp_pcap.gro.superpacket import SuperPacketBatch

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "tests" / "fixtures" / "kernel"


@pytest.fixture(scope="module")
def many_flows(tmp_path_factory) -> Path:
    """A small many-flows capture from the generator (about 1100 short connections, 200 open at once)."""
    out = tmp_path_factory.mktemp("mf") / "mf.pcap"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_field_captures.py"), str(out), "--packets", "20000",
                    "--alive", "200", "--gap-us", "5000"], check=True, capture_output=True)
    return out


def test_address_text_equals_ipaddress():
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, (400, 16), dtype=np.uint8)
    raw[rng.random((400, 16)) < 0.6] = 0  # runs of zero groups of every length and position
    raw[0] = 0
    raw[1, :15] = 0
    raw[2, 1:] = 0
    raw[3, 10:12] = 0xFF  # ::ffff:a.b.c.d (IPv4-mapped)
    ver = np.where(rng.random(400) < 0.3, 4, 6)
    got = address_strings(ver, raw.view(np.uint64).reshape(400, 2)).to_pylist()
    want = [str(ipaddress.IPv4Address(bytes(r[:4]))) if v == 4 else str(ipaddress.IPv6Address(bytes(r)))
            for v, r in zip(ver, raw)]
    assert got == want


def test_row_addresses_are_each_packets_own_addresses(many_flows):
    """The per-row dictionary columns (superpackets, egress) against each packet's own address bytes written by
    ``ipaddress``; rows without a flow, or whose flow is not in memory, are null."""
    ft, checked = FlowTable(), 0
    for pb, _ in iter_batches(many_flows, batch_size=3000):
        fid = ft.assign(pb)
        rows = np.concatenate([fid, [-1, 10**9]])  # no flow; a flow id never given
        src, dst = ft.row_addresses(rows)
        assert len(src.dictionary) <= 2 * len(np.unique(fid[fid >= 0]))  # each distinct address written once
        for col, raw in ((src, pb.src), (dst, pb.dst)):
            got = col.to_pylist()
            want = [None if f < 0 else str(ipaddress.IPv4Address(bytes(a[:4])) if v == 4
                                            else ipaddress.IPv6Address(bytes(a)))
                    for f, v, a in zip(fid.tolist(), pb.ip_version.tolist(), raw, strict=True)]
            assert got == want + [None, None]
        checked += int((fid >= 0).sum())
    assert checked > 10000


def test_ended_flows_are_streamed_with_the_values_of_a_run_without_timeouts(many_flows, tmp_path):
    # the generator never reuses a 5-tuple, so ending flows early must not change a value, only the memory
    short = analyze(many_flows, outdir=tmp_path / "a", flow_close_timeout_s=0.05, audit=False)
    never = analyze(many_flows, outdir=tmp_path / "b", flow_close_timeout_s=1e6, flow_idle_timeout_s=1e6, audit=False)
    a = short.flows.sort_values("flow_id").reset_index(drop=True)
    b = never.flows
    assert len(b) > 2000
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(short.superpackets, never.superpackets)
    assert short.params["flows"] == {"idle_timeout_s": 120.0, "close_timeout_s": 0.05}
    # and the memory followed the flows alive at once
    ft, peak = FlowTable(close_timeout_ns=50_000_000), 0
    for pb, _ in iter_batches(many_flows, batch_size=2000):
        ft.assign(pb)
        ft.expire(int(pb.ts_ns.max()))
        peak = max(peak, ft.alive)
    assert len(ft) == len(b) and peak < len(b) / 3


def test_a_flow_back_after_its_idle_timeout_is_a_new_row(tmp_path):
    """Oracle: tshark's conversations (tcp.stream) and timestamps, split where the connection was silent longer
    than the timeout; each piece gives one row per direction that sent in it."""
    if shutil.which("tshark") is None:
        pytest.skip("tshark not installed")
    cap = KERNEL / "mixed_185000.rcv.pcap"
    out = subprocess.run(["tshark", "-r", str(cap), "-Y", "tcp", "-T", "fields", "-E", "separator=,", "-e",
                          "tcp.stream", "-e", "frame.time_epoch", "-e", "ip.src", "-e", "ipv6.src", "-e", "tcp.srcport"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split(",") for line in out.splitlines()]
    t = pd.DataFrame({"stream": [int(r[0]) for r in rows], "ts": [float(r[1]) for r in rows],
                      "dir": [(r[2] or r[3]) + ":" + r[4] for r in rows]})
    gaps = np.sort(np.concatenate([np.diff(g.ts.to_numpy()) for _, g in t.groupby("stream")]))
    gaps = gaps[gaps > 1e-5]
    cut = (gaps[len(gaps) // 2] + gaps[len(gaps) // 2 + 1]) / 2  # between two distinct gaps: some splits
    want = 0
    for _, g in t.groupby("stream"):
        piece = np.concatenate([[0], np.cumsum(np.diff(g.ts.to_numpy()) > cut)])
        want += g.assign(piece=piece).groupby("piece").dir.nunique().sum()
    a = analyze(cap, outdir=tmp_path, flow_idle_timeout_s=cut, flow_close_timeout_s=1e6, audit=False)
    base = analyze(cap, outdir=tmp_path / "b", audit=False)
    assert len(a.flows) == want > len(base.flows)
    assert a.flows.flow_id.is_unique and a.flows.packets.sum() == base.flows.packets.sum()


def test_gro_key_recycling_keeps_every_row(many_flows):
    """The compiled engine forgetting keys of ended flows gives the same super-packets as keeping them all."""
    rows, kept = {}, {}
    for recycle in (False, True):
        ft = FlowTable(close_timeout_ns=50_000_000)
        eng = make_engine("compiled")
        out = []
        for pb, _ in iter_batches(many_flows, batch_size=2000):
            fid = ft.assign(pb)
            out.append(eng.feed(pb, fid))
            ft.add_superpackets(out[-1].flow_id, out[-1].payload_len)
            ft.expire(int(pb.ts_ns.max()), eng.held_flow_ids())
            if recycle:
                eng._recycle_at = 0  # every batch, not only when the keys doubled
                eng.recycle(ft.in_memory)
        out.append(eng.flush())
        rows[recycle] = SuperPacketBatch.concat(out).to_dict()
        kept[recycle] = eng._ngid
    for k in rows[False]:
        np.testing.assert_array_equal(rows[True][k], rows[False][k], err_msg=k)
    assert kept[True] < kept[False] / 3


@pytest.mark.parametrize("step", [1, 7])
def test_room_for_new_flows_made_in_steps_changes_nothing(many_flows, monkeypatch, step):
    """The flow kernel stops where it runs out of room for new flows and goes on after the table grew: with room
    for 1 or 7 new flows at a time (thousands of stops) every flow id and every flow row is the same."""
    def run() -> tuple[list, list]:
        ft, fids, rows = FlowTable(close_timeout_ns=50_000_000), [], []
        for pb, _ in iter_batches(many_flows, batch_size=3000):
            fids.append(ft.assign(pb))
            rows.append(ft.expire(int(pb.ts_ns.max()), np.zeros(0, np.int64)))
        rows.append(ft.expire(0, everything=True))
        return fids, [pd.DataFrame({k: list(v) for k, v in r.items()}) for r in rows if r is not None]

    want_fids, want_rows = run()
    monkeypatch.setattr(FlowTable, "NEW_FLOWS_STEP", step)
    monkeypatch.setattr(FlowTable, "alive", property(lambda self: 0))  # the step alone decides the room
    got_fids, got_rows = run()
    assert sum(len(f) for f in want_fids) == 20000 and len(want_rows) > 3
    for a, b in zip(got_fids, want_fids, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(got_rows, want_rows, strict=True):
        pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize("close_ms", [50, 2000])
def test_skipping_the_pass_over_every_slot_changes_no_row(many_flows, close_ms, monkeypatch):
    """``expire`` judges every alive slot only when a deadline may have passed (the earliest one of the last full
    pass, or a packet's time since plus the shorter timeout). Against a table forced to judge every slot at
    every call: the same rows in the same calls, with timestamps that sometimes go backwards, GRO-held flows
    and a lookahead that holds the last rows; and the pass was really skipped."""
    from bigtcp_pcap.flows import table

    fulls = []
    kernel = table.expire_kernel

    def spy(*a):
        fulls.append(a[2])
        return kernel(*a)

    monkeypatch.setattr(table, "expire_kernel", spy)

    def run(force: bool) -> list:
        rng = np.random.default_rng(close_ms)
        ft, out = FlowTable(close_timeout_ns=close_ms * 1_000_000), []
        for k, (pb, _) in enumerate(iter_batches(many_flows, batch_size=700)):
            if k % 5 == 3:  # a batch stamped 30 ms earlier than it is (a capture's clock steps back)
                pb.ts_ns[:] -= 30_000_000
            fid = ft.assign(pb)
            if force:
                ft._TO[2] = -1
            held = fid[rng.integers(0, len(fid), 3)] if k % 2 else np.zeros(0, np.int64)
            r = ft.expire(int(pb.ts_ns.max()), held, hold_from_frame=int(pb.frame[-50]))
            out.append(None if r is None else pd.DataFrame({c: list(v) for c, v in r.items()}))
        out.append(pd.DataFrame({c: list(v) for c, v in ft.expire(0, everything=True).items()}))
        return out

    want = run(True)
    assert all(fulls)
    fulls.clear()
    got = run(False)
    assert fulls.count(False) > 3 and sum(len(r) for r in want if r is not None) > 1000
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            pd.testing.assert_frame_equal(a, b)


def test_a_flow_that_starts_after_the_full_pass_and_closes_ends_on_time(tmp_path):
    """The case the packets' own times cover: every flow alive at the last full pass is open (deadline: idle
    timeout, far away), then a new connection opens, is reset and falls silent. Its row must come at the first
    call after its close timeout, as a pass over every slot finds it, not at the open flow's deadline."""
    from tests.craft import eth, ipv4, tcp
    from tests.oracle import write_pcap

    def frame(sport, flags=0x10):
        return eth(0x0800) + ipv4(20) + tcp(sport, 5201, 1000, 1, flags)

    times = [k * 100_000 for k in range(80)]  # the long connection: a packet every 100 ms for 8 s
    pkts = [frame(40000) for _ in times]
    pkts[11:11] = [frame(40001, 0x02), frame(40001, 0x04)]  # a connection at 1.05 s, reset at 1.06 s
    times[11:11] = [1_050_000, 1_060_000]
    path = write_pcap(tmp_path / "c.pcap", pkts, times_us=times)
    ft, ended_at = FlowTable(close_timeout_ns=2_000_000_000), {}
    for pb, _ in iter_batches(path, batch_size=1):
        ft.assign(pb)
        r = ft.expire(int(pb.ts_ns.max()))
        for sport in [] if r is None else r["sport"].tolist():
            ended_at[sport] = int(pb.ts_ns.max()) // 1000 - 1_700_000_000_000_000
    assert ended_at == {40001: 3_100_000}  # the first packet more than 2 s after the reset at 1.06 s
