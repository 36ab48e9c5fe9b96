"""One test per GRO rule (gro-spec.md R2, R4-R23), built from hand-made segment streams.

Every test asserts exact super-packet segment counts, payload lengths and flush reasons, and runs on both
engines (the compiled one users get, and the reference): the rules themselves live once, in gro/rules.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from bigtcp_pcap.decode.schema import (
    BIGTCP_HBH_JUMBO,
    BIGTCP_NONE,
    BIGTCP_V4_TOTLEN0,
    BIGTCP_V6_PLEN0,
    ST_IP_FRAGMENT,
    ST_MALFORMED,
    ST_TRUNC_L4,
    TH_ACK,
    TH_CWR,
    TH_ECE,
    TH_FIN,
    TH_PSH,
    TH_SYN,
)
from bigtcp_pcap.gro import GroConfig, SuperPacketBatch, make_engine, synth
from bigtcp_pcap.gro.prepare import prepare
from bigtcp_pcap.gro.synth import SynthFlow, build_batch, flow_ids, simulate

US = 1000


@pytest.fixture(autouse=True, params=["compiled", "reference"])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test of this module once per engine: ``simulate`` builds the engine named here."""
    monkeypatch.setattr(synth, "ENGINE", request.param)
    return request.param


def segs(r: SuperPacketBatch) -> list[int]:
    return r.n_segments.tolist()


def summary(r: SuperPacketBatch) -> list[tuple[int, int, str]]:
    """(first_frame, n_segments, reason) per row, in delivery order."""
    return list(zip(r.first_frame.tolist(), r.n_segments.tolist(), r.reason_labels(), strict=True))


def hash_of(**flow) -> int:
    """The engine's flow hash (skb->hash stand-in) of a SynthFlow's packets."""
    p = [SynthFlow(**flow).segment()]
    return int(prepare(build_batch(p), flow_ids(p), GroConfig()).flow_hash[0])


# --- R2: already aggregated input (GSO skbs) ------------------------------------------------------------------
def _handshake_mss(mss: int = 1440) -> list[dict]:
    """The receiver's SYN-ACK (reverse direction) advertising an MSS option."""
    rev = SynthFlow(sport=5201, dport=40000, src=0xFD00_00B1 << 96 | 2, dst=0xFD00_00B1 << 96 | 1, t0_ns=0)
    return [rev.pure_ack(tcp_flags=TH_SYN | TH_ACK, tcp_mss=mss, tcp_hdr_len=40)]


def test_r2_observed_aggregate_not_a_multiple_of_mss_goes_alone():
    f = SynthFlow(t0_ns=1 * US)
    r = simulate(_handshake_mss(1440) + [f.segment(10 * 1428 + 100)])
    assert len(r) == 1
    row = r.row(0)
    assert (row["source"], row["n_segments"], row["gso_size"], row["payload_len"]) == (1, 11, 1428, 14380)
    assert r.reason_labels() == ["short_segment"]


def test_r2_gso_input_counts_gso_segs_and_merges_plain_segments():
    f = SynthFlow(t0_ns=1 * US)
    r = simulate(_handshake_mss(1440) + [f.segment(10 * 1428)] + f.segments(2))
    assert summary(r) == [(2, 12, "end_of_capture")]
    assert r.source.tolist() == [0]  # rebuilt: GRO added segments to the observed aggregate
    assert r.payload_len.tolist() == [12 * 1428]


def test_r2_gso_input_alone_is_reported_as_observed():
    f = SynthFlow(t0_ns=1 * US)
    r = simulate(_handshake_mss(1440) + [f.segment(10 * 1428)])
    assert (segs(r), r.source.tolist(), r.gso_size.tolist()) == ([10], [1], [1428])


def test_r2_without_syn_fallback_mtu_detects_aggregates():
    f = SynthFlow(ip_version=4, mss=1448)
    r = simulate(f.segments(2) + [f.segment(3000, tcp_flags=TH_ACK | TH_PSH)])
    # 3000 > 1500 - 20 - 20: an aggregate; gso_size = the largest plain segment seen (1448)
    assert summary(r) == [(1, 5, "psh")]  # merged: 2 plain + ceil(3000/1448) = 3 GSO segments, then PSH
    assert r.payload_len.tolist() == [2 * 1448 + 3000]


def test_r2_input_is_gso_false_treats_big_packets_as_plain_segments():
    pk = _handshake_mss(1440) + [SynthFlow(t0_ns=1 * US).segment(10 * 1428)]
    f2 = SynthFlow(t0_ns=2 * US, seq=1000 + 10 * 1428)
    pk += f2.segments(1)
    r = simulate(pk, input_is_gso=False)
    # mss = 14280 (first segment); a 1428 segment merges and, being shorter than mss, completes p (R16)
    assert summary(r) == [(2, 2, "short_segment")]
    assert r.source.tolist() == [0]


