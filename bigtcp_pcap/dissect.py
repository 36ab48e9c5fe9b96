"""Per-packet text (the fields of ``tcpdump -v``) and JSON lines, from the decoded columns.

The text path is batch-wise: every column is converted once per batch (numpy -> Python lists, addresses
formatted once per distinct address, flag and option strings from the decoded fields), and one string join per
packet builds the line, so ``dissect`` keeps up with ``tcpdump -v`` (measured in the README). ``-f EXPR`` keeps
the frames a pcap filter matches *on their true lengths*: the expression is compiled by the system libpcap for
each linktype, as tcpdump would, and run on the audit's normalized copy of each BIG TCP frame (extension headers
removed, zero length fields restored), so ``tcp port 5201`` also selects the HBH jumbo super-packets that
tcpdump's own ``tcp port 5201`` misses. ``--bigtcp-only`` keeps frames with a BIG TCP encoding.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections import defaultdict
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from . import findings as F
from .capture.reader import CaptureReader
from .decode import decode
from .decode.schema import BIGTCP_NAMES, TUNNEL_NAMES, PacketBatch

_FLAGS = ((0x01, "F"), (0x02, "S"), (0x04, "R"), (0x08, "P"), (0x20, "U"), (0x40, "E"), (0x80, "W"), (0x100, "A"))
JSON_FIELDS = ("frame", "ts_ns", "caplen", "wirelen", "linktype", "ip_version", "ip_len", "ip_len_field", "bigtcp",
               "jumbo_len", "tunnel", "l4_proto", "sport", "dport", "tcp_seq", "tcp_ack", "tcp_flags", "tcp_win",
               "tcp_payload_len", "udp_len", "ttl", "tos", "ip_id", "flow_label", "tcp_cksum", "tcp_options")
_PROTO = {6: "TCP", 17: "UDP", 58: "ICMPv6", 1: "ICMP", 0: "Options"}


def tcp_flags_text(flags: int) -> str:
    """tcpdump's flag letters: S F R P U E W (AE as 'A'), '.' for ACK."""
    s = "".join(ch for bit, ch in _FLAGS if flags & bit)
    return s + ("." if flags & 0x10 else "") or "none"


_FLAG_TEXT = [tcp_flags_text(f) for f in range(512)]


def _addr(b, ver: int) -> str:
    return str(ipaddress.IPv4Address(bytes(b[:4]))) if ver == 4 else str(ipaddress.IPv6Address(bytes(b)))


def _addresses(a: np.ndarray, ver: np.ndarray) -> list[str | None]:
    """Text of each row's address, formatted once per distinct (version, address)."""
    if not len(a):
        return []
    key = np.concatenate([ver[:, None].astype(np.uint8), a], axis=1)
    uniq, inv = np.unique(np.ascontiguousarray(key).view(np.dtype((np.void, 17))).ravel(), return_inverse=True)
    texts = []
    for u in uniq.tolist():
        v = u[0]
        texts.append(None if v not in (4, 6) else _addr(u[1:], v))
    return [texts[i] for i in inv.ravel().tolist()]


def _checksums(rb, pb: PacketBatch, idx: np.ndarray) -> np.ndarray:
    """The TCP checksum field of each selected row (-1 when not TCP or not captured)."""
    off = np.asarray(rb.off, dtype=np.int64)[idx]
    l4 = pb.l4_off[idx].astype(np.int64)
    ok = (pb.l4_proto[idx] == 6) & (l4 >= 0) & (l4 + 18 <= pb.caplen[idx].astype(np.int64))
    pos = np.where(ok, off + l4 + 16, 0)
    buf = np.asarray(rb.buf)
    ck = (buf[pos].astype(np.int64) << 8) | buf[pos + 1].astype(np.int64)
    return np.where(ok, ck, -1)


def _options(pb: PacketBatch, idx: np.ndarray) -> list[str]:
    """The decoded TCP options of each selected row as tcpdump words (mss, wscale, sackOK, TS, sack), '' if none."""
    mss, ws = pb.tcp_mss[idx].tolist(), pb.tcp_wscale[idx].tolist()
    sp, sb = pb.tcp_sack_perm[idx].tolist(), pb.tcp_sack_blocks[idx].tolist()
    ts, tv, te = pb.tcp_has_ts[idx].tolist(), pb.tcp_ts_val[idx].tolist(), pb.tcp_ts_ecr[idx].tolist()
    has = (pb.tcp_mss[idx] > 0) | (pb.tcp_wscale[idx] >= 0) | pb.tcp_sack_perm[idx] | (pb.tcp_sack_blocks[idx] > 0)
    only_ts = (~has).tolist()
    out = []
    for k in range(len(idx)):
        if only_ts[k]:
            out.append(f"TS val {tv[k]} ecr {te[k]}" if ts[k] else "")
            continue
        parts = []
        if mss[k]:
            parts.append(f"mss {mss[k]}")
        if sp[k]:
            parts.append("sackOK")
        if ts[k]:
            parts.append(f"TS val {tv[k]} ecr {te[k]}")
        if ws[k] >= 0:
            parts.append(f"wscale {ws[k]}")
        if sb[k]:
            parts.append(f"sack {sb[k]}")
        out.append(",".join(parts))
    return out


