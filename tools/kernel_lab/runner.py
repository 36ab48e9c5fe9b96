"""Running commands: every command line is recorded for the JSON, with timeouts, optionally inside a namespace.

``helper_command`` gives the command line of one of this package's hidden entry points (``--_netlink``,
``--_tcbpf``, ``--_tun_relay``, ``--_geneve_relay``, ``--_probe``), which the experiment runs inside a namespace
with ``ip netns exec``; it starts the package directory itself, so it works from any working directory.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent


class CaptureError(RuntimeError):
    """A step of the experiment failed; the message says which."""


def helper_command(*args: str) -> list[str]:
    """``python tools/kernel_lab ARGS...``: this package's command line with ``args`` (absolute paths)."""
    return [sys.executable, str(PACKAGE_DIR), *args]


class Runner:
    """Runs commands (optionally inside a namespace) with timeouts and records each command line."""

    def __init__(self) -> None:
        self.log: list[dict[str, Any]] = []

    @staticmethod
    def wrap(cmd: list[str], ns: str | None) -> list[str]:
        """``cmd`` run inside network namespace ``ns`` (``ip netns exec``), or as is when ``ns`` is None."""
        return ["ip", "netns", "exec", ns, *cmd] if ns else cmd

    def run(
        self, cmd: list[str], ns: str | None = None, timeout: float = 20, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` to completion; CaptureError on a timeout, or on a non-zero exit status when ``check``."""
        full = self.wrap(cmd, ns)
        try:
            cp = subprocess.run(full, check=False, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self.log.append({"cmd": shlex.join(full), "rc": "timeout"})
            raise CaptureError(f"timed out after {timeout}s: {shlex.join(full)}") from e
        self.log.append({"cmd": shlex.join(full), "rc": cp.returncode})
        if check and cp.returncode != 0:
            raise CaptureError(f"failed ({cp.returncode}): {shlex.join(full)}: {cp.stderr.strip()}")
        return cp

    def popen(self, cmd: list[str], ns: str | None, stdout: Any, stderr: Any) -> subprocess.Popen[bytes]:
        """Start ``cmd`` in the background (stdin closed); the caller stops it with ``stop_process``."""
        full = self.wrap(cmd, ns)
        self.log.append({"cmd": shlex.join(full), "rc": "background"})
        # `ip netns exec` execs the command, so the Popen pid is the command's own pid.
        return subprocess.Popen(full, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)


def stop_process(p: subprocess.Popen[bytes], sig: int = signal.SIGINT, timeout: float = 10) -> int:
    """Send ``sig`` to a process we started, escalate to SIGKILL, return its exit status."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=5)
    return p.returncode
