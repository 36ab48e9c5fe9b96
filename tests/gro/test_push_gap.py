"""R21.2b (a short idle gap after a PSH segment ends the poll) against the kernel's own NAPI polls.

tests/fixtures/kernel/push holds an unpinned v6_65536 pair with the receiver's polls traced (its README.md).
The trace is the oracle twice: for the rule's premise (the gaps it acts on are where the kernel's polls start)
and, through the receiver capture, for its effect (the super-packets rebuilt from the sender's frames).
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import numpy as np
import pytest
from test_kernel_pairs import _flow_ids, _load, pair_config

from bigtcp_pcap.decode.schema import TH_PSH
from bigtcp_pcap.gro import GRO_ENGINES, GroConfig, SuperPacketBatch
from bigtcp_pcap.gro.polls import align_polls, parse_napi_tsv

PUSH_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "kernel" / "push"
NAME = "v6_65536"


def _pair():
    meta = json.loads((PUSH_DIR / f"{NAME}.json").read_text())
    mac = bytes.fromhex(meta["interfaces"]["va"]["ip_d_j_link_show"]["address"].replace(":", ""))
    return meta, _load(PUSH_DIR / f"{NAME}.snd.pcap", mac), _load(PUSH_DIR / f"{NAME}.rcv.pcap", mac)


def test_gaps_after_a_push_are_where_the_kernel_polls_start():
    _, snd, _ = _pair()
    al = align_polls(parse_napi_tsv((PUSH_DIR / f"{NAME}.napi.tsv").read_text()), snd.ts_ns)
    assert al.violations == 0
    starts = np.asarray(al.marks, bool)
    idle = np.diff(snd.ts_ns.astype(np.int64), prepend=np.int64(snd.ts_ns[0]))
    after_push = np.zeros(len(snd), bool)
    after_push[1:] = (snd.tcp_flags[:-1] & TH_PSH) != 0
    cfg = GroConfig()
    short = after_push & (idle > cfg.poll_push_gap_us * 1000) & (idle <= cfg.poll_gap_us * 1000)
    print(f"\n{int(short.sum())} gaps of 6-20 us after a PSH segment, {int(starts[short].sum())} are traced poll "
          f"starts; gaps of 6-20 us without PSH: {int((~after_push & (idle > 6000) & (idle <= 20000)).sum())}")
    assert short.sum() >= 20  # the pair exercises the rule
    assert starts[short].mean() >= 0.9
    # a push followed by a gap of 6 us or less is not a poll start
    tight = after_push & (idle <= cfg.poll_push_gap_us * 1000) & (np.arange(len(snd)) > 0)
    assert starts[tight].sum() <= max(1, 0.1 * tight.sum())


@pytest.mark.parametrize("engine", sorted(GRO_ENGINES))
def test_the_rule_rebuilds_more_of_the_kernels_superpackets(engine):
    meta, snd, rcv = _pair()
    m = rcv.tcp_payload_len > 0
    kernel = collections.Counter(zip(rcv.sport[m].tolist(), rcv.dport[m].tolist(), rcv.tcp_seq[m].tolist(),
                                     rcv.tcp_payload_len[m].tolist(), strict=True))

    def reproduced(push_gap: float) -> int:
        eng = GRO_ENGINES[engine](pair_config(meta, poll_push_gap_us=push_gap))
        out = SuperPacketBatch.concat([eng.feed(snd, _flow_ids(snd)), eng.flush()])
        sim = collections.Counter(zip(out.sport.tolist(), out.dport.tolist(), out.seq_first.tolist(),
                                      out.payload_len.tolist(), strict=True))
        return sum((kernel & sim).values())

    on, off = reproduced(6.0), reproduced(math.inf)
    print(f"\n{engine}: {on} of {sum(kernel.values())} kernel super-packets with R21.2b, {off} without")
    assert on > off
    assert on >= 0.95 * sum(kernel.values())
