"""CLI conventions: --version, -h as well as --help on every command, shell completion (the installed script), and
one-line errors for output paths that cannot be written."""

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


_KERNEL = Path(__file__).parent / "fixtures" / "kernel"


@needs_exe
@pytest.mark.parametrize("cmd", [
    ["egress", str(_KERNEL / "mixed_185000.rcv.pcap"), "-o", "{file}"],
    ["explode", str(_KERNEL / "mixed_185000.rcv.pcap"), "{file}/x.pcap"],
    ["compare", str(_KERNEL / "v6_185000.snd.pcap"), str(_KERNEL / "v6_185000.rcv.pcap"), "-o", "{file}"],
    ["analyze", str(_KERNEL / "mixed_185000.rcv.pcap"), str(_KERNEL / "v4_185000.rcv.pcap"), "-o", "{file}"],
])
def test_an_output_path_that_cannot_be_written_is_one_line_exit_4(tmp_path, cmd):
    """An output directory that is a file (or under one): one line naming it, exit 4, no traceback."""
    f = tmp_path / "afile"
    f.write_bytes(b"")
    r = _run(*(a.replace("{file}", str(f)) for a in cmd))
    assert r.returncode == 4, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bigtcp-pcap: ") and str(f) in lines[0], r.stderr


@needs_exe
def test_explode_refusal_leaves_no_part_file(tmp_path):
    """explode refuses to write a pcap of several link types (exit 2) and leaves neither the file nor its .part."""
    multi = tmp_path / "multi.pcapng"
    r = subprocess.run(["mergecap", "-w", str(multi), str(_KERNEL / "mixed_185000.rcv.pcap"),
                        str(_KERNEL / "linktypes" / "sll2_v6_185000.rcv.pcap")], capture_output=True, check=False)
    assert r.returncode == 0, r.stderr
    dest = tmp_path / "ex.pcap"
    r = _run("explode", str(multi), str(dest))
    assert r.returncode == 2, r.stderr
    assert "link types" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multi.pcapng"]


@needs_exe
def test_plot_and_report_on_damaged_outputs_and_bad_destinations(tmp_path):
    # a damaged analyze directory was a traceback (JSONDecodeError, ArrowInvalid), an unwritable --dest too, a
    # folder --dest left REPORT.tmp beside it; an empty capture's plots printed matplotlib's legend warnings
    import shutil

    kernel = Path(__file__).resolve().parent / "fixtures" / "kernel"
    out = tmp_path / "out"
    assert _run("analyze", str(kernel / "v6_185000.rcv.pcap"), "-o", str(out), "--no-progress").returncode in (0, 1)
    for name in ("summary.json", "flows.parquet", "superpackets.parquet"):
        bad = tmp_path / f"bad_{name}"
        shutil.copytree(out, bad)
        (bad / name).write_bytes((bad / name).read_bytes()[:50])
        for cmd in (["report", str(bad)], ["plot", str(bad)]):
            if cmd[0] == "plot" and name == "summary.json":
                continue  # plot reads only the tables
            r = _run(*cmd)
            assert r.returncode == 2 and "Traceback" not in r.stderr, (cmd, r.stderr)
            (line,) = r.stderr.splitlines()
            assert f"cannot read {name}" in line
    for cmd in (["plot", str(out), "--dest", "/proc/nope"], ["report", str(out), "--dest", "/proc/nope.html"]):
        r = _run(*cmd)
        assert r.returncode == 4 and len(r.stderr.splitlines()) == 1 and ".tmp" not in r.stderr, r.stderr
    folder = tmp_path / "folder"
    folder.mkdir()
    r = _run("report", str(out), "--dest", str(folder))
    assert r.returncode == 0 and [p.name for p in folder.iterdir()] == ["report.html"]
    empty = tmp_path / "empty.pcap"
    empty.write_bytes(bytes.fromhex("d4c3b2a1020004000000000000000000ffff000001000000"))
    assert _run("analyze", str(empty), "-o", str(tmp_path / "e"), "--no-progress").returncode == 0
    r = _run("plot", str(tmp_path / "e"))
    assert r.returncode == 0 and r.stderr == ""
