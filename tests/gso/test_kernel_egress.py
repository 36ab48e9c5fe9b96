"""The egress engine against real Linux segmentation: a0's super-packets in, b1's transmitted packets out.

Each pair in tests/fixtures/kernel/egress (made by scripts/make_egress_captures.py on a 6.18 kernel: BIG TCP
sender a0 -> veth -> bridge -> port b1 -> veth -> b0) holds ``<name>.a0.pcap.xz`` (what the sender handed its
device), ``<name>.b1.pcap.xz`` (what the bridge port transmitted after its egress decision) and
``<name>.json`` (every setting, read back from the kernel). The profile comes from that read-back (``ip -d -j
link show b1``, rtnetlink's gso_ipv4_max_size, ``ethtool -k b1``), not from the scenario's intent. b1's side is
parsed by the capture script's own stdlib parser, not by the toolkit's decoder. Nothing here depends on timing,
so the match must be exact.
"""

from __future__ import annotations

import collections
import json
import lzma
import sys
from pathlib import Path

import pytest

import bigtcp_pcap
from bigtcp_pcap.gso.config import EgressProfile

ROOT = Path(__file__).resolve().parents[2]
EGRESS_DIR = ROOT / "tests" / "fixtures" / "kernel" / "egress"
PAIRS = sorted(p.stem for p in EGRESS_DIR.glob("*.json"))
sys.path.insert(0, str(ROOT / "scripts"))
from make_kernel_captures import parse_frame, read_pcap  # the capture script's stdlib parser

SERVER_PORT = 5201


def recorded_profile(name: str) -> EgressProfile:
    """b1's profile as the kernel reported it after the run's settings were applied."""
    b1 = json.loads((EGRESS_DIR / f"{name}.json").read_text())["interfaces"]["b1"]
    tso = next(ln for ln in b1["ethtool_k"] if ln.startswith("tcp-segmentation-offload:")).split()[1] == "on"
    return EgressProfile.from_ip_link_json(b1["ip_d_j_link_show"], source=f"{name}.json",
                                           gso_ipv4_max_size=b1["rtnetlink_sizes"]["gso_ipv4_max_size"], tso=tso)


def b1_data_packets(name: str, tmp: Path) -> collections.Counter:
    """(sport, dport, seq, payload, frame_len) of every data packet b1 sent towards the server."""
    raw = tmp / f"{name}.b1.pcap"
    raw.write_bytes(lzma.decompress((EGRESS_DIR / f"{name}.b1.pcap.xz").read_bytes()))
    out: collections.Counter = collections.Counter()
    for ts, orig, d in read_pcap(raw):
        p = parse_frame(ts, orig, d)
        if p is not None and p.dport == SERVER_PORT and p.payload > 0:
            out[(p.sport, p.dport, p.seq, p.payload, p.frame_len)] += 1
    return out


def predicted(name: str, tmp: Path):
    res = bigtcp_pcap.egress(EGRESS_DIR / f"{name}.a0.pcap.xz", outdir=tmp / name, profile=recorded_profile(name))
    t = res.table
    t = t[(t.dport == SERVER_PORT) & (t.payload_len > 0)]
    keys = zip(t.sport.astype(int), t.dport.astype(int), t.seq.astype(int), t.payload_len.astype(int),
               t.frame_len.astype(int))
    return collections.Counter(keys), t, res


def test_pairs_present():
    assert len(PAIRS) >= 8, PAIRS


@pytest.mark.parametrize("name", PAIRS)
def test_replay_matches_b1_exactly(name, tmp_path):
    want = b1_data_packets(name, tmp_path)
    got, _table, res = predicted(name, tmp_path)
    common = sum((want & got).values())
    assert sum(want.values()) >= 20
    assert common == sum(want.values()) == sum(got.values()), (
        f"{name}: {common} of {sum(want.values())} b1 packets predicted; missing {list((want - got).items())[:3]}, "
        f"extra {list((got - want).items())[:3]}")
    assert res.summary["bytes_conserved"]


