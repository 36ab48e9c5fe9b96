"""Large state tables whose memory follows what is written into them.

``lazy_zeros`` is ``np.zeros`` for the tables that are sized for the worst case up front but are mostly left
untouched on a given capture (the ACK evidence's per-direction state holds 262,144 directions; a receiver
capture has a handful): an anonymous memory map, whose pages the kernel maps on first write and gives back
when the array is freed. ``np.zeros`` promises the same only when malloc hands it fresh pages; once earlier
frees have raised glibc's dynamic mmap threshold (up to 32 MiB), such a table comes from the heap and is
cleared, so every page of it counts in the resident set from the start.

``tune_malloc`` is the allocator policy of the processes that run analyses (the CLI and its worker tasks): a
fixed mmap threshold above a batch's arrays, so that every state table is its own map and a freed one goes
back to the kernel instead of leaving a resident hole in the heap.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

LAZY_MIN_BYTES = 1 << 20  # smaller tables: plain np.zeros (a map costs a system call and a page at least)


def lazy_zeros(shape: int | tuple[int, ...], dtype) -> np.ndarray:
    """A zero-filled, writable, C-contiguous array whose pages become resident only where it is written."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    if nbytes < LAZY_MIN_BYTES:
        return np.zeros(shape, dt)
    return np.frombuffer(mmap.mmap(-1, nbytes), dt).reshape(shape)


def table_full(shape: int | tuple[int, ...], fill, dtype, reuse: np.ndarray | None = None) -> np.ndarray:
    """``np.full`` for the tables a run rebuilds or grows as it goes (hash tables rebuilt without their tombstones,
    tables that double): from ``LAZY_MIN_BYTES`` on, each is its own memory map, given back whole when it is
    replaced. From the heap, a table of a few MiB rebuilt every few batches left a hole of its size between the
    batch arrays each time, and the heap grew with the run's length. ``reuse``: the table being replaced, filled
    and returned when it has this shape and type (a rebuild at the same size: no second table beside it)."""
    want = tuple(int(x) for x in np.atleast_1d(shape))
    if reuse is not None and reuse.shape == want and reuse.dtype == np.dtype(dtype):
        reuse.fill(fill)
        return reuse
    a = lazy_zeros(shape, dtype)
    if fill:
        a.fill(fill)
    return a


# glibc malloc policy of the processes that run analyses (the CLI, its --jobs workers, Dask tasks)
MMAP_THRESHOLD = (4 << 20) + (1 << 16)  # a batch's columns and its 4 MiB record buffer stay on the heap
TRIM_THRESHOLD = 8 << 20
_MALLOC_TUNED = False


def tune_malloc() -> bool:
    """Fix glibc's thresholds (once per process): every block of ``MMAP_THRESHOLD`` or more is its own memory map,
    given back to the kernel when freed, and batch-sized blocks stay on the heap.

    By default glibc raises its mmap threshold to the largest block freed so far (up to 32 MiB), so the state
    tables that grow by doubling (flow slots, GRO keys, hash maps) and their copies came from the heap and left
    holes there: on a 2 M-packet many-flows capture 40-80 MiB of the heap was free but resident. A threshold
    of about 1 MiB saved most of that but mapped and unmapped batch arrays every batch (system time 0.6 ->
    1.0 s on 6 M packets); at 4 MiB the batches stay on the heap and the tables mostly do not (6 M packets:
    423 MiB with glibc's dynamic threshold, 404 MiB at 4 MiB, 396 MiB at 1 MiB). A Dask nanny starts its
    workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which fixes the mmap threshold at glibc's 128 KiB floor (every
    batch array mapped, faulted in and unmapped: a 1 M-packet part ran at half speed); this resets it too.
    A user's own ``MALLOC_MMAP_THRESHOLD_`` wins. True when the thresholds were set."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED or os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    _MALLOC_TUNED = True
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt  # glibc (musl's is a stub)
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD)) and bool(mallopt(m_trim_threshold, TRIM_THRESHOLD))
