"""CLI conventions: --version, -h as well as --help on every command, shell completion (the installed script)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import bigtcp_pcap

EXE = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "bigtcp-pcap"
needs_exe = pytest.mark.skipif(not EXE.exists(), reason="console script not installed in .venv")


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=120, check=False,
                          env=(os.environ | (env or {})))


@needs_exe
def test_version():
    for flag in ("--version", "-V"):
        r = _run(flag)
        assert r.returncode == 0 and r.stdout.strip() == f"bigtcp-pcap {bigtcp_pcap.__version__}"


@needs_exe
@pytest.mark.parametrize("cmd", [[], ["analyze"], ["dissect"], ["report"], ["audit-filter"], ["wireshark"],
                                 ["wireshark", "open"]])
def test_short_help_equals_long_help(cmd):
    short, long = _run(*cmd, "-h"), _run(*cmd, "--help")
    assert short.returncode == long.returncode == 0
    assert short.stdout == long.stdout and "Usage:" in short.stdout


@needs_exe
def test_shell_completion_completes_commands_and_options():
    assert "_bigtcp_pcap_completion" in _run("--show-completion", "bash").stdout
    r = _run(env={"_BIGTCP_PCAP_COMPLETE": "complete_bash", "COMP_WORDS": "bigtcp-pcap rep", "COMP_CWORD": "1"})
    assert r.stdout.split() == ["report"]
    r = _run(env={"_BIGTCP_PCAP_COMPLETE": "complete_bash", "COMP_WORDS": "bigtcp-pcap dissect --bigtcp",
                  "COMP_CWORD": "2"})
    assert r.stdout.split() == ["--bigtcp-only"]
