"""The filter_audit.parquet table: one row per frame a filter mis-parses (the stage is audit/stage.py).

``analyze`` writes the rows batch by batch as the audits judge them (``merged_rows``): in frame order, and a
frame's rows in the order the expressions were given, so the table does not depend on where batches begin and a
split run's parts concatenate into the serial run's table. ``audit_rows`` writes one finished ``AuditResult``'s.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from ..audit.cbpf import OK, verdict_columns
from . import arrow as A

AUDIT_SCHEMA = pa.schema([("frame", pa.uint64()), ("filter", pa.string()),
                          ("verdict", pa.dictionary(pa.int8(), pa.string())),
                          ("reason", pa.dictionary(pa.int8(), pa.string()))])


def merged_rows(parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]], exprs: list[str]) -> pa.Table | None:
    """One batch's rows of every expression, as (index into ``exprs``, frame, verdict, reason) parts each in
    frame order, merged into frame order (a frame's rows by expression index); None when there are none."""
    parts = [p for p in parts if len(p[1])]
    if not parts:
        return None
    if len(parts) == 1:
        i, frame, verdict, reason = parts[0]
        which = np.full(len(frame), i, np.int8)
    else:
        parts.sort(key=lambda p: p[0])
        frame = np.concatenate([p[1] for p in parts])
        order = np.argsort(frame, kind="stable")  # (each part is sorted: a merge of runs)
        frame = frame[order]
        which = np.concatenate([np.full(len(p[1]), p[0], np.int8) for p in parts])[order]
        verdict = np.concatenate([p[2] for p in parts])[order]
        reason = np.concatenate([p[3] for p in parts])[order]
    return pa.table({"frame": A.array(frame, pa.uint64()),
                     "filter": A.strings_of(which, exprs),
                     **verdict_columns(verdict, reason)}, schema=AUDIT_SCHEMA)


def audit_rows(result) -> Iterator[pa.Table]:
    """Rows of filter_audit.parquet for one expression, in chunks (``AuditResult.chunks``: those the audit
    spilled to disk, then those in memory): the frames whose verdict is not ok."""
    for frame, verdict, reason, _, _ in result.chunks():
        bad = np.asarray(verdict) != OK  # the audit keeps only frames that are not ok
        if not bad.all():
            frame, verdict, reason = frame[bad], verdict[bad], reason[bad]
        if len(frame):
            yield pa.table({"frame": A.array(frame, pa.uint64()), "filter": A.repeat_string(result.expr, len(frame)),
                            **verdict_columns(verdict, reason)}, schema=AUDIT_SCHEMA)
