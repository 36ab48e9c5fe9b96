"""tools/kernel_lab tests: the repository root on sys.path, and a throwaway network namespace for root tests."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_COUNTER = itertools.count()


def need_root() -> None:
    """Skip unless root (network namespaces, BPF_PROG_LOAD, link changes need CAP_NET_ADMIN/CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, rtnetlink link changes, BPF_PROG_LOAD)")
    if shutil.which("ip") is None:
        pytest.skip("iproute2 'ip' is not installed")


def run_in_ns(ns: str, code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` (with the repository root importable) inside network namespace ``ns``."""
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.fixture
def veth_ns() -> Iterator[str]:
    """A fresh namespace ``kl-<pid>-<n>`` holding a veth pair klva/klvb (both down); deleted afterwards."""
    need_root()
    ns = f"kl-{os.getpid()}-{next(_COUNTER)}"
    cp = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True, timeout=10, check=False)
    if cp.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {cp.stderr.strip()}")
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "klva", "type", "veth", "peer", "name", "klvb"], check=True,
                       capture_output=True, timeout=10)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20, check=False)
