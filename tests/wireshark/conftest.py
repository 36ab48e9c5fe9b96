"""Helpers for the Wireshark plugin tests: run the real tshark with bigtcp.lua, headless.

Every tshark run gets a private HOME so that a plugin installed in the user's personal folder (or their
preferences) cannot change the result; the plugin under test is always the packaged copy given with -X.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bigtcp_pcap.wireshark import plugin_path

REPO = Path(__file__).resolve().parents[2]
KERNEL_DIR = REPO / "tests" / "fixtures" / "kernel"
EXTERNAL_DIR = Path(os.environ.get("BIGTCP_EXTERNAL_FIXTURES", REPO / "tests" / "fixtures" / "external"))
TSHARK = shutil.which("tshark")
TSO = ["-o", "ipv6.tso_support:TRUE", "-o", "ip.tso_support:TRUE"]

needs_tshark = pytest.mark.skipif(TSHARK is None, reason="tshark is not installed (apt-get install tshark)")


def kernel_captures() -> list[Path]:
    return sorted(KERNEL_DIR.glob("*.pcap")) if KERNEL_DIR.is_dir() else []


def kernel_params():
    caps = kernel_captures()
    if not caps:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no kernel captures in {KERNEL_DIR}"))]
    return [pytest.param(c, id=c.name) for c in caps]


def summarized_params():
    """kernel_params() restricted to the captures with a JSON summary (sample.pcap is a byte-for-byte copy of
    v6_185000.rcv.pcap, which has one)."""
    caps = [c for c in kernel_captures() if kernel_summary(c) is not None]
    if not caps:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no summarized kernel captures in {KERNEL_DIR}"))]
    return [pytest.param(c, id=c.name) for c in caps]


def kernel_summary(capture: Path) -> dict | None:
    """The capture script's JSON summary of this capture ('sender' or 'receiver' part), if any."""
    name = capture.name
    for side, suffix in (("sender", ".snd.pcap"), ("receiver", ".rcv.pcap")):
        if name.endswith(suffix):
            js = capture.with_name(name[: -len(suffix)] + ".json")
            if js.is_file():
                d = json.loads(js.read_text())
                if d.get("capture", {}).get(f"{side}_file") == name:
                    return d.get("observed", {}).get(side)
    return None


@pytest.fixture(scope="session")
def ws_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("wshome")


def tshark_env(home: Path) -> dict:
    env = dict(os.environ)
    env["HOME"] = str(home)
    env.pop("WIRESHARK_CONFIG_DIR", None)
    return env


def run_tshark(home: Path, capture: Path, args: list[str], *, plugin: bool = True, tso: bool = True,
               check: bool = True) -> subprocess.CompletedProcess:
    cmd = [TSHARK, "-n", "-r", str(capture)]
    if plugin:
        cmd += ["-X", f"lua_script:{plugin_path()}"]
    if tso:
        cmd += TSO
    cmd += args
    r = subprocess.run(cmd, capture_output=True, text=True, env=tshark_env(home), timeout=300, check=False)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} -> {r.returncode}\n{r.stderr}")
    # Lua errors are printed but do not change the exit code
    for bad in ("Lua: Error", "lua_pcall", "bigtcp.lua:"):
        assert bad not in r.stderr, r.stderr
    return r


def fields(home: Path, capture: Path, names: list[str], extra: list[str] = (), **kw) -> list[list[str]]:
    """-T fields rows (one list per frame; multiple values of one field joined by ',')."""
    args = list(extra) + ["-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,"]
    for n in [*names, "_ws.lua.error"]:
        args += ["-e", n]
    r = run_tshark(home, capture, args, **kw)
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    for row in rows:
        assert row[len(names)] == "", f"{capture.name}: Lua error in frame {row}"
    return [row[: len(names)] for row in rows]


def count(home: Path, capture: Path, display_filter: str, **kw) -> int:
    r = run_tshark(home, capture, ["-Y", display_filter, "-T", "fields", "-e", "frame.number"], **kw)
    return len(r.stdout.splitlines())
