"""Arrow arrays from numpy columns and Python lists, built from buffers.

``pa.array`` first asks pyarrow's pandas shim whether the input is a pandas object, and that imports pandas
(0.35 s and ~50 MiB here) in a process that never uses it. ``array`` builds the same arrays from buffers, so
the analysis pipeline runs without pandas; the DataFrame accessors import it when asked.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

_NUMPY = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
          pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
          pa.float32(): np.float32, pa.float64(): np.float64}


def _validity(mask: np.ndarray | None) -> tuple[pa.Buffer | None, int]:
    if mask is None or not mask.any():
        return None, 0
    return pa.py_buffer(np.packbits(~mask, bitorder="little")), int(mask.sum())


def array(values, type: pa.DataType, mask: np.ndarray | None = None) -> pa.Array:
    """``pa.array(values, type, mask=mask)`` for numeric, bool, timestamp and string types; None is null."""
    if isinstance(values, pa.Array):
        return values if values.type == type else values.cast(type)
    if pa.types.is_string(type):
        return _strings(values, mask)
    if isinstance(values, np.ndarray):
        data = values
    else:  # a list, possibly with None
        seq = list(values)
        nulls = np.fromiter((v is None for v in seq), bool, len(seq))
        if nulls.any():
            seq = [0 if v is None else v for v in seq]
            mask = nulls if mask is None else (mask | nulls)
        data = np.asarray(seq) if seq else np.zeros(0, np.int64)
    n = int(data.shape[0])
    validity, null_count = _validity(None if mask is None else np.asarray(mask, bool))
    if pa.types.is_boolean(type):
        buf = pa.py_buffer(np.packbits(data.astype(bool), bitorder="little"))
    elif pa.types.is_timestamp(type):
        buf = pa.py_buffer(np.ascontiguousarray(data.view(np.int64) if data.dtype.kind == "M"
                                                else data.astype(np.int64, copy=False)))
    else:
        buf = pa.py_buffer(np.ascontiguousarray(data, dtype=_NUMPY[type]))
    return pa.Array.from_buffers(type, n, [validity, buf], null_count=null_count)


def _strings(values: Sequence[str | None] | np.ndarray, mask: np.ndarray | None) -> pa.Array:
    seq = list(values)
    nulls = np.fromiter((v is None for v in seq), bool, len(seq))
    if mask is not None:
        nulls |= np.asarray(mask, bool)
    enc = [b"" if (v is None or m) else str(v).encode() for v, m in zip(seq, nulls.tolist())]
    offsets = np.zeros(len(enc) + 1, np.int32)
    if enc:
        np.cumsum(np.fromiter(map(len, enc), np.int64, len(enc)), out=offsets[1:], dtype=np.int32)
    validity, null_count = _validity(nulls)
    return pa.Array.from_buffers(pa.string(), len(enc), [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(enc))],
                                 null_count=null_count)


@functools.lru_cache(maxsize=64)
def _names(names: tuple[str, ...]) -> pa.Array:
    return _strings(list(names), None)


_INT8 = pa.int8()


def dictionary(codes: np.ndarray, names: Sequence[str], mask: np.ndarray | None = None,
               index: pa.DataType = _INT8) -> pa.DictionaryArray:
    """Codes into ``names`` (the toolkit's dictionary columns; int8 indices unless ``index`` says wider)."""
    return pa.DictionaryArray.from_arrays(array(np.asarray(codes).astype(index.to_pandas_dtype()), index, mask),
                                          _names(tuple(names)))


def table(columns: dict, schema: pa.Schema) -> pa.Table:
    """A table of ``schema``; each column is an Arrow array, values for ``array``, or (values, null mask)."""
    out = []
    for f in schema:
        c = columns[f.name]
        out.append(array(c[0], f.type, c[1]) if isinstance(c, tuple) else array(c, f.type))
    return pa.Table.from_arrays(out, schema=schema)