def _clock(ts_ns: np.ndarray) -> list[str]:
    """HH:MM:SS.nnnnnnnnn (UTC) of each timestamp."""
    ts = ts_ns.astype(np.int64)
    day = (ts // 1_000_000_000) % 86400
    ns = (ts % 1_000_000_000 + 1_000_000_000).astype("U10")  # "1nnnnnnnnn": zero-padded by the C cast
    secs, inv = np.unique(day, return_inverse=True)  # a batch spans few seconds: format each once
    hms = np.array([f"{d // 3600:02d}:{d // 60 % 60:02d}:{d % 60:02d}." for d in secs.tolist()])
    return np.char.add(hms[inv.ravel()], _tail9(ns)).tolist()


def _tail9(a: np.ndarray) -> np.ndarray:
    """The last 9 characters of each 10-character string."""
    return a.view("U1").reshape(len(a), 10)[:, 1:].copy().view("U9").ravel()


def format_lines(rb, pb: PacketBatch, idx: np.ndarray, notes: dict[int, list[str]]) -> list[str]:
    """The text lines of the selected rows ``idx`` of one batch (``rb``: its RecordBatch, for the checksums)."""
    if not len(idx):
        return []
    ver = pb.ip_version[idx]
    frames = pb.frame[idx].tolist()
    clock = _clock(pb.ts_ns[idx])
    src = _addresses(pb.src[idx], ver)
    dst = _addresses(pb.dst[idx], ver)
    vers = ver.tolist()
    ip_len, ip_field = pb.ip_len[idx].tolist(), pb.ip_len_field[idx].tolist()
    big = pb.bigtcp[idx].tolist()
    jumbo, has_jumbo = pb.jumbo_len[idx].tolist(), pb.has_jumbo[idx].tolist()
    tunnel = pb.tunnel[idx].tolist()
    ttl, tos, ipid, df = pb.ttl[idx].tolist(), pb.tos[idx].tolist(), pb.ip_id[idx].tolist(), pb.df[idx].tolist()
    flow = pb.flow_label[idx].tolist()
    proto = pb.l4_proto[idx].tolist()
    l4ok = (pb.l4_off[idx] >= 0).tolist()
    tcp = ((pb.l4_proto[idx] == 6) & (pb.l4_off[idx] >= 0) & (pb.tcp_hdr_len[idx] >= 20)).tolist()
    sport, dport = pb.sport[idx].tolist(), pb.dport[idx].tolist()
    seq, ack = pb.tcp_seq[idx].tolist(), pb.tcp_ack[idx].tolist()
    flags, win = pb.tcp_flags[idx].tolist(), pb.tcp_win[idx].tolist()
    pay, udp = pb.tcp_payload_len[idx].tolist(), pb.udp_len[idx].tolist()
    wire = pb.wirelen[idx].tolist()
    ck = _checksums(rb, pb, idx).tolist()
    opts = _options(pb, idx)
    out = []
    for k in range(len(frames)):
        head = f"{frames[k]:>6} {clock[k]}"
        v = vers[k]
        if v == 0:
            out.append(f"{head} non-IP frame, length {wire[k]}")
            continue
        if v == 4:
            fl = "DF" if df[k] else "none"
            ip = (f"IP (tos 0x{tos[k]:x}, ttl {ttl[k]}, id {ipid[k]}, flags [{fl}], "
                  f"proto {_PROTO.get(proto[k], proto[k])} ({proto[k]}), length {ip_len[k]})")
        else:
            cls = f"class 0x{tos[k]:02x}, " if tos[k] else ""
            lab = f"flowlabel 0x{flow[k]:05x}, " if flow[k] else ""
            ip = (f"IP6 ({cls}{lab}hlim {ttl[k]}, next-header {_PROTO.get(proto[k], proto[k])} ({proto[k]}), "
                  f"length {ip_len[k]})")
        if tunnel[k]:
            ip += f" (inner of {TUNNEL_NAMES[tunnel[k]]})"
        if big[k]:
            j = f" jumbo {jumbo[k]}," if has_jumbo[k] else ""
            ip += f" [BIG TCP {BIGTCP_NAMES[big[k]]}:{j} length field {ip_field[k]}, true length {ip_len[k]}]"
        if tcp[k]:
            p = pay[k]
            s = f"seq {seq[k]}:{(seq[k] + p) & 0xFFFFFFFF}" if p else f"seq {seq[k]}"
            c = f", cksum 0x{ck[k]:04x}" if ck[k] >= 0 else ""
            o = f", options [{opts[k]}]" if opts[k] else ""
            l4 = (f"{src[k]}.{sport[k]} > {dst[k]}.{dport[k]}: Flags [{_FLAG_TEXT[flags[k] & 511]}]{c}, {s}, "
                  f"ack {ack[k]}, win {win[k]}{o}, length {p}")
        elif l4ok[k] and proto[k] == 17:
            l4 = f"{src[k]}.{sport[k]} > {dst[k]}.{dport[k]}: UDP, length {udp[k] - 8}"
        else:
            l4 = f"{src[k]} > {dst[k]}: proto {proto[k]}"
        line = f"{head} {ip} {l4}"
        n = notes.get(frames[k])
        out.append(line + "".join(f" !{x}" for x in n) if n else line)
    return out


def packet_record(pb: PacketBatch, i: int, cksum: int = -1, options: str = "") -> dict:
    """The packets-table fields of row i as plain Python values (nulls as None)."""
    ver = int(pb.ip_version[i])
    tcp = pb.l4_proto[i] == 6 and pb.l4_off[i] >= 0 and pb.tcp_hdr_len[i] >= 20
    l4 = pb.l4_off[i] >= 0 and pb.l4_proto[i] in (6, 17)
    return {
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
        "ttl": int(pb.ttl[i]) if ver else None, "tos": int(pb.tos[i]) if ver else None,
        "ip_id": int(pb.ip_id[i]) if ver == 4 else None, "flow_label": int(pb.flow_label[i]) if ver == 6 else None,
        "tcp_cksum": cksum if tcp and cksum >= 0 else None, "tcp_options": options if tcp else None,
    }


class _Selector:
    """Which frames of a batch to show: a pcap filter judged on the true lengths, and/or BIG TCP only."""

    def __init__(self, expr: str | None, bigtcp_only: bool) -> None:
        self.bigtcp_only = bigtcp_only
        self.audit = None
        if expr:
            from .audit import FilterAudit  # compiles lazily per linktype; raises LibpcapMissing without libpcap

            self.audit = FilterAudit(expr, suggest=False)

    def select(self, rb, pb: PacketBatch) -> np.ndarray:
        keep = np.ones(len(pb), bool)
        if self.bigtcp_only:
            keep &= pb.bigtcp != 0
        if self.audit is not None and keep.any():
            keep &= self._truth(rb, pb)
        return np.flatnonzero(keep)

    def _truth(self, rb, pb: PacketBatch) -> np.ndarray:
        from .audit.cbpf import prepare_batch

        fa = self.audit
        b = prepare_batch(rb, pb, candidates_only=False, l4_index=fa.l4_index)
        truth = np.zeros(len(pb), bool)
        for key in b.key_list:  # (link type, byte order) compile keys, as the audit's own pass takes them
            sel = np.flatnonzero(b.keys == key)
            nmask = b.keys[b.norm_idx] == key
            # the audit's truth program: the expression itself, or its IPv6-extended form for tcp[]/udp[]
            cf = fa._truth_filter(key) if fa.l4_index else fa.filters.for_key(key)
            truth[sel] = cf.match_batch(b.buf, b.off[sel], b.cap[sel], b.wire[sel])
            truth[b.norm_idx[nmask]] = cf.match_batch(b.nbuf, b.n_off[nmask], b.n_cap[nmask], b.n_wire[nmask])
        return truth


def iter_blocks(source: str | os.PathLike | BinaryIO, *, count: int | None = None, as_json: bool = False,
                expr: str | None = None, bigtcp_only: bool = False) -> Iterator[list[str]]:
    """The output lines batch by batch (lists of lines); see ``iter_lines``."""
    selector = _Selector(expr, bigtcp_only)
    shown = 0
    for rb in CaptureReader(source):
        pb, fr = decode(rb)
        idx = selector.select(rb, pb)
        if count is not None:
            idx = idx[: max(0, count - shown)]
        notes: dict[int, list[str]] = defaultdict(list)
        for frame, code in zip(fr.frame.tolist(), fr.code.tolist()):
            notes[frame].append(F.BY_ID[code].code)
        if as_json:
            ck = _checksums(rb, pb, idx).tolist() if len(idx) else []
            opts = _options(pb, idx) if len(idx) else []
            lines = []
            for k, i in enumerate(idx.tolist()):
                r = packet_record(pb, i, ck[k], opts[k])
                lines.append(json.dumps({f: r[f] for f in JSON_FIELDS} | {"findings": notes.get(r["frame"], [])}))
        else:
            lines = format_lines(rb, pb, idx, notes)
        shown += len(idx)
        if lines:
            yield lines
        if count is not None and shown >= count:
            return


def iter_lines(source: str | os.PathLike | BinaryIO, *, count: int | None = None, as_json: bool = False,
               expr: str | None = None, bigtcp_only: bool = False) -> Iterator[str]:
    """One line per packet like ``tcpdump -v`` (or one JSON object), with the true lengths and BIG TCP encoding.

    ``expr``: keep the frames this pcap filter matches on their true lengths; ``bigtcp_only``: keep BIG TCP frames.
    """
    for block in iter_blocks(source, count=count, as_json=as_json, expr=expr, bigtcp_only=bigtcp_only):
        yield from block
