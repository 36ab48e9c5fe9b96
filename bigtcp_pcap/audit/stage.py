"""The filter-audit stage inside ``analyze``: which capture filters mis-parse this capture's packets.

With explicit expressions every one is audited and reported. Without, ``tcp``, ``ip6 and tcp`` and
``tcp port P`` (P: the port carrying most TCP payload in the first batch) are audited and only those that
mis-parse something (or could not audit some frames) are reported. Without libpcap the stage is skipped with a
note. The default audit never ends a run: a default filter libpcap rejects for the capture's link type (``ip6
and tcp`` on raw IPv4) is reported as not audited. An explicit filter libpcap rejects for every link type of the
capture is a usage error, as ``tcpdump -r`` would refuse it; rejected for some link types only, it is audited
on the others and the rest is counted as not audited.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from ..decode.schema import PacketBatch
from ..errors import UsageError
from ..output.audit import merged_rows
from .cbpf import FilterAudit, _Spill, prepare_batch
from .libpcap import FilterError, LibpcapMissing


def busiest_port(pb: PacketBatch) -> int | None:
    """The lower port of the flow direction with the most TCP payload in this batch (the service port)."""
    m = (pb.l4_proto == 6) & (pb.l4_off >= 0) & (pb.tcp_payload_len > 0)
    if not m.any():
        return None
    lo = np.minimum(pb.sport[m], pb.dport[m]).astype(np.int64)
    w = np.bincount(lo, weights=pb.tcp_payload_len[m], minlength=1)
    return int(np.argmax(w))


class FilterAudits:
    """The filter audits of one ``analyze`` run: started on the first batch, fed every batch, finished once."""

    def __init__(self, filters: list[str] | None, enabled: bool = True, default_port: int | None = None,
                 spill_dir=None, write: Callable[[pa.Table], None] | None = None):
        """``default_port``: the default audit's ``tcp port P`` chosen elsewhere (a split run's parts take the
        whole capture's first batch's; -1: none), instead of from this run's first batch. ``spill_dir``: where
        the audits write the per-frame rows they do not keep in memory (``FilterAudit(spill=True)``; None: the
        system's temporary directory). ``write``: where each batch's rows of filter_audit.parquet go as the
        batch is audited (``output.audit.merged_rows``); the audits then keep none. The rows of an expression
        libpcap has rejected for every link type met so far wait in a spill file until it compiles for one
        (then they are written, before that batch's), and are dropped when it never does: such an expression is
        not reported (the default audit) or ends the run (``finish``)."""
        self.spill_dir = spill_dir
        self._write = write
        self._batch: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []  # this batch's rows, per audit
        self._held: dict[int, _Spill] = {}  # audit index -> its rows from before it compiled anywhere
        self.explicit = filters is not None
        self.default_port = default_port
        self.exprs = list(dict.fromkeys(filters)) if filters else []  # a filter given twice is audited once
        self.enabled = enabled and (self.explicit or True)
        self.audits: list[FilterAudit] = []
        self.note: str | None = None
        self.rejected: list[str] = []  # default filters libpcap rejected for every link type of the capture
        self._started = False

    def _start(self, pb: PacketBatch) -> None:
        self._started = True
        if not self.enabled:
            return
        exprs = self.exprs
        if not self.explicit:
            exprs = ["tcp", "ip6 and tcp"]
            port = busiest_port(pb) if self.default_port is None else self.default_port
            if port is not None and port >= 0:
                exprs.append(f"tcp port {port}")
            self.exprs = exprs
        try:
            # the default audit looks only at the frames BIG TCP can affect (fast); explicit filters get all frames
            # the summary reports no affected flows (audit-filter does): no per-flow tally
            stream = self._write is not None  # the rows handed on as they come, or kept (spilled beyond a bound)
            self.audits = [FilterAudit(e, candidates_only=not self.explicit, spill=not stream,
                                       spill_dir=self.spill_dir, flows=False, emit=self._emitter(i) if stream else None)
                           for i, e in enumerate(exprs)]
        except LibpcapMissing as e:
            if self.explicit:
                raise UsageError(str(e)) from None
            self.note = f"filter audit skipped: {e}"
            self.audits = []

    def feed(self, rb, pb: PacketBatch, fid) -> None:
        if not self._started:
            self._start(pb)
        prepared = {}  # the selection and normalization are shared by the audits of one kind
        for a in self.audits:
            kind = (a.candidates_only, a.l4_index)
            if kind not in prepared:
                prepared[kind] = prepare_batch(rb, pb, *kind)
            a.feed_prepared(prepared[kind])
        if self._batch:
            self._write_batch()

    def _emitter(self, i: int) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
        return lambda frame, verdict, reason: self._batch.append((i, frame, verdict, reason))

    def _write_batch(self) -> None:
        parts, self._batch = self._batch, []
        now = []
        for p in parts:
            i = p[0]
            if not self.audits[i].compiled:  # rejected for every link type so far: held
                if i not in self._held:
                    self._held[i] = _Spill(self.spill_dir)
                self._held[i].write((p[1], p[2], p[3], np.zeros(len(p[1]), np.uint8), np.zeros(len(p[1]), np.uint8)))
                continue
            held = self._held.pop(i, None)
            if held is not None:  # it compiles now: its rows from before, then this batch's
                for frame, verdict, reason, _, _ in held.chunks():
                    self._write(merged_rows([(i, frame, verdict, reason)], self.exprs))
                held.close()
            now.append(p)
        t = merged_rows(now, self.exprs)
        if t is not None:
            self._write(t)

    def finish(self, report_all: bool = False) -> list:
        """The results to report (the default audit's: only those that found something, unless ``report_all``)."""
        for held in self._held.values():  # expressions no link type of the capture compiled: not reported
            held.close()
        self._held.clear()
        results = []
        for a in self.audits:
            try:
                results.append(a.result())
            except FilterError as e:
                if self.explicit:
                    raise UsageError(f"filter {a.expr!r}: {e.for_linktype()}") from None
                self.rejected.append(a.expr)
                note = f"filter {a.expr!r} not audited: libpcap: {e.for_linktype()}"
                self.note = note if self.note is None else f"{self.note}; {note}"
        if not self.explicit and not report_all:
            results = [r for r in results if not r.clean or not r.complete]
        return results

    def summary(self, results: list) -> dict:
        """The ``filter_audit`` part of summary.json."""
        audited = [e for e in self.exprs if e not in self.rejected] if self.audits else []
        return {"audited": audited, "note": self.note,
                "results": [r.to_json(frames=False) for r in results]}

