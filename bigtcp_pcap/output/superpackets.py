"""The superpackets table: one row per super-packet the GRO engine rebuilt or the capture showed."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..decode.schema import BIGTCP_NAMES
from ..gro.reasons import POLL_END_NAMES
from ..gro.receivers import interface_labels
from . import arrow as A
from .parquet import BIGTCP_TYPE, TS_TYPE

ADDRESS_TYPE = pa.dictionary(pa.int32(), pa.string())  # one text per distinct address, an index per row

SUPERPACKETS_SCHEMA = pa.schema([
    ("flow_id", pa.int64()), ("src", ADDRESS_TYPE), ("dst", ADDRESS_TYPE), ("sport", pa.uint16()),
    ("dport", pa.uint16()), ("seq_first", pa.uint32()), ("payload_len", pa.uint32()),
    ("n_segments", pa.uint32()), ("l3_len", pa.uint32()), ("frame_len", pa.uint32()), ("bigtcp", BIGTCP_TYPE),
    ("first_frame", pa.uint64()), ("last_frame", pa.uint64()), ("ts_first_ns", TS_TYPE),
    ("ts_last_ns", TS_TYPE), ("flush_reason", BIGTCP_TYPE), ("source", BIGTCP_TYPE),
    ("receiver", pa.dictionary(pa.int32(), pa.string())), ("poll_end", BIGTCP_TYPE),
])
SOURCE_NAMES = ("rebuilt", "observed")


def superpackets_columns(spb, flows, receivers: list[str] | None = None, slots: np.ndarray | None = None) -> dict:
    """Columns for SUPERPACKETS_SCHEMA from a GRO SuperPacketBatch; addresses come from the flow table (the rows'
    flows must still be in memory: the flow table keeps a flow until its GRO rows are out; ``slots``: their
    ``FlowTable.slots`` when the caller has them), receiver names from ``receivers``
    (gro.receivers.Receivers.labels; index = the row's receiver; None: the engines' default receiver, the
    capture interface, ``interface_labels``)."""
    fid = np.asarray(spb.flow_id)
    src, dst = flows.row_addresses(fid, slots)
    if not receivers:
        receivers = interface_labels(int(np.max(spb.receiver)) + 1 if len(spb) else 1)
    names = spb.reason_names
    return {
        "flow_id": fid, "src": src, "dst": dst,
        "sport": spb.sport, "dport": spb.dport, "seq_first": spb.seq_first, "payload_len": spb.payload_len,
        "n_segments": spb.n_segments, "l3_len": spb.l3_len, "frame_len": spb.frame_len,
        "bigtcp": A.dictionary(spb.bigtcp, BIGTCP_NAMES),
        "first_frame": spb.first_frame, "last_frame": spb.last_frame,
        "ts_first_ns": np.asarray(spb.ts_first_ns).view("datetime64[ns]"),
        "ts_last_ns": np.asarray(spb.ts_last_ns).view("datetime64[ns]"),
        "flush_reason": A.dictionary(spb.flush_reason, names),
        "source": A.dictionary(spb.source, SOURCE_NAMES),
        "receiver": A.dictionary(spb.receiver, tuple(receivers), index=pa.int32()),
        "poll_end": A.dictionary(spb.poll_end, POLL_END_NAMES),
    }
