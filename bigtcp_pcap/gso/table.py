"""The egress table (``egress.parquet``): one row per packet or skb leaving the egress device."""

from __future__ import annotations

import pyarrow as pa

from ..decode.schema import BIGTCP_NAMES
from ..output import arrow as A
from ..output.parquet import BIGTCP_TYPE, TS_TYPE
from ..output.superpackets import ADDRESS_TYPE
from .engine import ACTION_NAMES, REASON_NAMES, EgressBatch

EGRESS_SCHEMA = pa.schema([
    ("source_frame", pa.uint64()), ("out_index", pa.uint32()), ("ts_ns", TS_TYPE), ("flow_id", pa.int64()),
    ("src", ADDRESS_TYPE), ("dst", ADDRESS_TYPE), ("ip_version", pa.uint8()), ("sport", pa.uint16()),
    ("dport", pa.uint16()), ("seq", pa.uint32()), ("payload_len", pa.uint32()), ("l3_len", pa.uint32()),
    ("frame_len", pa.uint32()), ("gso_segs", pa.uint32()), ("gso_size", pa.uint32()), ("action", BIGTCP_TYPE),
    ("reason", BIGTCP_TYPE), ("ip_id", pa.uint16()), ("tcp_flags", pa.uint16()), ("bigtcp", BIGTCP_TYPE),
])
"""Columns: ``source_frame`` (the sender's frame this row came from), ``out_index`` (k-th output of it),
``seq`` raw, ``frame_len`` as tcpdump on the egress device records it, ``gso_segs`` (1: a plain packet),
``action`` passed/segmented/resegmented/dropped, ``reason`` why it was cut (gso_max_size, gso_max_segs,
tso_off, mtu; none when passed; not_tcp_gso: a non-TCP frame above the MTU, a UDP GSO skb whose segment size
the capture does not hold, or a TCP one whose header the snaplen cut, passed as it is)."""


def egress_columns(eb: EgressBatch, flows) -> dict:
    """Columns for EGRESS_SCHEMA; addresses come from the flow table as dictionary columns whose values are the
    batch's distinct addresses (``FlowTable.row_addresses``, as in superpackets.parquet)."""
    fid = eb.flow_id
    no_l4 = fid < 0
    src, dst = flows.row_addresses(fid)
    return {
        "source_frame": eb.source_frame, "out_index": eb.out_index, "ts_ns": eb.ts_ns.view("datetime64[ns]"),
        "flow_id": (fid, no_l4), "src": src, "dst": dst, "ip_version": eb.ip_version,
        "sport": (eb.sport, no_l4), "dport": (eb.dport, no_l4), "seq": (eb.seq, no_l4),
        "payload_len": eb.payload_len, "l3_len": eb.l3_len, "frame_len": eb.frame_len, "gso_segs": eb.gso_segs,
        "gso_size": eb.gso_size, "action": A.dictionary(eb.action, ACTION_NAMES),
        "reason": A.dictionary(eb.reason, REASON_NAMES), "ip_id": eb.ip_id, "tcp_flags": (eb.tcp_flags, no_l4),
        "bigtcp": A.dictionary(eb.bigtcp, BIGTCP_NAMES),
    }
