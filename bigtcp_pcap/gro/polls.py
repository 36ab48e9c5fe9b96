"""Known NAPI poll boundaries for ``feed(..., poll_start=...)``, from the kernel's napi:napi_poll tracepoint.

gro-spec 7.1: a capture cannot show where the receiver's NAPI polls began, so the engine guesses them from
sender timestamp gaps. When the receiver's polls were traced (``scripts/make_kernel_captures.py --trace-napi``
writes ``<scenario>.napi.tsv``: one row per poll of the receiving device, its time and the packets it took,
``work``), the real boundaries can be given instead::

    rows = parse_napi_tsv(text)                          # (time_ns, work) per poll
    marks = poll_starts_from_trace(rows, batch.ts_ns)    # one bool per packet of ``batch``
    eng.feed(batch, flow_id, poll_start=marks)

``batch`` must hold exactly the packets that entered the traced device's ring, in order: on a veth pair, every
frame the sender's veth transmitted (source MAC = the sender's), whatever its protocol (ICMPv6, ARP and pure
ACKs count: they take a ring slot and budget like data).

Sans-IO: text in, arrays out; reading the files is the caller's business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_SLACK_NS = 20_000
"""Tolerance when testing "packet sent after the poll that took it ended": the tracepoint's clock is put on the
pcap clock through a CLOCK_REALTIME - CLOCK_MONOTONIC offset read twice (a few us apart) and the trace clock
has 1 us resolution."""


@dataclass(frozen=True)
class PollAlignment:
    """How the traced polls were laid onto the packets (see ``align_polls``).

    marks: bool per packet, True where a traced poll begins (and on the first packet after the traced range).
    skip: packets before the first traced poll's first packet (negative: the trace took -skip packets the
    capture does not have). covered: packets inside the traced range. violations: polls whose last
    assigned packet was sent more than ``slack_ns`` after the poll ended (0 when the alignment is consistent;
    more means packets are missing from one side inside the range and the boundaries after it are shifted).
    """

    marks: np.ndarray
    skip: int
    covered: int
    violations: int
    sender_packets: int
    trace_packets: int

    @property
    def sender_extra(self) -> int:
        """Packets of the capture that no traced poll took (before and after the trace)."""
        return self.sender_packets - self.covered

    @property
    def trace_extra(self) -> int:
        """Packets the trace counts that the capture does not have."""
        return self.trace_packets - self.covered


def parse_napi_tsv(text: str) -> np.ndarray:
    """``<scenario>.napi.tsv`` text -> int64 array (n_polls, 3): time on the pcap clock (ns), cpu, work.

    Columns of the file: realtime_s, mono_s, cpu, context, work, budget and, in traces made since the NAPI
    instance was recorded, napi (header line first; the columns read here are the same in both forms)."""
    out = []
    for line in text.splitlines()[1:]:
        if not line.strip():
            continue
        f = line.split("\t")
        sec, _, frac = f[0].partition(".")
        ns = int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])
        out.append((ns, int(f[2]), int(f[4])))
    return np.array(out, np.int64).reshape(-1, 3)


def align_polls(trace_rows: Sequence | np.ndarray, sender_ts_ns: np.ndarray, *,
                slack_ns: int = DEFAULT_SLACK_NS) -> PollAlignment:
    """Lay the traced polls onto the packets: poll k (in time order) takes the next n_k packets.

    ``trace_rows``: per poll (time_ns, work) or (time_ns, cpu, work) (``parse_napi_tsv``); time is when the
    poll ended (the tracepoint fires after the driver's poll returns), on the clock of ``sender_ts_ns``.
    Polls with work 0 take nothing and are dropped. ``sender_ts_ns``: capture time of each packet that
    entered the ring, in ring order.

    Mismatch in totals (the trace is switched on after the capture starts and off before it stops, so the
    capture usually has a few more packets, e.g. an ICMPv6/ARP frame at either end): the trace's packets are
    one contiguous run of the capture's, starting after ``skip`` packets, with ``skip`` searched over every
    value that keeps the run inside the capture (0 .. N - W; when the trace has more packets than the capture,
    N - W .. 0, the surplus trace packets fall outside the capture). Among them the one with the fewest
    causality violations (a packet sent more than ``slack_ns`` after the poll that took it ended) wins, the
    largest such ``skip`` on ties: a too-small skip pulls earlier packets into every poll and violates
    nothing, a too-large one puts packets into polls that had already ended. Packets before the run get no
    mark (no traced poll; they continue whatever poll the engine is in); the first packet after the run is
    marked, so the last traced poll ends where the trace says it did. Packets missing from one side *inside*
    the run (capture drops) cannot be placed: every later boundary shifts by one; ``violations`` > 0 shows it.
    """
    tr = np.asarray(trace_rows, dtype=np.int64)
    if tr.ndim != 2 or tr.shape[1] not in (2, 3):
        raise ValueError(f"trace_rows must be (time_ns, work) or (time_ns, cpu, work) rows, shape {tr.shape}")
    ts = np.asarray(sender_ts_ns, dtype=np.int64)
    n = len(ts)
    tr = tr[np.argsort(tr[:, 0], kind="stable")]
    work = tr[:, -1]
    if (work < 0).any():
        raise ValueError("negative work in trace_rows")
    tr = tr[work > 0]
    tend, work = tr[:, 0], tr[:, -1]
    w_total = int(work.sum())
    starts = np.concatenate([[0], np.cumsum(work)[:-1]]).astype(np.int64)  # first packet of each poll
    lasts = starts + work - 1
    best = None
    for s in range(min(0, n - w_total), max(0, n - w_total) + 1):
        li = lasts + s
        ok = (li >= 0) & (li < n)
        viol = int((ts[li[ok]] > tend[ok] + slack_ns).sum())
        if best is None or viol <= best[0]:
            best = (viol, s)
    marks = np.zeros(n, dtype=bool)
    if best is None:  # no poll with work
        return PollAlignment(marks, 0, 0, 0, n, 0)
    viol, s = best
    idx = starts + s
    marks[idx[(idx >= 0) & (idx < n)]] = True
    end = s + w_total
    if 0 <= end < n:
        marks[end] = True  # packets after the trace: not in any traced poll
    covered = min(end, n) - max(s, 0)
    return PollAlignment(marks, s, max(covered, 0), viol, n, w_total)


def poll_starts_from_trace(trace_rows: Sequence | np.ndarray, sender_batch_ts_ns: np.ndarray, *,
                           slack_ns: int = DEFAULT_SLACK_NS) -> np.ndarray:
    """Poll-start marks (bool per packet) for ``feed(..., poll_start=...)``; see ``align_polls``."""
    return align_polls(trace_rows, sender_batch_ts_ns, slack_ns=slack_ns).marks
