"""Streaming Parquet sinks with provenance metadata.

Each table is written batch by batch (``ParquetWriter``), so memory does not grow with the capture. The
key-value metadata (``bigtcp_pcap.*`` keys, JSON values) is added when the table is closed, because only then
is it known whether the run was partial.

A table is written under a temporary name in its directory (``.NAME.parquet.<pid>.tmp``) and renamed into place
when it is complete: a reader never sees half a file, and a run that fails or is interrupted before a table is
finished leaves the earlier run's table, or nothing, never a file without its footer. Every OSError on the way
(read-only filesystem, no permission, disk full) is an ``OutputError`` naming the table.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..decode.schema import BIGTCP_NAMES, COLUMNS, TUNNEL_NAMES, PacketBatch
from ..errors import OutputError
from . import arrow as A

TS_UNKNOWN = -(1 << 63)  # capture.walk.TS_UNKNOWN: a timestamp that did not fit, written as null
BIGTCP_TYPE = pa.dictionary(pa.int8(), pa.string())
TS_TYPE = pa.timestamp("ns", tz="UTC")

_TYPES = {"u64": pa.uint64(), "u32": pa.uint32(), "u16": pa.uint16(), "u8": pa.uint8(), "i64": pa.int64(),
          "ts": TS_TYPE}
_NAMES = {"TUNNEL_NAMES": TUNNEL_NAMES, "BIGTCP_NAMES": BIGTCP_NAMES}


def _parquet_type(t: str) -> pa.DataType:
    return BIGTCP_TYPE if t.startswith("dict:") else _TYPES[t]


# packets.parquet: the columns of the column table (decode/schema.py COLUMNS) that have a Parquet type, in its order
PACKETS_SCHEMA = pa.schema([(c.name, _parquet_type(c.parquet)) for c in COLUMNS if c.parquet is not None])

FLOWS_SCHEMA = pa.schema([
    ("flow_id", pa.int64()), ("ip_version", pa.uint8()), ("src", pa.string()), ("dst", pa.string()),
    ("sport", pa.uint16()), ("dport", pa.uint16()), ("if_id", pa.uint32()), ("ifindex", pa.uint32()),
    ("direction", pa.uint8()),
    ("first_frame", pa.uint64()),
    ("ts_first_ns", TS_TYPE), ("ts_last_ns", TS_TYPE), ("packets", pa.uint64()),
    ("payload_bytes", pa.uint64()), ("wire_bytes", pa.uint64()), ("bigtcp_packets", pa.uint64()),
    ("max_payload_len", pa.uint32()), ("mss", pa.uint16()), ("p50_payload_len", pa.uint32()),
    ("p99_payload_len", pa.uint32()), ("superpackets", pa.uint64()), ("p50_superpacket_len", pa.uint32()),
    ("p99_superpacket_len", pa.uint32()), ("max_superpacket_len", pa.uint32()),
    ("retransmissions", pa.uint64()), ("out_of_order", pa.uint64()), ("capture_gap_bytes", pa.uint64()),
    ("poll_ends_evidenced", pa.uint64()), ("poll_ends_guessed", pa.uint64()),
])

# Parquet encodings per column. Dictionary encoding only pays for columns with few distinct values; tried on
# a near-unique column it costs time and space (the 2M-row packets table: 1.16 s and 24 MiB with dictionaries
# everywhere, 0.72 s and 9 MiB like this). Frame numbers and timestamps rise steadily: delta-encoded.
NO_DICTIONARY = frozenset({"tcp_seq", "tcp_ack", "ip_id", "tcp_ts_val", "flow_label", "seq_first"})
DELTA_ENCODED = frozenset({"frame", "ts_ns", "first_frame", "last_frame", "ts_first_ns", "ts_last_ns"})
# Row-group min/max statistics are written for every column but the dictionary-encoded ones (addresses in the
# superpackets table, reason and kind names): a reader skips row groups by time, frame, flow or length, and
# min/max of those strings are computed over their text (measured on a 948k-row superpackets table: 177 ->
# 139 ms to write, most of the background writer's time that the main thread waited for).

FINDINGS_SCHEMA = pa.schema([("frame", pa.uint64()), ("code", pa.string()), ("severity", pa.string()),
                             ("message", pa.string())])


def _dict_array(codes: np.ndarray, names: tuple[str, ...]) -> pa.Array:
    return A.dictionary(codes, names)


# what a split run's merge needs of every packet (merge.py): the flow, its place and its sequence numbers
MERGE_ROWS = ("frame", "flow_id", "tcp_seq", "tcp_payload_len", "tcp_flags")
MERGE_ROWS_SCHEMA = pa.schema([PACKETS_SCHEMA.field(n) for n in MERGE_ROWS] + [("ts_ns", pa.int64())])
# and of every flow row: the FIN (1) / RST (2) bits seen in the flow's own direction
FLOW_STATE_SCHEMA = pa.schema([("flow_id", pa.int64()), ("finrst", pa.uint8())])


def _is_tcp(pb: PacketBatch) -> np.ndarray:
    """Rows with a whole TCP header (the others have null TCP columns)."""
    return (pb.l4_off >= 0) & (pb.l4_proto == 6) & (pb.tcp_hdr_len >= 20)


def merge_rows_table(pb: PacketBatch, flow_id: np.ndarray) -> pa.Table:
    """The ``MERGE_ROWS`` of a batch with the values the merge reads from packets.parquet (where that has a
    null: no flow -1, not a whole TCP header 0), and the raw timestamp (what the flow table's timeouts see)."""
    tcp = _is_tcp(pb)
    return A.table({"frame": pb.frame, "flow_id": flow_id, "tcp_seq": np.where(tcp, pb.tcp_seq, 0),
                    "tcp_payload_len": np.where(tcp, pb.tcp_payload_len, 0),
                    "tcp_flags": np.where(tcp, pb.tcp_flags, 0), "ts_ns": pb.ts_ns}, MERGE_ROWS_SCHEMA)


def packets_table(pb: PacketBatch, flow_id: np.ndarray) -> pa.Table:
    """packets.parquet rows of a batch: each column as the column table declares it (type, when null)."""
    l4 = pb.l4_off >= 0
    is_tcp = _is_tcp(pb)  # a TCP header cut by the snaplen: nulls
    null_when = {  # the ``null`` vocabulary of schema.Column; each mask computed once, when a column needs it
        "ts_unknown": lambda: pb.ts_ns == TS_UNKNOWN, "no_flow": lambda: flow_id < 0,
        "no_ip": lambda: pb.ip_version == 0, "no_jumbo": lambda: ~pb.has_jumbo,
        "not_l4": lambda: ~(l4 & ((pb.l4_proto == 6) | (pb.l4_proto == 17))  # and the ports captured
                            & (pb.caplen.astype(np.int64) >= pb.l4_off.astype(np.int64) + 4)),
        "not_tcp": lambda: ~is_tcp,
        "no_ts": lambda: ~pb.tcp_has_ts, "not_udp": lambda: ~(l4 & (pb.l4_proto == 17)),
    }
    masks: dict[str, np.ndarray] = {}
    cols = {}  # name: values or (values, null mask)
    for c in COLUMNS:
        if c.parquet is None:
            continue
        v = flow_id if c.origin == "flows" else getattr(pb, c.name)
        if c.parquet.startswith("dict:"):
            cols[c.name] = _dict_array(v, _NAMES[c.parquet[5:]])
        elif c.null is None:
            cols[c.name] = v
        elif c.null == "zero":  # the value itself says absent (tcp_mss 0)
            cols[c.name] = (v, v == 0)
        else:
            if c.null not in masks:
                masks[c.null] = null_when[c.null]()
            cols[c.name] = (v, masks[c.null])
    return A.table(cols, PACKETS_SCHEMA)


class TableSink:
    """One Parquet file written incrementally; ``close()`` adds the provenance metadata.

    Small tables are buffered and written as row groups of about ``ROW_GROUP`` rows: fewer, larger row groups
    are faster to write and to scan, and the buffer bounds memory.

    ``background=True`` encodes and compresses the row groups on a writer thread (pyarrow releases the GIL
    while it writes), overlapping them with the decoding of the next batch; at most two row groups are in
    flight, so memory stays bounded, and a write error is raised by the next ``write`` or by ``close``. The
    packets table uses it: its encoding is ~40 % of a ``--packets`` run.
    """

    ROW_GROUP = 1 << 15
    IN_FLIGHT = 2

    def __init__(self, path: Path, schema: pa.Schema, background: bool = False):
        self.path = Path(path)
        self.tmp_path = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self.schema = schema
        self.rows = 0
        self.done = False  # renamed into place
        self.failed = False  # given up (abort): the temporary file is gone, the final name untouched
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        names = schema.names
        self._pool = None
        self._inflight: deque = deque()
        try:
            self._writer = pq.ParquetWriter(
                self.tmp_path, schema, compression="zstd",
                use_dictionary=[n for n in names if n not in NO_DICTIONARY and n not in DELTA_ENCODED],
                column_encoding={n: "DELTA_BINARY_PACKED" for n in names if n in DELTA_ENCODED} or None,
                write_statistics=[f.name for f in schema if not pa.types.is_dictionary(f.type)])
        except OSError as e:
            self._writer = None
            raise OutputError.from_os(str(self.path), e) from None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="parquet-writer") if background else None

    def write(self, table: pa.Table) -> None:
        try:
            self._write(table)
        except OSError as e:
            self.abort()
            raise OutputError.from_os(str(self.path), e) from None

    def _write(self, table: pa.Table) -> None:
        if table.num_rows:
            self._pending.append(table.cast(self.schema) if table.schema != self.schema else table)
            self._pending_rows += table.num_rows
            self.rows += table.num_rows
            if self._pending_rows >= self.ROW_GROUP:
                self._flush()

    def _flush(self) -> None:
        if self._pending:
            table = pa.concat_tables(self._pending).combine_chunks()
            rows = max(self._pending_rows, 1)
            self._pending = []
            self._pending_rows = 0
            if self._pool is None:
                self._writer.write_table(table, row_group_size=rows)
                return
            while len(self._inflight) >= self.IN_FLIGHT:
                self._inflight.popleft().result()
            self._inflight.append(self._pool.submit(self._writer.write_table, table, row_group_size=rows))

    def _drain(self) -> None:
        try:
            while self._inflight:
                self._inflight.popleft().result()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None

    def write_columns(self, cols: dict) -> None:
        arrays = []
        for f in self.schema:
            x = cols[f.name]
            arrays.append(A.array(x, f.type))
        self.write(pa.Table.from_arrays(arrays, schema=self.schema))

    def finish(self) -> None:
        """Write every buffered row group (where a full disk shows), before the metadata is decided."""
        try:
            self._flush()
            self._drain()
        except OSError as e:
            self.abort()
            raise OutputError.from_os(str(self.path), e) from None

    def close(self, metadata: dict) -> None:
        """Write what is buffered and the metadata, then rename the finished file into place."""
        try:
            self._flush()
            self._drain()
            self._writer.add_key_value_metadata(provenance_metadata(self.schema, metadata))
            self._writer.close()
            os.replace(self.tmp_path, self.path)
            self.done = True
        except OSError as e:
            self.abort()
            raise OutputError.from_os(str(self.path), e) from None

    def abort(self) -> None:
        """Give up this table: stop the writer and remove the temporary file (the final name is not touched)."""
        if self.done:
            return
        self.failed = True
        # a failed writer may fail again while closing; the temporary file goes anyway
        with contextlib.suppress(Exception):
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None
        with contextlib.suppress(Exception):
            if self._writer is not None:
                self._writer.close()
        self._writer = None
        with contextlib.suppress(OSError):
            self.tmp_path.unlink(missing_ok=True)


