"""One test per rule of docs/gso-spec.md, on values worked out by hand from the kernel functions each cites."""

from __future__ import annotations

import numpy as np
import pytest

from bigtcp_pcap.decode.schema import TH_ACK, TH_CWR, TH_ECE, TH_FIN, TH_PSH
from bigtcp_pcap.gso import rules as G
from bigtcp_pcap.gso.config import PROFILES, EgressProfile, ProfileError


def test_g2_limit_is_ge_and_segs_is_gt():
    # gso_features_check: skb->len >= limit masks; exactly one byte less passes
    assert G.g2_over_limit(65536, 45, 65536, 65535)
    assert not G.g2_over_limit(65535, 45, 65536, 65535)
    # gso_segs > gso_max_segs masks; equal passes
    assert G.g2_over_limit(30000, 25, 65536, 24)
    assert not G.g2_over_limit(30000, 24, 65536, 24)
    # elementwise on arrays
    np.testing.assert_array_equal(G.g2_over_limit(np.array([65535, 65536, 100]), np.array([1, 1, 30]), 65536, 24),
                                  [False, True, True])


def test_g3_limit_by_skb_protocol_and_by_l3():
    # untagged IPv6 -> gso_max_size; IPv4 -> gso_ipv4_max_size
    assert G.g3_limit(True, False, False, 185000, 65536) == 185000
    assert G.g3_limit(False, False, False, 185000, 65536) == 65536
    # in-band VLAN tag: skb->protocol is 802.1Q, so today IPv6 gets the IPv4 limit; the series' patch 1 fixes it
    assert G.g3_limit(True, True, False, 185000, 65536) == 65536
    assert G.g3_limit(True, True, True, 185000, 65536) == 185000
    assert G.g3_limit(False, True, True, 185000, 65536) == 65536


def test_g3_profile_coupling_and_series_lookup():
    # netif_set_gso_max_size copies a size <= 65536 to the IPv4 limit, a larger one leaves it at 65536
    assert EgressProfile(gso_max_size=32000).ipv4_limit == 32000
    assert EgressProfile(gso_max_size=185000).ipv4_limit == 65536
    assert EgressProfile(gso_max_size=185000, gso_ipv4_max_size=100000).ipv4_limit == 100000
    assert not EgressProfile().limit_by_l3 and EgressProfile(resegment=True).limit_by_l3
    assert not EgressProfile(resegment=True, vlan_l3_limit=False).limit_by_l3


def test_g3_inband_tags_and_hwaccel():
    # one tag held in skb->vlan_tci: nothing in band; QinQ: the inner tag is in band either way
    assert G.g3_inband_tags(1, 1) == 0 and G.g3_inband_tags(2, 1) == 1 and G.g3_inband_tags(1, 0) == 1
    assert G.g3_inband_tags(0, 1) == 0


def test_g4_software_gso_when_masked_or_tso_off():
    assert G.g4_software_gso(True, True, True)
    assert not G.g4_software_gso(True, False, True)
    assert G.g4_software_gso(True, False, False)  # ethtool -K tso off
    assert not G.g4_software_gso(False, True, False)  # a plain packet is never segmented


def test_g5_segment_count_and_short_last():
    # 184212 bytes at mss 1428 = 129 full segments; 100001 = 70 full + 41
    assert G.g5_gso_segs(184212, 1428) == 129
    assert G.g5_gso_segs(100001, 1428) == 71
    assert G.g5_payload(100001, 70, 1, 1428) == 41
    assert G.g5_payload(100001, 0, 1, 1428) == 1428
    assert G.g5_payload(100001, 0, 71, 1428) == 100001  # a passed skb keeps its payload


def test_g6_seq_advances_by_mss_and_wraps():
    assert G.g6_seq(1000, 3, 1448) == 1000 + 3 * 1448
    assert G.g6_seq(0xFFFFFF00, 1, 1448) == (0xFFFFFF00 + 1448) - 2**32


