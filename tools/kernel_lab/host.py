"""What the JSON records about the host: kernel HZ, tool versions, the package's own hash; the prerequisites."""

from __future__ import annotations

import gzip
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

from .runner import PACKAGE_DIR, Runner

PROG = "make_kernel_captures"  # prefix of every one-line error message (the historical script name)


def source_sha256() -> str:
    """sha256 over this package's source (``*.py`` in name order, each name then its bytes): the JSON's
    ``script_sha256``, which identifies the code that made a capture."""
    h = hashlib.sha256()
    for f in sorted(PACKAGE_DIR.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def kernel_hz() -> dict[str, Any]:
    """CONFIG_HZ from /proc/config.gz or /boot/config-*, else the spec's 250 marked as assumed."""
    for cand in ("/proc/config.gz", f"/boot/config-{platform.release()}"):
        try:
            opener = gzip.open if cand.endswith(".gz") else open
            with opener(cand, "rt") as f:  # type: ignore[operator]
                for line in f:
                    if line.startswith("CONFIG_HZ="):
                        return {"hz": int(line.split("=")[1]), "source": cand}
        except OSError:
            continue
    return {"hz": 250, "source": "assumed from gro-spec.md section 8 (kernel config not readable)"}


def tool_versions(r: Runner) -> dict[str, str]:
    """Version strings of the tools used."""
    out = {}
    for name, cmd in {
        "tcpdump": ["tcpdump", "--version"],
        "iperf3": ["iperf3", "--version"],
        "iproute2": ["ip", "-V"],
        "ethtool": ["ethtool", "--version"],
    }.items():
        cp = r.run(cmd, check=False)
        out[name] = (cp.stdout + cp.stderr).strip()
    try:
        import pyroute2  # type: ignore[import-untyped]

        out["pyroute2"] = pyroute2.__version__
    except ImportError:
        out["pyroute2"] = "not installed"
    out["python"] = sys.version.split()[0]
    return out


def check_prerequisites() -> None:
    """Exit with a one-line message unless root with ip netns, tc, ethtool, tcpdump and iperf3."""
    if os.geteuid() != 0:
        sys.exit(f"{PROG}: must run as root (needs network namespaces and tcpdump)")
    for tool in ("ip", "tc", "ethtool", "tcpdump", "iperf3"):
        if shutil.which(tool) is None:
            sys.exit(f"{PROG}: required tool '{tool}' not found in PATH")
    cp = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True, timeout=10)
    if cp.returncode != 0:
        sys.exit(f"{PROG}: 'ip netns' unusable: {cp.stderr.strip()}")

