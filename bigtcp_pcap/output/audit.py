"""The filter_audit.parquet table: one row per frame a filter mis-parses (the stage is audit/stage.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..audit.cbpf import OK
from . import arrow as A

AUDIT_SCHEMA = pa.schema([("frame", pa.uint64()), ("filter", pa.string()),
                          ("verdict", pa.dictionary(pa.int8(), pa.string())),
                          ("reason", pa.dictionary(pa.int8(), pa.string()))])


def audit_rows(result) -> pa.Table:
    """Rows of filter_audit.parquet for one expression: the frames whose verdict is not ok."""
    t = result.frames_table()
    bad = np.asarray(result.verdict) != OK
    if not bad.all():  # the audit keeps only frames that are not ok; Table.filter imports pyarrow.compute
        t = t.filter(A.array(bad, pa.bool_()))
    return pa.table({"frame": t.column("frame"), "filter": A.repeat_string(result.expr, t.num_rows),
                     "verdict": t.column("verdict"), "reason": t.column("reason")}, schema=AUDIT_SCHEMA)
