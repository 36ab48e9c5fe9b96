"""Every command the README shows is run, for real, in the order it shows them (so they cannot rot).

The README speaks to a user with their own captures (``trace.pcap``, ``sender.pcap``, ...); here those names are
real kernel captures from tests/fixtures copied into a scratch directory, and the few commands that need a live
system are given the nearest runnable form (``SUBSTITUTE``: a live ``tcpdump -i eth0 -w -`` becomes the same
bytes from a file, ``sudo`` is dropped because the suite runs as root where that command is tested, ``eth0`` is
the loopback device). A command must exit 0 or 1 (1: the capture has findings, as documented). A README
command line that this test does not know fails it: new commands must be added here, not skipped.

``scripts/setup demo`` and ``scripts/setup test`` are the README's two entry points: ``test`` is what runs this
suite (.ci/run) and ``demo`` reinstalls the package into .venv, so both are checked by tests/test_readme.py
(the script's modes) and by CI itself rather than from inside the suite.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from oracle import KERNEL, ROOT

README = (ROOT / "README.md").read_text()
NOT_RUN_HERE = {"scripts/setup demo", "scripts/setup test"}
FILES = {  # placeholder in the README -> the committed capture that stands in for it
    "trace.pcap": KERNEL / "mixed_185000.rcv.pcap",
    "sender.pcap": KERNEL / "v6_185000.snd.pcap",
    "receiver.pcap": KERNEL / "v6_185000.rcv.pcap",
}
SUBSTITUTE = [  # (regex, replacement) applied to a README line to make it runnable here
    (r"^tcpdump -i eth0 -s 128 -w - \|", "cat trace.pcap |"),
    (r"^sudo ", ""),
    (r"dev eth0", "dev lo"),
    (r"BIGTCP_FUZZ_EXAMPLES=\d+", "BIGTCP_FUZZ_EXAMPLES=40"),  # the long fuzz run, as a short one (~minutes)
]


def commands() -> list[str]:
    """Runnable README lines: bash blocks, comments dropped, the setup entry points left out."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.DOTALL):
        for line in block.splitlines():
            cmd = re.sub(r"\s+#.*$", "", line).strip()
            if cmd and not cmd.startswith("#") and cmd not in NOT_RUN_HERE:
                out.append(cmd)
    return out


def _bpf_object(dest: Path) -> None:
    llc = shutil.which("llc") or shutil.which("llc-14")
    assert llc, "llc is needed for the README's audit-ebpf example (apt-get install llvm)"
    subprocess.run([llc, "-march=bpf", "-filetype=obj", "-o", str(dest), str(ROOT / "tests/audit/bpf/aware_tc.ll")],
                   check=True)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("readme-commands")
    (d / ".venv").symlink_to(ROOT / ".venv")
    (d / "tests").symlink_to(ROOT / "tests")
    for name, src in FILES.items():
        shutil.copy(src, d / name)
    _bpf_object(d / "my_tc_prog.o")
    return d


def test_the_readme_has_commands():
    cmds = commands()
    assert sum(".venv/bin/bigtcp-pcap" in c for c in cmds) >= 10


def test_every_readme_command_runs(workdir):
    if os.geteuid() != 0:
        pytest.skip("the README's audit-ebpf example needs root (CAP_BPF)")
    env = dict(os.environ, HOME=str(workdir / "home"), COLUMNS="200")
    ran, assigned = [], []
    for cmd in commands():
        run = cmd
        for pat, rep in SUBSTITUTE:
            run = re.sub(pat, rep, run)
        if re.fullmatch(r"[A-Za-z_]\w*=\S+", run):  # a shell variable the README sets for the next lines
            assigned.append(run)
            ran.append(cmd)
            continue
        r = subprocess.run(["bash", "-c", "; ".join(["set -o pipefail", *assigned, run])], cwd=workdir, env=env,
                           capture_output=True,
                           text=True, timeout=300, check=False)
        assert r.returncode in (0, 1), f"README command failed ({r.returncode}): {cmd}\n{r.stderr[-2000:]}"
        assert "Traceback" not in r.stderr, f"{cmd}\n{r.stderr[-2000:]}"
        ran.append(cmd)
    assert ran == commands()
    # what the commands promise is there
    assert (workdir / "out" / "superpackets.parquet").exists() and list((workdir / "out" / "plots").glob("*.png"))
    assert list((workdir / "home").rglob("bigtcp.lua"))
