"""buffers.lazy_zeros: the worst-case tables are resident only where written (measured with mincore(2))."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
from oracle import KERNEL

from bigtcp_pcap.buffers import lazy_zeros
from bigtcp_pcap.capture import read_batches
from bigtcp_pcap.decode import decode
from bigtcp_pcap.gro.evidence import AckEvidence

_libc = ctypes.CDLL(None, use_errno=True)


def resident_pages(a: np.ndarray) -> int:
    addr = a.__array_interface__["data"][0]
    start = addr & ~(mmap.PAGESIZE - 1)
    npg = (addr + a.nbytes - start + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * npg)()
    assert _libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(npg * mmap.PAGESIZE), vec) == 0
    return sum(v & 1 for v in vec)


def test_lazy_zeros_is_zero_writable_and_resident_only_where_written():
    a = lazy_zeros((1 << 20, 2), np.int64)  # 16 MiB
    assert a.shape == (1 << 20, 2) and a.dtype == np.int64 and a.flags.c_contiguous and a.flags.writeable
    assert resident_pages(a) == 0
    a[::65536] = 7  # one row in every 256 pages
    assert resident_pages(a) == 16
    assert int(a.sum()) == 7 * 2 * 16
    small = lazy_zeros(10, np.uint8)  # below LAZY_MIN_BYTES: plain np.zeros
    assert small.shape == (10,) and not small.any()


def test_ack_evidence_tables_follow_the_flows_of_the_capture():
    """A receiver capture of one connection touches a few pages of the 16 MiB per-direction table."""
    ev = AckEvidence()
    assert resident_pages(ev._CS) == 0
    for rb in read_batches(KERNEL / "v6_185000.snd.pcap"):
        ev.push(decode(rb)[0])
    ev.finish()
    assert 0 < resident_pages(ev._CS) <= 8 < ev._CS.nbytes // mmap.PAGESIZE
