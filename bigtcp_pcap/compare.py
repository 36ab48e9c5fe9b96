"""``compare``: the GRO rebuild from a sender's capture against the receiver's real super-packets.

A sender capture (pre-GRO: the sender's interface with TSO off, or a mirror port) and a capture taken on the
receiving host (post-GRO) of the same transfer. The sender capture goes through exactly the GRO stage that
``analyze`` runs (``gro.stage.GroStage``: one NAPI model per receiving host, ACK evidence), and the rows of the
receiving host are kept. That host is recognised in the receiver capture as the destination of most TCP
payload bytes (its MAC address on Ethernet-like links, else its IP addresses). The receiver's data packets
arriving at it are its real super-packets.

Both sides are compared as multisets of (addresses, ports, raw sequence number, payload length). A receiver
super-packet matched exactly is ``reproduced``; the unmatched ones of a flow are grouped into clusters of
overlapping sequence ranges, and each cluster gets a cause:

* ``poll_boundary``: both sides carry exactly the same bytes, cut at different places, and every cut the
  rebuild made that the kernel did not is a NAPI poll end (or the kernel cut where the rebuild merged): the one
  thing a capture does not record (gro-spec section 7.1);
* ``rule``: the same bytes, every kernel cut is also a rebuild cut, but the rebuild cut more, for a rule's
  reason (a size limit, an option or flag change, ...): a rule or a setting disagrees;
* ``not_merged``: as ``rule``, but every extra cut is a packet the rebuild delivered alone (``not_mergeable_alone``:
  a tunnelled flow, which the model does not merge (R19), or IP options/flags, R5/R9/R12): no setting helps;
* ``drop_or_retransmission``: the two sides do not carry the same bytes (a segment lost between the two capture
  points, a retransmission, or a capture drop).

``--fit`` repeats the rebuild over a grid of poll parameters and reports the best-reproducing one as the
options to pass to ``analyze`` for what-if runs on the same host.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .capture.reader import CaptureReader
from .capture.source import Source
from .decode import PacketBatch, decode
from .errors import CaptureError, OutputError, UsageError, make_outdir
from .gro import GroConfig, SuperPacketBatch
from .gro.reasons import REASON_NAMES
from .gro.stage import GroStage

CAUSES = ("poll_boundary", "rule", "not_merged", "drop_or_retransmission")
POLL_REASONS = frozenset({"napi_poll", "end_of_capture"})  # cuts made by the poll model, not by a rule
FIT_POLL_GAP_US = (5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 75.0, 100.0, 200.0)
FIT_PUSH_GAP_US = (2.0, 4.0, 6.0, 8.0, 12.0, math.inf)  # searched at the best poll gap (R21.2b; inf: off)
ETHERNET_LIKE = frozenset({1})  # link types whose first 6 bytes are the destination MAC


@dataclass
class Comparison:
    """What ``compare`` found (``to_json()`` is the CLI's ``--json``)."""

    sender: str
    receiver: str
    config: GroConfig
    receiver_host: dict[str, Any]
    receiver_superpackets: int
    rebuilt_superpackets: int
    reproduced: int
    causes: dict[str, int]  # unmatched receiver super-packets by cause
    rebuilt_causes: dict[str, int]  # unmatched rebuilt super-packets by cause (bytes the receiver never showed)
    flows: list[dict[str, Any]]
    rows: dict[str, list] = field(repr=False)
    fit: list[dict[str, Any]] | None = None
    errors: list[str] = field(default_factory=list)  # faults that ended a capture early (one line each)
    by_delivery_delay: list[dict[str, Any]] = field(default_factory=list)  # ``_by_delay``

    @property
    def partial(self) -> bool:
        """A capture ended at a fault: the comparison covers the packets before it."""
        return bool(self.errors)

    @property
    def share(self) -> float:
        """Reproduced receiver super-packets / all of them (1.0 when the receiver has none)."""
        return self.reproduced / self.receiver_superpackets if self.receiver_superpackets else 1.0

    def to_json(self) -> dict[str, Any]:
        out = {"sender": self.sender, "receiver": self.receiver, "receiver_host": self.receiver_host,
               "receiver_superpackets": self.receiver_superpackets, "reproduced": self.reproduced,
               "share": round(self.share, 6), "rebuilt_superpackets": self.rebuilt_superpackets,
               "causes": self.causes, "rebuilt_causes": self.rebuilt_causes, "flows": self.flows,
               "by_delivery_delay": self.by_delivery_delay,
               "gro": self.config.to_metadata(), "partial": self.partial, "errors": self.errors}
        if self.fit is not None:
            out["fit"] = self.fit
            best = max(self.fit, key=lambda r: r["share"])
            out["fit_best"] = best
        return out


@dataclass
class _Side:
    """Decoded frames of one capture (TCP/IP only is not assumed: the NAPI budget counts everything)."""

    name: str
    pb: PacketBatch
    dmac: np.ndarray  # uint64 destination MAC per frame (0 where the link type has none)


def _batches(reader: CaptureReader, errors: list[CaptureError] | None):
    """The reader's record batches; a fault after the first record ends them and goes into ``errors`` (the
    comparison covers the packets before it, as analyze's tables do); one before any record is raised."""
    read = 0
    try:
        for rb in reader:
            read += len(rb)
            yield rb
    except CaptureError as e:
        if errors is None or read == 0:
            raise
        errors.append(e)


def _load(path: str | os.PathLike, errors: list[CaptureError] | None = None) -> _Side:
    parts, macs = [], []
    reader = CaptureReader(path)
    for rb in _batches(reader, errors):
        pb, _ = decode(rb)
        parts.append(pb)
        mac = np.zeros(len(rb), np.uint64)
        eth = np.isin(rb.linktype, list(ETHERNET_LIKE)) & (rb.caplen >= 6)
        if eth.any():
            b = rb.buf[rb.off[eth, None] + np.arange(6)[None, :]].astype(np.uint64)
            mac[eth] = (b << (np.arange(5, -1, -1, dtype=np.uint64) * np.uint64(8))[None, :]).sum(axis=1)
        macs.append(mac)
    return _Side(reader.info.name, PacketBatch.concat(parts),
                 np.concatenate(macs) if macs else np.zeros(0, np.uint64))


def _addr_keys(pb: PacketBatch, which: str) -> np.ndarray:
    """One hashable row per packet: (version, 16 address bytes) as a structured void array."""
    a = np.ascontiguousarray(np.concatenate([pb.ip_version[:, None], getattr(pb, which)], axis=1))
    return a.view(np.dtype((np.void, a.shape[1]))).reshape(-1)


def _receiving_host(rcv: _Side) -> tuple[np.ndarray | None, set[bytes], dict[str, Any]]:
    """(its MAC or None, its IP addresses, description) of the host the receiver capture was taken on."""
    pb = rcv.pb
    data = (pb.l4_proto == 6) & (pb.tcp_payload_len > 0) & ((pb.ip_version == 4) | (pb.ip_version == 6))
    if not data.any():
        raise UsageError(f"{rcv.name}: no TCP data packets to compare (is it the receiver's capture?)")
    w = pb.tcp_payload_len[data].astype(np.int64)
    mac = None
    sel = data.copy()
    macs = rcv.dmac[data]
    if (macs != 0).any():
        u, inv = np.unique(macs, return_inverse=True)
        top = u[np.argmax(np.bincount(inv.reshape(-1), weights=w))]
        if top != 0 and not (int(top) >> 40) & 1:  # a unicast MAC
            mac = top
            sel = data & (rcv.dmac == top)
    keys = _addr_keys(pb, "dst")
    if mac is None:  # no MAC: the destination address that receives the most bytes (and its other family)
        u, inv = np.unique(keys[data], return_inverse=True)
        addrs = {bytes(u[np.argmax(np.bincount(inv.reshape(-1), weights=w))])}
    else:
        addrs = {bytes(k) for k in np.unique(keys[sel])}
    desc = {"mac": None if mac is None else ":".join(f"{(int(mac) >> s) & 0xFF:02x}" for s in range(40, -8, -8)),
            "addresses": sorted(_fmt(a) for a in addrs)}
    return mac, addrs, desc


def _fmt(key: bytes) -> str:
    import ipaddress

    return str(ipaddress.ip_address(key[1:5] if key[0] == 4 else key[1:17]))


def _towards(side: _Side, mac: np.ndarray | None, addrs: set[bytes]) -> np.ndarray:
    """Frames that travel towards the receiving host: to its MAC (or a group address) on Ethernet-like links,
    else to one of its IP addresses."""
    pb = side.pb
    keys = _addr_keys(pb, "dst")
    to_addr = np.isin(keys, np.array(sorted(addrs), dtype=keys.dtype)) if len(keys) else np.zeros(0, bool)
    if mac is None:
        return to_addr
    has_mac = side.dmac != 0
    group = ((side.dmac >> np.uint64(40)) & np.uint64(1)) != 0
    return np.where(has_mac, (side.dmac == mac) | group, to_addr)


def _flow_keys(pb: PacketBatch) -> np.ndarray:
    """(version, src, dst, sport, dport) of every row as 37-byte void keys."""
    k = np.concatenate([pb.ip_version[:, None], pb.src, pb.dst, pb.sport.view(np.uint8).reshape(-1, 2),
                        pb.dport.view(np.uint8).reshape(-1, 2)], axis=1)
    return np.ascontiguousarray(k).view(np.dtype((np.void, k.shape[1]))).reshape(-1)


def _flow_ids(pb: PacketBatch) -> tuple[np.ndarray, np.ndarray]:
    """(flow id per TCP row, -1 elsewhere; the distinct (version, src, dst, ports) rows)."""
    tcp = (pb.l4_proto == 6) & ((pb.ip_version == 4) | (pb.ip_version == 6)) & (pb.l4_off >= 0)
    u, inv = np.unique(_flow_keys(pb), return_inverse=True)
    return np.where(tcp, inv.reshape(-1), -1).astype(np.int64), u


def rebuild(sender: str | os.PathLike, cfg: GroConfig, host_mac: int | None,
            host_addrs: set[bytes], errors: list[CaptureError] | None = None,
            end_times: tuple[np.ndarray, dict[bytes, list[int]]] | None = None,
            used: list[GroConfig] | None = None) -> tuple[SuperPacketBatch, np.ndarray]:
    """``analyze``'s GRO stage over the sender capture, the receiving host's rows only: (rows, flow keys by
    flow_id). ``errors``: where a fault after the first record goes (the rows cover the packets before it).
    ``end_times``: (wanted ``_end_keys``, dict): the capture times of the sender's data segments with those
    (flow, end) keys go into the dict, key -> times in capture order."""
    stage = GroStage(cfg)
    ids: dict[bytes, int] = {}
    keys: list[bytes] = []
    parts = []
    for rb in _batches(CaptureReader(sender), errors):
        pb, _ = decode(rb)
        tcp = (pb.l4_proto == 6) & ((pb.ip_version == 4) | (pb.ip_version == 6)) & (pb.l4_off >= 0)
        k = _flow_keys(pb)
        if end_times is not None and len(pb):
            data = np.flatnonzero(tcp & (pb.tcp_payload_len > 0))
            ek = _end_keys(k[data], pb.tcp_seq[data], pb.tcp_payload_len[data])
            hit = np.flatnonzero(np.isin(ek, end_times[0]))
            for kb, t in zip(ek[hit].tolist(), pb.ts_ns[data[hit]].tolist(), strict=True):
                end_times[1].setdefault(bytes(kb), []).append(t)
        uniq, inv = np.unique(k, return_inverse=True)
        g = np.empty(len(uniq), np.int64)
        for j, kb in enumerate(uniq.tolist()):
            kb = bytes(kb)
            if kb not in ids:
                ids[kb] = len(keys)
                keys.append(kb)
            g[j] = ids[kb]
        parts.append(stage.feed(rb, pb, np.where(tcp, g[inv.reshape(-1)], -1)))
    parts.append(stage.finish())
    if used is not None:  # the configuration the stage ran (with the fallback MTU read off the capture)
        used.append(stage.config)
    rows = SuperPacketBatch.concat(parts)
    mine = np.array([_is_host(label, host_mac, host_addrs) or not cfg.split_receivers for label in stage.labels],
                    bool)
    arr = np.array(keys, dtype=np.dtype((np.void, 37))) if keys else np.zeros(0, np.dtype((np.void, 37)))
    keep = mine[rows.receiver.astype(np.int64)] if len(rows) else np.zeros(0, bool)
    if len(rows) and cfg.split_receivers and host_addrs:
        # or built for a flow to one of the host's addresses: the two captures need not share a link type (an
        # Ethernet sender's receivers are MACs, an SLL2 or raw-IP receiver capture names the host by address)
        k = arr.view(np.uint8).reshape(-1, 37)
        dst = np.ascontiguousarray(np.concatenate([k[:, :1], k[:, 17:33]], axis=1)).view(
            np.dtype((np.void, 17))).reshape(-1)
        to_host = np.isin(dst, np.array(sorted(host_addrs), dtype=dst.dtype))
        fid = rows.flow_id.astype(np.int64)
        keep |= (fid >= 0) & to_host[np.maximum(fid, 0)]
    sel = SuperPacketBatch(**{name: col[keep] for name, col in rows.to_dict().items()})
    return sel, arr


def _is_host(label: str, mac: int | None, addrs: set[bytes]) -> bool:
    """Is a GroStage receiver label the receiving host (its MAC, or one of its addresses)?"""
    name = label.split(" (")[0]
    if mac is not None and name == ":".join(f"{(int(mac) >> s) & 0xFF:02x}" for s in range(40, -8, -8)):
        return True
    return name in {_fmt(a) for a in addrs}


def _key_of(keys: np.ndarray, fid: np.ndarray) -> list[bytes]:
    """The flow bytes (version, src, dst, ports) of each row (without the version byte's ambiguity)."""
    return [bytes(keys[f]) for f in fid.tolist()]


def _classify(kernel_only: dict, sim_only: dict) -> tuple[collections.Counter, collections.Counter, dict]:
    """Counts by cause of the unmatched receiver rows and of the unmatched rebuilt rows, and the cause of each
    row (see the module docstring).

    ``kernel_only`` / ``sim_only``: flow -> list of (seq, len, flush reason name or None)."""
    causes: collections.Counter = collections.Counter()
    sim_causes: collections.Counter = collections.Counter()
    row_cause: dict = {}
    for fl in set(kernel_only) | set(sim_only):
        rows = [(s, ln, "k", why) for s, ln, why in kernel_only.get(fl, [])] + \
               [(s, ln, "s", why) for s, ln, why in sim_only.get(fl, [])]
        base = min(r[0] for r in rows)
        rows = sorted(((s - base) & 0xFFFFFFFF, ln, side, why, s) for s, ln, side, why in rows)
        clusters: list[list] = []
        end = -1
        for r in rows:
            if r[0] < end:
                clusters[-1].append(r)
            else:
                clusters.append([r])
            end = max(end, r[0] + r[1])
        for c in clusters:
            ks = sorted((r[0], r[1]) for r in c if r[2] == "k")
            ss = sorted((r[0], r[1], r[3]) for r in c if r[2] == "s")
            span = (min(r[0] for r in c), max(r[0] + r[1] for r in c))
            if ks and ss and _covers(span, ks) and _covers(span, [(s, ln) for s, ln, _ in ss]):
                kcuts = {s + ln for s, ln in ks}
                scuts = {s + ln for s, ln, _ in ss}
                # the rebuild's cuts the kernel did not make, and why the rebuild made them; a kernel cut the
                # rebuild lacks is a poll end it could not see (its later rule cuts are consequences)
                extra = [why for s, ln, why in ss if s + ln not in kcuts]
                rule = any(w not in POLL_REASONS for w in extra) and kcuts <= scuts
                cause = "rule" if rule else "poll_boundary"
                if rule and all(w == "not_mergeable_alone" for w in extra if w not in POLL_REASONS):
                    cause = "not_merged"  # the rebuild gave the packets up (R19 tunnels, R5/R9/R12): no setting
            else:
                cause = "drop_or_retransmission"
            causes[cause] += len(ks)
            sim_causes[cause] += len(ss)
            for r in c:
                row_cause[(fl, r[2], r[4], r[1])] = cause
    return causes, sim_causes, row_cause


def _end_keys(flow_keys: np.ndarray, seq: np.ndarray, plen: np.ndarray) -> np.ndarray:
    """(37-byte flow key, 4-byte end sequence number) of each segment as 41-byte void keys."""
    end = ((seq.astype(np.uint64) + plen.astype(np.uint64)) & np.uint64(0xFFFFFFFF)).astype("<u4")
    k = np.concatenate([flow_keys.view(np.uint8).reshape(-1, 37), end.view(np.uint8).reshape(-1, 4)], axis=1)
    return np.ascontiguousarray(k).view(np.dtype((np.void, 41))).reshape(-1)


DELAY_BUCKETS_US = (5.0, 50.0)
"""Bounds of ``by_delivery_delay``: below 5 us the receiver took each segment almost as it came (on veth pairs of
two flows: a receiver polling on another CPU every few microseconds, super-packets of a few segments that no
ACK or gap in the sender's capture shows); 50 us and more, it was behind (full 64-packet polls back to back,
their phase kept only where the ACKs show it)."""


def _delays(ends: np.ndarray, kernel_ts: np.ndarray, times: dict[bytes, list[int]]) -> np.ndarray:
    """Per receiver super-packet (its ``_end_keys`` key and capture time): that time less the time of the sender's
    segment ending where it ends (the last copy sent before it, else the first); -1 where the sender's capture
    has no such segment."""
    out = np.full(len(ends), -1, np.int64)
    for i, (key, t) in enumerate(zip(ends.tolist(), kernel_ts.tolist(), strict=True)):
        sent = times.get(bytes(key))
        if sent:
            before = [x for x in sent if x <= t]
            out[i] = t - (before[-1] if before else sent[0])
    return out


def _by_delay(delay: np.ndarray, matched: np.ndarray) -> list[dict[str, Any]]:
    """Receiver super-packets and those reproduced, by delivery delay (DELAY_BUCKETS_US; ``unknown``: no sender
    segment ends where the super-packet ends)."""
    lo, hi = (int(b * 1000) for b in DELAY_BUCKETS_US)
    names = (f"< {DELAY_BUCKETS_US[0]:g} us", f"{DELAY_BUCKETS_US[0]:g}-{DELAY_BUCKETS_US[1]:g} us",
             f">= {DELAY_BUCKETS_US[1]:g} us", "unknown")
    which = np.where(delay < 0, 3, np.where(delay < lo, 0, np.where(delay < hi, 1, 2)))
    out = []
    for b, name in enumerate(names):
        sel = which == b
        n = int(sel.sum())
        if n:
            rep = int(matched[sel].sum())
            out.append({"delay": name, "receiver_superpackets": n, "reproduced": rep, "share": round(rep / n, 6)})
    return out


def _covers(span: tuple[int, int], ranges: list[tuple[int, int]]) -> bool:
    """Do the (start, len) ``ranges`` cover ``span`` exactly, end to end, without overlap?"""
    pos = span[0]
    for s, ln in sorted(ranges):
        if s != pos:
            return False
        pos += ln
    return pos == span[1]


def _kernel_rows(rcv_pb: PacketBatch) -> tuple[list, np.ndarray, np.ndarray]:
    """The receiver's super-packets: (flow key, raw sequence number, payload length) of each TCP data row, their
    (flow, end) keys (``_end_keys``) and which rows of ``rcv_pb`` they are (a mask)."""
    rfid, rkeys = _flow_ids(rcv_pb)
    m = (rfid >= 0) & (rcv_pb.tcp_payload_len > 0)
    kernel = list(zip(_key_of(rkeys, rfid[m]), rcv_pb.tcp_seq[m].tolist(), rcv_pb.tcp_payload_len[m].tolist(),
                      strict=True))
    return kernel, _end_keys(rkeys[rfid[m]], rcv_pb.tcp_seq[m], rcv_pb.tcp_payload_len[m]), m


def _match(kernel: list, sim: SuperPacketBatch, keys: np.ndarray) -> tuple[int, dict, dict]:
    """(reproduced, kernel-only rows by flow, rebuilt-only rows by flow) as multisets (``kernel``:
    ``_kernel_rows``)."""
    names = sim.reason_labels()
    simrows = list(zip(_key_of(keys, sim.flow_id), sim.seq_first.tolist(), sim.payload_len.tolist(), strict=True))
    ck, cs = collections.Counter(kernel), collections.Counter(simrows)
    both = ck & cs
    k_only: dict = collections.defaultdict(list)
    for (fl, s, ln), k in (ck - cs).items():
        k_only[fl].extend([(s, ln, None)] * k)
    left = cs - ck
    s_only: dict = collections.defaultdict(list)
    for (fl, s, ln), why in zip(simrows, names, strict=True):
        if left[(fl, s, ln)] > 0:
            left[(fl, s, ln)] -= 1
            s_only[fl].append((s, ln, why))
    return sum(both.values()), k_only, s_only


def compare(sender: str | os.PathLike, receiver: str | os.PathLike, *, gro: GroConfig | None = None,
            fit: bool = False, outdir: str | os.PathLike | None = None, **gro_params: Any) -> Comparison:
    """Rebuild the receiver's super-packets from ``sender`` and compare them with ``receiver``'s (module doc).

    GRO settings as ``gro=GroConfig(...)`` or keywords (``gro_max_size=185000``); ``fit`` also searches the poll
    gap that reproduces the pair best; ``outdir`` writes ``compare.parquet`` there (one row per receiver
    super-packet and per unmatched rebuilt one)."""
    if gro is not None and gro_params:
        raise TypeError(f"compare() got both gro= and GRO keywords ({', '.join(sorted(gro_params))})")
    cfg = gro if gro is not None else GroConfig(**gro_params)
    if str(sender) != "-":  # the receiver is read first (it names the receiving host): a sender that cannot be
        Source(sender).close()  # opened is still reported first, as the arguments come
    errors: list[CaptureError] = []
    rcv = _load(receiver, errors)
    mac, addrs, host = _receiving_host(rcv)
    rcv_in = rcv.pb.take(_towards(rcv, mac, addrs))
    kernel, ends, m = _kernel_rows(rcv_in)
    times: dict[bytes, list[int]] = {}
    used: list[GroConfig] = []
    sim, keys = rebuild(sender, cfg, mac, addrs, errors, end_times=(np.unique(ends), times), used=used)
    cfg = used[0] if used else cfg  # (recorded, and the --fit runs start from it)
    reproduced, k_only, s_only = _match(kernel, sim, keys)
    causes, sim_causes, row_cause = _classify(k_only, s_only)
    rows = _rows(kernel, k_only, s_only, row_cause)
    delay = _delays(ends, rcv_in.ts_ns[m], times)
    rows["delay_ns"] = delay.tolist() + [-1] * (len(rows["side"]) - len(kernel))
    res = Comparison(sender=str(sender), receiver=str(receiver), config=cfg, receiver_host=host,
                     receiver_superpackets=len(kernel), rebuilt_superpackets=len(sim), reproduced=reproduced,
                     causes={c: int(causes.get(c, 0)) for c in CAUSES},
                     rebuilt_causes={c: int(sim_causes.get(c, 0)) for c in CAUSES}, flows=_per_flow(kernel, k_only),
                     rows=rows, errors=[e.one_line() for e in errors],
                     by_delivery_delay=_by_delay(delay, np.array(rows["matched"][:len(kernel)], bool)))
    if fit:
        res.fit = _fit(sender, cfg, mac, addrs, kernel)
    if outdir is not None:
        _write(Path(outdir), res)
    return res


def _fit(sender: str | os.PathLike, cfg: GroConfig, mac: bytes | None, addrs: Any,
         kernel: list) -> list[dict[str, Any]]:
    """``--fit``: the rebuild over the poll gaps of FIT_POLL_GAP_US (push gap as configured), then over the push
    gaps of FIT_PUSH_GAP_US at the best of those poll gaps; one entry per rebuild, in that order."""
    out: list[dict[str, Any]] = []

    def run(gap: float, push: float) -> None:
        c2 = dataclasses.replace(cfg, poll_gap_us=gap, poll_push_gap_us=push)
        sim2, keys2 = rebuild(sender, c2, mac, addrs, [])  # (a fault: reported once, by the first rebuild)
        rep2 = _match(kernel, sim2, keys2)[0]
        out.append({"poll_gap_us": gap, "poll_push_gap_us": "inf" if math.isinf(push) else push,
                    "reproduced": rep2, "share": round(rep2 / len(kernel), 6) if kernel else 1.0,
                    "options": f"--poll-gap-us {gap:g} --poll-push-gap-us {push:g}"})

    for gap in FIT_POLL_GAP_US:
        run(gap, cfg.poll_push_gap_us)
    best = max(out, key=lambda r: r["share"])["poll_gap_us"]
    for push in FIT_PUSH_GAP_US:
        if push != cfg.poll_push_gap_us:
            run(best, push)
    return out


def _per_flow(kernel: list, k_only: dict) -> list[dict[str, Any]]:
    total = collections.Counter(fl for fl, _, _ in kernel)
    missed = {fl: len(v) for fl, v in k_only.items()}
    out = []
    for fl, n in total.most_common():
        v = fl[0]
        a = 16
        src, dst = fl[1:1 + a], fl[1 + a:1 + 2 * a]
        sport = int.from_bytes(fl[1 + 2 * a:3 + 2 * a], "little")
        dport = int.from_bytes(fl[3 + 2 * a:5 + 2 * a], "little")
        rep = n - missed.get(fl, 0)
        out.append({"src": _fmt(bytes([v]) + src), "dst": _fmt(bytes([v]) + dst), "sport": sport, "dport": dport,
                    "receiver_superpackets": n, "reproduced": rep, "share": round(rep / n, 6)})
    return out


def _rows(kernel: list, k_only: dict, s_only: dict, row_cause: dict) -> dict[str, list]:
    cols: dict[str, list] = {c: [] for c in ("side", "src", "dst", "sport", "dport", "seq", "payload_len",
                                             "matched", "cause", "flush_reason")}
    unmatched = collections.Counter((fl, s, ln) for fl, rows in k_only.items() for s, ln, _ in rows)

    def add(side: str, fl: bytes, s: int, ln: int, matched: bool, cause, why) -> None:
        v = fl[0]
        cols["side"].append(side)
        cols["src"].append(_fmt(bytes([v]) + fl[1:17]))
        cols["dst"].append(_fmt(bytes([v]) + fl[17:33]))
        cols["sport"].append(int.from_bytes(fl[33:35], "little"))
        cols["dport"].append(int.from_bytes(fl[35:37], "little"))
        cols["seq"].append(s)
        cols["payload_len"].append(ln)
        cols["matched"].append(matched)
        cols["cause"].append(cause)
        cols["flush_reason"].append(why)

    for fl, s, ln in kernel:
        if unmatched[(fl, s, ln)] > 0:
            unmatched[(fl, s, ln)] -= 1
            add("receiver", fl, s, ln, False, row_cause.get((fl, "k", s, ln)), None)
        else:
            add("receiver", fl, s, ln, True, None, None)
    for fl, rows in s_only.items():
        for s, ln, why in rows:
            add("rebuilt", fl, s, ln, False, row_cause.get((fl, "s", s, ln)), why)
    return cols


def _write(out: Path, res: Comparison) -> None:
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    make_outdir(out)
    schema = pa.schema([("side", pa.string()), ("src", pa.string()), ("dst", pa.string()), ("sport", pa.uint16()),
                        ("dport", pa.uint16()), ("seq", pa.uint32()), ("payload_len", pa.uint32()),
                        ("matched", pa.bool_()), ("cause", pa.string()), ("flush_reason", pa.string()),
                        ("delay_ns", pa.int64())],
                       metadata={"bigtcp_pcap.compare": json.dumps({k: v for k, v in res.to_json().items()
                                                                     if k not in ("flows",)})})
    rows = dict(res.rows)
    d = np.array(rows["delay_ns"], np.int64)
    rows["delay_ns"] = pa.array(d, pa.int64(), mask=d < 0)
    table = pa.table(rows, schema=schema)
    tmp = out / "compare.parquet.tmp"
    try:
        pq.write_table(table, tmp)
        tmp.replace(out / "compare.parquet")
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError.from_os(str(out / "compare.parquet"), e) from None


__all__ = ["CAUSES", "REASON_NAMES", "Comparison", "compare", "rebuild"]