def test_g7_psh_fin_last_cwr_first():
    f = TH_ACK | TH_PSH | TH_FIN | TH_CWR | TH_ECE
    assert G.g7_flags(f, True, False) == TH_ACK | TH_CWR | TH_ECE
    assert G.g7_flags(f, False, False) == TH_ACK | TH_ECE
    assert G.g7_flags(f, False, True) == TH_ACK | TH_PSH | TH_FIN | TH_ECE
    assert G.g7_flags(f, True, True) == f  # a single output keeps everything


def test_g8_ipv4_id_increments_or_stays_fixed():
    assert G.g8_ip_id(100, 5, False) == 105
    assert G.g8_ip_id(0xFFFE, 3, False) == 1
    assert G.g8_ip_id(100, 5, True) == 100


def test_g8_fixedid_df0_fails_before_6_18():
    assert G.g8_fixedid_fails(True, True, 0, True)
    assert not G.g8_fixedid_fails(True, True, 1, True)  # DF set
    assert not G.g8_fixedid_fails(True, True, 0, False)  # 6.18
    assert not G.g8_fixedid_fails(False, True, 0, True)  # IDs increment: never a problem


def test_g9_hbh_removed_from_segment_headers():
    # ipv6_hopopt_jumbo_remove needs skb->protocol IPv6: under an in-band tag the HBH stays
    assert G.g9_hbh_removed(True, True) and not G.g9_hbh_removed(True, False)
    # Ethernet 14 + IPv6 40 + HBH 8 + TCP 32: the TCP header starts at 62, the segments' headers are 86 bytes
    assert G.g9_header_len(62, 32, 1) == 86
    assert G.g9_header_len(70, 32, 0) == 102  # QinQ (+8), HBH kept: 1428-byte segments are 1530-byte frames
    assert G.g9_header_len(34, 32, 0) == 66  # IPv4: nothing removed
    assert G.g9_frame_len(86, 1428) == 1514


def test_g10_resegment_trigger():
    assert G.g10_resegment(True, True, True, 0, 0, True)
    assert not G.g10_resegment(True, True, True, 0, 0, False)  # today's kernel
    assert not G.g10_resegment(True, False, True, 0, 0, True)  # within the limits: passes whole
    assert not G.g10_resegment(True, True, False, 0, 0, True)  # the device does not offload the type
    assert not G.g10_resegment(True, True, True, 1, 0, True)  # encapsulated
    assert not G.g10_resegment(True, True, True, 0, 1, True)  # frag_list


def test_g11_group_fits_size_and_segs():
    # limit 65536, 86 header bytes, mss 1428: (65535 - 86) // 1428 = 45 segments (86 + 45 * 1428 = 64346 < 65536)
    assert G.g11_group_segs(65536, 65535, 86, 1428) == 45
    assert 86 + 46 * 1428 >= 65536
    assert G.g11_group_segs(65536, 24, 86, 1428) == 24
    assert G.g11_group_segs(1000, 65535, 86, 1428) == 1  # never 0


def test_g12_plain_frame_over_mtu_dropped_gso_exempt():
    assert G.g12_mtu_drop(False, 1501, 1500)
    assert not G.g12_mtu_drop(False, 1500, 1500)
    assert not G.g12_mtu_drop(True, 60000, 1500)


def test_g14_mss_from_syn_and_gso_threshold():
    assert G.g14_mss(1440, 32) == 1428  # IPv6, timestamps
    assert G.g14_mss(1460, 32) == 1448  # IPv4, timestamps
    assert not G.g14_is_gso(1428, 1428) and G.g14_is_gso(1429, 1428)