# --- R4: L2 flow match, RX queues -----------------------------------------------------------------------------
def test_r4_different_mac_header_never_merges():
    a = SynthFlow(l2_hash=1)
    b = SynthFlow(l2_hash=2, t0_ns=500)
    r = simulate([a.segment(), b.segment(), a.segment(), b.segment()])
    assert summary(r) == [(1, 2, "end_of_capture"), (2, 2, "end_of_capture")]


def test_r4_different_vlan_never_merges():
    a = SynthFlow(vlan=10)
    b = SynthFlow(vlan=20, t0_ns=500)
    r = simulate([a.segment(), b.segment(), a.segment(), b.segment()])
    assert sorted(segs(r)) == [2, 2]


def test_r4_flows_on_different_rx_queues_have_separate_tables_and_budgets():
    ports = [p for p in range(40000, 40100)]
    qs = {p: (hash_of(sport=p) >> 32) % 2 for p in ports}
    pa = ports[0]
    pb = next(p for p in ports if qs[p] != qs[pa])
    a = SynthFlow(sport=pa, flow_id=1)
    b = SynthFlow(sport=pb, flow_id=2, t0_ns=500)
    pk = [x for _ in range(64) for x in (a.segment(), b.segment())]
    one = simulate(pk, gro_max_size=185000, rx_queues=1)
    two = simulate(pk, gro_max_size=185000, rx_queues=2)
    # one queue: 128 packets = two 64-packet polls, each holding 32 segments of each flow
    assert segs(one) == [32, 32, 32, 32]
    # two queues: each flow has its own NAPI budget of 64
    assert sorted(segs(two)) == [64, 64]


# --- R5: IPv4 give-up cases -----------------------------------------------------------------------------------
def test_r5_ipv4_options_delivered_alone_and_overtake_held_packet():
    f = SynthFlow(ip_version=4, mss=1448)
    pk = f.segments(2) + [f.segment(ip_hdr_len=24)] + f.segments(2)
    r = simulate(pk)
    # the options packet goes alone at once (overtaking p); the next segment finds a hole in p (seq_gap)
    assert summary(r) == [(3, 1, "not_mergeable_alone"), (1, 2, "seq_gap"), (4, 2, "end_of_capture")]


def test_r5_ipv4_options_pure_ack_leaves_held_packet_untouched():
    f = SynthFlow(ip_version=4, mss=1448)
    pk = f.segments(2) + [f.pure_ack(ip_hdr_len=24, ip_id=999)] + f.segments(1)  # ID 999: keep 100, 101, 102
    assert summary(simulate(pk)) == [(1, 3, "end_of_capture")]
    g = SynthFlow(ip_version=4, mss=1448)
    plain = g.segments(2) + [g.pure_ack(ip_id=999)] + g.segments(1)  # the same ACK without options flushes p
    assert summary(simulate(plain)) == [(1, 2, "no_payload"), (4, 1, "end_of_capture")]


def test_r5_ipv4_fragment_leaves_held_packet_untouched():
    f = SynthFlow(ip_version=4, mss=1448)
    pk = f.segments(2) + [f.pure_ack(status=ST_IP_FRAGMENT, ip_id=999)] + f.segments(1)
    assert summary(simulate(pk)) == [(1, 3, "end_of_capture")]


# --- R6: IPv4 same-flow keys ----------------------------------------------------------------------------------
def test_r6_different_addresses_are_different_flows():
    a = SynthFlow(ip_version=4, mss=1448, dst=0x0A000002)
    b = SynthFlow(ip_version=4, mss=1448, dst=0x0A000003, t0_ns=500)
    r = simulate([a.segment(), b.segment(), a.segment(), b.segment()])
    assert sorted(segs(r)) == [2, 2]
    assert set(r.reason_labels()) == {"end_of_capture"}


# --- R7: flush-marking at L3 (IPv4) ---------------------------------------------------------------------------
def test_r7_ethernet_padding_flush_marks_the_packet():
    f = SynthFlow(ip_version=4, mss=1448, tcp_hdr_len=20)
    pk = f.segments(2) + [f.segment(2, wirelen=60)]  # ip_len 42, 46 L3 bytes in the frame
    assert summary(simulate(pk)) == [(1, 2, "flush_marked"), (3, 1, "flush_marked")]
    assert summary(simulate(pk, treat_padding_as_flush=False)) == [(1, 3, "short_segment")]


def test_r7_bigtcp_input_with_tot_len_0_is_flush_marked():
    f = SynthFlow(ip_version=4, mss=1448)
    pk = f.segments(2) + [f.segment(20 * 1448, ip_len_field=0, bigtcp=BIGTCP_V4_TOTLEN0)]
    r = simulate(pk)
    assert summary(r) == [(1, 2, "flush_marked"), (3, 20, "flush_marked")]
    assert r.source.tolist() == [0, 1]
    assert r.bigtcp.tolist() == [BIGTCP_NONE, BIGTCP_V4_TOTLEN0]


def test_r7_evil_bit_flush_marks():
    f = SynthFlow(ip_version=4, mss=1448)
    pk = f.segments(2) + [f.segment(ip_evil=1)] + f.segments(1)
    assert summary(simulate(pk)) == [(1, 2, "flush_marked"), (3, 1, "flush_marked"), (4, 1, "end_of_capture")]


