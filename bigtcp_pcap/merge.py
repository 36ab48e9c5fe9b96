"""Merging the tables of a capture's parts (``split.py``) into the tables of one serial run, exactly.

Per table: frame numbers are shifted by the records before the part; flow ids are re-numbered in the order of
first appearance over the whole capture (what a serial run assigns). A flow seen in one part keeps its row
(shifted); a flow seen in several parts is reduced: sums (packets, bytes, super-packets), min/max (first frame,
first/last time, largest payload and super-packet), the last SYN's MSS, and the columns that need the flow's
whole history are recomputed from the parts' rows: the nearest-rank p50/p99 of payload and super-packet lengths
(exact, from the packets and superpackets rows) and retransmissions / out-of-order / capture gaps (the compiled
sequence kernel of ``flows/table.py`` re-run over the flow's packets in frame order). The capture-wide finding
"tcp port filter suspected" is recomputed on the merged flows, and the summary is summed part by part.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import diagnose as D
from . import findings as F
from .audit.cbpf import SKIPPED_NOTE, reportable
from .flows.points import capture_points, flows_per_point
from .flows.table import CLOSE_TIMEOUT_NS, F_GAP, F_OOO, F_RETRANS, IDLE_TIMEOUT_NS, MAX_HOLES, NF, seq_kernel
from .output.parquet import FLOWS_SCHEMA, MERGE_ROWS, TableSink, read_metadata
from .output.tables import BY_NAME
from .split import Part

KEY = ["ip_version", "src", "dst", "sport", "dport", "if_id", "ifindex", "direction"]  # (the last 3: the point)
SUMS = ["packets", "payload_bytes", "wire_bytes", "bigtcp_packets", "superpackets", "poll_ends_evidenced",
        "poll_ends_guessed"]
SUSPECT = F.BY_ID[F.TCP_PORT_FILTER_SUSPECTED]


class NeedPackets(Exception):
    """The parts were analysed without their packets tables, and a flow spans a cut (see ``merge_parts``)."""


class NotExact(Exception):
    """A flow's rows across a cut cannot be merged exactly from the parts' facts: the serial run decides."""


def _closed(bits: int) -> bool:
    """``flows.table._ended``'s test of a closed connection on both directions' bits packed as here: RST either
    way (2), or FIN both ways (1: this direction, 4: the reverse)."""
    return bool(bits & 2) or (bits & 5) == 5


class _Gaps:
    """Whether a connection's packets in one part are never more than ``close`` ns apart (its merge rows)."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def within(self, part: int, flow_ids: list[int], close: int) -> bool:
        if part not in self._rows:
            p = self.dirs[part] / "merge_rows.parquet"
            if not p.exists():
                return False
            t = pq.read_table(p, columns=["flow_id", "ts_ns"])
            self._rows[part] = (_np(t, "flow_id", np.int64, -1), _np(t, "ts_ns", np.int64))
        fid, ts = self._rows[part]
        t = ts[np.isin(fid, flow_ids)]  # in frame order already
        return bool(t.size < 2 or int(np.diff(t).max()) <= close)


