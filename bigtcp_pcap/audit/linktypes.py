"""What the filter audit needs to know about each link type, in one table.

For every pcap/pcapng LINKTYPE_* value the reader hands over: its name (for messages), the LINKTYPE value
written into the one-header savefile libpcap compiles against (libpcap.py), and the length of the link header
(suggest.py's length rewrites: ``ip[2:2]`` -> ``len - L2``). Values from pcap-linktype(7) and libpcap's
pcap-common.c. A link type missing here is still compiled by libpcap under its own number; only the
suggestions that need the link header length are then left out.

The rows come from the project's link-type table (``bigtcp_pcap/linktypes.py``); only what the audit sees
differently is written here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from ..linktypes import LINKTYPES as _TABLE


@dataclass(frozen=True)
class LinkType:
    """One link type as the audit sees it."""

    name: str
    savefile: int  # LINKTYPE_* value to put in the savefile header libpcap compiles against
    header_len: int | None  # bytes before the IP header (None: variable)


# From the project's one link-type table (bigtcp_pcap/linktypes.py), with what differs for the audit: the savefile
# value libpcap compiles against (LINKTYPE 14 is DLT_RAW only on OpenBSD; libpcap elsewhere knows raw IP as
# LINKTYPE_RAW 101) and the name tcpdump prints (DLT_EN10MB for Ethernet).
_SAVEFILE = {14: 101}
_NAME = {1: "EN10MB"}
LINKTYPES: dict[int, LinkType] = {
    lt.number: LinkType(_NAME.get(lt.number, lt.name), _SAVEFILE.get(lt.number, lt.number),
                        lt.header if lt.header >= 0 else None)
    for lt in _TABLE
}
# link types whose header holds a host-byte-order word: libpcap compiles the comparison for the byte order of
# the file's writer, so a program exists per byte order (see ``byte_swapped``)
HOST_ORDER_HEADER = frozenset({0})


def name(linktype: int) -> str:
    """``228 (IPV4)``: the number and name used in messages."""
    lt = LINKTYPES.get(int(linktype))
    return f"{int(linktype)} ({lt.name})" if lt else str(int(linktype))


def savefile_linktype(linktype: int) -> int:
    """The LINKTYPE value libpcap is given for frames of ``linktype``."""
    lt = LINKTYPES.get(int(linktype))
    return lt.savefile if lt else int(linktype)


def header_len(linktype: int) -> int | None:
    """Bytes of link header before IP (None when unknown or variable)."""
    lt = LINKTYPES.get(int(linktype))
    return lt.header_len if lt else None


def compile_key(linktype: int, swapped: bool = False) -> int:
    """One integer per program libpcap compiles: the link type and the writer's byte order."""
    return int(linktype) * 2 + bool(swapped)


def split_key(key: int) -> tuple[int, bool]:
    """(linktype, swapped) of a ``compile_key``."""
    return int(key) // 2, bool(int(key) & 1)


def compile_keys(linktypes: np.ndarray, buf: np.ndarray, off: np.ndarray, caplen: np.ndarray) -> np.ndarray:
    """``compile_key`` per frame (int64)."""
    swapped = byte_swapped(linktypes, buf, off, caplen, sys.byteorder == "little")
    return np.asarray(linktypes, np.int64) * 2 + swapped


def byte_swapped(linktypes: np.ndarray, buf: np.ndarray, off: np.ndarray, caplen: np.ndarray,
                 little_host: bool) -> np.ndarray:
    """Per frame: True when a host-byte-order link header (DLT_NULL's address family) was written by a host of
    the other byte order than this one, as libpcap's ``swapped`` flag would say for the file.

    libpcap takes the byte order from the file header; the reader does not pass it on, so it is read from the
    address family itself (a value < 256 in one byte order): the writer of a NULL file is the host whose family
    word it is, so the two agree on every file a capture tool writes."""
    out = np.zeros(len(off), bool)
    sel = np.flatnonzero(np.isin(linktypes, list(HOST_ORDER_HEADER)) & (np.asarray(caplen) >= 4))
    if sel.size:
        first = buf[np.asarray(off)[sel]]  # low byte of a little-endian family, high byte of a big-endian one
        written_little = first != 0
        out[sel] = written_little != little_host
    return out