# --- R8: L3 mergeability (IPv4) -------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [("ttl", 63), ("tos", 0x03), ("df", 0)])
def test_r8_ttl_tos_df_change_flushes(field, value):
    f = SynthFlow(ip_version=4, mss=1448)
    pk = f.segments(2) + f.segments(2, **{field: value})
    assert summary(simulate(pk)) == [(1, 2, "ip_change"), (3, 2, "end_of_capture")]


# --- R9: IPv6 extension headers -------------------------------------------------------------------------------
def test_r9_fragment_header_leaves_held_packet_untouched():
    f = SynthFlow()
    pk = f.segments(2) + [f.pure_ack(status=ST_IP_FRAGMENT)] + f.segments(1)
    assert summary(simulate(pk)) == [(1, 3, "end_of_capture")]


def test_r9_walkable_extension_headers_still_aggregate():
    f = SynthFlow(ip_hdr_len=48, ext_len=8, ext_hash=0x77)
    r = simulate(f.segments(3))
    assert summary(r) == [(1, 3, "end_of_capture")]
    assert r.l3_len.tolist() == [48 + 32 + 3 * 1428]


# --- R10: IPv6 same-flow keys ---------------------------------------------------------------------------------
def test_r10_flow_label_change_makes_a_separate_entry_without_flushing():
    f = SynthFlow(flow_label=1)
    pk = f.segments(2) + f.segments(2, flow_label=2)
    r = simulate(pk)
    got = sorted(summary(r))
    assert got == [(1, 2, "end_of_capture"), (3, 2, "end_of_capture")]


def test_r10_extension_header_bytes_must_match():
    f = SynthFlow(ip_hdr_len=48, ext_len=8, ext_hash=0x77)
    pk = f.segments(2) + f.segments(2, ext_hash=0x78)
    assert sorted(summary(simulate(pk))) == [(1, 2, "end_of_capture"), (3, 2, "end_of_capture")]


# --- R11: IPv6 flush-marking and mergeability -----------------------------------------------------------------
@pytest.mark.parametrize("field,value", [("ttl", 63), ("tos", 0x03)])
def test_r11_hop_limit_or_traffic_class_change_flushes(field, value):
    f = SynthFlow()
    pk = f.segments(2) + f.segments(2, **{field: value})
    assert summary(simulate(pk)) == [(1, 2, "ip_change"), (3, 2, "end_of_capture")]


def test_r11_payload_len_mismatch_flush_marks():
    f = SynthFlow()
    pk = f.segments(2) + [f.segment(ip_len_field=0, bigtcp=BIGTCP_V6_PLEN0)] + f.segments(1)
    assert summary(simulate(pk)) == [(1, 2, "flush_marked"), (3, 1, "flush_marked"), (4, 1, "end_of_capture")]


# --- R12: TCP header/checksum give-up -------------------------------------------------------------------------
def test_r12_malformed_tcp_header_leaves_held_packet_untouched():
    f = SynthFlow()
    pk = f.segments(2) + [f.pure_ack(status=ST_MALFORMED)] + f.segments(1)
    assert summary(simulate(pk)) == [(1, 3, "end_of_capture")]


def test_r12_tcp_header_cut_by_snaplen_is_delivered_alone():
    """The fixed 20 bytes cut (the decoder then gives no tcp_hdr_len): nothing to compare, delivered alone."""
    f = SynthFlow()
    pk = f.segments(2) + [f.segment(status=ST_TRUNC_L4, tcp_hdr_len=0)]
    assert summary(simulate(pk)) == [(3, 1, "not_mergeable_alone"), (1, 2, "end_of_capture")]


def test_r12_tcp_options_cut_by_snaplen_merge_compared_as_captured():
    """Only options cut (the kernel had them): merged when the captured option bytes are equal (R14.4 on their
    digest), an option change where they differ."""
    f = SynthFlow()
    pk = f.segments(2) + [f.segment(status=ST_TRUNC_L4)]
    assert summary(simulate(pk)) == [(1, 3, "end_of_capture")]
    g = SynthFlow()
    pk = g.segments(2) + [g.segment(status=ST_TRUNC_L4, tcp_opt_hash=0xCD)]
    assert summary(simulate(pk)) == [(1, 2, "option_change"), (3, 1, "end_of_capture")]


# --- R13: ports -----------------------------------------------------------------------------------------------
def test_r13_different_ports_are_different_flows():
    a = SynthFlow(sport=40000)
    b = SynthFlow(sport=40001, t0_ns=500)
    r = simulate([a.segment(), b.segment(), a.segment(), b.segment()])
    assert sorted(segs(r)) == [2, 2]


# --- R14: merge preconditions ---------------------------------------------------------------------------------
def _cwr_stream() -> list[dict]:
    f = SynthFlow()
    return [f.segment(), f.segment(tcp_flags=TH_ACK | TH_CWR), f.segment()]