def _group_rows(allf: pd.DataFrame, dirs: list[Path], meta: dict) -> np.ndarray:
    """The serial run's flow of every row of the parts' flows tables (``allf``, in part then flow_id order).

    A row is its own flow unless it continues a row of an earlier part: the serial flow table ends a flow when
    its connection (both directions) was silent ``idle`` ns, or closed (RST, or FIN both ways) and then silent
    ``close`` ns, judged at the connection's next packet (``flows/table.py``). So, per connection seen in
    several parts, at its first packet in a later part: not ended -> the first row of each direction there
    continues that direction's open row; ended -> new rows. The FIN/RST bits come from each part's
    ``flow_state.parquet``. A connection that continues with a FIN or RST already seen carries that state into
    the next part, which the part's own run did not know; it changes nothing there unless the connection then
    goes silent for more than ``close`` ns inside that part (its merge rows say), and then ``NotExact`` (the
    caller runs the capture serially)."""
    n = len(allf)
    gid = np.arange(n, dtype=np.int64)
    if n == 0:
        return gid
    keys = list(zip(*(allf[c].fillna(0).astype(np.int64).tolist() if c in ("if_id", "ifindex", "direction")
                      else allf[c].tolist() for c in KEY)))
    part = allf["_part"].to_numpy()
    by_key: dict[tuple, list[int]] = {}
    for i, k in enumerate(keys):
        by_key.setdefault(k, []).append(i)
    conns: dict[tuple, list[tuple]] = {}
    for k, rows in by_key.items():
        if part[rows[0]] != part[rows[-1]]:  # this direction is in several parts
            rk = (k[0], k[2], k[1], k[4], k[3], k[5], k[6], (0, 2, 1)[k[7]])  # (received <-> sent: flows/table.py)
            conns.setdefault(min(k, rk), [k, rk])
    if not conns:
        return gid
    params = (meta.get("params") or {}).get("flows") or {}
    idle = round(float(params.get("idle_timeout_s", IDLE_TIMEOUT_NS / 1e9)) * 1e9)
    close = round(float(params.get("close_timeout_s", CLOSE_TIMEOUT_NS / 1e9)) * 1e9)
    bits_of = np.zeros(n, np.int64)
    fids = allf["flow_id"].to_numpy()
    for k, d in enumerate(dirs):
        st = pq.read_table(d / "flow_state.parquet") if (d / "flow_state.parquet").exists() else None
        rows = np.flatnonzero(part == k)
        if st is None:
            bits_of[rows] = -1  # unknown
            continue
        lut = dict(zip(st.column("flow_id").to_pylist(), st.column("finrst").to_pylist()))
        bits_of[rows] = [lut.get(int(f), -1) for f in fids[rows]]
    gaps = _Gaps(dirs)
    t0s, t1s = (np.asarray(pd.to_datetime(allf[c]).array.asi8, np.int64) for c in ("ts_first_ns", "ts_last_ns"))
    for dirs_ in conns.values():
        rows_of = [by_key.get(k, []) for k in dirs_]
        parts_here = sorted({int(part[i]) for rows in rows_of for i in rows})
        open_row: list[int | None] = [None, None]  # per direction: the row its next row would continue
        last = None  # the connection's last packet time while open
        bits = 0  # FIN/RST of the open rows (FIN of direction 1 as bit 4)
        for q in parts_here:
            here = [[i for i in rows if part[i] == q] for rows in rows_of]
            t0 = min(int(t0s[h[0]]) for h in here if h)
            carried = 0
            if last is not None:
                ended = t0 - last > idle or (_closed(bits) and t0 - last > close)
                if not ended and bits != 0:
                    firsts = [int(fids[h[0]]) for h in here if h]
                    if not gaps.within(q, firsts, close):
                        raise NotExact("a flow continues across a cut after a FIN or RST")
                    carried = bits
                for dd in (0, 1):
                    if here[dd] and not ended and open_row[dd] is not None:
                        gid[here[dd][0]] = gid[open_row[dd]]
                if ended:
                    open_row = [None, None]
            restarted = any(len(h) > 1 for h in here)
            for dd in (0, 1):
                if here[dd]:
                    open_row[dd] = here[dd][-1]
                elif restarted:
                    open_row[dd] = None
            bits, last = 0 if restarted else carried, None
            for dd in (0, 1):
                r = open_row[dd]
                if r is not None:
                    b = int(bits_of[r])
                    if b < 0:
                        raise NotExact("a part has no flow_state.parquet")
                    bits |= (b & 2) | ((b & 1) << (2 * dd))
                    last = max(last or 0, int(t1s[r]))
    # number the flows in order of first appearance, as the serial run does
    _, first, inverse = np.unique(gid, return_index=True, return_inverse=True)
    ren = np.empty(first.size, np.int64)
    ren[np.argsort(first, kind="stable")] = np.arange(first.size)
    return ren[inverse.ravel()]


def _read(d: Path, table: str) -> pa.Table | None:
    p = d / f"{table}.parquet"
    return pq.read_table(p) if p.exists() else None


def _shift(t: pa.Table, cols: list[str], by: int) -> pa.Table:
    for c in cols:
        i = t.schema.get_field_index(c)
        typ = t.schema.field(c).type
        t = t.set_column(i, t.schema.field(c), pc.cast(pc.add(t.column(c), pa.scalar(by, typ)), typ))
    return t


