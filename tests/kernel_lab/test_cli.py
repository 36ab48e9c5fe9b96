"""The entry points: scripts/make_kernel_captures.py (wrapper), python -m tools.kernel_lab, python tools/kernel_lab."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
from oracle import KERNEL

import tools.kernel_lab as kl
from tools.kernel_lab.scenarios import DERIVED, MIN_SNAPLEN

from .conftest import ROOT

SCRIPT = ROOT / "scripts" / "make_kernel_captures.py"
ENTRY_POINTS = {
    "script": [sys.executable, str(SCRIPT)],
    "module": [sys.executable, "-m", "tools.kernel_lab"],
    "directory": [sys.executable, str(ROOT / "tools" / "kernel_lab")],
}


def _run(argv: list[str], cwd=ROOT, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False, **kw)


def test_wrapper_reexports_the_package_names():
    spec = importlib.util.spec_from_file_location("make_kernel_captures", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_kernel_captures"] = mod  # dataclasses with postponed annotations need the module registered
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules["make_kernel_captures"]
    for name in ("nl_set_ipv4_sizes", "nl_get_link_sizes", "Runner", "stop_process", "summarize_pcap", "read_pcap",
                 "parse_frame", "pcap_header", "Scenario", "SCENARIOS", "Experiment", "check_prerequisites",
                 "derive_loopback_pcap", "DERIVED", "IFLA", "DEFAULT_BYTES", "DEFAULT_SNAPLEN", "KERNEL_FIXTURES",
                 "main", "CaptureError", "CpuPlan", "kernel_hz", "tool_versions"):  # + make_egress_captures.py's
        assert getattr(mod, name) is getattr(kl, name), name
    assert set(mod.__all__) <= set(dir(mod))


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_help_is_the_same_from_every_entry_point(entry):
    # -m needs the repository root as working directory; the two paths work from anywhere
    cp = _run([*ENTRY_POINTS[entry], "--help"], cwd=ROOT if entry == "module" else "/")
    assert cp.returncode == 0, cp.stderr
    assert "Make real Linux BIG TCP / GRO capture pairs in two network namespaces." in cp.stdout
    for opt in ("--outdir", "--scenario", "--all", "--linktypes", "--derive", "--derive-from", "--bytes", "--snaplen",
                "--pin-cpu", "--server-cpu", "--tcpdump-cpu", "--threaded", "--trace-napi"):
        assert opt in cp.stdout


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_usage_errors_exit_2_with_one_line(entry, tmp_path):
    cp = _run([*ENTRY_POINTS[entry], "--outdir", str(tmp_path)])
    assert cp.returncode == 2 and cp.stderr.strip().splitlines()[-1].endswith(
        "give --scenario NAME (repeatable), --all, --linktypes or --derive")
    cp = _run([*ENTRY_POINTS[entry], "--outdir", str(tmp_path), "--scenario", "v6_80000", "--snaplen",
               str(MIN_SNAPLEN - 1)])
    assert cp.returncode == 2 and f"--snaplen must be >= {MIN_SNAPLEN}" in cp.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_derive_rebuilds_the_committed_null_and_loop_files(tmp_path):
    cp = _run([*ENTRY_POINTS["script"], "--outdir", str(tmp_path), "--derive"], cwd="/")
    assert cp.returncode == 0, cp.stderr
    for name in DERIVED:
        assert (tmp_path / f"{name}.pcap").read_bytes() == (KERNEL / "linktypes" / f"{name}.pcap").read_bytes()
        new, old = (json.loads(p.read_text()) for p in (tmp_path / f"{name}.json", KERNEL / "linktypes" / f"{name}.json"))
        assert new["script_sha256"] == kl.source_sha256()
        provenance = ("derived_by", "script_sha256")
        assert {k: v for k, v in new.items() if k not in provenance} == {k: v for k, v in old.items()
                                                                         if k not in provenance}


def test_a_missing_derive_source_fails_with_one_line(tmp_path):
    cp = _run([*ENTRY_POINTS["module"], "--outdir", str(tmp_path / "out"), "--derive", "--derive-from",
               str(tmp_path)])
    assert cp.returncode == 1
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == len(DERIVED) and all(ln.startswith("make_kernel_captures: ") for ln in lines)
    assert "Traceback" not in cp.stderr


def test_capture_runs_refuse_without_root(tmp_path):
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root and util-linux setpriv (to drop root) is not installed")
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        os.chmod(tmp_path, 0o777)
    else:
        prefix = []
    cp = _run([*prefix, *ENTRY_POINTS["directory"], "--outdir", str(tmp_path / "o"), "--scenario", "v6_80000"],
              cwd="/")
    assert cp.returncode == 1
    assert cp.stderr.strip() == "make_kernel_captures: must run as root (needs network namespaces and tcpdump)"