def test_r14_1_cwr_starts_a_new_super_packet_up_to_6_19():
    assert summary(simulate(_cwr_stream(), kernel="6.18")) == [(1, 1, "cwr"), (2, 2, "end_of_capture")]


def test_r14_1_cwr_is_compared_like_other_flags_on_7_0():
    assert summary(simulate(_cwr_stream(), kernel="7.0")) == [(1, 1, "cwr"), (2, 1, "cwr"), (3, 1, "end_of_capture")]


def test_r14_2_window_change_flushes():
    f = SynthFlow()
    pk = f.segments(2) + f.segments(2, tcp_win=600)
    assert summary(simulate(pk)) == [(1, 2, "window_change"), (3, 2, "end_of_capture")]


def test_r14_2_ece_flag_change_flushes():
    f = SynthFlow()
    pk = f.segments(2) + f.segments(2, tcp_flags=TH_ACK | TH_ECE)
    assert summary(simulate(pk)) == [(1, 2, "flags"), (3, 2, "end_of_capture")]


def test_r14_2_data_offset_change_flushes():
    f = SynthFlow()
    pk = f.segments(2) + f.segments(2, tcp_hdr_len=20, tcp_opt_hash=0)
    assert summary(simulate(pk)) == [(1, 2, "option_change"), (3, 2, "end_of_capture")]


def test_r14_3_ack_change_flushes():
    f = SynthFlow()
    pk = f.segments(2) + f.segments(2, tcp_ack=5000)
    assert summary(simulate(pk)) == [(1, 2, "ack_change"), (3, 2, "end_of_capture")]


def test_r14_4_option_change_flushes():
    f = SynthFlow()
    pk = f.segments(2) + f.segments(2, tcp_opt_hash=0xAC)  # e.g. a TSval tick
    assert summary(simulate(pk)) == [(1, 2, "option_change"), (3, 2, "end_of_capture")]


def test_r14_5_incrementing_ip_ids_merge():
    f = SynthFlow(ip_version=4, mss=1448)  # IDs 100, 101, 102
    assert segs(simulate(f.segments(3))) == [3]


@pytest.mark.parametrize("kernel,df,expected", [
    ("6.18", 1, [3]), ("6.18", 0, [3]),  # 6.18: fixed IDs are fine whatever DF says
    ("6.17", 1, [3]), ("6.17", 0, [1, 1, 1]),  # <= 6.17: fixed-ID mode needs DF=1
])
def test_r14_5_fixed_ip_id_depends_on_kernel_and_df(kernel, df, expected):
    f = SynthFlow(ip_version=4, mss=1448)
    pk = f.segments(3, ip_id=7, df=df)
    r = simulate(pk, kernel=kernel)
    assert segs(r) == expected
    if expected == [1, 1, 1]:
        assert r.reason_labels() == ["ip_id", "ip_id", "end_of_capture"]


def test_r14_5_fixed_id_mode_then_increment_flushes():
    f = SynthFlow(ip_version=4, mss=1448)
    pk = f.segments(2, ip_id=7) + [f.segment(ip_id=8)]
    assert summary(simulate(pk)) == [(1, 2, "ip_id"), (3, 1, "end_of_capture")]


def test_r14_5_skipped_ip_id_flushes():
    f = SynthFlow(ip_version=4, mss=1448)
    pk = [f.segment(ip_id=7), f.segment(ip_id=9)]
    assert summary(simulate(pk)) == [(1, 1, "ip_id"), (2, 1, "end_of_capture")]


def test_r14_6_first_segment_shorter_than_the_next_is_alone():
    f = SynthFlow()
    pk = [f.segment(1000)] + f.segments(2)
    r = simulate(pk)
    assert summary(r) == [(1, 1, "mss_exceeded"), (2, 2, "end_of_capture")]
    assert r.payload_len.tolist() == [1000, 2856]


def test_r14_6_zero_payload_packet_flushes_and_is_not_a_row():
    f = SynthFlow()
    pk = f.segments(2) + [f.pure_ack()] + f.segments(2)
    assert summary(simulate(pk)) == [(1, 2, "no_payload"), (4, 2, "end_of_capture")]


def test_r14_7_hole_flushes():
    f = SynthFlow()
    pk = f.segments(2)
    f.segment()  # lost
    pk += f.segments(2)
    assert summary(simulate(pk)) == [(1, 2, "seq_gap"), (3, 2, "end_of_capture")]


def test_r14_7_retransmission_flushes():
    f = SynthFlow()
    pk = f.segments(2)
    pk.append(dict(pk[0], ts_ns=5 * US, frame=3))
    r = simulate(pk)
    assert summary(r) == [(1, 2, "seq_gap"), (3, 1, "end_of_capture")]


def test_r14_7_contiguity_wraps_mod_2_32():
    f = SynthFlow(seq=0xFFFFFFFF - 1428 + 1)
    r = simulate(f.segments(3))
    assert segs(r) == [3]
    assert r.seq_first.tolist() == [0xFFFFFFFF - 1427]