def _remap(t: pa.Table, col: str, mapping: np.ndarray) -> pa.Table:
    i = t.schema.get_field_index(col)
    null = np.asarray(t.column(col).is_null().to_numpy(zero_copy_only=False), np.bool_)
    ids = _np(t, col, np.int64, -1)
    new = np.where(ids >= 0, mapping[np.clip(ids, 0, None)] if mapping.size else ids, -1).astype(np.int64)
    return t.set_column(i, t.schema.field(col), pa.array(new, pa.int64(), mask=null if null.any() else None))


def _np(t: pa.Table, col: str, dtype, fill: int = 0) -> np.ndarray:
    """A column as a numpy array of ``dtype``, nulls as ``fill`` (an empty column has no chunks, no dtype)."""
    c = t.column(col)
    return np.asarray((c.fill_null(fill) if c.null_count else c).to_numpy(), dtype)


def _nearest_rank(values: np.ndarray) -> tuple[Any, Any, Any]:
    if values.size == 0:
        return None, None, None
    v = np.sort(values)
    total = v.size
    return tuple(int(v[max(1, int(np.ceil(q * total))) - 1]) for q in (0.50, 0.99)) + (int(v[-1]),)


def merge_parts(parts: list[Part], dirs: list[Path], summaries: list[dict], out: Path, *,
                packets: bool, explicit: bool = False, gro: Any = None, gro_engine: str = "compiled",
                flow_timeouts_s: tuple[float, float] = (IDLE_TIMEOUT_NS / 1e9, CLOSE_TIMEOUT_NS / 1e9)) -> dict:
    """Write the merged tables of ``parts`` (analysed into ``dirs``) to ``out``; returns the merged summary.

    The parts' packets tables are read only when ``packets`` (the merged packets table is wanted) or when a
    flow spans a cut (its history-dependent columns are recomputed from its packets); raises ``NeedPackets``
    when that is so and the parts have none. ``explicit``: the audit's filters were given (every result is
    reported; the default audit reports only those that found something). ``gro``, ``gro_engine``,
    ``flow_timeouts_s``: the run's, for the capture inference and the diagnosis of the whole capture."""
    out.mkdir(parents=True, exist_ok=True)
    offs = [p.first_record for p in parts]
    flows_k = [_read(d, "flows").to_pandas() for d in dirs]
    allf = pd.concat([f.assign(_part=k) for k, f in enumerate(flows_k)], ignore_index=True)
    allf["_gid"] = _group_rows(allf, dirs, read_metadata(dirs[0] / "flows.parquet"))
    maps = []
    for k, f in enumerate(flows_k):
        m = np.zeros(int(f["flow_id"].max()) + 1 if len(f) else 0, np.int64)
        rows = allf[allf["_part"] == k]
        m[rows["flow_id"].to_numpy()] = rows["_gid"].to_numpy()
        maps.append(m)

    # the flows seen in several parts: their history-dependent columns are recomputed from their rows, the only
    # rows kept in memory; every table is otherwise streamed part by part, a batch at a time, into the same
    # writers a serial run uses (output/parquet.py TableSink: its encoding, its metadata, bounded memory)
    sizes = allf.groupby("_gid").size()
    multi = sizes.index[sizes.to_numpy() > 1].to_numpy(np.int64)
    is_multi = np.zeros(int(allf["_gid"].max()) + 1 if len(allf) else 0, bool)
    is_multi[multi] = True
    meta = read_metadata(dirs[0] / "flows.parquet")
    audit = _merge_audit(summaries, explicit)
    meta.update({"packet_count": int(sum(s["capture"]["packets"] for s in summaries)),
                 "source_name": Path(parts[0].path).name, "source_size": Path(parts[0].path).stat().st_size,
                 "params": dict(meta.get("params") or {}, filters=[r["expr"] for r in audit])})
    sinks: dict[str, TableSink] = {}

    def sink(name: str) -> TableSink:
        spec = BY_NAME[name]
        sinks[name] = TableSink(out / f"{name}.parquet", spec.schema, background=spec.background)
        return sinks[name]

    try:
        packets_t = None
        if packets or multi.size:
            # the packets tables when they are wanted, else the narrow rows parts write for the merge (flow_state)
            name = "packets" if packets or not all((d / "merge_rows.parquet").exists() for d in dirs) else \
                "merge_rows"
            if not all((d / f"{name}.parquet").exists() for d in dirs):
                raise NeedPackets("flows cross the cuts: the parts must be analysed with their packets")
            to = sink("packets") if packets else None
            kept, pcols = [], list(MERGE_ROWS)
            for d, o, m in zip(dirs, offs, maps, strict=True):
                for t in _batches(d, name, o, m, ["frame"], None if packets else list(MERGE_ROWS)):
                    if to is not None:
                        to.write(t)
                    kept.append(_of_flows(t, is_multi, pcols))
            packets_t = _concat(kept, BY_NAME["packets"].schema, pcols)
        sp_to, sp_kept = sink("superpackets"), []
        for k, (d, o, m) in enumerate(zip(dirs, offs, maps, strict=True)):
            for t in _batches(d, "superpackets", o, m, ["first_frame", "last_frame"]):
                if k < len(dirs) - 1 and pc.any(pc.equal(pc.cast(t.column("flush_reason"), pa.string()),
                                                         "end_of_capture")).as_py():
                    # a part that ended with GRO entries held: when and why the serial run completes them
                    # depends on what its receive queue sees next, which that part did not see
                    raise NotExact("a part ended with GRO entries held")
                sp_to.write(t)
                sp_kept.append(_of_flows(t, is_multi, ["flow_id", "payload_len"]))
        flows = _reduce_flows(allf, offs, packets_t,
                              _concat(sp_kept, BY_NAME["superpackets"].schema, ["flow_id", "payload_len"]))
        fschema = BY_NAME["flows"].schema
        sink("flows").write(pa.Table.from_pandas(flows, schema=fschema.remove_metadata(), preserve_index=False))

        # findings: the parts' rows shifted, without their own capture-wide suspicion, which is recomputed here
        fd_to = sink("findings")
        for d, o in zip(dirs, offs, strict=True):
            for t in _batches(d, "findings", o, None, ["frame"]):
                fd_to.write(t.filter(pc.not_equal(t.column("code"), SUSPECT.code)))
        hbh = sum(s["bigtcp"].get("hbh_jumbo", 0) for s in summaries)
        v6 = (flows["ip_version"] == 6) & (flows["bigtcp_packets"] == 0)
        gaps = int(flows.loc[v6, "capture_gap_bytes"].sum())
        suspect = []
        if gaps > 0 and hbh == 0:
            msg = SUSPECT.template.format(value=gaps)
            suspect.append(msg)
            fd_to.write_columns({"frame": [0], "code": [SUSPECT.code], "severity": [SUSPECT.severity],
                                 "message": [msg]})

        # filter audit: the parts' rows one after the other are in the order the serial run writes them (frame,
        # then expression: output/audit.py), of the expressions the first part audited
        if any((d / "filter_audit.parquet").exists() for d in dirs):
            au_to = sink("filter_audit")
            audited = pa.array(summaries[0]["filter_audit"]["audited"], pa.string())
            for d, o in zip(dirs, offs, strict=True):
                for t in _batches(d, "filter_audit", o, None, ["frame"]):
                    au_to.write(t.filter(pc.is_in(pc.cast(t.column("filter"), pa.string()), value_set=audited)))
        diag = _diagnosis(parts, dirs, maps, flows, summaries, gro, gro_engine, flow_timeouts_s)
        for sk in sinks.values():
            sk.close(meta)
    except BaseException:
        for sk in sinks.values():
            sk.abort()
        raise
    for t in ("packets", "filter_audit"):
        if t not in sinks:
            (out / f"{t}.parquet").unlink(missing_ok=True)
    return _merge_summary(summaries, flows, suspect, parts, audit, diag)


