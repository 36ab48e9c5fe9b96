"""SuperPacketBatch: the GRO engine's output, one row per packet the receiver's stack (and tcpdump) would see.

A row is either a super-packet GRO completed (R20; ``n_segments`` may be 1: a segment held and flushed alone
still reaches the stack as a packet) or a payload-carrying packet GRO delivered alone (R5/R9/R12/R17).
Packets without TCP payload (pure ACKs, SYN, bare FIN, ...) never become rows, although they count toward the
NAPI budget and flush held entries. Rows are in the kernel's delivery order (R23): the order in which
completions happen, not the order in which the first segments arrived.

``source`` is ``SOURCE_OBSERVED`` when the row is one input packet that was already an aggregate (a GSO/GRO
packet in the capture, R2) and GRO added nothing to it; otherwise ``SOURCE_REBUILT``. Each input payload byte
appears in exactly one row.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from .reasons import REASON_NAMES

SOURCE_REBUILT, SOURCE_OBSERVED = 0, 1
SOURCE_NAMES = ("rebuilt", "observed")

COLUMN_TYPES: dict[str, type] = {
    "flow_id": np.int64,  # the caller's flow id of the first segment
    "ip_version": np.uint8,
    "sport": np.uint16,
    "dport": np.uint16,
    "seq_first": np.uint32,  # raw TCP seq of the first segment
    "payload_len": np.uint32,  # TCP payload bytes in the super-packet
    "n_segments": np.uint32,  # NAPI_GRO_CB(p)->count (GSO inputs count gso_segs)
    "l3_len": np.uint32,  # p->len: IP header(s) + TCP header + payload, without a synthetic HBH
    "frame_len": np.uint32,  # pcap original length at the receiver: l2 + l3_len (+8 HBH on IPv6 > 64 KiB, <= 6.19)
    "bigtcp": np.uint8,  # decode.schema BIGTCP_* as the receiver's capture would show it
    "first_frame": np.uint64,
    "last_frame": np.uint64,
    "ts_first_ns": np.int64,
    "ts_last_ns": np.int64,
    "flush_reason": np.uint8,  # reasons.REASON_NAMES
    "source": np.uint8,  # SOURCE_REBUILT / SOURCE_OBSERVED
    "tcp_flags": np.uint16,  # first segment's flags with PSH/FIN of later segments ORed in (R16, R20)
    "ack": np.uint32,
    "gso_size": np.uint32,  # skb_shinfo->gso_size after completion (0 when count == 1, R20)
    "receiver": np.uint32,  # the receiving host (NAPI instance group) that built the row: the caller's index
    "poll_end": np.uint8,  # reasons.POLL_END_NAMES: for rows a NAPI poll end completed, what the end rests on
}

ROW_FIELDS: tuple[str, ...] = tuple(COLUMN_TYPES)
"""Column order of the row tuples the engine builds (one tuple per row)."""


@dataclass
class SuperPacketBatch:
    """Columns of super-packet rows (see module docstring and ``COLUMN_TYPES``)."""

    flow_id: np.ndarray
    ip_version: np.ndarray
    sport: np.ndarray
    dport: np.ndarray
    seq_first: np.ndarray
    payload_len: np.ndarray
    n_segments: np.ndarray
    l3_len: np.ndarray
    frame_len: np.ndarray
    bigtcp: np.ndarray
    first_frame: np.ndarray
    last_frame: np.ndarray
    ts_first_ns: np.ndarray
    ts_last_ns: np.ndarray
    flush_reason: np.ndarray
    source: np.ndarray
    tcp_flags: np.ndarray
    ack: np.ndarray
    gso_size: np.ndarray
    receiver: np.ndarray
    poll_end: np.ndarray

    reason_names = REASON_NAMES
    source_names = SOURCE_NAMES

    def __len__(self) -> int:
        return int(self.flow_id.shape[0])

    @classmethod
    def empty(cls, n: int = 0) -> SuperPacketBatch:
        """n zero rows with the documented column types."""
        return cls(**{name: np.zeros(n, dtype=t) for name, t in COLUMN_TYPES.items()})

    @classmethod
    def from_rows(cls, rows: list[tuple]) -> SuperPacketBatch:
        """Build from row tuples in ``ROW_FIELDS`` order."""
        if not rows:
            return cls.empty(0)
        cols = zip(*rows, strict=True)
        return cls(**{name: np.array(col, dtype=COLUMN_TYPES[name])
                      for name, col in zip(ROW_FIELDS, cols, strict=True)})

    @classmethod
    def concat(cls, batches: list[SuperPacketBatch]) -> SuperPacketBatch:
        """Rows of all batches, in order."""
        if not batches:
            return cls.empty(0)
        return cls(**{f.name: np.concatenate([getattr(b, f.name) for b in batches]) for f in fields(cls)})

    def to_dict(self) -> dict[str, np.ndarray]:
        """Column name -> numpy array (e.g. for ``pandas.DataFrame(batch.to_dict())``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reason_labels(self) -> list[str]:
        """``flush_reason`` as names."""
        return [REASON_NAMES[c] for c in self.flush_reason.tolist()]

    def row(self, i: int) -> dict[str, Any]:
        """Row i as a dict of Python values (for tests and debugging)."""
        return {f.name: getattr(self, f.name)[i].item() for f in fields(self)}
