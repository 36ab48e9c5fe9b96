"""The filter_audit.parquet table: one row per frame a filter mis-parses (the stage is audit/stage.py).

``analyze`` writes the rows batch by batch as the audits judge them (``merged_rows``): in frame order, and a
frame's rows in the order the expressions were given, so the table does not depend on where batches begin and a
split run's parts concatenate into the serial run's table.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..audit.cbpf import verdict_columns
from . import arrow as A

_INT32 = pa.int32()

AUDIT_SCHEMA = pa.schema([("frame", pa.uint64()), ("filter", pa.dictionary(_INT32, pa.string())),
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
        which = np.full(len(frame), i, np.int64)
    else:
        parts.sort(key=lambda p: p[0])
        frame = np.concatenate([p[1] for p in parts])
        order = np.argsort(frame, kind="stable")  # (each part is sorted: a merge of runs)
        frame = frame[order]
        which = np.concatenate([np.full(len(p[1]), p[0], np.int64) for p in parts])[order]
        verdict = np.concatenate([p[2] for p in parts])[order]
        reason = np.concatenate([p[3] for p in parts])[order]
    return pa.table({"frame": A.array(frame, pa.uint64()),
                     "filter": A.dictionary(which, exprs, index=_INT32),
                     **verdict_columns(verdict, reason)}, schema=AUDIT_SCHEMA)
