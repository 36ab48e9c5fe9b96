"""Suite-wide: in a run that must have every oracle (CI, ``scripts/setup test``), a skip is a failure.

Tests skip when an oracle they need (tshark, tcpdump, libpcap, libbpf, llc, root for network namespaces, a
kernel capture) is missing, so that a developer without one still gets a useful run. ``scripts/setup test``
installs all of them and sets ``BIGTCP_PCAP_REQUIRE_ORACLES=1``: there, a skip can only mean an oracle did not
come up, and the test is reported as failed with the skip's reason, so a green CI run cannot hide an
unchecked claim.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_ORACLES = bool(os.environ.get("BIGTCP_PCAP_REQUIRE_ORACLES"))


def _as_failure(rep: pytest.TestReport | pytest.CollectReport) -> None:
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    rep.outcome = "failed"
    rep.longrepr = f"skipped in a run that requires every oracle (BIGTCP_PCAP_REQUIRE_ORACLES): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE_ORACLES and rep.skipped and not hasattr(rep, "wasxfail") and not item.get_closest_marker("opt_in"):
        _as_failure(rep)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "opt_in: a test that runs only when asked for (a long run by an environment "
                            "variable); its skip is not a missing oracle")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE_ORACLES and rep.skipped:
        _as_failure(rep)