# --- R15: size limits -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("gro_max_size,expected", [
    (80000, [55, 9]),  # gro-spec 8: 72 + 55 x 1428 = 78612; one more = 80040 >= 80000
    (65536, [45, 19]),  # 72 + 45 x 1428 = 64332 < 65536 < 65760
    (185000, [64]),  # the NAPI weight binds at HZ=250 (R21.3)
])
def test_r15a_ipv6_limit_on_a_64_segment_poll(gro_max_size, expected):
    r = simulate(SynthFlow(mss=1428).segments(64), gro_max_size=gro_max_size)
    assert segs(r) == expected
    assert r.payload_len.tolist() == [n * 1428 for n in expected]
    # a 64-packet poll ends with a full budget (napi_poll); the size limit cut the first super-packet
    assert r.reason_labels() == (["size_limit", "napi_poll"] if len(expected) == 2 else ["napi_poll"])


def test_r15a_ipv6_80000_largest_super_packet_numbers():
    f = SynthFlow(mss=1428)
    pk = f.segments(64)
    f.gap(100 * US)
    r = simulate(pk + f.segments(1), gro_max_size=80000)
    assert summary(r) == [(1, 55, "size_limit"), (56, 9, "napi_poll"), (65, 1, "end_of_capture")]
    assert r.l3_len.tolist()[0] == 78612
    assert r.frame_len.tolist()[0] == 78612 + 14 + 8  # HBH jumbo (payload 78572 > 65535)


def test_r15a_ipv4_1448_at_65536_gives_45():
    r = simulate(SynthFlow(ip_version=4, mss=1448).segments(64))
    assert segs(r) == [45, 19]
    assert r.frame_len.tolist()[0] == 65226  # gro-spec 8: largest frame of the v4 65536 run


def test_r15a_limit_is_strict():
    # 72 + 2 x 1428 = 2928; + 1428 = 4356 exactly: refused at limit 4356, accepted at 4357
    assert segs(simulate(SynthFlow().segments(6), gro_max_size=4356)) == [2, 2, 2]
    assert segs(simulate(SynthFlow().segments(6), gro_max_size=4357)) == [3, 3]


def test_r15a_gro_max_size_above_64k_leaves_ipv4_at_65536():
    r = simulate(SynthFlow(ip_version=4, mss=1448).segments(64), gro_max_size=185000)
    assert segs(r) == [45, 19]


def test_r15a_gro_max_size_below_64k_lowers_ipv4_too():
    # 52 + 22 x 1448 = 31908 < 32000 <= 33356
    r = simulate(SynthFlow(ip_version=4, mss=1448).segments(64), gro_max_size=32000)
    assert segs(r) == [22, 22, 20]


def test_r15a_gro_ipv4_max_size_raises_only_ipv4():
    r4 = simulate(SynthFlow(ip_version=4, mss=1448).segments(64), gro_ipv4_max_size=185000)
    r6 = simulate(SynthFlow(mss=1428).segments(64), gro_ipv4_max_size=185000)
    assert (segs(r4), segs(r6)) == ([64], [45, 19])


def test_r15a_short_trailing_segment_merges_under_the_limit():
    f = SynthFlow(mss=1428)
    r = simulate(f.segments(55) + [f.segment(56)], gro_max_size=80000)
    assert summary(r) == [(1, 56, "short_segment")]
    assert r.l3_len.tolist() == [78612 + 56]


def test_r15b_no_hbh_headroom_caps_ipv6_at_64k():
    r = simulate(SynthFlow().segments(64), gro_max_size=185000, hbh_headroom_ok=False)
    assert segs(r) == [45, 19]


# --- R16: after a merge ---------------------------------------------------------------------------------------
def test_r16_psh_completes_p_including_the_segment():
    f = SynthFlow()
    r = simulate(f.segments(3, last_psh=True) + f.segments(2))
    assert summary(r) == [(1, 3, "psh"), (4, 2, "end_of_capture")]
    assert r.tcp_flags.tolist()[0] == TH_ACK | TH_PSH  # R20: PSH ORed into p's header


def test_r16_fin_completes_and_is_ored():
    f = SynthFlow()
    pk = f.segments(2) + [f.segment(500, tcp_flags=TH_ACK | TH_FIN)]
    r = simulate(pk)
    assert summary(r) == [(1, 3, "fin")]
    assert r.tcp_flags.tolist() == [TH_ACK | TH_FIN]
    assert r.payload_len.tolist() == [2 * 1428 + 500]


def test_r16_short_segment_completes():
    f = SynthFlow()
    r = simulate(f.segments(2) + [f.segment(700)] + f.segments(1))
    assert summary(r) == [(1, 3, "short_segment"), (4, 1, "end_of_capture")]


# --- R17: deliver alone or hold -------------------------------------------------------------------------------
def test_r17_lone_psh_segment_is_delivered_alone():
    f = SynthFlow()
    r = simulate([f.segment(300, tcp_flags=TH_ACK | TH_PSH)])
    assert summary(r) == [(1, 1, "psh")]
    assert r.gso_size.tolist() == [0]


