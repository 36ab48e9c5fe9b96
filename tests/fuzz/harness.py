"""One fuzz input through the whole pipeline (``bigtcp_pcap.analyze``: reader, decoder, GRO, flows, filter audit,
Parquet sinks), with the only results the toolkit documents:

* a complete analysis, or a partial one whose error names the file, the frame and the byte offset, and whose
  tables are all readable and marked partial;
* nothing else: no other exception, no run longer than ``TIMEOUT_S`` (SIGALRM), no temporary file left.

``Stats`` counts what the inputs did, for the figures a fuzz run reports.
"""

from __future__ import annotations

import io
import signal
from collections import Counter
from dataclasses import dataclass, field

import pyarrow.parquet as pq

import bigtcp_pcap
from bigtcp_pcap.errors import CaptureError, UsageError
from bigtcp_pcap.output.parquet import read_metadata

TIMEOUT_S = 20.0


class Hang(Exception):
    """An input ran longer than TIMEOUT_S."""


@dataclass
class Stats:
    """Outcome counts over a fuzz run."""

    outcomes: Counter = field(default_factory=Counter)

    def __str__(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))


STATS = Stats()


def _alarm(_signum, _frame):
    raise Hang(f"input ran longer than {TIMEOUT_S} s")


def check(data: bytes, name: str = "fuzz-input", audit: bool = True) -> str:
    """Run one input; assert the documented result; return the outcome ("clean", "partial", "findings")."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, TIMEOUT_S)
    try:
        try:
            a = bigtcp_pcap.analyze(io.BytesIO(data), name=name, audit=audit, packets=True)
        except UsageError as e:
            # Known, owned by the filter-audit work of issue 14: libpcap rejects the default 'ip6 and tcp' for a
            # raw-IPv4 link type and that ends the run. Counted, and the rest of the pipeline checked without it.
            if not (audit and "rejects all packets" in str(e)):
                raise
            STATS.outcomes["known: default audit usage error"] += 1
            a = bigtcp_pcap.analyze(io.BytesIO(data), name=name, audit=False, packets=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    tables = sorted(a.outdir.glob("*.parquet"))
    assert {p.stem for p in tables} >= {"packets", "findings", "flows", "superpackets"}
    assert not list(a.outdir.glob(".*.tmp")), "a temporary table was left behind"
    for p in tables:
        for _ in pq.ParquetFile(p).iter_batches():  # readable to the end (footer present), one batch at a time
            pass
        meta = read_metadata(p)
        assert meta["partial"] is a.partial
    codes = pq.read_table(a.outdir / "findings.parquet", columns=["code"]).column("code")
    if a.partial:
        e = a.error
        assert isinstance(e, CaptureError), repr(e)
        line = e.one_line()
        assert line.startswith(name) and e.frame is not None and e.offset is not None, line
        assert f"frame {e.frame}" in line and f"byte offset {e.offset}" in line
        assert "capture.partial" in codes.unique().to_pylist()
        outcome = "partial"
    else:
        outcome = "findings" if len(codes) else "clean"
    STATS.outcomes[outcome] += 1
    return outcome
