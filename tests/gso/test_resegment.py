"""--resegment (seed 003; not in this kernel, so proved by construction) on the committed kernel a0 captures.

For every input skb the series cuts (G10/G11): every output fits the profile's limits (the G2 test passes on
it), its bytes and sequence space are exactly the input's, the wire packets its outputs imply (G4-G9 applied to
each output GSO skb, as a TSO device would) equal today's software segmentation of the same input, and it
needs fewer skbs than that segmentation.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest

from bigtcp_pcap.api import iter_batches
from bigtcp_pcap.flows.table import FlowTable
from bigtcp_pcap.gso import rules as G
from bigtcp_pcap.gso.config import PROFILES, EgressProfile
from bigtcp_pcap.gso.engine import ACTION_RESEGMENTED, ACTION_SEGMENTED, EgressBatch, EgressEngine

EGRESS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "kernel" / "egress"
CAPTURES = sorted(EGRESS_DIR.glob("v[46]_*.a0.pcap.xz"))
PROFILES_UNDER_TEST = {
    "gso65536": EgressProfile(),
    "gso100000": EgressProfile(gso_max_size=100000, gso_ipv4_max_size=100000),
    "segs24": EgressProfile(gso_max_size=185000, gso_max_segs=24),
    "ice": PROFILES["ice"],
}


def run(capture: Path, prof: EgressProfile) -> EgressBatch:
    eng, flows, parts = EgressEngine(prof), FlowTable(), []
    for pb, _ in iter_batches(capture):
        parts.append(eng.feed(pb, flows.assign(pb)))
    return EgressBatch.concat(parts)


def implied_wire(eb: EgressBatch, mss: np.ndarray) -> collections.Counter:
    """What a TSO device sends for each output: G5-G9 on the output GSO skb (one MSS per packet)."""
    out: collections.Counter = collections.Counter()
    for i in range(len(eb)):
        n = int(eb.gso_segs[i])
        hdr = int(eb.frame_len[i]) - int(eb.payload_len[i])
        for k in range(n):
            pay = int(G.g5_payload(int(eb.payload_len[i]), k, 1, int(mss[i])))
            out[(int(eb.source_frame[i]), int(G.g6_seq(int(eb.seq[i]), k, int(mss[i]))), pay, hdr + pay,
                 int(G.g8_ip_id(int(eb.ip_id[i]), k, False)) if eb.ip_version[i] == 4 else 0,
                 int(G.g7_flags(int(eb.tcp_flags[i]), k == 0, k == n - 1)))] += 1
    return out


@pytest.mark.parametrize("pname", sorted(PROFILES_UNDER_TEST))
@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name.split(".")[0])
def test_resegment_by_construction(capture, pname):
    # both runs with the series' L3 limit lookup (patch 1), so that the same skbs are over the limit; today's
    # skb->protocol lookup cuts more of the QinQ pair's skbs (test_kernel_egress checks that one)
    base = PROFILES_UNDER_TEST[pname].with_overrides(vlan_l3_limit=True)
    today = run(capture, base)
    series = run(capture, base.with_overrides(resegment=True))
    cut = np.unique(today.source_frame[today.action == ACTION_SEGMENTED])
    reseg_frames = np.unique(series.source_frame[series.action == ACTION_RESEGMENTED])
    np.testing.assert_array_equal(cut, reseg_frames)  # same inputs (TSO on: G10 applies wherever G2 cuts)
    if cut.size == 0:  # nothing over this device's limits: both behaviours pass every skb whole
        assert len(series) == len(today) and not (series.action == ACTION_RESEGMENTED).any()
        np.testing.assert_array_equal(series.source_frame, today.source_frame)
        return
    r = series.action == ACTION_RESEGMENTED
    rs = EgressBatch(**{k: v[r] for k, v in series.to_dict().items()})
    v6 = rs.ip_version == 6
    limit = np.where(v6, base.gso_max_size, base.ipv4_limit)
    # every output fits: the G2 test of the same device passes on it
    assert not G.g2_over_limit(rs.frame_len.astype(np.int64), rs.gso_segs, limit, base.gso_max_segs).any()
    # bytes and sequence space per input skb: contiguous outputs covering exactly the input's payload
    t = today.action == ACTION_SEGMENTED
    for f in cut.tolist():
        o = rs.source_frame == f
        seqs, pays = rs.seq[o].astype(np.int64), rs.payload_len[o].astype(np.int64)
        assert np.all((seqs[1:] - seqs[:-1]) % 2**32 == pays[:-1])
        ts = today.source_frame == f
        assert pays.sum() == today.payload_len[t & ts].sum()
        assert seqs[0] == today.seq[t & ts][0]
        assert o.sum() < (t & ts).sum()  # fewer skbs than segmentation
        assert (rs.gso_segs[o][:-1] == rs.gso_segs[o][0]).all()  # maximal groups, the rest last
    # the wire packets the outputs imply are today's segments, field for field
    mss = np.where(rs.gso_segs > 1, rs.gso_size, rs.payload_len)
    want = collections.Counter(zip(today.source_frame[t].tolist(), today.seq[t].tolist(),
                                   today.payload_len[t].tolist(), today.frame_len[t].tolist(),
                                   np.where(today.ip_version[t] == 4, today.ip_id[t], 0).tolist(),
                                   today.tcp_flags[t].tolist()))
    assert implied_wire(rs, mss) == want


def test_resegment_ice_numbers():
    """A 184306-byte IPv6 skb (129 x 1428) on ice (131072): 91 segments (86 + 91 * 1428 = 130034 < 131072)
    then 38; two skbs instead of 129 packets."""
    eb = run(EGRESS_DIR / "v6_edge.a0.pcap.xz", PROFILES["ice"].with_overrides(resegment=True))
    r = eb.action == ACTION_RESEGMENTED
    total = collections.Counter()
    for f, p in zip(eb.source_frame[r].tolist(), eb.payload_len[r].tolist()):
        total[f] += p
    big = [f for f, p in total.items() if p == 129 * 1428]
    assert len(big) >= 1
    for f in big:
        o = eb.source_frame == f
        assert eb.gso_segs[o].tolist() == [91, 38]
        assert eb.frame_len[o].tolist() == [86 + 91 * 1428, 86 + 38 * 1428]