def test_r17_unmergeable_psh_segment_flushes_p_then_goes_alone():
    f = SynthFlow()
    pk = f.segments(2)
    f.segment()  # a hole
    pk.append(f.segment(300, tcp_flags=TH_ACK | TH_PSH))
    assert summary(simulate(pk)) == [(1, 2, "seq_gap"), (3, 1, "psh")]


def test_r17_syn_and_pure_acks_are_never_rows():
    f = SynthFlow()
    pk = [f.pure_ack(tcp_flags=TH_SYN, tcp_mss=1440), f.pure_ack(), f.pure_ack()]
    assert len(simulate(pk)) == 0


# --- R18: bucket overflow -------------------------------------------------------------------------------------
def test_r18_full_bucket_evicts_its_oldest_entry():
    a, b, c = (SynthFlow(sport=40000 + k, flow_id=k, t0_ns=k * 100) for k in range(3))
    pk = [a.segment(), b.segment(), c.segment()]
    r = simulate(pk, gro_hash_buckets=1, max_gro_skbs=2)
    assert summary(r) == [(1, 1, "bucket_evict"), (2, 1, "end_of_capture"), (3, 1, "end_of_capture")]
    assert r.flow_id.tolist() == [0, 1, 2]


# --- R20: what the receiver sees ------------------------------------------------------------------------------
def test_r20_ipv6_over_64k_has_hbh_up_to_6_19_and_plen0_on_7_0():
    r618 = simulate(SynthFlow().segments(50), gro_max_size=185000, kernel="6.18")
    r70 = simulate(SynthFlow().segments(50), gro_max_size=185000, kernel="7.0")
    l3 = 72 + 50 * 1428
    assert (r618.bigtcp.tolist(), r618.l3_len.tolist(), r618.frame_len.tolist()) == (
        [BIGTCP_HBH_JUMBO], [l3], [14 + l3 + 8])
    assert (r70.bigtcp.tolist(), r70.l3_len.tolist(), r70.frame_len.tolist()) == ([BIGTCP_V6_PLEN0], [l3], [14 + l3])


def test_r20_ipv4_over_65535_has_tot_len_0():
    r = simulate(SynthFlow(ip_version=4, mss=1448).segments(50), gro_ipv4_max_size=185000)
    assert (r.bigtcp.tolist(), r.frame_len.tolist()) == ([BIGTCP_V4_TOTLEN0], [14 + 52 + 50 * 1448])


def test_r20_ipv6_payload_just_under_64k_keeps_payload_len():
    # 32 + 45 x 1428 = 64292 <= 65535: no HBH even with a large limit
    r = simulate(SynthFlow().segments(45, last_psh=True), gro_max_size=185000)
    assert (r.bigtcp.tolist(), r.frame_len.tolist()) == ([BIGTCP_NONE], [14 + 72 + 45 * 1428])


def test_r20_single_segment_goes_up_unchanged():
    r = simulate(SynthFlow().segments(1))
    assert (r.n_segments.tolist(), r.gso_size.tolist(), r.frame_len.tolist()) == ([1], [0], [14 + 72 + 1428])


# --- R21: poll boundaries -------------------------------------------------------------------------------------
def test_r21_2_idle_gap_ends_the_poll():
    f = SynthFlow()
    pk = f.segments(3)
    f.gap(30 * US)
    pk += f.segments(3)
    assert summary(simulate(pk)) == [(1, 3, "napi_poll"), (4, 3, "end_of_capture")]


def test_r21_2_gap_must_exceed_poll_gap_us():
    f = SynthFlow(spacing_ns=20 * US)  # exactly 20 us apart: same poll
    assert segs(simulate(f.segments(4))) == [4]
    g = SynthFlow(spacing_ns=20 * US + 1)
    assert segs(simulate(g.segments(4))) == [1, 1, 1, 1]


def _push_then_gap(idle_us: int, psh: bool = True) -> list[dict]:
    """40 segments (the last with PSH), an idle gap, 60 more: one flow, 1 us apart otherwise."""
    f = SynthFlow()
    pk = f.segments(40, last_psh=psh)
    f.gap((idle_us - 1) * US)
    return pk + f.segments(60)


def test_r21_2b_idle_gap_after_a_push_ends_the_poll_and_resets_the_budget():
    """8 us idle after a PSH segment (shorter than poll_gap_us 20): the poll ended there, so the next 60
    segments start a fresh 64-packet budget; without R21.2b the poll runs on and its budget cuts after 24."""
    pk = _push_then_gap(8)
    assert summary(simulate(pk, gro_max_size=185000)) == [(1, 40, "psh"), (41, 60, "end_of_capture")]
    off = [(1, 40, "psh"), (41, 24, "napi_poll"), (65, 36, "end_of_capture")]
    assert summary(simulate(pk, gro_max_size=185000, poll_push_gap_us=math.inf)) == off
    assert summary(simulate(pk, gro_max_size=185000, rx_usecs=1000)) == off  # a NIC's polls follow its IRQs


