"""The diagnosis and the post-GRO inference on the kernel captures, checked against each pair's recorded settings
(tests/fixtures/kernel/*.json: the receiver's gro limits read back from the kernel, its HZ, the MSS, and the
segment counts the capture script measured), and the what-ifs against a full ``analyze`` with the knob changed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from oracle import KERNEL

from bigtcp_pcap.api import analyze
from bigtcp_pcap.gro.superpacket import SOURCE_OBSERVED

PAIRS = sorted(p.stem for p in KERNEL.glob("*.json"))


def _recorded(name: str) -> dict:
    return json.loads((KERNEL / f"{name}.json").read_text())


def _limits(rec: dict) -> dict[int, int]:
    lim = rec["interfaces"]["vb"]["limits"]
    return {6: lim["gro_max_size"], 4: lim["gro_ipv4_max_size"]}


def _families(rec: dict) -> list[int]:
    return sorted({f["family"] for f in rec["observed"]["receiver"]["flows"]})


def _full_napi_l3(rec: dict, ver: int) -> int:
    """IP length of a 64-segment super-packet of this pair (MSS payload + IP + TCP with timestamps)."""
    mss = rec["mss_seen"]["ipv6" if ver == 6 else "ipv4"]
    return 64 * mss + (40 if ver == 6 else 20) + 32


@pytest.mark.parametrize("name", PAIRS)
def test_receiver_capture_is_post_gro_and_host_limits_match_recorded(name):
    rec = _recorded(name)
    a = analyze(KERNEL / f"{name}.rcv.pcap", audit=False)
    ck = a.summary["capture_kind"]
    assert ck["post_gro"] and ck["kind"] == "post-GRO (or TSO-side)"
    sp = a.superpackets
    # observed rows carry their own reason, never flush_marked, with the capture's segment count
    obs = sp[sp.source == "observed"]
    assert len(obs) == ck["observed_superpackets"] > 0
    assert set(obs.flush_reason.astype(str)) == {"observed"}
    assert "flush_marked" not in a.summary["superpackets"]["flush_reasons"]
    big = [f for f in rec["observed"]["receiver"]["flows"] if f["max_segments"] > 1]
    for ver in _families(rec):
        host = next(h for h in ck["host"] if h["ip_version"] == ver)
        limit = _limits(rec)[ver]
        want_segs = max(f["max_segments"] for f in big if f["family"] == ver)
        assert host["max_segments"] == want_segs
        assert host["limit_at_least"] <= limit  # the kernel's limit admits what was observed
        if want_segs == 64:  # the script saw 64-segment super-packets: the NAPI budget, HZ < 1000
            assert rec["hz"]["hz"] < 1000
            assert host["stops_at"] == "napi_budget"
            assert "NAPI budget at HZ < 1000" in host["text"]
        else:
            assert host["stops_at"] == "size_limit"
            assert host["limit_at_least"] <= limit <= host["limit_at_most"]
            if limit == 65536:
                knob = "gro_max_size" if ver == 6 else "gro_ipv4_max_size"
                assert f"{knob} is 65536, not raised" in host["text"]
        # the default model (65536) contradicts an observed super-packet above 64 KiB, and only then
        contradicts = any(c.startswith(f"IPv{ver}:") for c in ck["contradictions"])
        assert contradicts == (host["largest_l3_len"] >= 65536)


@pytest.mark.parametrize("name", PAIRS)
def test_receiver_analysed_with_recorded_settings_has_no_contradiction(name):
    rec = _recorded(name)
    lim = _limits(rec)
    a = analyze(KERNEL / f"{name}.rcv.pcap", audit=False, gro_max_size=lim[6], gro_ipv4_max_size=lim[4],
                hz=rec["hz"]["hz"])
    assert a.summary["capture_kind"]["contradictions"] == []


@pytest.mark.parametrize("name", PAIRS)
def test_sender_diagnosis_names_the_recorded_limit_or_napi_budget(name):
    rec = _recorded(name)
    lim = _limits(rec)
    hz = rec["hz"]["hz"]
    a = analyze(KERNEL / f"{name}.snd.pcap", audit=False, gro_max_size=lim[6], gro_ipv4_max_size=lim[4], hz=hz)
    assert not a.summary["capture_kind"]["post_gro"]
    diag = a.summary["diagnosis"]
    for ver in _families(rec):
        flow = next(f for f in diag["flows"] if f["ip_version"] == ver)  # the busiest flow of this family
        top = flow["reasons"][0]
        assert [r["bytes"] for r in flow["reasons"]] == sorted((r["bytes"] for r in flow["reasons"]), reverse=True)
        if lim[ver] <= _full_napi_l3(rec, ver):  # the limit is reached before 64 segments
            assert top["reason"] == "size_limit"
            assert top["knob"] == ("gro_max_size" if ver == 6 else "gro_ipv4_max_size")
            assert f"size limit {lim[ver]:,}" in top["text"]
            if ver == 4:
                assert "gro_max_size does not raise" in top["text"]
            assert [k["knob"] for k in top["knobs"]] == [top["knob"]]
        else:
            assert top["reason"] == "napi_poll"
            assert top["knob"] == "napi budget / HZ"
            assert f"reached 64 segments, and at HZ {hz} (< 1000)" in top["text"]
            assert "hz" in [k["knob"] for k in top["knobs"]]


def _flow_rebuilt(a, flow_id: int) -> tuple[int, int, int]:
    sp = a.superpackets
    s = sp[(sp.flow_id == flow_id) & (sp.source != "observed")]
    return len(s), int(np.median(s.l3_len)), int(s.l3_len.max())


@pytest.mark.parametrize("name,ver,kw,knob,changed", [
    ("v4_snd185000_rcv65536", 4, {}, "gro_ipv4_max_size", {"gro_ipv4_max_size": 185000}),
    ("v6_65536", 6, {}, "gro_max_size", {"gro_max_size": 185000, "gro_ipv4_max_size": 65536}),
    ("v6_185000", 6, {"gro_max_size": 185000}, "hz", {"gro_max_size": 185000, "hz": 1000}),
])
def test_what_if_equals_a_full_run_with_the_knob_changed(name, ver, kw, knob, changed):
    cap = KERNEL / f"{name}.snd.pcap"
    a = analyze(cap, audit=False, **kw)
    flow = next(f for f in a.summary["diagnosis"]["flows"] if f["ip_version"] == ver)
    k = next(k for r in flow["reasons"] for k in r["knobs"] if k["knob"] == knob)
    # both sides of a what-if are the timing model alone (the ACK evidence is the capture's own receiver)
    a0 = analyze(cap, audit=False, ack_evidence=False, **kw)
    b = analyze(cap, audit=False, ack_evidence=False, **changed)
    for got, run in ((k["before"], a0), (k["after"], b)):
        n, p50, mx = _flow_rebuilt(run, flow["flow_id"])
        assert (got["superpackets"], got["p50_l3_len"], got["max_l3_len"]) == (n, p50, mx)
    assert a.summary["diagnosis"]["what_if_input"]["packets"] == a.info.packets
    # where the sender's bursts allow it the change shows a gain (with the evidence it did not: the ACKed ends of
    # the capture's own receiver pinned the cuts); v6_65536's sender ends its bursts at 64 KiB itself
    if name != "v6_65536":
        assert k["after"]["max_l3_len"] > k["before"]["max_l3_len"] or \
            k["after"]["p50_l3_len"] > k["before"]["p50_l3_len"]


def test_observed_label_keeps_segment_counts_of_the_capture():
    rec = _recorded("v6_185000")
    a = analyze(KERNEL / "v6_185000.rcv.pcap", audit=False)
    sp = a.superpackets
    obs = sp[sp.source == "observed"]
    flow = next(f for f in rec["observed"]["receiver"]["flows"] if f["max_segments"] > 1)
    hist = {int(k): v for k, v in flow["segments_histogram"].items() if int(k) > 1}
    got = obs.n_segments.value_counts().to_dict()
    assert {int(k): int(v) for k, v in got.items()} == hist
    assert SOURCE_OBSERVED == 1


@pytest.mark.parametrize("name,side", [("v6_185000", "rcv"), ("mixed_185000", "rcv"), ("v4_185000", "rcv"),
                                       ("v6_185000", "snd")])
def test_inference_and_what_ifs_do_not_depend_on_batches(name, side, monkeypatch):
    """The observed sizes are counted batch by batch (``ObservedSizes``) and the what-if runs feed the engine a
    few thousand rows at a time: 7-record batches and 5-row feeds give the default run's capture kind and
    diagnosis, and the inferred host still admits the recorded kernel limits."""
    from bigtcp_pcap import api
    from bigtcp_pcap import diagnose as D
    from bigtcp_pcap.capture.reader import CaptureReader
    from bigtcp_pcap.gro import evidence

    cap = KERNEL / f"{name}.{side}.pcap"
    monkeypatch.setattr(evidence, "WINDOW", 40)  # (the ACK lookahead would hold a fixture's rows to its end)
    whole = analyze(cap, audit=False).summary
    chunks = []
    real = D.infer_capture
    monkeypatch.setattr(D, "infer_capture", lambda tally, *a: (chunks.append(tally.observed.batches), real(tally, *a))[1])
    monkeypatch.setattr(api, "CaptureReader", lambda src, **kw: CaptureReader(src, batch_size=7, **kw))
    monkeypatch.setattr(D.WhatIfInput, "FEED_ROWS", 5)
    small = analyze(cap, audit=False).summary
    assert (chunks[0] > 5) == (side == "rcv"), "the observed rows should come in many batches"
    assert small["capture_kind"] == whole["capture_kind"]
    assert small["diagnosis"] == whole["diagnosis"]
    assert whole["diagnosis"]["flows"], "the diagnosis should have flows to compare"
    for host in small["capture_kind"]["host"]:
        assert host["limit_at_least"] <= _limits(_recorded(name))[host["ip_version"]]


@pytest.mark.parametrize("name", ["v6_185000", "mixed_185000", "v4_185000", "v4_65536", "v6_65536",
                                  "v4_snd185000_rcv65536"])
def test_observed_sizes_equal_a_count_of_the_observed_rows(name):
    """The capture kind's host facts and each top flow's ``observed`` ends come from aggregates kept batch by
    batch (``ObservedSizes``); here they are counted again from the observed rows of superpackets.parquet, each
    joined to its frame in packets.parquet for the IP version and the PSH flag, with the rules written out."""
    a = analyze(KERNEL / f"{name}.rcv.pcap", audit=False, packets=True)
    sp, pk = a.superpackets, a.packets
    obs = sp[sp.source == "observed"].merge(pk[["frame", "ip_version", "tcp_flags"]], left_on="first_frame",
                                            right_on="frame", how="left")
    assert len(obs) == (sp.source == "observed").sum() > 0
    l3, nseg, pay = (obs[c].astype("int64").to_numpy() for c in ("l3_len", "n_segments", "payload_len"))
    ver, psh = obs.ip_version.astype("int64").to_numpy(), (obs.tcp_flags.astype("int64").to_numpy() & 8) != 0
    kind = a.summary["capture_kind"]
    assert kind["observed_superpackets"] == len(obs)
    assert sorted(h["ip_version"] for h in kind["host"]) == sorted(set(ver.tolist()))
    for host in kind["host"]:
        sel = ver == host["ip_version"]
        first_largest = np.flatnonzero(sel & (l3 == l3[sel].max()))[0]
        mss = int(np.max(np.where(nseg[sel] > 0, (pay[sel] + np.maximum(nseg[sel], 1) - 1)
                                  // np.maximum(nseg[sel], 1), 0)))
        assert (host["largest_l3_len"], host["segments_of_largest"], host["mss"], host["max_segments"],
                host["at_napi_budget"]) == (l3[sel].max(), nseg[first_largest], mss, nseg[sel].max(),
                                            (nseg[sel] == 64).sum())
    checked = near64 = 0
    for flow in a.summary["diagnosis"]["flows"]:
        for r in flow["reasons"]:
            if r["reason"] != "observed":
                continue
            f = obs.flow_id.to_numpy() == flow["flow_id"]
            n, ln, p, ps = nseg[f], l3[f], pay[f], psh[f]
            fmss = int(np.max((p + np.maximum(n, 1) - 1) // np.maximum(n, 1)))
            budget = n >= 64
            near = ~budget & (ln < 65536) & (ln + fmss >= 65536)
            want = {"napi_budget": int(budget.sum()), "below_64k": int(near.sum()),
                    "psh": int((~budget & ~near & ps).sum()), "other": int((~budget & ~near & ~ps).sum())}
            assert (r["ends"], r["max_segments"]) == (want, int(n.max()))
            checked += 1
            near64 += want["below_64k"]
    assert checked
    # a receiver at 65536 ends super-packets within one segment of 64 KiB (42, 44, 21 on these fixtures)
    assert (near64 > 0) == name.endswith("65536")


def test_observed_ends_count_only_super_packets_of_exactly_the_budget(tmp_path):
    # a TX capture's GSO skbs hold up to 129 segments; each of 64 or more was called "at 64 segments (NAPI budget)"
    import pyarrow.parquet as pq

    a = analyze(KERNEL / "egress" / "v6_gso65536.a0.pcap.xz", outdir=tmp_path)
    sp = pq.read_table(tmp_path / "superpackets.parquet").to_pandas()
    flow = max(a.summary["diagnosis"]["flows"], key=lambda f: f["payload_bytes"])
    obs = next(r for r in flow["reasons"] if r["reason"] == "observed")
    rows = sp[(sp.flow_id == flow["flow_id"]) & (sp.flush_reason == "observed")]
    assert (rows.n_segments > 64).sum() >= 3  # the shape that was miscounted
    assert obs["ends"]["napi_budget"] == int((rows.n_segments == 64).sum())
    assert f"{obs['ends']['napi_budget']} at 64 segments (NAPI budget)" in obs["text"]
