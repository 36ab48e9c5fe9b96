"""Per-packet text (in the spirit of ``tcpdump -v``) and JSON lines, from the decoded columns."""

from __future__ import annotations

import ipaddress
import json
import os
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import BinaryIO

from . import findings as F
from .api import iter_batches
from .decode.schema import BIGTCP_NAMES, TUNNEL_NAMES, PacketBatch

_FLAGS = ((0x01, "F"), (0x02, "S"), (0x04, "R"), (0x08, "P"), (0x20, "U"), (0x40, "E"), (0x80, "W"), (0x100, "A"))
JSON_FIELDS = ("frame", "ts_ns", "caplen", "wirelen", "linktype", "ip_version", "ip_len", "ip_len_field", "bigtcp",
               "jumbo_len", "tunnel", "l4_proto", "sport", "dport", "tcp_seq", "tcp_ack", "tcp_flags", "tcp_win",
               "tcp_payload_len", "udp_len")


def tcp_flags_text(flags: int) -> str:
    """tcpdump's flag letters: S F R P U E W (AE as 'A'), '.' for ACK."""
    s = "".join(ch for bit, ch in _FLAGS if flags & bit)
    return s + ("." if flags & 0x10 else "") or "none"


def _addr(b, ver: int) -> str:
    return str(ipaddress.IPv4Address(bytes(b[:4]))) if ver == 4 else str(ipaddress.IPv6Address(bytes(b)))


def packet_record(pb: PacketBatch, i: int) -> dict:
    """The packets-table fields of row i as plain Python values (nulls as None)."""
    ver = int(pb.ip_version[i])
    tcp = pb.l4_proto[i] == 6 and pb.l4_off[i] >= 0 and pb.tcp_hdr_len[i] >= 20
    l4 = pb.l4_off[i] >= 0 and pb.l4_proto[i] in (6, 17)
    r = {
        "frame": int(pb.frame[i]), "ts_ns": int(pb.ts_ns[i]), "caplen": int(pb.caplen[i]),
        "wirelen": int(pb.wirelen[i]), "linktype": int(pb.linktype[i]), "ip_version": ver or None,
        "ip_len": int(pb.ip_len[i]) if ver else None, "ip_len_field": int(pb.ip_len_field[i]) if ver else None,
        "bigtcp": BIGTCP_NAMES[pb.bigtcp[i]], "jumbo_len": int(pb.jumbo_len[i]) if pb.has_jumbo[i] else None,
        "tunnel": TUNNEL_NAMES[pb.tunnel[i]], "l4_proto": int(pb.l4_proto[i]) if ver else None,
        "src": _addr(pb.src[i], ver) if ver else None, "dst": _addr(pb.dst[i], ver) if ver else None,
        "sport": int(pb.sport[i]) if l4 else None, "dport": int(pb.dport[i]) if l4 else None,
        "tcp_seq": int(pb.tcp_seq[i]) if tcp else None, "tcp_ack": int(pb.tcp_ack[i]) if tcp else None,
        "tcp_flags": int(pb.tcp_flags[i]) if tcp else None, "tcp_win": int(pb.tcp_win[i]) if tcp else None,
        "tcp_payload_len": int(pb.tcp_payload_len[i]) if tcp else None,
        "udp_len": int(pb.udp_len[i]) if l4 and pb.l4_proto[i] == 17 else None,
    }
    return r


def packet_line(r: dict, notes: list[str]) -> str:
    ts = datetime.fromtimestamp(r["ts_ns"] // 1_000_000_000, UTC)
    t = f"{ts:%H:%M:%S}.{r['ts_ns'] % 1_000_000_000:09d}"
    head = f"{r['frame']:>6} {t}"
    if r["ip_version"] is None:
        body = f"non-IP frame, length {r['wirelen']}"
    else:
        ip = "IP" if r["ip_version"] == 4 else "IP6"
        big = ""
        if r["bigtcp"] != "none":
            jumbo = f" jumbo {r['jumbo_len']}," if r["jumbo_len"] is not None else ""
            big = f" [BIG TCP {r['bigtcp']}:{jumbo} length field {r['ip_len_field']}, true length {r['ip_len']}]"
        tun = f" (inner of {r['tunnel']})" if r["tunnel"] != "none" else ""
        if r["tcp_seq"] is not None:
            pl = r["tcp_payload_len"]
            seq = f"seq {r['tcp_seq']}:{(r['tcp_seq'] + pl) % 2**32}" if pl else f"seq {r['tcp_seq']}"
            l4 = (f"{r['src']}.{r['sport']} > {r['dst']}.{r['dport']}: Flags [{tcp_flags_text(r['tcp_flags'])}], "
                  f"{seq}, ack {r['tcp_ack']}, win {r['tcp_win']}, length {pl}")
        elif r["udp_len"] is not None:
            l4 = f"{r['src']}.{r['sport']} > {r['dst']}.{r['dport']}: UDP, length {r['udp_len'] - 8}"
        else:
            l4 = f"{r['src']} > {r['dst']}: proto {r['l4_proto']}"
        body = f"{ip}{tun} (length {r['ip_len']}){big} {l4}"
    tail = "".join(f" !{n}" for n in notes)
    return f"{head} {body}{tail}"


def iter_lines(source: str | os.PathLike | BinaryIO, *, count: int | None = None,
               as_json: bool = False) -> Iterator[str]:
    shown = 0
    for pb, fr in iter_batches(source):
        notes: dict[int, list[str]] = defaultdict(list)
        for frame, code in zip(fr.frame.tolist(), fr.code.tolist()):
            notes[frame].append(F.BY_ID[code].code)
        for i in range(len(pb)):
            if count is not None and shown >= count:
                return
            r = packet_record(pb, i)
            if as_json:
                yield json.dumps({k: r[k] for k in JSON_FIELDS} | {"findings": notes.get(r["frame"], [])})
            else:
                yield packet_line(r, notes.get(r["frame"], []))
            shown += 1
