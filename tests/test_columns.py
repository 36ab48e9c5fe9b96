"""The column table (decode/schema.py COLUMNS) is the one home of every per-frame column: PacketBatch, the
decoder's output rows, decode()'s mapping and packets.parquet all follow it."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pyarrow.parquet as pq
from oracle import KERNEL, tshark_fields

from bigtcp_pcap import analyze
from bigtcp_pcap.capture import CaptureReader
from bigtcp_pcap.decode import decode
from bigtcp_pcap.decode import kernel as K
from bigtcp_pcap.decode.schema import BATCH_COLUMNS, COLUMNS, KERNEL_ROWS, PacketBatch
from bigtcp_pcap.output.parquet import PACKETS_SCHEMA


def test_packetbatch_fields_are_the_table():
    assert [f.name for f in fields(PacketBatch)] == [c.name for c in BATCH_COLUMNS]
    pb = PacketBatch.empty(3)
    for c in BATCH_COLUMNS:
        a = getattr(pb, c.name)
        assert a.dtype == np.dtype(c.dtype) and a.shape == (3, *c.shape), c.name


def test_kernel_rows_are_dense_and_distinct_per_type():
    consts = {name: getattr(K, name) for name in dir(K) if name[:3] in ("U64", "U32", "U16", "I32") or
              name[:3] in ("U8_", "I8_")}
    for prefix, group in (("U64_", "u64"), ("U32_", "u32"), ("U16_", "u16"), ("U8_", "u8"), ("I32_", "i32"),
                          ("I8_", "i8")):
        rows = sorted(v for k, v in consts.items() if k.startswith(prefix))
        assert rows == list(range(len(KERNEL_ROWS[group]))), group  # every row named once, none left over
        assert getattr(K, "N_" + group.upper()) == len(KERNEL_ROWS[group])


def test_decode_fills_each_column_from_its_row():
    """The mapping follows the table: on a kernel BIG TCP capture, the columns tshark also reads agree."""
    cap = KERNEL / "v6_185000.rcv.pcap"
    pb = next(iter(decode(rb)[0] for rb in CaptureReader(cap)))
    want = tshark_fields(cap, ["tcp.srcport", "tcp.seq_raw", "tcp.window_size_value", "ipv6.hlim", "tcp.hdr_len"],
                         prefs=["-o", "ipv6.tso_support:TRUE"])[: len(pb)]
    tcp = [i for i, r in enumerate(want) if r["tcp.srcport"]]
    assert len(tcp) > 100
    assert [int(want[i]["tcp.srcport"]) for i in tcp] == pb.sport[tcp].tolist()
    assert [int(want[i]["tcp.seq_raw"]) for i in tcp] == pb.tcp_seq[tcp].tolist()
    assert [int(want[i]["tcp.window_size_value"]) for i in tcp] == pb.tcp_win[tcp].tolist()
    assert [int(want[i]["ipv6.hlim"]) for i in tcp] == pb.ttl[tcp].tolist()
    assert [int(want[i]["tcp.hdr_len"]) for i in tcp] == pb.tcp_hdr_len[tcp].tolist()


def test_packets_parquet_is_the_table(tmp_path):
    assert PACKETS_SCHEMA.names == [c.name for c in COLUMNS if c.parquet is not None]
    a = analyze(KERNEL / "v6_185000.rcv.pcap", outdir=tmp_path, packets=True, audit=False)
    assert pq.read_schema(tmp_path / "packets.parquet").names == PACKETS_SCHEMA.names
    assert len(a.packets) == a.info.packets