def test_r21_2b_needs_the_push_and_a_gap_longer_than_poll_push_gap_us():
    budget_cut = [(1, 40, "psh"), (41, 24, "napi_poll"), (65, 36, "end_of_capture")]
    assert summary(simulate(_push_then_gap(6), gro_max_size=185000)) == budget_cut  # 6 us: not longer
    assert summary(simulate(_push_then_gap(7), gro_max_size=185000, poll_push_gap_us=7)) == budget_cut
    assert segs(simulate(_push_then_gap(7), gro_max_size=185000)) == [40, 60]
    no_push = simulate(_push_then_gap(8, psh=False), gro_max_size=185000)  # the same gap, no PSH: same poll
    assert summary(no_push) == [(1, 64, "napi_poll"), (65, 36, "end_of_capture")]


def test_r21_2b_poll_end_flushes_the_other_flows_and_says_push_gap():
    """Flow B's 3 segments are held when A's push is followed by 8 us of silence: the poll end completes them
    (poll_end push_gap), and B's next 3 make a new super-packet."""
    from bigtcp_pcap.gro.reasons import POLL_END_NAMES

    a, b = SynthFlow(), SynthFlow(sport=40001, t0_ns=500)
    pk: list[dict] = []
    for _ in range(3):
        pk += [b.segment(), a.segment()]
    pk[-1]["tcp_flags"] = TH_ACK | TH_PSH
    a.gap(7 * US)
    b.t = a.t + 500
    for _ in range(3):
        pk += [a.segment(), b.segment()]
    r = simulate(pk)
    assert summary(r) == [(2, 3, "psh"), (1, 3, "napi_poll"), (7, 3, "end_of_capture"), (8, 3, "end_of_capture")]
    assert [POLL_END_NAMES[c] for c in r.poll_end.tolist()] == ["none", "push_gap", "end_of_capture",
                                                                "end_of_capture"]
    off = simulate(pk, poll_push_gap_us=math.inf)  # one poll: B's six segments merge
    assert sorted(zip(off.first_frame.tolist(), segs(off))) == [(1, 6), (2, 3), (7, 3)]


def test_r21_3_full_budget_at_hz_250_flushes_everything():
    r = simulate(SynthFlow().segments(100), gro_max_size=185000)
    assert summary(r) == [(1, 64, "napi_poll"), (65, 36, "end_of_capture")]


def test_r21_3_every_packet_of_the_queue_counts_toward_the_budget():
    other = [{"ip_version": 6, "l4_proto": 17, "ts_ns": k * 100, "flow_id": -1} for k in range(10)]
    f = SynthFlow(t0_ns=2 * US)
    r = simulate(other + f.segments(64), gro_max_size=185000)
    assert summary(r) == [(11, 54, "napi_poll"), (65, 10, "end_of_capture")]


def test_r21_3_hz_1000_keeps_this_jiffys_entry_across_full_budget_polls():
    r = simulate(SynthFlow().segments(100), gro_max_size=185000, hz=1000)
    assert summary(r) == [(1, 100, "end_of_capture")]


def test_r21_3_hz_1000_flushes_an_entry_from_an_older_jiffy():
    f = SynthFlow(t0_ns=1_000_000 - 30 * US)  # the jiffy changes after 30 packets
    r = simulate(f.segments(100), gro_max_size=185000, hz=1000)
    assert summary(r) == [(1, 64, "napi_poll"), (65, 36, "end_of_capture")]


def test_r21_3_jiffy_phase_moves_the_boundary():
    pk = SynthFlow().segments(100)
    assert segs(simulate(pk, gro_max_size=185000, hz=1000)) == [100]
    assert segs(simulate(pk, gro_max_size=185000, hz=1000, jiffy_phase_ns=-970 * US)) == [64, 36]


def test_r21_4_flush_old_stops_at_the_first_young_entry():
    a = SynthFlow(sport=40000, flow_id=1, t0_ns=999_990)
    b = SynthFlow(sport=40001, flow_id=2, t0_ns=1_000_000)
    pk = [a.segment(), b.segment()]
    a.t = b.t = 1_000_001
    pk += [a.segment(), b.segment()]  # 4th packet ends a full budget of 4, in jiffy 1
    pk += [b.segment(ts_ns=1_000_003)]
    r = simulate(pk, napi_weight=4, hz=1000, gro_hash_buckets=1)
    assert summary(r) == [(1, 2, "napi_poll"), (2, 3, "end_of_capture")]


def test_r21_4_buckets_are_flushed_in_ascending_order():
    by_bucket = {}
    for p in range(40000, 40200):
        by_bucket.setdefault(hash_of(sport=p) % 8, p)
    lo, hi = min(by_bucket), max(by_bucket)
    old = SynthFlow(sport=by_bucket[hi], flow_id=1)  # held first, in the higher bucket
    young = SynthFlow(sport=by_bucket[lo], flow_id=2, t0_ns=500)
    r = simulate([old.segment(), young.segment()], napi_weight=2)
    assert r.flow_id.tolist() == [2, 1]
    assert r.reason_labels() == ["napi_poll", "napi_poll"]