@pytest.mark.parametrize("name", PAIRS)
def test_ip_id_and_flags_match_b1(name, tmp_path):
    """G7/G8 on the kernel: the IPv4 IDs and TCP flags of every segment equal b1's, as the toolkit's decoder
    reads b1 (the IDs increment per segment, PSH stays on the last, from the same a0 skb)."""
    _, t, _ = predicted(name, tmp_path)
    got = collections.Counter(zip(t.seq.astype(int), t.ip_id.astype(int), t.tcp_flags.astype(int)))
    want: collections.Counter = collections.Counter()
    for pb, _ in bigtcp_pcap.iter_batches(EGRESS_DIR / f"{name}.b1.pcap.xz"):
        m = (pb.l4_proto == 6) & (pb.dport == SERVER_PORT) & (pb.tcp_payload_len > 0)
        want.update(zip(pb.tcp_seq[m].tolist(), pb.ip_id[m].tolist(), pb.tcp_flags[m].tolist()))
    assert got == want


def test_limit_is_ge_on_skb_len_with_l2_and_hbh(tmp_path):
    """G2 on the kernel: b1 gso_max_size 184306 (= the frame length of a0's largest skbs, 14 + 40 + 8 + 32 +
    129 * 1428) cuts them; 184307 lets them pass. A test on the L3 length, or '>', would pass both."""
    _, t_eq, _ = predicted("v6_edge", tmp_path)
    _, t_p1, _ = predicted("v6_edge_plus1", tmp_path)
    cut = t_eq[(t_eq.action == "segmented") & (t_eq.out_index == 0)]
    assert len(cut) >= 1
    assert set(cut.gso_segs.astype(int)) == {1}
    assert (t_p1.action == "passed").all() and (t_p1.frame_len == 184306).sum() >= 1
    a0_big = [orig for _, orig, _ in read_pcap_xz("v6_edge.a0", tmp_path) if orig == 184306]
    assert len(a0_big) == len(cut)


def read_pcap_xz(stem: str, tmp: Path):
    raw = tmp / f"{stem}.pcap"
    raw.write_bytes(lzma.decompress((EGRESS_DIR / f"{stem}.pcap.xz").read_bytes()))
    return list(read_pcap(raw))


def test_gso_max_segs_cuts_only_above_the_count(tmp_path):
    """G2 (segments): with gso_max_segs 24 every skb of more than 24 segments is cut and every one of 24 or
    fewer passes whole, as b1 showed (the replay test checks the packets; this checks the split)."""
    for name in ("v6_segs24", "v4_segs24"):
        _, t, _ = predicted(name, tmp_path)
        first = t[t.out_index == 0]
        passed = first[first.action == "passed"]
        assert passed.gso_segs.max() <= 24
        seg = t[t.action == "segmented"].groupby("source_frame").size()
        assert len(seg) >= 1 and seg.min() > 24


def test_vlan_tagged_ipv6_gets_the_ipv4_limit(tmp_path):
    """G3 on the kernel: QinQ-tagged IPv6 through b1 with gso_max_size 185000 and gso_ipv4_max_size 65536. The
    inner tag is in band, so skb->protocol is 802.1Q and the IPv4 limit cut every skb >= 65536 (b1 sent nothing
    that large); the series' L3 lookup (patch 1) would have passed them whole. Under the in-band tag the
    segments keep the HBH jumbo header (G9: ipv6_hopopt_jumbo_remove needs skb->protocol IPv6)."""
    name = "v6_qinq_g3"
    prof = recorded_profile(name)
    assert (prof.gso_max_size, prof.ipv4_limit) == (185000, 65536)
    today = bigtcp_pcap.egress(EGRESS_DIR / f"{name}.a0.pcap.xz", profile=prof).summary["inputs_by_action"]
    series = bigtcp_pcap.egress(EGRESS_DIR / f"{name}.a0.pcap.xz",
                                profile=prof.with_overrides(vlan_l3_limit=True)).summary["inputs_by_action"]
    assert today["segmented"] >= 1 and series["segmented"] == 0
    frames = [(orig, d) for _, orig, d in read_pcap_xz(f"{name}.b1", tmp_path)]
    assert max(orig for orig, _ in frames) < 65536
    seg = [d for orig, d in frames if orig == 14 + 8 + 40 + 8 + 32 + 1428]
    assert seg and all(d[22 + 6] == 0 for d in seg)  # IPv6 next header 0: the HBH is still there
