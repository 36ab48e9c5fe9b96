"""Digests of every table ``analyze`` writes for every committed capture: the behaviour-unchanged check.

``python tests/golden/golden_tables.py --write`` records them (``digests.json`` beside this file) from the code in
the checkout; ``test_golden.py`` recomputes them and compares. A digest covers each table's schema (names and
types) and every value, not its file metadata (tool version, file names). When a change is meant to alter
a table, rewrite the digests in the same commit and say why in its message.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
DIGESTS = Path(__file__).with_name("digests.json")
from bigtcp_pcap.output.tables import TABLES  # the registry (output/tables.py)

CONFIGS = {  # name -> analyze keywords
    "default": {},
    "big": {"gro_max_size": 185000, "gro_ipv4_max_size": 185000},
    "hz1000_tmo": {"hz": 1000, "gro_flush_timeout_ns": 200_000, "napi_defer_hard_irqs": 2, "rx_queues": 2},
}


def captures() -> list[Path]:
    """Every committed capture (pcap/pcapng) under tests/fixtures, in a stable order."""
    return sorted(p for p in FIXTURES.rglob("*") if p.suffix in (".pcap", ".pcapng") and p.is_file())


def table_digest(path: Path) -> str:
    """SHA-256 of a Parquet table's schema (names, types) and values; file metadata is left out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    t = t.replace_schema_metadata(None)
    if path.name == "superpackets.parquet":  # addresses are dictionary columns: digest their text, as before
        for name in ("src", "dst"):
            i = t.schema.get_field_index(name)
            if pa.types.is_dictionary(t.schema.field(i).type):
                t = t.set_column(i, name, t.column(i).cast(pa.string()))
    if path.name == "flows.parquet":  # rows are streamed as flows end: digest them in flow_id order
        t = t.sort_by("flow_id")
    if path.name == "filter_audit.parquet":  # digested in (frame, filter) order, the order rows are written in aside;
        i = t.schema.get_field_index("filter")  # the filter is a dictionary column: digest its text, as before
        if pa.types.is_dictionary(t.schema.field(i).type):
            t = t.set_column(i, "filter", t.column(i).cast(pa.string()))
        t = t.sort_by([("frame", "ascending"), ("filter", "ascending")])
    t = pa.Table.from_arrays(t.columns, schema=pa.schema([f.remove_metadata() for f in t.schema]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t.combine_chunks())
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def compute(paths: list[Path] | None = None) -> dict[str, dict[str, str]]:
    """{"<fixture>|<config>": {table: digest}} from the code that is imported."""
    from bigtcp_pcap.api import analyze

    out: dict[str, dict[str, str]] = {}
    for cap in paths or captures():
        rel = str(cap.relative_to(FIXTURES))
        for cname, kw in CONFIGS.items():
            with tempfile.TemporaryDirectory() as d:
                analyze(cap, outdir=d, packets=True, **kw)
                out[f"{rel}|{cname}"] = {t: table_digest(Path(d) / f"{t}.parquet") for t in TABLES
                                         if (Path(d) / f"{t}.parquet").exists()}
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        DIGESTS.write_text(json.dumps(compute(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {DIGESTS}")
    else:
        got, want = compute(), json.loads(DIGESTS.read_text())
        bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        print("\n".join(bad) or "all equal")
        sys.exit(1 if bad else 0)
