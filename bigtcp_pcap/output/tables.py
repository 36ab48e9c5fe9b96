"""The output tables of ``analyze``: one registry that the run, the multi-capture dataset and the docs use.

Each table has its name (``OUTDIR/<name>.parquet``, ``DIR/<name>/capture=<c>/`` in a dataset), its schema (the
one home of its columns, next to the code that fills them), whether it is written on every run or only when
asked for, whether its encoding runs on a writer thread (the big one), and a line for the README and ``-h``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from .audit import AUDIT_SCHEMA
from .parquet import FINDINGS_SCHEMA, FLOWS_SCHEMA, PACKETS_SCHEMA
from .superpackets import SUPERPACKETS_SCHEMA


@dataclass(frozen=True)
class Table:
    name: str
    schema: pa.Schema
    always: bool  # False: written only when asked for (``packets=True``)
    background: bool  # encoded and written on a writer thread
    doc: str


REGISTRY: tuple[Table, ...] = (
    Table("packets", PACKETS_SCHEMA, False, True, "one row per frame: decoded headers and true lengths"),
    Table("superpackets", SUPERPACKETS_SCHEMA, True, True,
          "one row per super-packet GRO would build (or the capture shows), with why it ended"),
    Table("flows", FLOWS_SCHEMA, True, True, "one row per TCP flow direction, streamed when the flow ends"),
    Table("findings", FINDINGS_SCHEMA, True, False, "RFC 2675 violations, capture faults and notes, by frame"),
    Table("filter_audit", AUDIT_SCHEMA, True, True, "frames a capture filter mis-parses, with the reason"),
)
BY_NAME: dict[str, Table] = {t.name: t for t in REGISTRY}
TABLES: tuple[str, ...] = tuple(t.name for t in REGISTRY)
