"""Behaviour unchanged: every table of every committed capture equals the recorded digests (golden_tables.py).

Refactors must leave these alone; a change that means to alter a table rewrites ``digests.json`` in the same
commit (``python tests/golden/golden_tables.py --write``) and says why.
"""

from __future__ import annotations

import json

import pytest
from golden_tables import CONFIGS, DIGESTS, FIXTURES, captures, compute

WANT = json.loads(DIGESTS.read_text())


def test_every_capture_and_config_is_recorded():
    assert sorted(WANT) == sorted(f"{p.relative_to(FIXTURES)}|{c}" for p in captures() for c in CONFIGS)


@pytest.mark.parametrize("cap", captures(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_tables_equal_the_recorded_digests(cap):
    got = compute([cap])
    for key, tables in got.items():
        assert tables == WANT[key], key