def _two_bursts(gap_us: int) -> list[dict]:
    f = SynthFlow()
    pk = f.segments(5)
    f.gap(gap_us * US)
    return pk + f.segments(5)


def test_r21_5_gro_flush_timeout_keeps_young_entries_across_polls():
    assert segs(simulate(_two_bursts(50))) == [5, 5]
    assert segs(simulate(_two_bursts(50), gro_flush_timeout_ns=200 * US)) == [10]
    # the timer poll (no new work, no deferral) fires before the second burst and flushes everything
    assert segs(simulate(_two_bursts(300), gro_flush_timeout_ns=200 * US)) == [5, 5]


def test_r21_5_defer_hard_irqs_keeps_polling_from_the_timer():
    r = simulate(_two_bursts(300), gro_flush_timeout_ns=200 * US, napi_defer_hard_irqs=2)
    assert summary(r) == [(1, 10, "end_of_capture")]


# --- R23: delivery order --------------------------------------------------------------------------------------
def test_r23_rows_come_in_completion_order():
    a = SynthFlow(sport=40000, flow_id=1, t0_ns=100)
    b = SynthFlow(sport=40001, flow_id=2, t0_ns=0)
    pk = [b.segment(), a.segment(), a.segment(tcp_flags=TH_ACK | TH_PSH, ts_ns=200)]
    r = simulate(pk)
    assert r.flow_id.tolist() == [1, 2]  # a completed (PSH) before b, although b started first
    assert summary(r) == [(2, 2, "psh"), (1, 1, "end_of_capture")]


# --- engine-level properties ----------------------------------------------------------------------------------
def _mixed_stream() -> list[dict]:
    rng = np.random.default_rng(7)
    flows = [SynthFlow(sport=40000 + k, flow_id=k, ip_version=4 if k % 2 else 6, mss=1448 if k % 2 else 1428)
             for k in range(5)]
    pk, t = [], 0
    for _ in range(600):
        k = int(rng.integers(5))
        f = flows[k]
        t += int(rng.choice([500, 1000, 30_000]))
        f.t = t
        roll = rng.random()
        if roll < 0.08:
            pk.append(f.pure_ack())
        elif roll < 0.15:
            pk.append(f.segment(int(rng.integers(1, f.mss)), tcp_flags=TH_ACK | TH_PSH))
        elif roll < 0.18:
            pk.append(f.segment(tcp_opt_hash=int(rng.integers(1000))))
        else:
            pk.append(f.segment())
    return pk


def test_batches_of_any_size_give_the_same_rows(engine: str):
    pk = _mixed_stream()
    whole = simulate(pk, gro_max_size=30000)
    eng = make_engine(engine, GroConfig(gro_max_size=30000))
    parts, i, step = [], 0, 1
    while i < len(pk):
        chunk = pk[i:i + step]
        parts.append(eng.feed(build_batch(chunk, first_frame=i + 1), flow_ids(chunk)))
        i += step
        step = step % 7 + 1
    parts.append(eng.flush())
    split = SuperPacketBatch.concat(parts)
    for name, col in whole.to_dict().items():
        assert np.array_equal(col, getattr(split, name)), name
    assert eng.held == 0


def test_every_payload_byte_lands_in_exactly_one_row():
    pk = _mixed_stream()
    r = simulate(pk, gro_max_size=30000)
    assert int(r.payload_len.sum()) == sum(p.get("tcp_payload_len", 0) for p in pk)
    assert int(r.n_segments.sum()) == sum(1 for p in pk if p.get("tcp_payload_len", 0) > 0)


# --- NIC interrupt coalescing (rx-usecs / rx-frames) -----------------------------------------------------------
def test_nic_rx_usecs_window_cuts_a_steady_stream_into_polls():
    """A steady stream 1 us apart (no idle gap) on a NIC with rx-usecs 10: the IRQ comes 10 us after the first
    packet, the poll takes the 11 that arrived by then (t0..t0+10 us), the 12th opens the next window."""
    f = SynthFlow(spacing_ns=1 * US)
    r = simulate(f.segments(30), rx_usecs=10, poll_gap_us=1000)
    assert segs(r) == [11, 11, 8]
    assert r.reason_labels() == ["napi_poll", "napi_poll", "end_of_capture"]
    from bigtcp_pcap.gro.reasons import POLL_END_NAMES

    assert [POLL_END_NAMES[c] for c in r.poll_end.tolist()] == ["coalescing", "coalescing", "end_of_capture"]


def test_nic_rx_frames_fires_the_irq_early():
    f = SynthFlow(spacing_ns=1 * US)
    r = simulate(f.segments(20), rx_usecs=100, rx_frames=8, poll_gap_us=1000)
    assert segs(r) == [8, 8, 4]


def test_no_coalescing_by_default_keeps_the_gap_rule_alone():
    f = SynthFlow(spacing_ns=1 * US)
    assert segs(simulate(f.segments(30), poll_gap_us=1000)) == [30]
