"""Where the capture run's processes run (``--pin-cpu`` and friends) and the per-CPU counters read around it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class CpuPlan:
    """CPU placement of the capture run (``--pin-cpu`` etc.); every field None = the scheduler's choice.

    veth's NAPI is scheduled (napi_schedule) on the CPU that transmits on ``va``. With the two iperf3 ends on
    different CPUs, transmits happen on both (the client's sendmsg and the ACK-clocked softirq that follows
    the server's ACKs), so vb's poll can run on one CPU while the other keeps filling the ring: polls then
    see a few packets each and the sender timestamps do not show the poll boundaries. Pinning both ends
    to one CPU serializes transmit and poll (see ``--pin-cpu``).
    """

    client: int | None = None  # taskset -c for the iperf3 client (sender namespace)
    server: int | None = None  # taskset -c for the iperf3 server (receiver namespace)
    tcpdump: int | None = None  # taskset -c for both tcpdumps
    threaded: int | None = None  # /sys/class/net/vb/threaded (threaded NAPI), None: kernel default
    trace_napi: bool = False  # record every napi:napi_poll of vb (tracefs) to <name>.napi.tsv

    @staticmethod
    def prefix(cpu: int | None) -> list[str]:
        """``taskset -c CPU`` to put before a command, or nothing when ``cpu`` is None."""
        return ["taskset", "-c", str(cpu)] if cpu is not None else []

    def record(self) -> dict[str, Any]:
        """The plan and the busy-poll sysctls, for the JSON's ``cpu`` record."""
        return {
            "iperf3_client_cpu": self.client, "iperf3_server_cpu": self.server, "tcpdump_cpu": self.tcpdump,
            "vb_threaded": self.threaded, "trace_napi": self.trace_napi, "online_cpus": os.cpu_count(),
            "busy_poll": read_text("/proc/sys/net/core/busy_poll"),
            "busy_read": read_text("/proc/sys/net/core/busy_read"),
        }  # fmt: skip


def read_text(path: str) -> str | None:
    """The stripped text of a small (proc/sys) file, None when it cannot be read."""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cpu_counters() -> dict[str, Any]:
    """Per-CPU NET_RX/NET_TX softirq counts, softnet_stat (processed, time_squeeze) and ksoftirqd CPU ticks."""
    out: dict[str, Any] = {}
    for line in (read_text("/proc/softirqs") or "").splitlines():
        name, _, vals = line.partition(":")
        if name.strip() in ("NET_RX", "NET_TX"):
            out[name.strip()] = [int(v) for v in vals.split()]
    proc, squeeze = [], []
    for line in (read_text("/proc/net/softnet_stat") or "").splitlines():
        f = [int(x, 16) for x in line.split()]
        proc.append(f[0])
        squeeze.append(f[2])
    out["softnet_processed"], out["softnet_time_squeeze"] = proc, squeeze
    ticks: dict[str, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        comm = read_text(f"/proc/{d.name}/comm") or ""
        if comm.startswith(("ksoftirqd/", "napi/")):
            st = (read_text(f"/proc/{d.name}/stat") or "").rsplit(")", 1)[-1].split()
            if len(st) > 13:
                ticks[comm] = ticks.get(comm, 0) + int(st[11]) + int(st[12])  # utime + stime
    out["kthread_ticks"] = ticks
    return out


def counter_delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``b - a`` of two ``cpu_counters()`` readings (kernel threads whose ticks did not change are left out)."""
    out: dict[str, Any] = {}
    for k, v in b.items():
        if isinstance(v, list):
            old = a.get(k, [0] * len(v))
            out[k] = [x - y for x, y in zip(v, old)]
        elif isinstance(v, dict):
            out[k] = {n: t - a.get(k, {}).get(n, 0) for n, t in v.items() if t - a.get(k, {}).get(n, 0)}
    out["kthread_ticks_hz"] = os.sysconf("SC_CLK_TCK")
    return out