def _batches(d: Path, table: str, off: int, fmap: np.ndarray | None, frames: list[str],
             columns: list[str] | None = None) -> Iterator[pa.Table]:
    """A part's table a batch at a time: its ``frames`` columns shifted by the records before the part, its
    flow ids mapped to the merged ones (``fmap``)."""
    path = d / f"{table}.parquet"
    if not path.exists():
        return
    for rb in pq.ParquetFile(path).iter_batches(batch_size=1 << 16, columns=columns):
        t = _shift(pa.Table.from_batches([rb]), frames, off)
        yield t if fmap is None else _remap(t, "flow_id", fmap)


def _of_flows(t: pa.Table, is_multi: np.ndarray, columns: list[str]) -> pa.Table:
    """The rows of ``t`` (``columns``) whose flow is one of those marked in ``is_multi``."""
    fid = _np(t, "flow_id", np.int64, -1)
    ok = (fid >= 0) & (fid < is_multi.size)
    ok[ok] = is_multi[fid[ok]]
    return t.select(columns).filter(pa.array(ok))


def _concat(tables: list[pa.Table], schema: pa.Schema, columns: list[str]) -> pa.Table:
    """The kept rows as one table (none: an empty one of ``schema``'s ``columns``)."""
    if tables:
        return pa.concat_tables(tables)
    return pa.schema([schema.field(c) for c in columns]).empty_table()


