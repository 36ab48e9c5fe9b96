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

from dataclasses import dataclass, fields

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


@dataclass
class PacketBatch:
    """Decoded columns of consecutive frames (see module docstring)."""

    frame: np.ndarray  # uint64, 1-based, = Wireshark frame.number
    ts_ns: np.ndarray  # int64, ns since the epoch, UTC
    caplen: np.ndarray  # uint32
    wirelen: np.ndarray  # uint32, the original length recorded by the capture
    linktype: np.ndarray  # uint16
    if_id: np.ndarray  # uint32, pcapng interface id (0 for pcap)
    status: np.ndarray  # uint16, ST_* bits
    tunnel: np.ndarray  # uint8, TUNNEL_*
    l2_hash: np.ndarray  # uint64, digest of the (outer) link header incl. VLAN tags
    l2_len: np.ndarray  # uint16, bytes of the (outer) link header
    vlan: np.ndarray  # uint16, outermost VLAN id, 0xFFFF when untagged
    l3_off: np.ndarray  # int32, offset of the innermost IP header in the frame, -1 if none
    ip_version: np.ndarray  # uint8, 0 / 4 / 6
    ip_hdr_len: np.ndarray  # uint16, bytes from the IP header to L4 (IPv4 IHL*4, IPv6 40 + ext headers)
    ip_len_field: np.ndarray  # uint32, the raw tot_len / payload_len field as found
    ip_len: np.ndarray  # uint32, true L3 length (IPv4 total length or 40 + IPv6 payload)
    bigtcp: np.ndarray  # uint8, BIGTCP_*
    jumbo_len: np.ndarray  # uint32, the Jumbo Payload value, 0 when absent
    has_jumbo: np.ndarray  # bool
    src: np.ndarray  # uint8 (n, 16)
    dst: np.ndarray  # uint8 (n, 16)
    ttl: np.ndarray  # uint8, IPv4 TTL or IPv6 hop limit
    tos: np.ndarray  # uint8, IPv4 TOS or IPv6 traffic class (incl. ECN bits)
    ip_id: np.ndarray  # uint16 (IPv4)
    df: np.ndarray  # uint8 (IPv4 DF bit)
    ip_evil: np.ndarray  # uint8 (IPv4 reserved flag bit)
    flow_label: np.ndarray  # uint32 (IPv6)
    ext_hash: np.ndarray  # uint64, digest of all IPv6 extension header bytes (0 when none)
    ext_len: np.ndarray  # uint16, bytes of IPv6 extension headers
    l4_proto: np.ndarray  # uint8, protocol number reached at the end of the header chain
    l4_off: np.ndarray  # int32, offset of the L4 header in the frame, -1 if none
    sport: np.ndarray  # uint16
    dport: np.ndarray  # uint16
    tcp_seq: np.ndarray  # uint32
    tcp_ack: np.ndarray  # uint32
    tcp_flags: np.ndarray  # uint16, TH_* bits: the 12-bit flag word (reserved bits, AE, CWR..FIN)
    tcp_win: np.ndarray  # uint16 (raw, unscaled)
    tcp_hdr_len: np.ndarray  # uint8, doff * 4
    tcp_payload_len: np.ndarray  # uint32, true TCP payload (from ip_len, never caplen)
    tcp_opt_hash: np.ndarray  # uint64, digest of the option bytes (0 when no options)
    tcp_mss: np.ndarray  # uint16, MSS option, 0 when absent
    tcp_wscale: np.ndarray  # int8, window scale option, -1 when absent
    tcp_sack_perm: np.ndarray  # bool
    tcp_sack_blocks: np.ndarray  # uint8, number of SACK blocks
    tcp_has_ts: np.ndarray  # bool
    tcp_ts_val: np.ndarray  # uint32
    tcp_ts_ecr: np.ndarray  # uint32
    udp_len: np.ndarray  # uint32, true UDP length (the field, or from ip_len when the field is 0)
    epb_flags: np.ndarray  # uint32, the pcapng epb_flags option passed through from the reader (0 when absent)

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
        return PacketBatch(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    @classmethod
    def concat(cls, batches: list[PacketBatch]) -> PacketBatch:
        if not batches:
            return cls.empty(0)
        return cls(**{f.name: np.concatenate([getattr(b, f.name) for b in batches]) for f in fields(cls)})

    def columns(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


COLUMN_TYPES: dict[str, tuple[type, tuple[int, ...]]] = {
    "frame": (np.uint64, ()),
    "ts_ns": (np.int64, ()),
    "caplen": (np.uint32, ()),
    "wirelen": (np.uint32, ()),
    "linktype": (np.uint16, ()),
    "if_id": (np.uint32, ()),
    "status": (np.uint16, ()),
    "tunnel": (np.uint8, ()),
    "l2_hash": (np.uint64, ()),
    "l2_len": (np.uint16, ()),
    "vlan": (np.uint16, ()),
    "l3_off": (np.int32, ()),
    "ip_version": (np.uint8, ()),
    "ip_hdr_len": (np.uint16, ()),
    "ip_len_field": (np.uint32, ()),
    "ip_len": (np.uint32, ()),
    "bigtcp": (np.uint8, ()),
    "jumbo_len": (np.uint32, ()),
    "has_jumbo": (np.bool_, ()),
    "src": (np.uint8, (16,)),
    "dst": (np.uint8, (16,)),
    "ttl": (np.uint8, ()),
    "tos": (np.uint8, ()),
    "ip_id": (np.uint16, ()),
    "df": (np.uint8, ()),
    "ip_evil": (np.uint8, ()),
    "flow_label": (np.uint32, ()),
    "ext_hash": (np.uint64, ()),
    "ext_len": (np.uint16, ()),
    "l4_proto": (np.uint8, ()),
    "l4_off": (np.int32, ()),
    "sport": (np.uint16, ()),
    "dport": (np.uint16, ()),
    "tcp_seq": (np.uint32, ()),
    "tcp_ack": (np.uint32, ()),
    "tcp_flags": (np.uint16, ()),
    "tcp_win": (np.uint16, ()),
    "tcp_hdr_len": (np.uint8, ()),
    "tcp_payload_len": (np.uint32, ()),
    "tcp_opt_hash": (np.uint64, ()),
    "tcp_mss": (np.uint16, ()),
    "tcp_wscale": (np.int8, ()),
    "tcp_sack_perm": (np.bool_, ()),
    "tcp_sack_blocks": (np.uint8, ()),
    "tcp_has_ts": (np.bool_, ()),
    "tcp_ts_val": (np.uint32, ()),
    "tcp_ts_ecr": (np.uint32, ()),
    "udp_len": (np.uint32, ()),
    "epb_flags": (np.uint32, ()),
}
