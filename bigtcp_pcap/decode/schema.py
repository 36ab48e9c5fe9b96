"""The PacketBatch: one column per decoded header field, one row per frame.

Every stage after the decoder (GRO engine, flow table, filter audit, sinks) reads these columns and nothing
else, so a stage can be tested with a batch built by hand (``PacketBatch.empty(n)`` then fill columns).

Conventions
-----------
* Lengths are uint32: BIG TCP frames reach 512 KB, so 16-bit types are never used for a length.
* TCP/UDP fields and the ``ip_*`` fields describe the innermost IP/L4 header (the inner frame of a VXLAN,
  Geneve, GRE or ERSPAN tunnel, or of IP-in-IP); ``tunnel`` says whether there was one (``TUNNEL_NAMES``).
* ``bigtcp`` is the encoding code (``BIGTCP_NAMES``): how the kernel signalled a length that does not fit in
  16 bits. ``ip_len`` is always the true L3 length, from the jumbo option or from the frame's original length
  (wirelen), never from caplen.
* Addresses are 16 bytes per row (IPv4 in the first 4 bytes, rest zero); ``ip_version`` tells which.
* ``*_hash`` columns are 64-bit digests (``kernel.digest``) of variable-length byte runs (the MAC header, IPv6 extension
  headers, TCP options) so that the GRO engine can compare them byte-for-byte (gro-spec R4, R10, R14.4)
  without keeping the packet buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, make_dataclass

import numpy as np

# --- enumerations -------------------------------------------------------------------------------------------
BIGTCP_NONE, BIGTCP_HBH_JUMBO, BIGTCP_V6_PLEN0, BIGTCP_V4_TOTLEN0 = 0, 1, 2, 3
BIGTCP_NAMES = ("none", "hbh_jumbo", "v6_plen0", "v4_totlen0")

# The tunnel (or IP-in-IP encapsulation) whose inner frame the IP/L4 columns describe, the innermost one when
# they nest. This is the one list of them: the decoder writes these codes, the Parquet and dissect outputs their
# names. vxlan/geneve: UDP 4789/6081; gre: GRE (RFC 2784/2890, PPTP's version 1, GRE-in-UDP 4754) carrying
# IPv4, IPv6, MPLS, PPP, Ethernet (0x6558) or Aruba's 802.11 frames, and WCCP redirects; erspan: GRE 0x88BE (ERSPAN type I and II) or 0x22EB (type
# III) from a mirror port; ipip: IP protocol 4 (IPv4 inside IPv4 or IPv6); ip6ip: IP protocol 41 (IPv6 inside
# IPv4, i.e. SIT/6in4, or inside IPv6, ip6ip6).
TUNNEL_NONE, TUNNEL_VXLAN, TUNNEL_GENEVE, TUNNEL_GRE, TUNNEL_ERSPAN, TUNNEL_IPIP, TUNNEL_IP6IP = 0, 1, 2, 3, 4, 5, 6
TUNNEL_NAMES = ("none", "vxlan", "geneve", "gre", "erspan", "ipip", "ip6ip")

# TCP flag bits: the 12 low bits of the 16-bit word at TCP offset 12 (the data offset is the top 4): FIN..CWR,
# AE (the old NS bit) and the three reserved bits, which the kernel's GRO flag-word comparison includes.
TH_FIN, TH_SYN, TH_RST, TH_PSH, TH_ACK, TH_URG, TH_ECE, TH_CWR, TH_AE = 1, 2, 4, 8, 16, 32, 64, 128, 256
TH_RESERVED = 0xE00  # the bits between AE and the data offset (RFC 9293 "Rsrvd")
TH_ALL = 0xFFF  # every flag bit the tcp_flags column keeps

# status bits: what the decoder could not do for this frame
ST_TRUNC_L2 = 1  # link header cut by the snaplen
ST_TRUNC_L3 = 2  # IP header or extension-header chain cut by the snaplen
ST_TRUNC_L4 = 4  # TCP/UDP header (or TCP options) cut by the snaplen
ST_NOT_IP = 8  # no IP layer (ARP, LLDP, ...)
ST_UNKNOWN_LINKTYPE = 16
ST_MALFORMED = 32  # a header field is impossible (IHL < 5, doff < 5, ...)
ST_IP_FRAGMENT = 64  # IPv4 MF/offset or an IPv6 Fragment header: no L4 beyond the first fragment
ST_L4_UNKNOWN = 128  # the chain ended in a protocol we do not decode
STATUS_NAMES = ("truncated_l2", "truncated_ip", "truncated_l4", "not_ip", "unknown_linktype", "malformed",
                "ip_fragment", "l4_not_decoded")  # index = bit number


# --- the column table -------------------------------------------------------------------------------------------
# One home for every per-frame column: PacketBatch's fields, their dtypes, where the decoder produces them (a row
# of one of its grouped output arrays, or the reader's record columns), and how packets.parquet writes them. The
# kernel's row indices (kernel.py), decode()'s mapping (decode.py) and PACKETS_SCHEMA (output/parquet.py) are
# derived from it. ``origin``: "record" (the reader's RecordBatch), "u64" / "u32" / "u16" / "u8" / "i32" / "i8"
# (a row of the decoder's output array of that type), "addr" (the (n, 16) address arrays), "flows" (assigned by
# the flow table: a packets.parquet column, not a PacketBatch field). ``parquet``: the column's Parquet type
# ("ts": timestamp ns UTC, "dict:<names>": dictionary of the names tuple here) or None when not written; ``null``:
# when the Parquet value is null (see output/parquet.py NULL_WHEN), None for never.
@dataclass(frozen=True)
class Column:
    name: str
    dtype: type
    origin: str
    doc: str
    parquet: str | None = None
    null: str | None = None
    shape: tuple[int, ...] = ()


C = Column
COLUMNS: tuple[Column, ...] = (
    C("frame", np.uint64, "record", "1-based, = Wireshark frame.number", "u64"),
    C("ts_ns", np.int64, "record", "ns since the epoch, UTC", "ts", "ts_unknown"),
    C("caplen", np.uint32, "record", "bytes captured", "u32"),
    C("wirelen", np.uint32, "record", "the original length recorded by the capture", "u32"),
    C("linktype", np.uint16, "record", "the frame's link type (pcapng: its interface's)", "u16"),
    C("if_id", np.uint32, "record", "pcapng interface id (0 for pcap)", "u32"),
    C("if_gid", np.uint32, "record", "the pcapng interface numbered across sections (if_id plus the interfaces of "
      "the sections before): one capture point per interface of each section"),
    C("direction", np.uint8, "u8", "the capturing host received (1) or sent (2) the frame, as the packet type of a "
      "Linux cooked header (v1 or v2) says; null (0) when the link header does not say", "u8", "zero"),
    C("ifindex", np.uint32, "u32", "the capturing host's interface index in a Linux cooked v2 header (tcpdump -i "
      "any); null (0) when the link header carries none", "u32", "zero"),
    C("flow_id", np.int64, "flows", "the flow table's id of the flow direction", "i64", "no_flow"),
    C("tunnel", np.uint8, "u8", "TUNNEL_* of the innermost tunnel", "dict:TUNNEL_NAMES"),
    C("ip_version", np.uint8, "u8", "0 / 4 / 6", "u8", "no_ip"),
    C("ip_len", np.uint32, "u32", "true L3 length (IPv4 total length or 40 + IPv6 payload)", "u32", "no_ip"),
    C("ip_len_field", np.uint32, "u32", "the raw tot_len / payload_len field as found", "u32", "no_ip"),
    C("bigtcp", np.uint8, "u8", "BIGTCP_*", "dict:BIGTCP_NAMES"),
    C("jumbo_len", np.uint32, "u32", "the Jumbo Payload value, 0 when absent", "u32", "no_jumbo"),
    C("ext_len", np.uint16, "u16", "bytes of IPv6 extension headers", "u16"),
    C("ttl", np.uint8, "u8", "IPv4 TTL or IPv6 hop limit", "u8"),
    C("tos", np.uint8, "u8", "IPv4 TOS or IPv6 traffic class (incl. ECN bits)", "u8"),
    C("ip_id", np.uint16, "u16", "IPv4 identification", "u16"),
    C("flow_label", np.uint32, "u32", "IPv6 flow label", "u32"),
    C("l4_proto", np.uint8, "u8", "protocol number reached at the end of the header chain", "u8", "no_ip"),
    C("sport", np.uint16, "u16", "TCP/UDP source port", "u16", "not_l4"),
    C("dport", np.uint16, "u16", "TCP/UDP destination port", "u16", "not_l4"),
    C("tcp_seq", np.uint32, "u32", "raw sequence number", "u32", "not_tcp"),
    C("tcp_ack", np.uint32, "u32", "raw acknowledgment number", "u32", "not_tcp"),
    C("tcp_flags", np.uint16, "u16", "TH_* bits: the 12-bit flag word (reserved bits, AE, CWR..FIN)", "u16",
      "not_tcp"),
    C("tcp_win", np.uint16, "u16", "raw window (unscaled)", "u16", "not_tcp"),
    C("tcp_hdr_len", np.uint8, "u8", "doff * 4", "u8", "not_tcp"),
    C("tcp_payload_len", np.uint32, "u32", "true TCP payload (from ip_len, never caplen)", "u32", "not_tcp"),
    C("tcp_mss", np.uint16, "u16", "MSS option, 0 when absent", "u16", "zero"),
    C("tcp_ts_val", np.uint32, "u32", "timestamp option TSval", "u32", "no_ts"),
    C("udp_len", np.uint32, "u32", "true UDP length (the field, or from ip_len when the field is 0)", "u32",
      "not_udp"),
    C("status", np.uint16, "u16", "ST_* bits: what the decoder could not do", "u16"),
    C("epb_flags", np.uint32, "record", "the pcapng epb_flags option (0 when absent; bits 9-11 checksum / GSO)",
      "u32"),
    # --- decoder columns the stages use, not written to packets.parquet ---
    C("l2_hash", np.uint64, "u64", "digest of the (outer) link header incl. VLAN tags"),
    C("l2_len", np.uint16, "u16", "bytes of the (outer) link header"),
    C("vlan", np.uint16, "u16", "outermost VLAN id, 0xFFFF when untagged"),
    C("l3_off", np.int32, "i32", "offset of the innermost IP header in the frame, -1 if none"),
    C("ip_hdr_len", np.uint16, "u16", "bytes from the IP header to L4 (IPv4 IHL*4, IPv6 40 + ext headers)"),
    C("has_jumbo", np.bool_, "u8", "a Jumbo Payload option was found"),
    C("src", np.uint8, "addr", "source address, 16 bytes (IPv4 in the first 4)", shape=(16,)),
    C("dst", np.uint8, "addr", "destination address, 16 bytes (IPv4 in the first 4)", shape=(16,)),
    C("df", np.uint8, "u8", "IPv4 DF bit"),
    C("ip_evil", np.uint8, "u8", "IPv4 reserved flag bit"),
    C("ext_hash", np.uint64, "u64", "digest of all IPv6 extension header bytes (0 when none)"),
    C("l4_off", np.int32, "i32", "offset of the L4 header in the frame, -1 if none"),
    C("tcp_opt_hash", np.uint64, "u64", "digest of the option bytes (0 when no options)"),
    C("tcp_wscale", np.int8, "i8", "window scale option, -1 when absent"),
    C("tcp_sack_perm", np.bool_, "u8", "SACK-permitted option present"),
    C("tcp_sack_blocks", np.uint8, "u8", "number of SACK blocks"),
    C("tcp_has_ts", np.bool_, "u8", "timestamp option present"),
    C("tcp_ts_ecr", np.uint32, "u32", "timestamp option TSecr"),
    C("tcp_sack_left", np.uint32, "u32", "left edge of the first SACK block (raw), 0 when none"),
    C("tcp_sack_right", np.uint32, "u32", "right edge of the first SACK block (raw), 0 when none"),
)
del C
BATCH_COLUMNS: tuple[Column, ...] = tuple(c for c in COLUMNS if c.origin != "flows")
COLUMN_TYPES: dict[str, tuple[type, tuple[int, ...]]] = {c.name: (c.dtype, c.shape) for c in BATCH_COLUMNS}
# the decoder's grouped output arrays: one (rows, n) array per dtype, a row per column of that origin
KERNEL_GROUPS: dict[str, type] = {"u64": np.uint64, "u32": np.uint32, "u16": np.uint16, "u8": np.uint8,
                                  "i32": np.int32, "i8": np.int8}
KERNEL_ROWS: dict[str, tuple[str, ...]] = {g: tuple(c.name for c in BATCH_COLUMNS if c.origin == g)
                                           for g in KERNEL_GROUPS}


def kernel_row(name: str) -> int:
    """Row of column ``name`` in the decoder's output array of its type (kernel.py's U32_* etc. constants)."""
    for rows in KERNEL_ROWS.values():
        if name in rows:
            return rows.index(name)
    raise KeyError(name)


class _Batch:
    """The methods of PacketBatch (its fields come from COLUMNS)."""

    def __len__(self) -> int:
        return int(self.frame.shape[0])

    @classmethod
    def empty(cls, n: int) -> PacketBatch:
        """A zero-filled batch of n rows with the column types above (for tests and for the decoder)."""
        cols = {}
        for f in fields(cls):
            dtype, shape = COLUMN_TYPES[f.name]
            cols[f.name] = np.zeros((n, *shape), dtype=dtype)
        b = cls(**cols)
        b.l3_off[:] = -1
        b.l4_off[:] = -1
        b.vlan[:] = 0xFFFF
        b.tcp_wscale[:] = -1
        return b

    def take(self, idx: np.ndarray) -> PacketBatch:
        """Rows selected by a boolean mask or an index array."""
        return type(self)(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    @classmethod
    def concat(cls, batches: list[PacketBatch]) -> PacketBatch:
        if not batches:
            return cls.empty(0)
        return cls(**{f.name: np.concatenate([getattr(b, f.name) for b in batches]) for f in fields(cls)})

    def columns(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class RowsView:
    """Rows ``idx`` of a PacketBatch, each column taken only when first read: for a stage that reads a few
    columns of a subset (the filter audit's candidate frames), instead of ``take`` copying every column."""

    def __init__(self, batch, idx: np.ndarray) -> None:
        self._batch = batch
        self._idx = np.flatnonzero(idx) if idx.dtype == np.bool_ else idx

    def __len__(self) -> int:
        return int(self._idx.shape[0])

    def __getattr__(self, name: str) -> np.ndarray:  # a column not read yet
        if name not in COLUMN_TYPES:
            raise AttributeError(name)
        col = getattr(self._batch, name)[self._idx]
        setattr(self, name, col)
        return col


PacketBatch = make_dataclass(
    "PacketBatch", [(c.name, np.ndarray) for c in BATCH_COLUMNS], bases=(_Batch,),
    namespace={"__doc__": "Decoded columns of consecutive frames (see the module docstring and COLUMNS)."})
PacketBatch.__module__ = __name__
