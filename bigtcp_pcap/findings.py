"""Finding codes: every stage reports problems as rows (frame, code, severity, message), never as exceptions.

Codes follow Wireshark's ``proto.what`` expert-info naming so that users moving between Wireshark, tcpdump and
our tables recognise them. The decoder's compiled kernel emits the small integer ``id`` of a code plus one
numeric value; ``message()`` turns that into text only when findings are written.
"""

from __future__ import annotations

from dataclasses import dataclass

NOTE, WARN, ERROR = "note", "warn", "error"


@dataclass(frozen=True)
class Code:
    id: int
    code: str
    severity: str
    template: str  # formatted with value=<the kernel's number>


_CODES = [
    # RFC 2675 (IPv6 Jumbo Payload option)
    Code(1, "ipv6.jumbo.too_small", ERROR, "Jumbo Payload length {value} is <= 65535 (RFC 2675 section 3)"),
    Code(2, "ipv6.jumbo.plen_nonzero", ERROR, "Jumbo Payload option with IPv6 payload length {value} != 0"),
    Code(3, "ipv6.jumbo.with_fragment", ERROR, "Jumbo Payload option together with a Fragment header"),
    Code(4, "ipv6.jumbo.misaligned", WARN, "Jumbo Payload option at offset {value}, not 4n+2 (RFC 2675)"),
    Code(5, "ipv6.jumbo.not_hbh", ERROR, "Jumbo Payload option in a Destination Options header, not Hop-by-Hop"),
    Code(6, "ipv6.jumbo.missing", ERROR, "IPv6 payload length 0 with a Hop-by-Hop header but no Jumbo option"),
    Code(7, "ipv6.jumbo.duplicate", ERROR, "more than one Jumbo Payload option"),
    Code(8, "ipv6.jumbo.exceeds_frame", ERROR, "Jumbo Payload length needs {value} bytes more than the frame"),
    Code(9, "ipv6.hbh.not_first", ERROR, "Hop-by-Hop header not directly after the IPv6 header"),
    Code(10, "ipv6.jumbo.bad_length", ERROR, "Jumbo Payload option data length {value} != 4"),
    # zero length fields that are not plausible BIG TCP / TSO
    Code(20, "ipv6.plen0.not_tcp_udp", WARN, "IPv6 payload length 0 without Jumbo option, next header {value} "
         "is not TCP/UDP or a tunnel (4, 41, 47): not presumed BIG TCP, length left at 0"),
    Code(21, "ipv4.totlen0.not_tcp_udp", WARN, "IPv4 total length 0, protocol {value} is not TCP/UDP or a tunnel "
         "(4, 41, 47): not presumed BIG TCP/TSO, length left at the header"),
    Code(22, "ipv4.len_exceeds_frame", WARN, "IPv4 total length exceeds the frame by {value} bytes"),
    Code(23, "ipv6.plen_exceeds_frame", WARN, "IPv6 payload length exceeds the frame by {value} bytes"),
    Code(24, "ipv4.bad_ihl", ERROR, "IPv4 header length {value} < 20"),
    Code(25, "tcp.bad_doff", ERROR, "TCP header length {value} < 20"),
    Code(26, "ip.bad_version", ERROR, "IP version {value} where an IP header was expected"),
    Code(27, "ipv4.totlen_lt_header", ERROR, "IPv4 total length {value} is smaller than its header"),
    Code(28, "udp.bad_length", WARN, "UDP length {value} disagrees with the IP payload length"),
    Code(29, "ipv6.exthdr.too_many", WARN, "more than {value} IPv6 extension headers; stopped walking"),
    # ICMP errors about a packet too big for a hop (the quoted packet's own header says what it was)
    Code(30, "icmp.too_big.bigtcp", WARN, "ICMP Packet Too Big / Fragmentation Needed (MTU {value}) answering a "
         "BIG TCP packet (the quoted header: IPv6 payload length 0, or IPv4 total length 0 with TCP or UDP): a "
         "hop did not forward that super-packet, so its bytes are resent (retransmissions)"),
    Code(31, "icmp.too_big", NOTE, "ICMP Packet Too Big / Fragmentation Needed (MTU {value}): path MTU discovery"),
    # truncation by the snaplen (the capture, not the packet)
    Code(40, "frame.truncated.l2", NOTE, "link-layer header cut by the snaplen (caplen {value})"),
    Code(41, "frame.truncated.ip", NOTE, "IP header or extension header chain cut by the snaplen (caplen {value})"),
    Code(42, "frame.truncated.l4", NOTE, "TCP/UDP header cut by the snaplen (caplen {value})"),
    Code(43, "frame.wirelen_lt_caplen", WARN, "original length {value} is smaller than the captured length"),
    Code(44, "frame.unknown_linktype", WARN, "linktype {value} is not decoded"),
    # capture-level (reader / flow stages)
    Code(60, "capture.partial", ERROR, "the capture could not be read to its end: {value}"),
    Code(62, "capture.snaplen_exceeded", NOTE, "records longer than the snaplen {value} were read whole (as "
         "Wireshark does; libpcap cuts them to the snaplen in a pcap file, and stops at the first one in a pcapng "
         "file)"),
    Code(63, "capture.interrupted", ERROR, "the run was interrupted ({value}): the tables hold the frames read "
         "before it"),
    Code(64, "capture.undefined_interface", WARN, "packet blocks name interface {value}, which no Interface "
         "Description Block defines: skipped"),
    Code(65, "capture.tpacket_v2_clamp", WARN, "Ethernet frames with caplen {value} < wire length: libpcap's "
         "TPACKET_V2 ring cut them (tcpdump --immediate-mode with offloads on sizes ring frames for "
         "MAX(MTU, 65535) + 18); their payload past the cut is missing, the lengths come from the wire length"),
    Code(66, "output.write_failed", ERROR, "the output failed ({value}): the tables hold the frames read before it"),
    Code(67, "capture.ts_out_of_range", WARN, "timestamps of interface {value} do not fit int64 nanoseconds since "
         "1970 (years 1677-2262): left null in packets.parquet"),
    Code(68, "capture.empty", NOTE, "the capture holds no packets ({value} bytes): nothing to analyse (tshark "
         "reads it as a capture of none)"),
    Code(69, "capture.dropped", WARN, "the capture's own statistics (pcapng Interface Statistics Block) say "
         "the capturing system dropped {value} packets: sequence gaps, missing segments and resends there may be "
         "the capture's, not the network's"),
    Code(61, "capture.tcp_port_filter_suspected", WARN, "IPv6 TCP flows show {value} bytes of sequence gaps and no "
         "Hop-by-Hop packets: the capture was probably taken with a 'tcp port' filter that drops BIG TCP, or it lost "
         "packets (a full capture buffer: tcpdump's 'dropped by kernel')"),
]