STRING_KEYS = frozenset({"tool_version", "source_name", "source_sha256", "format", "compression", "error", "filter",
                         "ebpf_program"})
"""Provenance keys whose values are plain text (no JSON quoting); every other value is JSON."""


def _encode_value(k: str, v) -> str:
    return v if k in STRING_KEYS and isinstance(v, str) else json.dumps(v, default=str)


def provenance_metadata(schema: pa.Schema, metadata: dict) -> dict[str, str]:
    """File key-value metadata for ``metadata``: ``bigtcp_pcap.KEY`` entries (plain strings stay plain text),
    the same entries in the stored Arrow schema (``ARROW:schema``, so ``pq.read_table(p).schema.metadata``,
    ``pq.read_schema`` and ``pyarrow.dataset`` show them), and ``PANDAS_ATTRS`` (pandas >= 2.1 puts the
    provenance in ``DataFrame.attrs``)."""
    kv = {f"bigtcp_pcap.{k}": _encode_value(k, v) for k, v in metadata.items()}
    kv["PANDAS_ATTRS"] = json.dumps({"bigtcp_pcap": metadata}, default=str)
    arrow_schema = base64.b64encode(schema.with_metadata(kv).serialize().to_pybytes()).decode("ascii")
    return kv | {"ARROW:schema": arrow_schema}