def _reduce_flows(allf: pd.DataFrame, offs: list[int], packets_t: pa.Table | None, sp_t: pa.Table) -> pd.DataFrame:
    allf = allf.copy()
    allf["first_frame"] = allf["first_frame"].astype(np.int64) + np.asarray(offs, np.int64)[allf["_part"]]
    g = allf.groupby("_gid", sort=True)
    first = g.first()
    res = first[KEY].copy()
    res["first_frame"] = g["first_frame"].min()
    res["ts_first_ns"] = g["ts_first_ns"].min()
    res["ts_last_ns"] = g["ts_last_ns"].max()
    for c in SUMS:
        res[c] = g[c].sum()
    for c in ("max_payload_len", "max_superpacket_len"):
        res[c] = g[c].max()
    res["mss"] = g["mss"].last()  # the last non-null: the last SYN's option, as the serial counters keep it
    for c in ("p50_payload_len", "p99_payload_len", "p50_superpacket_len", "p99_superpacket_len",
              "retransmissions", "out_of_order", "capture_gap_bytes"):
        res[c] = first[c]
    span = g.size()
    multi = span.index[span.to_numpy() > 1].to_numpy()
    if multi.size:
        _recompute(res, multi, packets_t, sp_t)
    res.insert(0, "flow_id", res.index.to_numpy(np.int64))
    res = res.reset_index(drop=True)
    return res[list(FLOWS_SCHEMA.names)]  # (the flows table's columns, in its order)


def _recompute(res: pd.DataFrame, multi: np.ndarray, packets_t: pa.Table, sp_t: pa.Table) -> None:
    """The history-dependent columns of the flows seen in several parts, from their rows (exact)."""
    compact = np.full(int(res.index.max()) + 1, -1, np.int64)
    compact[multi] = np.arange(multi.size)
    cols = packets_t.select(["frame", "flow_id", "tcp_seq", "tcp_payload_len", "tcp_flags"])
    fid_all = _np(cols, "flow_id", np.int64, -1)
    sel = np.flatnonzero((fid_all >= 0) & (compact[np.clip(fid_all, 0, None)] >= 0))
    frame = _np(cols, "frame", np.uint64)[sel]
    order = sel[np.argsort(frame, kind="stable")]
    fid = compact[fid_all[order]]
    seq = np.ascontiguousarray(_np(cols, "tcp_seq", np.uint32)[order])
    plen = np.ascontiguousarray(_np(cols, "tcp_payload_len", np.uint32)[order])
    flags = np.ascontiguousarray(_np(cols, "tcp_flags", np.uint16)[order])
    m = multi.size
    state = np.zeros((m, NF), np.int64)
    holes = np.zeros((m, MAX_HOLES, 2), np.int64)
    seq_kernel(fid, seq, plen, flags, state, holes)
    retrans, ooo, gap = state[:, F_RETRANS], state[:, F_OOO], state[:, F_GAP]
    sp_fid = _np(sp_t, "flow_id", np.int64, -1)
    sp_len = _np(sp_t, "payload_len", np.int64)
    pos = plen > 0
    p50, p99 = _grouped_nearest_rank(fid[pos], plen[pos].astype(np.int64), m)
    sp_sel = (sp_fid >= 0) & (sp_fid < compact.size)
    sp_c = np.full(sp_fid.size, -1, np.int64)
    sp_c[sp_sel] = compact[sp_fid[sp_sel]]
    keep = sp_c >= 0
    s50, s99 = _grouped_nearest_rank(sp_c[keep], sp_len[keep], m)
    for col, v in (("p50_payload_len", p50), ("p99_payload_len", p99), ("p50_superpacket_len", s50),
                   ("p99_superpacket_len", s99)):
        res.loc[multi, col] = np.where(v < 0, np.nan, v) if (v < 0).any() else v
    for col, v in (("retransmissions", retrans), ("out_of_order", ooo), ("capture_gap_bytes", gap)):
        res.loc[multi, col] = v