def test_rules_compile_with_numba():
    """The rules are numba-compilable on scalars and give the same values as in Python."""
    numba = pytest.importorskip("numba")
    cases = {
        "G2": (65536, 45, 65536, 65535), "G3": (True, True, False, 185000, 65536), "G3b": (2, 1), "G4": (True, False, False),
        "G5": (100001, 1428), "G5b": (100001, 70, 1, 1428), "G6": (0xFFFFFF00, 1, 1448),
        "G7": (TH_ACK | TH_PSH | TH_CWR, False, True), "G8": (0xFFFE, 3, False), "G8b": (True, True, 0, True), "G9": (True, False), "G9b": (62, 32, 1),
        "G9c": (86, 1428), "G10": (True, True, True, 0, 0, True), "G11": (65536, 65535, 86, 1428),
        "G12": (False, 1501, 1500), "G14": (1440, 32), "G14b": (1429, 1428),
    }
    assert set(cases) == set(G.RULES)
    for rule, args in cases.items():
        f = G.RULES[rule]
        assert numba.njit(f)(*args) == f(*args), rule


def test_profile_validation_to_kernel_ranges():
    with pytest.raises(ProfileError, match="tso_max_size"):
        EgressProfile(gso_max_size=131073, tso_max_size=131072)
    with pytest.raises(ProfileError, match="524280"):
        EgressProfile(tso_max_size=524288)
    with pytest.raises(ProfileError, match="gso_max_segs"):
        EgressProfile(gso_max_segs=0)
    with pytest.raises(ProfileError, match="mtu"):
        EgressProfile(mtu=67)
    assert PROFILES["ice"].tso_max_size == 131072 and PROFILES["mlx4"].tso_max_size == 524280


def test_from_ip_link_json_reads_real_output():
    doc = ('[{"ifindex": 3, "ifname": "b1", "mtu": 9000, "gso_max_size": 100000, "gso_max_segs": 24, '
           '"tso_max_size": 524280, "tso_max_segs": 65535, "gso_ipv4_max_size": 90000}]')
    p = EgressProfile.from_ip_link_json(doc, source="b1.json", tso=False)
    assert (p.gso_max_size, p.gso_max_segs, p.mtu, p.ipv4_limit, p.tso) == (100000, 24, 9000, 90000, False)
    for bad, what in (("{", "not JSON"), ("[]", "array of 0"), ('{"a": 1}', "no 'ifname'"),
                      ('[{"ifname": "x", "mtu": 1500}]', "has no gso_max_size")):
        with pytest.raises(ProfileError, match=what) as e:
            EgressProfile.from_ip_link_json(bad, source="f.json")
        assert str(e.value).startswith("f.json: ") and "\n" not in str(e.value)


def test_engine_fixedid_ids_and_the_pre_6_18_failure():
    """G8 through the engine: a FIXEDID skb's segments all carry the first ID on 6.18; with DF=0 on 6.17 the
    skb cannot be segmented and is dropped (forwarded GRO output with fixed IDs, e.g.)."""
    from pathlib import Path

    from bigtcp_pcap.api import iter_batches
    from bigtcp_pcap.gso.engine import ACTION_DROPPED, ACTION_SEGMENTED, EgressEngine

    cap = Path(__file__).resolve().parents[1] / "fixtures" / "kernel" / "egress" / "v4_gso65536.a0.pcap.xz"
    (pb, _), = list(iter_batches(cap))
    fid = np.zeros(len(pb), np.int64)
    pb.df[:] = 0
    new = EgressEngine(EgressProfile(kernel="6.18"), fixedid=True).feed(pb, fid)
    seg = new.action == ACTION_SEGMENTED
    assert seg.sum() > 100
    first_ids = {f: i for f, i, k in zip(new.source_frame[seg], new.ip_id[seg], new.out_index[seg]) if k == 0}
    assert all(first_ids[f] == i for f, i in zip(new.source_frame[seg], new.ip_id[seg]))
    old = EgressEngine(EgressProfile(kernel="6.17"), fixedid=True).feed(pb, fid)
    assert (old.action == ACTION_SEGMENTED).sum() == 0
    assert (old.action == ACTION_DROPPED).sum() == len(first_ids)
