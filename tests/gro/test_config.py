"""GroConfig validation and derived values (gro-spec.md sections 4 and 6), SuperPacketBatch plumbing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bigtcp_pcap.gro import REASON_CODES, REASON_NAMES, GroConfig, GroEngine, SuperPacketBatch
from bigtcp_pcap.gro.synth import SynthFlow, simulate


def test_defaults_are_the_kernel_defaults():
    c = GroConfig()
    assert (c.gro_max_size, c.ipv4_limit, c.napi_weight, c.hz, c.poll_gap_us) == (65536, 65536, 64, 250, 20.0)
    assert (c.gro_hash_buckets, c.max_gro_skbs, c.rx_queues) == (8, 8, 1)


@pytest.mark.parametrize("gro_max_size,ipv4", [(185000, 65536), (65536, 65536), (32000, 32000), (80000, 65536)])
def test_ipv4_limit_follows_kernel_coupling(gro_max_size, ipv4):
    assert GroConfig(gro_max_size=gro_max_size).ipv4_limit == ipv4


def test_explicit_ipv4_limit_wins():
    assert GroConfig(gro_max_size=32000, gro_ipv4_max_size=185000).ipv4_limit == 185000


@pytest.mark.parametrize("kernel,cwr,needs_df,hbh", [
    ("6.18", True, False, True), ("6.17", True, True, True), ("6.19", True, False, True),
    ("7.0", False, False, False), ("6.18.44-fc-v1098", True, False, True),
])
def test_kernel_version_behaviour(kernel, cwr, needs_df, hbh):
    c = GroConfig(kernel=kernel)
    assert (c.cwr_flushes, c.fixedid_needs_df, c.ipv6_hbh) == (cwr, needs_df, hbh)


@pytest.mark.parametrize("kw,msg", [
    ({"gro_max_size": 524281}, "gro_max_size must be an int in 1..524280"),
    ({"gro_ipv4_max_size": 600000}, "gro_ipv4_max_size must be an int in 1..524280"),
    ({"gro_max_size": 0}, "gro_max_size"),
    ({"kernel": "5.15"}, "6.3 and later"),
    ({"kernel": "latest"}, "kernel must look like"),
    ({"napi_weight": 0}, "napi_weight must be an int >= 1"),
    ({"poll_gap_us": -1}, "poll_gap_us"),
    ({"max_gro_skbs": 0}, "max_gro_skbs"),
    ({"checksum_ok": False}, "checksum status"),
    ({"input_is_gso": "yes"}, "input_is_gso"),
    ({"rx_queues": 0}, "rx_queues"),
])
def test_invalid_settings_raise_clear_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        GroConfig(**kw)


def test_unlimited_bucket_and_no_gap_rule_are_accepted():
    c = GroConfig(max_gro_skbs=math.inf, poll_gap_us=math.inf)
    md = c.to_metadata()
    assert (md["max_gro_skbs"], md["poll_gap_us"]) == ("inf", "inf")


def test_to_metadata_is_json_and_records_derived_values():
    md = GroConfig(gro_max_size=185000).to_metadata()
    json.dumps(md)
    assert md["gro_max_size"] == 185000
    assert md["effective_gro_ipv4_max_size"] == 65536
    assert md["ipv6_big_representation"] == "hbh_jumbo"
    assert md["poll_gap_us"] == 20.0


def test_reason_names_and_codes_are_inverse():
    assert all(REASON_CODES[n] == c for c, n in enumerate(REASON_NAMES))
    assert len(set(REASON_NAMES)) == len(REASON_NAMES)


def test_superpacket_batch_concat_to_dict_and_empty():
    r = simulate(SynthFlow().segments(100), gro_max_size=185000)
    both = SuperPacketBatch.concat([r, SuperPacketBatch.empty(0), r])
    assert len(both) == 2 * len(r) == 4
    d = both.to_dict()
    assert d["n_segments"].tolist() == [64, 36, 64, 36]
    assert d["seq_first"].dtype == np.uint32 and d["flow_id"].dtype == np.int64
    assert len(SuperPacketBatch.concat([])) == 0


def test_feed_rejects_a_flow_id_of_the_wrong_length():
    from bigtcp_pcap.gro.synth import build_batch

    with pytest.raises(ValueError, match="one entry per packet"):
        GroEngine().feed(build_batch(SynthFlow().segments(3)), np.zeros(2, np.int64))


def test_empty_batch_and_empty_flush():
    from bigtcp_pcap.decode.schema import PacketBatch

    eng = GroEngine()
    assert len(eng.feed(PacketBatch.empty(0), np.zeros(0, np.int64))) == 0
    assert len(eng.flush()) == 0