def read_metadata(path: str | Path) -> dict:
    """The ``bigtcp_pcap.*`` key-value metadata of a table written by this toolkit, decoded."""
    md = pq.read_metadata(path).metadata or {}
    out = {}
    for k, v in md.items():
        k = k.decode()
        if k.startswith("bigtcp_pcap."):
            key = k[len("bigtcp_pcap."):]
            text = v.decode()
            if key in STRING_KEYS and not text.startswith('"') and text != "null":
                out[key] = text  # plain text (files of earlier versions JSON-quoted it)
            else:
                out[key] = json.loads(text)
    return out


def column_max(path: str | Path, column: str):
    """The largest non-null value of ``column`` in a table (None when it has none), from the row groups'
    statistics where they are written, else by reading that column alone. Neither imports pyarrow.dataset
    (and pandas with it: ~0.35 s in a worker process that needs neither)."""
    f = pq.ParquetFile(path)
    md = f.metadata
    j = md.schema.to_arrow_schema().get_field_index(column)
    best = None
    for i in range(md.num_row_groups):
        c = md.row_group(i).column(j)
        if c.num_values == 0:
            continue
        st = c.statistics
        if st is None or not st.has_min_max:
            if st is not None and st.null_count == c.num_values:
                continue  # every value null
            col = f.read(columns=[column]).column(0).drop_null()
            return max(col.to_pylist()) if len(col) else None
        best = st.max if best is None else max(best, st.max)
    return best
