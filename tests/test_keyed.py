"""KeyedSums (bigtcp_pcap/keyed.py) against a plain dict count of the same rows."""

from __future__ import annotations

import numpy as np
import pytest

from bigtcp_pcap.keyed import PRUNE_MIN, ROOM_STEP, KeyedSums


def _by_dict(batches, keep_flows=None, shift=7):
    out: dict[int, list[int]] = {}
    for keys, sums, first in batches:
        for k, s, f in zip(keys.tolist(), sums.tolist(), first.tolist(), strict=True):
            if keep_flows is not None and (k >> shift) not in keep_flows:
                continue
            if k in out:
                out[k] = [a + b for a, b in zip(out[k][:-1], s, strict=True)] + [min(out[k][-1], f)]
            else:
                out[k] = [*s, f]
    return out


def _batches(rng, n_batches, rows, flows, width):
    row0, out = 0, []
    for _ in range(n_batches):
        flow = rng.integers(0, flows, rows)
        code = rng.integers(0, 90, rows)
        keys = (flow << 7) | code
        sums = rng.integers(0, 1 << 20, (rows, width))
        first = row0 + rng.permutation(rows)  # rows come in any order within a batch
        out.append((keys.astype(np.int64), sums.astype(np.int64), first.astype(np.int64)))
        row0 += rows
    return out


@pytest.mark.parametrize(("rows", "flows", "width"), [(1, 3, 1), (1000, 50, 3), (3 * ROOM_STEP, 100_000, 2)])
def test_keyed_sums_equal_a_dict_count(rows, flows, width):
    """Sums, first-seen minimum and the ascending key view; a batch of mostly new keys (the last case) makes
    the compiled pass stop for room several times."""
    rng = np.random.default_rng(rows)
    batches = _batches(rng, 7, rows, flows, width)
    ks = KeyedSums(width, None)
    for b in batches:
        ks.add(*b)
    want = _by_dict(batches)
    assert len(ks) == len(want)
    assert ks.keys.tolist() == sorted(want)
    assert ks.sums.tolist() == [want[k][:-1] for k in sorted(want)]
    assert ks.first.tolist() == [want[k][-1] for k in sorted(want)]
    flow = int(ks.keys[len(ks) // 2]) >> 7
    codes, sums, first = ks.of_flow(flow)
    mine = sorted(k for k in want if k >> 7 == flow)
    assert codes.tolist() == [k & 127 for k in mine]
    assert sums.tolist() == [want[k][:-1] for k in mine] and first.tolist() == [want[k][-1] for k in mine]


def test_keyed_sums_prune_the_flows_keep_rejects():
    """Past PRUNE_MIN keys the rejected flows go (and a flow that is rejected once never comes back, as a flow
    that has left memory gets no rows again); the kept flows' sums are exact whatever the pruning."""
    rng = np.random.default_rng(5)
    flows = 3 * PRUNE_MIN
    kept = set(range(0, flows, 3))
    batches = _batches(rng, 8, PRUNE_MIN // 2, flows, 1)
    ks = KeyedSums(1, lambda f: np.isin(f, np.fromiter(kept, np.int64)))
    for b in batches:
        ks.add(*b)
    assert ks._prune_at > PRUNE_MIN  # it pruned
    got = {int(k): [int(s), int(f)] for k, s, f in zip(ks.keys, ks.sums[:, 0], ks.first, strict=True)
           if (int(k) >> 7) in kept}
    assert got == _by_dict(batches, kept)
    assert len(ks) < len(_by_dict(batches))  # rejected flows' keys were dropped


def test_add_mapped_renumbers_flows():
    ks = KeyedSums(1, None)
    keys = np.array([(0 << 7) | 5, (1 << 7) | 6, (0 << 7) | 5], np.int64)
    ks.add_mapped(keys, np.ones((3, 1), np.int64), np.array([4, 2, 1], np.int64), np.array([10, 3]))
    assert ks.keys.tolist() == [(3 << 7) | 6, (10 << 7) | 5]
    assert ks.sums[:, 0].tolist() == [1, 2] and ks.first.tolist() == [2, 1]
