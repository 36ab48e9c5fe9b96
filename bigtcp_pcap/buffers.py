"""Large state tables whose memory follows what is written into them.

``lazy_zeros`` is ``np.zeros`` for the tables that are sized for the worst case up front but are mostly left
untouched on a given capture (the ACK evidence's per-direction state holds 262,144 directions; a receiver
capture has a handful): an anonymous memory map, whose pages the kernel maps on first write and gives back
when the array is freed. ``np.zeros`` promises the same only when malloc hands it fresh pages; once earlier
frees have raised glibc's dynamic mmap threshold (up to 32 MiB), such a table comes from the heap and is
cleared, so every page of it counts in the resident set from the start.
"""

from __future__ import annotations

import mmap

import numpy as np

LAZY_MIN_BYTES = 1 << 20  # smaller tables: plain np.zeros (a map costs a system call and a page at least)


def lazy_zeros(shape: int | tuple[int, ...], dtype) -> np.ndarray:
    """A zero-filled, writable, C-contiguous array whose pages become resident only where it is written."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    if nbytes < LAZY_MIN_BYTES:
        return np.zeros(shape, dt)
    return np.frombuffer(mmap.mmap(-1, nbytes), dt).reshape(shape)