def _grouped_nearest_rank(group: np.ndarray, values: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The nearest-rank p50 and p99 of ``values`` per group 0..m-1 (-1 where a group has none): one sort for
    every group (a per-group pass cost O(groups x rows) when many flows cross the cuts)."""
    out = np.full((2, m), -1, np.int64)
    if values.size == 0:
        return out[0], out[1]
    order = np.lexsort((values, group))
    g, v = group[order], values[order]
    count = np.bincount(g, minlength=m)
    start = np.concatenate(([0], np.cumsum(count)[:-1]))
    have = count > 0
    for k, q in enumerate((0.50, 0.99)):
        rank = np.maximum(1, np.ceil(q * count).astype(np.int64))  # nearest rank, as _nearest_rank
        out[k, have] = v[start[have] + rank[have] - 1]
    return out[0], out[1]


def _add(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def _diagnosis(parts: list[Part], dirs: list[Path], maps: list[np.ndarray], flows: pd.DataFrame,
               summaries: list[dict], gro: Any, engine: str, timeouts: tuple[float, float]) -> dict:
    """The capture inference and the diagnosis of the whole capture, as the serial run makes them: from the
    parts' tallies (``diagnosis_state.npz``: every flow's counts, flow ids mapped to the merged ones), the
    merged flows' top flows, and the what-if input read again from the capture's first packets."""
    from .api import _KEEP_TOP, whatif_input
    from .gro.config import GroConfig
    from .split import PartReader, record_chunks

    cfg = gro or GroConfig()
    if cfg.fallback_mtu is None:  # the one the parts used (the whole capture's first batch's)
        cfg = replace(cfg, fallback_mtu=summaries[0]["gro"]["fallback_mtu"])
    states = [dict(np.load(d / "diagnosis_state.npz")) for d in dirs]
    tally = D.SuperPacketTally.merged(states, maps, cfg)
    total = sum(s["capture"]["packets"] for s in summaries)
    # the first WHATIF_MAX_PACKETS records: a run of that prefix keeps the serial run's what-if input
    k, n, stop = D.WHATIF_MAX_PACKETS, 0, parts[-1].stop
    for t, off in record_chunks(parts[0].path):
        if n + t.size > k:
            stop = int(off[k - n])
            break
        n += t.size
    whatif = whatif_input(PartReader(Part(parts[0].path, 0, 24, stop, 0, min(k, total))), cfg, engine, timeouts)
    whatif.seen = total
    top = flows.assign(_neg=-flows["payload_bytes"].astype(np.int64)).sort_values(
        ["_neg", "flow_id"], kind="stable").head(_KEEP_TOP)
    cols = {k: [_plain(v) for v in top[k].tolist()] for k in (*_top_keys(), "ip_version")}
    return {"capture_kind": D.infer_capture(tally, cfg, sum(int(st["payload_packets"]) for st in states), cols),
            "diagnosis": D.diagnose(tally, cols, cfg, whatif, engine)}


def _top_keys() -> tuple[str, ...]:
    from .api import _TOP_KEYS  # the serial summary's one list

    return _TOP_KEYS


def _span(caps: list[dict]) -> dict:
    """The whole capture's earliest and latest timestamps and their distance, from its parts'."""
    starts = [c["start_ns"] for c in caps if c.get("start_ns") is not None]
    ends = [c["end_ns"] for c in caps if c.get("end_ns") is not None]
    start, end = (min(starts), max(ends)) if starts else (None, None)
    return {"start_ns": start, "end_ns": end, "duration_s": round(((end or 0) - (start or 0)) / 1e9, 6)}


def _merge_summary(ss: list[dict], flows: pd.DataFrame, suspect: list[str], parts: list[Part],
                   audit: list[dict], diag: dict) -> dict:
    s0 = ss[0]
    cap = dict(s0["capture"])
    cap.update(name=parts[0].path, size=Path(parts[0].path).stat().st_size,
               packets=sum(s["capture"]["packets"] for s in ss),
               bytes_on_wire=sum(s["capture"]["bytes_on_wire"] for s in ss),
               **_span([s["capture"] for s in ss]))
    findings: Counter = Counter()
    for s in ss:
        findings.update({k: v for k, v in s["findings"].items() if k != SUSPECT.code})
    if suspect:
        findings[SUSPECT.code] += 1
    out = dict(s0)
    out["capture"] = cap
    out["bigtcp"] = {k: sum(s["bigtcp"].get(k, 0) for s in ss) for k in s0["bigtcp"]}
    out["max_bigtcp_ip_len"] = max(s["max_bigtcp_ip_len"] for s in ss)
    out["flows"] = len(flows)
    out["capture_points"] = capture_points(flows_per_point(flows["if_id"].to_numpy(np.uint64),
                                                           flows["ifindex"].fillna(0).to_numpy(np.uint64)))
    keys = _top_keys()  # (a part may have no top flow to copy them from)
    top = flows.sort_values("payload_bytes", ascending=False, kind="stable").head(5)
    out["top_flows"] = [{k: _plain(r[k]) for k in keys} for _, r in top.iterrows()]
    sp = {"count": 0, "flush_reasons": {}, "poll_ends": {}, "receivers": {}, "late_segments": 0, "lost_segments": 0}
    for s in ss:
        sp["count"] += s["superpackets"]["count"]
        sp["late_segments"] += s["superpackets"].get("late_segments", 0)
        sp["lost_segments"] += s["superpackets"].get("lost_segments", 0)
        for k in ("flush_reasons", "poll_ends", "receivers"):
            sp[k] = _add(sp[k], s["superpackets"][k])
    out["superpackets"] = sp
    out["findings"] = dict(findings.most_common())
    nfd: dict = {}
    for s in ss:
        nfd = _add(nfd, s["not_fully_decoded"])
    out["not_fully_decoded"] = nfd
    out["tcp_options_cut"] = sum(s.get("tcp_options_cut", 0) for s in ss)
    out["suspect"] = suspect
    out["filter_audit"] = dict(s0["filter_audit"], results=audit)
    out["parts"] = len(parts)
    out.update(diag)
    return out


def _merge_audit(ss: list[dict], explicit: bool) -> list[dict]:
    """The parts' filter-audit results added up per expression, in the serial run's order. Every part reports
    every expression (``AuditStage.finish(report_all=True)``): counts and reasons are sums, a suggestion is
    verified when it is on every part, the note on frames not run through the filter is written again with
    the total; then the default audit keeps only the results that found something, as a serial run does."""
    by: dict[str, list[dict]] = {}
    for s in ss:
        for r in s["filter_audit"]["results"]:
            by.setdefault(r["expr"], []).append(r)
    order = [e for e in ss[0]["filter_audit"]["audited"] if e in by] + \
        [e for e in by if e not in ss[0]["filter_audit"]["audited"]]
    head, tail = SKIPPED_NOTE.split("{n}")
    out = []
    for expr in order:
        rs = by[expr]
        m = dict(rs[0])
        for r in rs[1:]:
            for k, v in r.items():
                w = m.get(k)
                if k == "linktypes":
                    m[k] = sorted(set(w or []) | set(v or []))
                elif k == "suggestion_verified":
                    m[k] = False if False in (w, v) else (True if True in (w, v) else None)
                elif isinstance(v, bool) or isinstance(w, bool) or k in ("suggestion", "alternative", "error"):
                    m[k] = w if w is not None else v
                elif isinstance(v, int) or isinstance(w, int):
                    m[k] = (w or 0) + (v or 0)
                elif k == "notes":
                    m[k] = list(dict.fromkeys((w or []) + (v or [])))
                elif k in ("rejected", "suggestions_by_linktype"):
                    m[k] = {**(v or {}), **(w or {})}
                elif isinstance(v, dict) or isinstance(w, dict):
                    m[k] = _add(w or {}, v or {})
        notes = [x for x in m.get("notes") or [] if not (x.startswith(head) and x.endswith(tail)
                                                         and x[len(head):len(x) - len(tail)].isdigit())]
        if m.get("frames_skipped") and len(notes) < len(m.get("notes") or []):
            notes.insert(0, SKIPPED_NOTE.format(n=m["frames_skipped"]))
        m["notes"] = notes
        out.append(m)
    return out if explicit else [r for r in out if reportable(r)]

def _plain(v: Any) -> Any:
    """A pandas cell as the serial summary has it: None for a missing value, ints for whole numbers (a reduced
    column of ints with a missing value in another row is float64 in pandas)."""
    if pd.isna(v):
        return None
    v = v.item() if hasattr(v, "item") else v
    return int(v) if isinstance(v, float) and v.is_integer() else v
