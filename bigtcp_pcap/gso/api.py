"""``egress()``: a sender's TX capture -> what an egress device with a given profile transmits (egress.parquet),
optionally chained into the GRO engine of the receiver behind it (superpackets.parquet).

Reading and decoding are the toolkit's own (``CaptureReader``, ``decode``); flow ids come from the same
``FlowTable`` as ``analyze``, so the flow ids of both tables agree.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from .. import __version__
from ..capture.reader import CaptureInfo, CaptureReader
from ..decode import decode
from ..errors import CaptureError, make_outdir
from ..flows.table import FlowTable
from ..output import arrow as A
from ..output import parquet as P
from .config import EgressProfile
from .engine import (
    ACTION_DROPPED,
    ACTION_NAMES,
    ACTION_PASSED,
    ACTION_RESEGMENTED,
    ACTION_SEGMENTED,
    EgressBatch,
    EgressEngine,
    output_packets,
)
from .table import EGRESS_SCHEMA, egress_columns

if TYPE_CHECKING:
    import pandas as pd

    from ..gro.config import GroConfig

TABLES = ("egress", "superpackets")
__all__ = ["EgressProfile", "EgressResult", "egress", "explode"]


def explode(source: str | os.PathLike | BinaryIO, dest: str | os.PathLike, **kw: Any):
    """Rewrite super-packets into wire-sized packets (``gso.explode.explode``; see there for the options)."""
    from .explode import explode as run

    return run(source, dest, **kw)


@dataclass
class EgressResult:
    """What ``egress()`` produced: the table files, capture facts and a summary (``summary["flows"]``)."""

    outdir: Path
    info: CaptureInfo
    profile: EgressProfile
    summary: dict[str, Any]
    error: CaptureError | None = None
    _tmp: Any = field(default=None, repr=False)

    @property
    def table(self) -> pd.DataFrame:
        """egress.parquet as a DataFrame."""
        import pandas as pd

        return pd.read_parquet(self.outdir / "egress.parquet")

    @property
    def superpackets(self) -> pd.DataFrame | None:
        """superpackets.parquet (the receiver's GRO after the hop) when ``then_gro`` was given."""
        import pandas as pd

        path = self.outdir / "superpackets.parquet"
        return pd.read_parquet(path) if path.exists() else None


class _Tally:
    """Per-flow counters of the summary (arrays indexed by flow id, grown as flows appear)."""

    NAMES = ("skbs_in", "super_packets_in", "payload_in", "rows_out", "payload_out", "passed", "segmented",
             "resegmented", "dropped", "max_frame_in", "max_frame_out", "superpackets_after_gro")

    def __init__(self) -> None:
        self.c = {k: np.zeros(0, np.int64) for k in self.NAMES}
        self.no_flow = dict.fromkeys(ACTION_NAMES, 0)  # inputs without a TCP flow (UDP, ARP, ...) by action

    def _grow(self, n: int) -> None:
        for k, v in self.c.items():
            if v.shape[0] < n:
                self.c[k] = np.concatenate([v, np.zeros(max(n, 2 * v.shape[0]) - v.shape[0], np.int64)])

    def add(self, fid: np.ndarray, wirelen: np.ndarray, payload: np.ndarray, eb: EgressBatch, nflows: int) -> None:
        self._grow(nflows)
        m = fid >= 0
        c = self.c
        c["skbs_in"] += np.bincount(fid[m], minlength=c["skbs_in"].shape[0])
        c["payload_in"] += np.bincount(fid[m], payload[m].astype(np.int64), c["skbs_in"].shape[0]).astype(np.int64)
        np.maximum.at(c["max_frame_in"], fid[m], wirelen[m].astype(np.int64))
        o = eb.flow_id >= 0
        ofid = eb.flow_id[o]
        first = o & (eb.out_index == 0)
        kept = o & (eb.action != ACTION_DROPPED)
        size = c["skbs_in"].shape[0]
        c["rows_out"] += np.bincount(eb.flow_id[kept], minlength=size)
        c["payload_out"] += np.bincount(eb.flow_id[kept], eb.payload_len[kept].astype(np.int64), size
                                        ).astype(np.int64)
        sp = first & ((eb.action == ACTION_SEGMENTED) | (eb.action == ACTION_RESEGMENTED) | (eb.gso_segs > 1))
        c["super_packets_in"] += np.bincount(eb.flow_id[sp], minlength=size)
        for code, name in ((ACTION_PASSED, "passed"), (ACTION_SEGMENTED, "segmented"),
                           (ACTION_RESEGMENTED, "resegmented"), (ACTION_DROPPED, "dropped")):
            sel = first & (eb.action == code)
            c[name] += np.bincount(eb.flow_id[sel], minlength=size)
            self.no_flow[name] += int(((eb.out_index == 0) & ~o & (eb.action == code)).sum())
        if ofid.size:
            np.maximum.at(c["max_frame_out"], eb.flow_id[kept], eb.frame_len[kept].astype(np.int64))

    def add_superpackets(self, fid: np.ndarray) -> None:
        m = fid >= 0
        if m.any():
            self._grow(int(fid[m].max()) + 1)
            self.c["superpackets_after_gro"] += np.bincount(fid[m], minlength=self.c["skbs_in"].shape[0])


def egress(source: str | os.PathLike | BinaryIO, *, outdir: str | os.PathLike | None = None,
           profile: EgressProfile | str | None = None, then_gro: GroConfig | None = None, mss: int | None = None,
           fixedid: bool = False, name: str | None = None, sha256: bool = False, gro_engine: str = "compiled",
           progress: Callable[[int, int | None], None] | None = None, **profile_fields: Any) -> EgressResult:
    """Predict what an egress device transmits for the skbs in a sender's TX capture (docs/gso-spec.md).

    ``source``: a capture of what a sender hands its device (tcpdump on the sender's interface with TSO/GSO
    on: super-packets). ``profile``: an ``EgressProfile``, a named profile (``veth``, ``ice``, ``mlx4``,
    ``legacy``) or a file of ``ip -d -j link show DEV`` JSON; ``profile_fields`` (``gso_max_size=65536``,
    ``tso=False``, ``resegment=True``, ...) override its fields. ``mss``: the sender's gso_size for every flow
    (default: from the SYN MSS options, else the MTU). ``fixedid``: the skbs are SKB_GSO_TCP_FIXEDID (G8).
    ``then_gro``: also run the receiver's GRO (this ``GroConfig``) on the device's output and write
    ``superpackets.parquet``.

    Writes ``egress.parquet`` to ``outdir`` (a temporary directory owned by the result when None). A capture
    without super-packets gives an empty table and says so in ``summary["note"]``. A damaged capture does not
    raise: everything before the fault is kept, ``result.error`` and the metadata say the run was partial.
    """
    if isinstance(profile, str):
        prof = EgressProfile.load(profile, **profile_fields)
    else:
        prof = (profile or EgressProfile()).with_overrides(**profile_fields)
    engine = EgressEngine(prof, mss=mss, fixedid=fixedid)
    gro = None
    if then_gro is not None:
        from ..gro import make_engine

        if then_gro.fallback_mtu is None:  # the device's MTU is known here: no need to read it off the capture
            then_gro = replace(then_gro, fallback_mtu=prof.mtu)
        gro = make_engine(gro_engine, then_gro)
    tmp = None
    if outdir is None:
        out = tmp = Path(tempfile.mkdtemp(prefix="bigtcp-egress-"))
    else:
        out = make_outdir(outdir)
        for t in TABLES:
            (out / f"{t}.parquet").unlink(missing_ok=True)
    reader = CaptureReader(source, name=name, sha256=sha256)
    info = reader.info
    flows = FlowTable()
    tally = _Tally()
    sink = P.TableSink(out / "egress.parquet", EGRESS_SCHEMA, background=True)  # encoding on a writer thread
    sink_sp = None
    if gro is not None:
        from ..output.superpackets import SUPERPACKETS_SCHEMA, superpackets_columns

        sink_sp = P.TableSink(out / "superpackets.parquet", SUPERPACKETS_SCHEMA)
    error: CaptureError | None = None
    inputs = 0
    sp_rows = 0

    def emit_sp(spb) -> None:
        nonlocal sp_rows
        if len(spb):
            sp_rows += len(spb)
            tally.add_superpackets(np.asarray(spb.flow_id, np.int64))
            sink_sp.write_columns(superpackets_columns(spb, flows))

    try:
        for rb in reader:
            pb, _ = decode(rb)
            fid = flows.assign(pb)
            eb = engine.feed(pb, fid)
            inputs += len(pb)
            tally.add(fid, pb.wirelen, pb.tcp_payload_len, eb, len(flows))
            if len(eb):
                sink.write(A.table(egress_columns(eb, flows), EGRESS_SCHEMA))
            if gro is not None:
                opb, ofid = output_packets(pb, eb)
                emit_sp(gro.feed(opb, ofid))
            if progress is not None:
                progress(reader.src.bytes_read, info.size)
    except CaptureError as e:
        error = e
    if gro is not None:
        emit_sp(gro.flush())
    c = {k: v[: len(flows)] for k, v in tally.c.items()}
    n_super = int(c["super_packets_in"].sum())
    note = None
    if n_super == 0:
        note = (f"{os.path.basename(info.name)}: no super-packets (no TCP skb larger than one MSS): nothing for "
                "an egress device to cut; capture the sender's interface with TSO/GSO on")
    params = {"egress": prof.to_metadata(), "mss": mss, "fixedid": fixedid,
              "then_gro": then_gro.to_metadata() if then_gro is not None else None}
    meta = {"tool_version": __version__, "source_name": os.path.basename(info.name), "source_size": info.size,
            "source_sha256": info.sha256, "format": info.format, "compression": info.compression,
            "linktypes": sorted(info.linktypes), "snaplen": sorted(info.snaplens), "packet_count": info.packets,
            "first_ts_ns": info.first_ts_ns, "params": params, "partial": error is not None,
            "error": error.one_line() if error else None, "note": note}
    if n_super == 0:  # "says so and writes an empty table": rows of plain packets are not a prediction
        sink.close(meta)
        sink = P.TableSink(out / "egress.parquet", EGRESS_SCHEMA)
    sink.close(meta)
    if sink_sp is not None:
        sink_sp.close(meta)
    summary = _summary(info, prof, c, flows, inputs, note, error, sp_rows if gro is not None else None,
                       tally.no_flow)
    result = EgressResult(outdir=out, info=info, profile=prof, summary=summary, error=error)
    if tmp is not None:
        result._tmp = weakref.finalize(result, shutil.rmtree, tmp, ignore_errors=True)
    return result


def _summary(info: CaptureInfo, prof: EgressProfile, c: dict, flows: FlowTable, inputs: int, note: str | None,
             error: CaptureError | None, sp_rows: int | None, no_flow: dict[str, int]) -> dict[str, Any]:
    flow_rows = []
    live = np.flatnonzero(c["payload_in"] > 0)
    for f, key, pt in zip(live.tolist(), flows.keys(live), flows.points(live)):
        src, dst, sport, dport, _ver = key
        skbs, rows = int(c["skbs_in"][f]), int(c["rows_out"][f])
        if_id, ifindex, direction = pt if pt is not None else (0, 0, 0)
        row = {"flow_id": f, "src": src, "dst": dst, "sport": sport, "dport": dport, "if_id": if_id,
               "ifindex": ifindex or None, "direction": direction or None, "skbs_in": skbs,
               "super_packets_in": int(c["super_packets_in"][f]), "packets_out": rows,
               "amplification": round(rows / skbs, 3) if skbs else None,
               "payload_in": int(c["payload_in"][f]), "payload_out": int(c["payload_out"][f]),
               "bytes_conserved": bool(c["payload_in"][f] == c["payload_out"][f]),
               **{a: int(c[a][f]) for a in ACTION_NAMES},
               "max_frame_in": int(c["max_frame_in"][f]), "max_frame_out": int(c["max_frame_out"][f])}
        if sp_rows is not None:
            row["superpackets_after_gro"] = int(c["superpackets_after_gro"][f])
        flow_rows.append(row)
    flow_rows.sort(key=lambda r: -r["payload_in"])
    out = {
        "capture": {"name": info.name, "format": info.format, "packets": info.packets,
                    "partial": error is not None, "error": error.one_line() if error else None},
        "profile": prof.to_metadata(),
        "frames_in": inputs, "super_packets_in": int(c["super_packets_in"].sum()),
        "inputs_by_action": {a: int(c[a].sum()) + no_flow[a] for a in ACTION_NAMES},  # every frame, TCP or not
        "inputs_without_tcp_flow": sum(no_flow.values()),
        "flows": flow_rows,
        "bytes_conserved": all(r["bytes_conserved"] for r in flow_rows if r["dropped"] == 0),
        "note": note,
    }
    if sp_rows is not None:
        out["superpackets_after_gro"] = sp_rows
    return out
