"""The link-type table: every link type the decoder takes to the network layer, declared once.

One row per ``LINKTYPE_*`` value that can appear in a pcap file header or a pcapng Interface Description Block
(numbers and names from the tcpdump.org link-layer header type registry). Each row says the ``DLT_*`` value
libpcap wants for the same header (``pcap_open_dead``: they differ for a few historical types), the fixed header
length when there is one (``-1`` when it is variable), how the decoder finds the network layer (``method``, one of
the ``L2_*`` constants below: the compiled decoder dispatches on it), and a short description.

Users of the table: the reader (``capture/reader.py``, names and the supported set), the decoder
(``decode/kernel.py`` reads ``METHOD_OF``, a 65536-entry array from link type to method, as a compile-time
constant), and the filter audit (``audit/``: DLT and header length). ``tests/test_linktypes_table.py`` checks that
the decoder handles exactly the table's link types.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# How the network layer is found (the decoder's dispatch constants; 0 = not decoded).
L2_NONE = 0
L2_ETHERNET = 1  # 14 bytes, ethertype at 12 (then 802.1Q/802.1ad tags, 802.3 length + LLC/SNAP)
L2_SLL = 2  # Linux cooked v1: 16 bytes, protocol at 14
L2_SLL2 = 3  # Linux cooked v2: 20 bytes, protocol at 0
L2_RAW = 4  # IP, version from the first nibble
L2_IPV4 = 5  # IPv4 only
L2_IPV6 = 6  # IPv6 only
L2_NULL = 7  # 4-byte address family in the capturing host's byte order
L2_LOOP = 8  # 4-byte address family in network byte order
L2_PPP = 9  # PPP: optional FF 03 address/control, 1- or 2-byte protocol (RFC 1661/1662)
L2_PPP_HDLC = 10  # PPP in HDLC-like framing (FF 03) or Cisco HDLC framing (0F/8F)
L2_PPP_DIR = 11  # one direction byte, then PPP
L2_CHDLC = 12  # Cisco HDLC: address, control, 2-byte ethertype
L2_IEEE802_11 = 13  # 802.11 MAC header (data frames, unprotected), then LLC/SNAP
L2_RADIOTAP = 14  # radiotap header (length at byte 2, little-endian), then 802.11
L2_PPI = 15  # PPI header (length at byte 2, DLT at byte 4, little-endian), then that DLT
L2_NFLOG = 16  # Linux NFLOG: 4-byte header, then TLVs; the payload TLV (type 9) holds the IP packet
L2_IPOIB = 17  # IP over InfiniBand: 44 bytes (addresses, then the RFC 4391 type at 40 and 2 reserved bytes)
L2_PKTAP = 18  # Apple PKTAP: header length at 0, record type at 4, DLT of the rest at 8 (little-endian)
L2_FDDI = 19  # FDDI: frame control + two addresses (13 bytes), then LLC/SNAP

METHOD_NAMES = ("none", "ethernet", "sll", "sll2", "raw", "ipv4", "ipv6", "null", "loop", "ppp", "ppp_hdlc",
                "ppp_dir", "chdlc", "ieee802_11", "radiotap", "ppi", "nflog", "ipoib", "pktap", "fddi")


@dataclass(frozen=True)
class LinkType:
    """One row of the table (see the module docstring)."""

    number: int  # LINKTYPE_ value in the file
    name: str  # LINKTYPE_ name without the prefix
    dlt: int  # DLT_ value libpcap compiles filters for
    header: int  # fixed link-header bytes before the next layer, -1 when variable
    method: int  # L2_* constant: how the decoder reaches the network layer
    description: str


LINKTYPES: tuple[LinkType, ...] = (
    LinkType(0, "NULL", 0, 4, L2_NULL, "BSD loopback: address family in host byte order"),
    LinkType(1, "ETHERNET", 1, 14, L2_ETHERNET, "Ethernet II / 802.3, with 802.1Q/802.1ad tags"),
    LinkType(9, "PPP", 9, -1, L2_PPP, "PPP (RFC 1661), with or without HDLC-like framing"),
    LinkType(10, "FDDI", 10, 21, L2_FDDI, "FDDI, 802.2 LLC/SNAP"),
    LinkType(12, "RAW", 12, 0, L2_RAW, "raw IP (the value some BSDs write for DLT_RAW)"),
    LinkType(14, "RAW", 14, 0, L2_RAW, "raw IP (the value OpenBSD writes for DLT_RAW)"),
    LinkType(50, "PPP_HDLC", 50, -1, L2_PPP_HDLC, "PPP in HDLC-like framing, or Cisco PPP with HDLC framing"),
    LinkType(101, "RAW", 12, 0, L2_RAW, "raw IPv4 or IPv6"),
    LinkType(104, "C_HDLC", 104, 4, L2_CHDLC, "Cisco HDLC"),
    LinkType(105, "IEEE802_11", 105, -1, L2_IEEE802_11, "802.11 frames, no radio header"),
    LinkType(108, "LOOP", 108, 4, L2_LOOP, "OpenBSD loopback: address family in network byte order"),
    LinkType(113, "LINUX_SLL", 113, 16, L2_SLL, "Linux cooked capture v1 (tcpdump -i any)"),
    LinkType(127, "IEEE802_11_RADIOTAP", 127, -1, L2_RADIOTAP, "radiotap header, then 802.11"),
    LinkType(149, "PKTAP", 149, -1, L2_PKTAP, "Apple PKTAP as Apple's libpcap writes it (DLT_USER2)"),
    LinkType(192, "PPI", 192, -1, L2_PPI, "Per-Packet Information header, then 802.11 or Ethernet"),
    LinkType(204, "PPP_WITH_DIR", 204, -1, L2_PPP_DIR, "PPP preceded by a direction byte"),
    LinkType(228, "IPV4", 228, 0, L2_IPV4, "raw IPv4"),
    LinkType(229, "IPV6", 229, 0, L2_IPV6, "raw IPv6"),
    LinkType(239, "NFLOG", 239, -1, L2_NFLOG, "Linux netfilter log (nflog:N): TLVs, payload TLV holds IP"),
    LinkType(242, "IPOIB", 242, 44, L2_IPOIB, "IP over InfiniBand: addresses, then the RFC 4391 header"),
    LinkType(258, "PKTAP", 149, -1, L2_PKTAP, "Apple PKTAP: metadata header, then the interface's link type"),
    LinkType(276, "LINUX_SLL2", 276, 20, L2_SLL2, "Linux cooked capture v2 (tcpdump -i any, libpcap >= 1.10)"),
)

BY_NUMBER: dict[int, LinkType] = {lt.number: lt for lt in LINKTYPES}
NAMES: dict[int, str] = {lt.number: lt.name for lt in LINKTYPES}
"""Link type number -> name, for every link type the decoder takes to the network layer."""


def _method_array() -> np.ndarray:
    a = np.zeros(65536, np.uint8)
    for lt in LINKTYPES:
        a[lt.number] = lt.method
    return a


METHOD_OF: np.ndarray = _method_array()
"""uint8[65536]: link type number -> L2_* method (L2_NONE for a link type the decoder does not know)."""


def name(number: int) -> str:
    """The table's name for a link type, or ``LINKTYPE_<number>`` for one it does not hold."""
    lt = BY_NUMBER.get(number)
    return lt.name if lt is not None else f"LINKTYPE_{number}"


# libpcap's snaplen limits (pcap-common.c max_snaplen_for_dlt): MAXIMUM_SNAPLEN for most link types, more for a
# few it does not decode (DLT_DBUS, DLT_EBHSCR, DLT_USBPCAP). tcpdump compiles with it and refuses a longer record.
LIBPCAP_MAXIMUM_SNAPLEN = 262144
LIBPCAP_MAX_SNAPLEN = {231: 128 << 20, 279: 8 << 20, 249: 1 << 20}


def libpcap_max_snaplen(number: int) -> int:
    """The largest caplen libpcap accepts for a link type."""
    return LIBPCAP_MAX_SNAPLEN.get(number, LIBPCAP_MAXIMUM_SNAPLEN)
