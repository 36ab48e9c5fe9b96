"""The filter_audit.parquet table: one row per frame a filter mis-parses (the stage is audit/stage.py)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from ..audit.cbpf import OK, verdict_columns
from . import arrow as A

AUDIT_SCHEMA = pa.schema([("frame", pa.uint64()), ("filter", pa.string()),
                          ("verdict", pa.dictionary(pa.int8(), pa.string())),
                          ("reason", pa.dictionary(pa.int8(), pa.string()))])


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
