"""The library face: ``analyze()`` wires reader -> decoder -> stages -> sinks; the CLI only calls it.

Tables are always streamed to Parquet files (in ``outdir``, or a temporary directory owned by the returned
``Analysis``), and the DataFrame properties read them back on demand. So the CLI and the API produce the same
tables by construction, and memory is bounded by the number of flows, not by the capture size.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from . import __version__, _native
from . import diagnose as D
from . import findings as F
from .audit.stage import FilterAudits
from .capture.reader import CaptureInfo, CaptureReader
from .decode import FindingRows, PacketBatch, decode
from .decode.schema import BIGTCP_NAMES, ST_TRUNC_L4, STATUS_NAMES
from .errors import BigtcpError, CaptureError, Interrupted, OutputError, UsageError, make_outdir
from .flows.points import capture_points, flows_per_point
from .flows.table import CLOSE_TIMEOUT_NS, FINRST, IDLE_TIMEOUT_NS, IFINDEX, FlowTable
from .gro.config import GroConfig
from .gro.reasons import POLL_END_NAMES
from .gro.stage import GroStage
from .output import parquet as P
from .output.report import write_summary
from .output.superpackets import superpackets_columns
from .output.tables import BY_NAME, TABLES

if TYPE_CHECKING:
    import pandas as pd

SAMPLE_NAME = "sample-bigtcp.pcap"
OUTPUT_FILES = ("summary.json", "report.html")  # an earlier run's, removed once this run's tables are in place


def sample_capture() -> Path:
    """The bundled real BIG TCP sample capture (made by the Linux kernel; see tests/fixtures/README.md)."""
    return Path(__file__).parent / "data" / SAMPLE_NAME


def iter_batches(source: str | os.PathLike | BinaryIO, **reader_kw) -> Iterator[tuple[PacketBatch, FindingRows]]:
    """Decoded batches of a capture, for users who want columns and not DataFrames.

    Raises ``CaptureError`` after the last good batch when the capture is damaged.
    """
    for rb in CaptureReader(source, **reader_kw):
        yield decode(rb)


@dataclass
class Analysis:
    """What ``analyze()`` produced: table files, capture facts and a summary."""

    outdir: Path
    info: CaptureInfo
    params: dict[str, Any]
    summary: dict[str, Any]
    error: BigtcpError | None = None  # why the tables are partial (a CaptureError for a damaged capture)
    sidecar: Path | None = None
    _tmp: Any = field(default=None, repr=False)

    @property
    def partial(self) -> bool:
        return self.error is not None

    def _table(self, name: str) -> pd.DataFrame | None:
        import pandas as pd

        path = self.outdir / f"{name}.parquet"
        # nullable integer columns stay integers (pd.Int64Dtype, <NA>) instead of float64 with NaN
        return pd.read_parquet(path, dtype_backend="numpy_nullable") if path.exists() else None

    @property
    def packets(self) -> pd.DataFrame | None:
        return self._table("packets")

    @property
    def superpackets(self) -> pd.DataFrame:
        return self._table("superpackets")

    @property
    def flows(self) -> pd.DataFrame:
        return self._table("flows")

    @property
    def findings(self) -> pd.DataFrame:
        return self._table("findings")

    @property
    def filter_audit(self) -> pd.DataFrame | None:
        return self._table("filter_audit")

    def report(self, dest: str | os.PathLike | None = None) -> Path:
        """Write the self-contained HTML report (default ``OUTDIR/report.html``) and return its path."""
        from .output.report import write_report

        return write_report(self.outdir, dest)

    def write(self, outdir: str | os.PathLike) -> Path:
        """Copy the tables and ``summary.json`` to ``outdir`` (created if needed), each under a temporary name
        renamed into place."""
        out = Path(outdir)
        try:
            out.mkdir(parents=True, exist_ok=True)
            for p in [*self.outdir.glob("*.parquet"), *(self.outdir / n for n in OUTPUT_FILES)]:
                if p.exists() and out.resolve() != self.outdir.resolve():
                    tmp = out / f".{p.name}.{os.getpid()}.tmp"
                    shutil.copy2(p, tmp)
                    os.replace(tmp, out / p.name)
        except OSError as e:
            raise OutputError.from_os(str(out), e) from None
        return out


def analyze(source: str | os.PathLike | BinaryIO | None = None, *, outdir: str | os.PathLike | None = None,
            packets: bool = False, gro: GroConfig | None = None, progress: Callable[[int, int | None], None]
            | None = None, name: str | None = None, filters: list[str] | None = None, audit: bool = True,
            wireshark_sidecar: bool = False, gro_engine: str = "compiled", sha256: bool = False,
            flow_idle_timeout_s: float = IDLE_TIMEOUT_NS / 1e9, flow_close_timeout_s: float = CLOSE_TIMEOUT_NS / 1e9,
            flow_state: bool = False, default_audit_port: int | None = None, capture_mtu: int | None = None,
            **gro_params: Any) -> Analysis:
    """Analyse a capture: decode, rebuild GRO super-packets, build flows and findings, write Parquet.

    ``source`` is a path, ``-`` for stdin, a binary file object, or None for the bundled sample.
    GRO parameters may be given as a ``GroConfig`` or as keyword arguments (``gro_max_size=185000``, ...).
    ``progress(bytes_read, total_bytes)`` is called after each batch. A damaged capture does not raise: the
    tables hold everything before the fault and ``Analysis.error`` / the metadata say the run was partial.
    ``filters``: pcap filter expressions to audit (``filter_audit.parquet``); None audits ``tcp``,
    ``ip6 and tcp`` and ``tcp port P`` for the busiest port and reports only those that mis-parse.
    ``wireshark_sidecar``: also write ``<capture>.bigtcp.tsv`` for the Lua plugin (implies ``packets``).
    ``gro_engine``: "compiled" (numba, default) or "reference" (pure Python, for tests); identical rows.
    ``sha256``: record the SHA-256 of the capture file in the tables' metadata (``source_sha256``; otherwise
    null). It costs about 0.6 s per GiB read, like ``capinfos -H`` it is asked for, not default.
    ``flow_idle_timeout_s`` / ``flow_close_timeout_s``: a flow ends (its row is written and leaves memory) when
    its connection was silent this long, or closed (RST, or FIN both ways) and then silent this long; the same
    5-tuple later is a new flow (new row, new flow_id). Recorded in the metadata (``params.flows``).
    ``flow_state``: also write what the merge of a split run needs (``merge.py``): ``flow_state.parquet``
    (``flow_id``, ``finrst``: FIN 1 / RST 2 seen in the flow's own direction), to tell a flow that continues
    across a cut from one that ended before it, and ``merge_rows.parquet`` (frame, flow and sequence numbers of
    every packet), to recompute the columns of a flow seen in several parts. ``default_audit_port``: the port
    of the default audit's ``tcp port P`` (-1: none), where it is not this run's first batch's to choose (a
    split run's parts take the whole capture's); ``capture_mtu`` likewise, the fallback MTU read off the
    capture's first batch where ``fallback_mtu`` is not given (0: none; ``gro.stage.capture_mtu``).
    """
    packets = packets or wireshark_sidecar
    if wireshark_sidecar and (source is not None and (not isinstance(source, (str, os.PathLike))
                                                      or str(source) == "-")):
        raise UsageError("--wireshark-sidecar needs a capture file: the sidecar is tied to the file's name and "
                         "size, which a stream does not have (save it first, e.g. tcpdump -w FILE)")
    if gro is not None and gro_params:
        raise TypeError(f"analyze() got both gro= and GRO keywords ({', '.join(sorted(gro_params))}): "
                        "give one, e.g. gro=dataclasses.replace(gro, ...)")
    run = _Run(sample_capture() if source is None else source, outdir, name=name, sha256=sha256,
               cfg=gro if gro is not None else GroConfig(**gro_params), gro_engine=gro_engine, filters=filters,
               audit=audit, packets=packets, flow_timeouts_s=(flow_idle_timeout_s, flow_close_timeout_s),
               flow_state=flow_state, default_audit_port=default_audit_port, capture_mtu=capture_mtu)
    try:
        run.stream(progress)  # decode -> flows -> GRO -> audit -> sinks, batch by batch; faults recorded
        run.finish()  # the stages' last rows, notes, the audit table
    except OutputError as e:  # a table failed after reading ended: the others are still finished
        run.stop, run.error = run.stop or e, run.error or e
    except BaseException:  # a usage error (a bad filter) or a crash: nothing replaces the earlier tables
        run.abort()
        raise
    return run.close(wireshark_sidecar)  # tables renamed into place, summary.json; raises a stop it recorded


def whatif_input(source, cfg: GroConfig, gro_engine: str = "compiled",
                 flow_timeouts_s: tuple[float, float] = (IDLE_TIMEOUT_NS / 1e9, CLOSE_TIMEOUT_NS / 1e9)
                 ) -> D.WhatIfInput:
    """The what-if input a run of ``source`` keeps (its first ``WHATIF_MAX_PACKETS`` decoded packets, with the
    run's flow ids and receivers): a split run's merge reads the capture's first records again for it, as the
    parts keep none. Nothing is written."""
    run = _Run(source, None, name=None, sha256=False, cfg=cfg, gro_engine=gro_engine, filters=None, audit=False,
               packets=False, flow_timeouts_s=flow_timeouts_s)
    try:
        run.stream(None)
    finally:
        run.abort()
    if run.error is not None:
        raise run.error
    return run.whatif


def flow_timeout_ns(name: str, seconds: Any) -> int:
    """A flow timeout in ns; a UsageError naming ``name`` outside 1 us to 1e9 s (inf and 1e10 s overflowed the
    int64 clock; 1e-12 s rounded to 0)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 1e-6 <= seconds <= 1e9:
        raise UsageError(f"{name} must be between 1e-6 and 1e9 seconds, got {seconds!r}")
    return round(seconds * 1e9)


class _Run:
    """The state of one ``analyze`` run: the reader, the stages, the sinks, and why the tables are partial."""

    def __init__(self, source, outdir, *, name, sha256, cfg: GroConfig, gro_engine: str, filters, audit: bool,
                 packets: bool, flow_timeouts_s: tuple[float, float], flow_state: bool = False,
                 default_audit_port: int | None = None, capture_mtu: int | None = None) -> None:
        self.cfg, self.gro_engine, self.filters, self.packets = cfg, gro_engine, filters, packets
        # options are checked before the capture is opened and the output directory touched
        idle, close = flow_timeouts_s
        idle_ns = flow_timeout_ns("flow_idle_timeout_s", idle)
        close_ns = flow_timeout_ns("flow_close_timeout_s", close)
        self.gro_stage = GroStage(cfg, gro_engine, capture_mtu)
        self.reader = CaptureReader(source, name=name, sha256=sha256)
        self.info = self.reader.info
        self.tmp = None
        if outdir is None:
            # removed when the Analysis is garbage-collected (or at exit): the tables live as long as it does
            self.out = Path(tempfile.mkdtemp(prefix="bigtcp-pcap-"))
            self.tmp = self.out
        else:
            try:
                self.out = make_outdir(outdir)
            except OutputError:
                self.reader.src.close()
                raise
        self.flows = FlowTable(idle_timeout_ns=idle_ns, close_timeout_ns=close_ns)
        self.flow_params = {"idle_timeout_s": idle, "close_timeout_s": close}
        self.flow_sum = _FlowSummary()
        self.stats = _Stats()
        # a part of a split run keeps every flow's counts and no what-if input: the merge ranks the whole
        # capture's flows and takes the what-if input from the capture's first packets (merge.py)
        self.part = flow_state
        self.tally = D.SuperPacketTally(cfg, keep=None if flow_state else self.tally_keeps)
        self.whatif = D.WhatIfInput(limit=0 if flow_state else D.WHATIF_MAX_PACKETS)
        self.error: BigtcpError | None = None  # why the tables are partial
        self.stop: BaseException | None = None  # raised again once the tables are closed (interrupt, output fault)
        self.audit_results: list = []
        # each table is written to a temporary name and renamed into place when complete (output/parquet.py)
        self.sinks: dict[str, P.TableSink] = {}
        try:  # (before analyze's own handlers: a failure here leaves nothing behind)
            self.sink_packets = self.open_sink("packets") if packets else None
            self.sink_findings = self.open_sink("findings")
            self.sink_sp = self.open_sink("superpackets")
            self.sink_flows = self.open_sink("flows")
            self.sink_audit = self.open_sink("filter_audit")  # always written, empty when clean
            self.sink_merge = self.sink_flow_state = None
            if flow_state:  # a part of a split run: what the merge needs of every packet and flow (merge.py)
                self.sink_merge = P.TableSink(self.out / "merge_rows.parquet", P.MERGE_ROWS_SCHEMA, background=True)
                self.sink_flow_state = P.TableSink(self.out / "flow_state.parquet", P.FLOW_STATE_SCHEMA)
                self.sinks["merge_rows"], self.sinks["flow_state"] = self.sink_merge, self.sink_flow_state
        except BaseException:
            self.abort()
            raise
        # the audits' rows go to filter_audit.parquet batch by batch; those held (an expression libpcap has not
        # compiled for any link type yet) wait in the output directory
        self.audits = FilterAudits(filters, enabled=audit, default_port=default_audit_port, spill_dir=self.out,
                                   write=self.write_audit_rows)

    def write_audit_rows(self, table) -> None:
        if not self.sink_audit.failed:
            self.sink_audit.write(table)

    def tally_keeps(self, flow_id: np.ndarray) -> np.ndarray:
        """The diagnosis keeps a flow's counts while the flow is in memory or among the top flows."""
        return self.flows.in_memory(flow_id) | np.isin(flow_id, [r["flow_id"] for r in self.flow_sum.top])

    def open_sink(self, table: str) -> P.TableSink:
        spec = BY_NAME[table]  # output/tables.py: name, schema, writer thread
        self.sinks[table] = P.TableSink(self.out / f"{table}.parquet", spec.schema, background=spec.background)
        return self.sinks[table]

    def emit_superpackets(self, rows) -> None:
        # converted while their flows are in memory (the table buffers them into row groups)
        if len(rows):
            D.label_observed(rows)  # one aggregated input packet: reason "observed", not the flush that sent it
            slots = self.flows.slots(rows.flow_id)  # (the rows' flows, looked up once for both uses)
            self.flows.add_superpackets(rows.flow_id, rows.payload_len, rows.poll_end, slots=slots)
            self.stats.add_superpackets(rows)
            self.tally.add(rows)
            if not self.sink_sp.failed:
                self.sink_sp.write_columns(superpackets_columns(rows, self.flows, self.gro_stage.labels, slots))

    def emit_flows(self, cols) -> None:
        if cols is not None:
            self.flow_sum.add(cols)
            if self.sink_flow_state is not None and not self.sink_flow_state.failed:
                self.sink_flow_state.write_columns({"flow_id": cols["flow_id"], "finrst": cols[FINRST]})
            if not self.sink_flows.failed:
                self.sink_flows.write_columns(cols)

    def partial_row(self, code: int, frame: int, text: str) -> None:
        if not self.sink_findings.failed:
            self.sink_findings.write_columns({"frame": [frame], "code": [F.BY_ID[code].code],
                                              "severity": [F.BY_ID[code].severity], "message": [text]})
        self.stats.findings[F.BY_ID[code].code] += 1

    def stream(self, progress) -> None:
        """Every batch through the stages; a damaged capture, an interrupt or an output fault ends the stream and
        is recorded (the tables before it are kept, marked partial)."""
        info, flows, gro_stage = self.info, self.flows, self.gro_stage
        batches = iter(self.reader)
        try:
            for rb in batches:
                pb, fr = decode(rb)
                fid = flows.assign(pb)
                fr = _count_unknown_linktypes(fr, info)
                self.stats.add(pb, fr)
                if len(fr):
                    self.sink_findings.write_columns(_finding_columns(fr))
                if self.sink_packets is not None:
                    self.sink_packets.write(P.packets_table(pb, fid))
                if self.sink_merge is not None:
                    self.sink_merge.write(P.merge_rows_table(pb, fid))
                self.emit_superpackets(gro_stage.feed(rb, pb, fid))
                self.whatif.add(pb, fid, gro_stage.last_receivers)
                if len(pb):  # ended flows leave memory (those with GRO rows still to come wait)
                    self.emit_flows(flows.expire(int(pb.ts_ns.max()), gro_stage.held_flow_ids(),
                                                 hold_from_frame=gro_stage.pending_from_frame()))
                    gro_stage.recycle(flows.in_memory)  # and the GRO engine forgets their keys
                self.audits.feed(rb, pb, fid)
                if progress is not None:
                    progress(self.reader.src.bytes_read, info.size)
        except CaptureError as e:
            self.error = e
            self.partial_row(F.CAPTURE_PARTIAL, e.frame or 0, e.one_line())
        except (KeyboardInterrupt, Interrupted) as e:
            self.stop = e
            signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
            self.error = Interrupted(signum, f"the tables hold frames 1-{info.last_frame}")
            self.partial_row(F.INTERRUPTED, info.last_frame + 1,
                             F.message(F.INTERRUPTED, signal.Signals(signum).name))
        except OutputError as e:  # the table that failed is gone; the others are finished, marked partial
            self.stop = self.error = e
            self.partial_row(F.OUTPUT_FAILED, info.last_frame + 1, F.message(F.OUTPUT_FAILED, e.one_line()))
        finally:
            batches.close()

    def finish(self) -> None:
        """The rows the stages still hold, the capture's notes, and the filter-audit table."""
        self.emit_superpackets(self.gro_stage.finish())
        # the stream's state is done with: freed before the last flow rows, the audit table, the summary and
        # the what-if runs, which would otherwise stack their memory on top of it
        self.gro_stage.release()
        self.emit_flows(self.flows.expire(0, everything=True))
        self.flows.release()
        if not self.sink_findings.failed:
            _suspect_filtered_capture(self.flow_sum, self.stats, self.sink_findings)
            _capture_drops(self.info, self.stats, self.sink_findings)
            notes = self.info.notes.rows()
            if notes["frame"]:
                self.sink_findings.write_columns(notes)
                self.stats.findings.update(notes["code"])
        # a part of a split run reports every expression's counts (the merge adds them up, then leaves out the
        # default audit's clean ones as this does)
        self.audit_results = self.audits.finish(report_all=self.part)

    def abort(self) -> None:
        for sink in self.sinks.values():
            sink.abort()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def close(self, wireshark_sidecar: bool) -> Analysis:
        """Close the tables (renamed into place with their metadata), write the summary, return the Analysis."""
        # the configuration used: the fallback MTU read off the capture where it was not given
        info, out, error, cfg = self.info, self.out, self.error, self.gro_stage.config
        gro_meta = dict(cfg.to_metadata(), fallback_mtu_from=self.gro_stage.mtu_from or "default")
        params = {"gro": gro_meta, "gro_engine": self.gro_engine, "packets": self.packets,
                  "filters": [r.expr for r in self.audit_results], "default_filters": self.filters is None,
                  "flows": self.flow_params}
        meta = {
            "tool_version": __version__, "source_name": os.path.basename(info.name), "source_size": info.size,
            "source_sha256": info.sha256, "format": info.format, "compression": info.compression,
            "linktypes": sorted(info.linktypes), "snaplen": sorted(info.snaplens), "packet_count": info.packets,
            "first_ts_ns": info.first_ts_ns, "params": params, "partial": error is not None,
            "error": error.one_line() if error else None,
        }
        out_err = _close_sinks(self.sinks, meta, out if self.tmp is None else None)
        if self.stop is not None or out_err is not None:
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
            _raise_stop(self.stop, error, out_err, self.sinks, out)
        summary = self.stats.summary(info, self.flow_sum, error, gro_meta, self.gro_stage.labels,
                                     self.gro_stage.late_segments, self.gro_stage.lost_segments)
        summary["filter_audit"] = self.audits.summary(self.audit_results)
        summary["kernels"] = _native.MODE  # "aot", or "jit (why)": a slower start-up has its reason here
        if self.part:  # the merge makes these of the whole capture from every part's tally
            np.savez(out / "diagnosis_state.npz", payload_packets=np.int64(self.stats.payload_packets),
                     **self.tally.state())
            summary["capture_kind"] = summary["diagnosis"] = None
        else:
            summary["capture_kind"] = D.infer_capture(self.tally, cfg, self.stats.payload_packets,
                                                      self.flow_sum.columns())
            summary["diagnosis"] = D.diagnose(self.tally, self.flow_sum.columns(), cfg, self.whatif,
                                              self.gro_engine)
        self.whatif.batches.clear()
        write_summary(out / "summary.json", summary)
        result = Analysis(outdir=out, info=info, params=params, summary=summary, error=error)
        if self.tmp is not None:
            result._tmp = weakref.finalize(result, shutil.rmtree, self.tmp, ignore_errors=True)
        if wireshark_sidecar:
            from .wireshark.build import write_analysis_sidecar

            stem = os.path.basename(info.name) if info.name not in ("<stdin>", "<stream>") else "stdin"
            result.sidecar = write_analysis_sidecar(out / f"{stem}.bigtcp.tsv", analysis=result)
        return result


def _close_sinks(sinks: dict[str, P.TableSink], meta: dict, outdir: Path | None) -> OutputError | None:
    """Close every table still writable (each renamed into place when complete); the first OutputError.

    In a directory of the user's (``outdir``), a table this run did not finish is removed: a table must not
    survive from an earlier run beside this run's tables.
    """
    first = None
    for sink in sinks.values():  # the row groups first: a table that fails here makes the others partial
        if not sink.failed:
            try:
                sink.finish()
            except OutputError as e:
                first = first or e
    if first is not None and not meta["partial"]:
        meta = {**meta, "partial": True, "error": first.one_line()}
        findings = sinks.get("findings")
        if findings is not None and not findings.failed:
            code = F.BY_ID[F.OUTPUT_FAILED]
            findings.write_columns({"frame": [0], "code": [code.code], "severity": [code.severity],
                                    "message": [code.template.format(value=first.one_line())]})
    for sink in sinks.values():
        if sink.failed:
            continue
        try:
            sink.close(meta)
        except OutputError as e:
            first = first or e
    if outdir is not None and any(sink.done for sink in sinks.values()):
        for table in TABLES:
            if table not in sinks or not sinks[table].done:
                with contextlib.suppress(OSError):
                    (outdir / f"{table}.parquet").unlink(missing_ok=True)
        for fname in OUTPUT_FILES:  # the summary and report of an earlier run (this run writes its own next)
            with contextlib.suppress(OSError):
                (outdir / fname).unlink(missing_ok=True)
    return first


def _raise_stop(stop: BaseException | None, error: BigtcpError | None, out_err: OutputError | None,
                sinks: dict[str, P.TableSink], out: Path) -> None:
    """Raise what ended the run early, once the tables are closed: the interrupt, or the output fault with the
    tables it left (in its one line)."""
    if isinstance(stop, KeyboardInterrupt):
        raise stop
    if isinstance(stop, Interrupted):
        raise error
    fault = stop or out_err
    kept = [name for name, sink in sinks.items() if sink.done]
    if kept and isinstance(fault, OutputError):
        raise OutputError(fault.path, f"{fault.message} ({', '.join(kept)} written to {out}/, marked partial)")
    raise fault


def _count_unknown_linktypes(fr: FindingRows, info: CaptureInfo) -> FindingRows:
    """The decoder's frame.unknown_linktype rows become one counted note per link type (capture/notes.py)."""
    unknown = fr.code == F.UNKNOWN_LINKTYPE
    if not unknown.any():
        return fr
    info.notes.count_by_value(F.UNKNOWN_LINKTYPE, fr.value[unknown], fr.frame[unknown])
    keep = ~unknown
    return FindingRows(fr.frame[keep], fr.code[keep], fr.value[keep])


def _finding_columns(fr: FindingRows) -> dict[str, list]:
    codes = [F.BY_ID[c] for c in fr.code.tolist()]
    return {"frame": fr.frame, "code": [c.code for c in codes], "severity": [c.severity for c in codes],
            "message": [c.template.format(value=v) for c, v in zip(codes, fr.value.tolist())]}


_TOP_KEYS = ("flow_id", "src", "dst", "sport", "dport", "if_id", "ifindex", "direction",
             "packets", "payload_bytes", "bigtcp_packets", "mss",
             "p50_payload_len", "max_payload_len", "superpackets", "p50_superpacket_len", "max_superpacket_len",
             "retransmissions", "out_of_order", "capture_gap_bytes", "poll_ends_evidenced", "poll_ends_guessed")
_KEEP_TOP = max(5, D.TOP_FLOWS)  # the summary's top flows and the diagnosis's


class _FlowSummary:
    """What the summary needs of the flows table, gathered as its rows are streamed (bounded size)."""

    def __init__(self) -> None:
        self.count = 0
        self.v6_gap_bytes = 0  # capture gaps of IPv6 flows without BIG TCP packets
        self.top: list[dict] = []  # the flows with the most payload (ties: lower flow_id), with ip_version
        self.points: Counter = Counter()  # flow rows per capture point (pcapng interface, cooked v2 ifindex)

    def add(self, cols: dict) -> None:
        n = len(cols["flow_id"])
        self.count += n
        self.points.update(flows_per_point(cols["if_id"], cols[IFINDEX]))
        v6 = (cols["ip_version"] == 6) & (cols["bigtcp_packets"] == 0)
        self.v6_gap_bytes += int(cols["capture_gap_bytes"][v6].sum(dtype=np.uint64))
        best = np.lexsort((cols["flow_id"], -cols["payload_bytes"].astype(np.int64)))[:_KEEP_TOP].tolist()

        def value(k: str, i: int):
            c = cols[k]
            return c[i].as_py() if hasattr(c, "to_pylist") else c[i].item()

        self.top = sorted(self.top + [{k: value(k, i) for k in (*_TOP_KEYS, "ip_version")} for i in best],
                          key=lambda r: (-r["payload_bytes"], r["flow_id"]))[:_KEEP_TOP]

    def columns(self) -> dict[str, list]:
        """The kept top flows as columns (what ``diagnose`` reads)."""
        return {k: [r[k] for r in self.top] for k in (*_TOP_KEYS, "ip_version")}


def _capture_finding(sink, stats: _Stats, code_id: int, message: str) -> None:
    """One capture-level finding row (frame 0), counted for the summary."""
    code = F.BY_ID[code_id]
    sink.write_columns({"frame": [0], "code": [code.code], "severity": [code.severity], "message": [message]})
    stats.findings[code.code] += 1


def _capture_drops(info: CaptureInfo, stats: _Stats, sink) -> None:
    """One capture-level finding per interface whose statistics block counts dropped packets."""
    for if_gid, n in sorted(info.dropped.items()):
        if n:
            _capture_finding(sink, stats, F.CAPTURE_DROPPED, f"{F.message(F.CAPTURE_DROPPED, n)} (interface {if_gid})")


def _suspect_filtered_capture(flow_sum: _FlowSummary, stats: _Stats, sink) -> None:
    """IPv6 TCP flows with sequence gaps and no HBH packets: likely a 'tcp port N' capture of BIG TCP."""
    gaps = flow_sum.v6_gap_bytes
    if gaps > 0 and stats.bigtcp[BIGTCP_NAMES.index("hbh_jumbo")] == 0:
        text = F.message(F.TCP_PORT_FILTER_SUSPECTED, gaps)
        _capture_finding(sink, stats, F.TCP_PORT_FILTER_SUSPECTED, text)
        stats.suspect.append(text)


class _Stats:
    """Capture-wide counters for the summary (bounded size)."""

    def __init__(self) -> None:
        self.packets = 0
        self.payload_packets = 0  # TCP packets with payload
        self.bytes = 0
        self.bigtcp = np.zeros(len(BIGTCP_NAMES), np.int64)
        self.max_bigtcp_len = 0
        self.findings: Counter[str] = Counter()
        self.truncated = 0
        self.fallback = 0
        self.sp_reasons: Counter[str] = Counter()
        self.poll_ends = np.zeros(len(POLL_END_NAMES), np.int64)
        self.receiver_rows: Counter[int] = Counter()
        self.sp_rows = 0
        self.suspect: list[str] = []
        self.status = np.zeros(16, np.int64)  # frames per decoder status bit (schema.ST_*)
        self.tcp_options_cut = 0  # truncated_l4 frames whose TCP fixed header is there (only options were cut)

    def add(self, pb: PacketBatch, fr: FindingRows) -> None:
        self.packets += len(pb)
        self.payload_packets += int(np.count_nonzero((pb.l4_proto == 6) & (pb.tcp_payload_len > 0)))
        self.bytes += int(pb.wirelen.sum(dtype=np.int64))
        self.bigtcp += np.bincount(pb.bigtcp, minlength=len(BIGTCP_NAMES))[:len(BIGTCP_NAMES)]
        big = pb.bigtcp != 0
        if big.any():
            self.max_bigtcp_len = max(self.max_bigtcp_len, int(pb.ip_len[big].max()))
        for c, k in zip(*np.unique(fr.code, return_counts=True)):
            self.findings[F.BY_ID[int(c)].code] += int(k)
        if pb.status.any():
            bits = (pb.status[:, None] >> np.arange(16, dtype=np.uint16)) & 1
            self.status += bits.sum(axis=0).astype(np.int64)
            self.tcp_options_cut += int(np.count_nonzero(((pb.status & ST_TRUNC_L4) != 0) & (pb.l4_proto == 6)
                                                         & (pb.tcp_hdr_len >= 20)))

    def add_superpackets(self, spb) -> None:
        self.sp_rows += len(spb)
        names = spb.reason_names
        for c, k in enumerate(np.bincount(spb.flush_reason).tolist()):  # (counts, not a sort: codes are small)
            if k:
                self.sp_reasons[names[c]] += k
        self.poll_ends += np.bincount(spb.poll_end, minlength=len(POLL_END_NAMES))[:len(POLL_END_NAMES)]
        for r, k in enumerate(np.bincount(spb.receiver).tolist()):  # (receiver indices: 0 .. receivers - 1)
            if k:
                self.receiver_rows[r] += k

    def summary(self, info: CaptureInfo, flow_sum: _FlowSummary, error: BigtcpError | None, gro: dict,
                receivers: list[str], late_segments: int = 0, lost_segments: int = 0) -> dict:
        """The run's summary; ``gro``: the GRO configuration used, as the tables' metadata records it."""
        dur = ((info.max_ts_ns or 0) - (info.min_ts_ns or 0)) / 1e9  # the span, as capinfos' duration
        return {
            "capture": {"name": info.name, "format": info.format, "compression": info.compression,
                        "size": info.size, "packets": info.packets, "bytes_on_wire": self.bytes,
                        "duration_s": round(dur, 6), "start_ns": info.min_ts_ns, "end_ns": info.max_ts_ns,
                        "linktypes": sorted(info.linktypes),
                        "snaplen": sorted(info.snaplens), "partial": error is not None,
                        "error": error.one_line() if error else None,
                        "linktypes_not_decoded": info.notes.by_value(F.UNKNOWN_LINKTYPE)},
            "bigtcp": {name: int(self.bigtcp[i]) for i, name in enumerate(BIGTCP_NAMES) if name != "none"},
            "max_bigtcp_ip_len": self.max_bigtcp_len,
            "flows": flow_sum.count,
            "capture_points": capture_points(flow_sum.points),
            "top_flows": [{k: r[k] for k in _TOP_KEYS} for r in flow_sum.top[:5]],
            "superpackets": {"count": self.sp_rows, "flush_reasons": dict(self.sp_reasons.most_common()),
                             "poll_ends": {n: int(self.poll_ends[i]) for i, n in enumerate(POLL_END_NAMES) if i},
                             "receivers": {receivers[r]: k for r, k in self.receiver_rows.most_common()},
                             "late_segments": late_segments, "lost_segments": lost_segments},
            "findings": dict(self.findings.most_common()),
            "not_fully_decoded": {name: int(self.status[bit]) for bit, name in enumerate(STATUS_NAMES)
                                  if name and self.status[bit]},
            "tcp_options_cut": self.tcp_options_cut,
            "suspect": self.suspect,
            "gro": gro,
        }
