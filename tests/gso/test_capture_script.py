"""scripts/make_egress_captures.py end to end: build the namespaces, capture a0 and b1, and the replay of the fresh
a0 capture predicts the fresh b1 capture exactly. Needs root, network namespaces, tcpdump and iperf3; skipped
with the reason otherwise (the committed pairs in tests/fixtures/kernel/egress need none of that)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from .test_kernel_egress import ROOT


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, tcpdump)"
    for tool in ("ip", "ethtool", "tcpdump", "iperf3", "ss", "tc"):
        if shutil.which(tool) is None:
            return f"needs {tool} in PATH"
    cp = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False, timeout=10)
    if cp.returncode != 0:
        return f"'ip netns' unusable: {cp.stderr.strip()}"
    return None


@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
def test_script_run_replays_exactly(tmp_path, monkeypatch):
    cmd = [sys.executable, str(ROOT / "scripts" / "make_egress_captures.py"), "--outdir", str(tmp_path),
           "--scenario", "v6_gso65536", "--bytes", "400000"]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    if cp.returncode != 0 and "incomplete capture" in cp.stderr:
        # the script checks its captures against iperf3's byte count; one CI run (of many) had b1's capture
        # without the data connection, a capture-side miss the script now reports: one more run, which must pass
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    assert cp.returncode == 0, cp.stderr[-2000:]
    info = json.loads((tmp_path / "v6_gso65536.json").read_text())
    assert "error" not in info and info["interfaces"]["b1"]["rtnetlink_sizes"]["gso_max_size"] == 65536
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    assert not any(ns in left for ns in info["namespaces"].values())  # cleaned up
    from . import test_kernel_egress as K

    monkeypatch.setattr(K, "EGRESS_DIR", tmp_path)
    want = K.b1_data_packets("v6_gso65536", tmp_path)
    got, _, _ = K.predicted("v6_gso65536", tmp_path)
    assert sum(want.values()) > 50 and got == want
