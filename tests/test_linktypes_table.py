"""The link-type table is the decoder's: the kernel handles exactly the table's link types, and the reader names
them from it."""

from __future__ import annotations

import numpy as np

from bigtcp_pcap import linktypes
from bigtcp_pcap.capture import RecordBatch, reader
from bigtcp_pcap.decode import decode
from bigtcp_pcap.decode.schema import ST_UNKNOWN_LINKTYPE


def test_kernel_handles_exactly_the_table():
    """One 64-byte record per link type number 0..65535: the decoder calls it unknown iff the table lacks it."""
    n = 65536
    buf = np.zeros(64, np.uint8)
    rb = RecordBatch(buf, np.zeros(n, np.int64), np.full(n, 64, np.uint32), np.full(n, 64, np.uint32),
                     np.zeros(n, np.int64), np.arange(n, dtype=np.uint16), np.zeros(n, np.uint32),
                     np.arange(1, n + 1, dtype=np.uint64), np.zeros(n, np.int64))
    pb, _ = decode(rb)
    unknown = set(np.flatnonzero(pb.status & ST_UNKNOWN_LINKTYPE).tolist())
    assert unknown == set(range(n)) - {lt.number for lt in linktypes.LINKTYPES}


def test_table_rows_are_consistent():
    numbers = [lt.number for lt in linktypes.LINKTYPES]
    assert len(numbers) == len(set(numbers))
    assert all(0 < lt.method < len(linktypes.METHOD_NAMES) for lt in linktypes.LINKTYPES)
    assert set(np.flatnonzero(linktypes.METHOD_OF).tolist()) == set(numbers)
    assert reader.SUPPORTED_LINKTYPES is linktypes.NAMES
    assert linktypes.name(127) == "IEEE802_11_RADIOTAP" and linktypes.name(65000) == "LINKTYPE_65000"