BY_ID: dict[int, Code] = {c.id: c for c in _CODES}
BY_CODE: dict[str, Code] = {c.code: c for c in _CODES}
# plain ints for the compiled decoder (numba reads module-level ints as constants)
JUMBO_TOO_SMALL, JUMBO_PLEN_NONZERO, JUMBO_WITH_FRAGMENT, JUMBO_MISALIGNED = 1, 2, 3, 4
JUMBO_NOT_HBH, JUMBO_MISSING, JUMBO_DUPLICATE, JUMBO_EXCEEDS_FRAME, HBH_NOT_FIRST, JUMBO_BAD_LENGTH = 5, 6, 7, 8, 9, 10
PLEN0_NOT_TCP_UDP, TOTLEN0_NOT_TCP_UDP, V4_LEN_EXCEEDS, V6_PLEN_EXCEEDS, V4_BAD_IHL, TCP_BAD_DOFF = 20, 21, 22, 23, 24, 25
BAD_VERSION, V4_TOTLEN_LT_HDR, UDP_BAD_LENGTH, EXT_TOO_MANY = 26, 27, 28, 29
ICMP_TOO_BIG_BIGTCP, ICMP_TOO_BIG = 30, 31
TRUNC_L2, TRUNC_IP, TRUNC_L4, WIRELEN_LT_CAPLEN, UNKNOWN_LINKTYPE = 40, 41, 42, 43, 44
CAPTURE_PARTIAL, TCP_PORT_FILTER_SUSPECTED = 60, 61
SNAPLEN_EXCEEDED, INTERRUPTED, UNDEFINED_INTERFACE, TPACKET_V2_CLAMP, OUTPUT_FAILED, TS_OUT_OF_RANGE = (
    62, 63, 64, 65, 66, 67)
CAPTURE_EMPTY, CAPTURE_DROPPED = 68, 69


def message(code_id: int, value: int | str) -> str:
    return BY_ID[code_id].template.format(value=value)
