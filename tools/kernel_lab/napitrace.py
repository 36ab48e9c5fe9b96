"""The receiver's NAPI polls recorded from tracefs (``--trace-napi``): the kernel's actual poll boundaries."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .runner import CaptureError

TRACEFS = Path("/sys/kernel/tracing")
NAPI_POLL_RE = re.compile(
    r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>\d+\.\d+): napi_poll: "
    r".*?napi struct (?P<napi>\S+) .*? "
    r"work (?P<work>\d+) budget (?P<budget>\d+)"
)


class NapiTrace:
    """napi:napi_poll events of the receiver's ``vb`` in a private tracefs instance (``--trace-napi``).

    Each event is one veth_poll() call: CPU, the task it interrupted (or ksoftirqd / napi/vb-N), ``work``
    packets taken from the ring, and which NAPI instance (one per RX queue of vb) it was. The trace clock is
    ``mono``; the JSON records CLOCK_REALTIME - CLOCK_MONOTONIC so the poll times can be put on the pcap time
    axis (``<name>.napi.tsv`` has both).
    """

    def __init__(self, name: str) -> None:
        self.mounted = False
        if not (TRACEFS / "events" / "napi" / "napi_poll").is_dir():
            if not (TRACEFS / "instances").is_dir():
                subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=True, timeout=10)
                self.mounted = True
            if not (TRACEFS / "events" / "napi" / "napi_poll").is_dir():
                raise CaptureError("tracefs has no napi:napi_poll event")
        self.inst = TRACEFS / "instances" / name
        self.inst.mkdir()
        self._w("buffer_size_kb", "16384")
        self._w("trace_clock", "mono")
        self._w("events/napi/napi_poll/filter", 'dev_name == "vb"')
        self._w("events/napi/napi_poll/enable", "1")
        self.offsets: list[int] = []

    def _w(self, leaf: str, value: str) -> None:
        (self.inst / leaf).write_text(value + "\n")

    def _offset(self) -> None:
        self.offsets.append(time.clock_gettime_ns(time.CLOCK_REALTIME) - time.clock_gettime_ns(time.CLOCK_MONOTONIC))

    def start(self) -> None:
        """Turn tracing on (recording the realtime - monotonic offset first)."""
        self._offset()
        self._w("tracing_on", "1")

    def stop(self, tsv: Path) -> dict[str, Any]:
        """Turn tracing off, write every poll to ``tsv`` and return the record for the JSON."""
        self._w("tracing_on", "0")
        self._offset()
        off = sum(self.offsets) / len(self.offsets) / 1e9
        text = (self.inst / "trace").read_text(errors="replace")
        work_hist: Counter[int] = Counter()
        per_cpu: Counter[int] = Counter()
        per_ctx: Counter[str] = Counter()
        per_napi: Counter[str] = Counter()
        rows = ["realtime_s\tmono_s\tcpu\tcontext\twork\tbudget\tnapi"]
        for line in text.splitlines():
            m = NAPI_POLL_RE.match(line)
            if not m:
                continue
            w, cpu, ts = int(m["work"]), int(m["cpu"]), float(m["ts"])
            ctx = re.sub(r"[/:].*", "", m["comm"].strip())  # ksoftirqd/0 -> ksoftirqd, napi/vb-3 -> napi
            rows.append(f"{ts + off:.9f}\t{ts:.9f}\t{cpu}\t{m['comm'].strip()}\t{w}\t{m['budget']}\t{m['napi']}")
            work_hist[w] += 1
            per_cpu[cpu] += w
            per_ctx[ctx] += w
            per_napi[m["napi"]] += w
        tsv.write_text("\n".join(rows) + "\n")
        lost = re.search(r"entries-in-buffer/entries-written: (\d+)/(\d+)", text)
        return {
            "file": tsv.name, "event": "napi:napi_poll", "filter": 'dev_name == "vb"', "trace_clock": "mono",
            "realtime_minus_mono_ns": self.offsets, "polls": sum(work_hist.values()),
            "packets": sum(per_cpu.values()), "work_histogram": dict(sorted(work_hist.items())),
            "packets_per_cpu": dict(sorted(per_cpu.items())), "packets_per_context": dict(per_ctx.most_common()),
            "packets_per_napi": dict(per_napi.most_common()),
            "entries_in_buffer_written": [int(lost[1]), int(lost[2])] if lost else None,
        }  # fmt: skip

    def close(self) -> None:
        """Disable the event and remove the tracefs instance (unmount tracefs if this object mounted it)."""
        with contextlib.suppress(OSError):
            self._w("events/napi/napi_poll/enable", "0")
        with contextlib.suppress(OSError):
            self.inst.rmdir()
        if self.mounted:
            subprocess.run(["umount", str(TRACEFS)], check=False, timeout=10)
