"""RecordBatch -> (PacketBatch, FindingRows): the Python face of the compiled decoder."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..capture.reader import RecordBatch
from . import kernel as K
from .schema import BATCH_COLUMNS, KERNEL_GROUPS, PacketBatch, kernel_row

_ROW = {c.name: kernel_row(c.name) for c in BATCH_COLUMNS if c.origin in KERNEL_GROUPS}  # row in its group


@dataclass
class FindingRows:
    """Findings as columns: frame number, code id (findings.BY_ID) and the kernel's numeric value."""

    frame: np.ndarray  # uint64
    code: np.ndarray  # int16
    value: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.frame.shape[0])

    @classmethod
    def empty(cls) -> FindingRows:
        return cls(np.zeros(0, np.uint64), np.zeros(0, np.int16), np.zeros(0, np.int64))

    @classmethod
    def concat(cls, parts: list[FindingRows]) -> FindingRows:
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("frame", "code", "value")))


def decode(rb: RecordBatch) -> tuple[PacketBatch, FindingRows]:
    """Decode one record batch. Pure function of its input; no state carries between batches."""
    n = len(rb)
    out = {g: np.zeros((len(K.KERNEL_ROWS[g]), n), dt) for g, dt in KERNEL_GROUPS.items()}
    src = np.zeros((n, 16), np.uint8)
    dst = np.zeros((n, 16), np.uint8)
    fcap = n * K.MAX_FINDINGS_PER_PACKET
    f_row = np.empty(fcap, np.int64)
    f_code = np.empty(fcap, np.int16)
    f_val = np.empty(fcap, np.int64)
    nf = K.decode_kernel(rb.buf, rb.off, rb.caplen, rb.wirelen, rb.linktype, out["u64"], out["u32"], out["u16"],
                         out["u8"], out["i32"], out["i8"], src, dst, f_row, f_code, f_val)
    addr = {"src": src, "dst": dst}
    cols = {}
    for c in BATCH_COLUMNS:  # schema.COLUMNS says where each column comes from
        if c.origin == "record":
            cols[c.name] = getattr(rb, c.name)
        elif c.origin == "addr":
            cols[c.name] = addr[c.name]
        else:
            row = out[c.origin][_ROW[c.name]]
            cols[c.name] = row.view(np.bool_) if c.dtype is np.bool_ else row
    pb = PacketBatch(**cols)
    fr = FindingRows(rb.frame[f_row[:nf]], f_code[:nf].copy(), f_val[:nf].copy())
    return pb, fr
