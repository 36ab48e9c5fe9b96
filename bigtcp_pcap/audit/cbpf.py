"""The cBPF (pcap filter) audit: which packets does a capture filter get wrong because of BIG TCP?

Method (ecosystem.md section 1, "Audit method"): libpcap compiles the user's expression once per linktype and
runs it twice per packet, on the raw frame and on its normalized copy (normalize.py: extension headers removed,
zero length fields restored). The normalized verdict is the truth; a packet is ``missed`` when the truth says
yes and the raw verdict no, a ``false_match`` the other way round. Because the truth comes from the same
compiled program, this works for any expression without re-implementing the filter language.

One gap normalization cannot close: libpcap's ``tcp[...]``/``udp[...]`` indexing only ever matches IPv4
(pcap-filter(7): "only apply to IPv4"), with or without BIG TCP. For such expressions the truth is the
expression with an IPv6 branch added (suggest.rewrite mode 'truth'), run on the normalized copy, and those
differences carry their own reason (``tcp_index_ipv4_only``), because they are not a BIG TCP problem.

An expression that tests a header field the normalization rewrites (``ip[2:2] = 0``, ``ip6[6] = 0``, ``ip6
proto 51``; normalize.raw_header_reads) asks about the frame as captured, so its truth is the raw verdict: it is
reported as "tests the raw header; judged on the raw frame", with the normalized copy's verdict side by side
(``AuditResult.normalized``) and, when the two differ, a suggestion for the normalized meaning.

Frames whose verdict cannot be known are counted apart as ``not_audited`` (never as correctly classified): a
frame that needs normalizing but cannot be normalized (an IP fragment, a header cut by the snaplen, a tunnel
with an outer extension header), a frame of a link type the decoder does not read, and the frames of a link
type libpcap rejects the expression for (``expression rejects all packets`` for ``ip6`` on raw IPv4); the last
is an error only when the expression compiles for no link type of the capture, as ``tcpdump -r`` would fail.

A suggested expression (suggest.py) is then run on every raw packet; it is reported as verified only when it
gives the truth verdict on every one of them.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from ..decode.schema import (
    ST_UNKNOWN_LINKTYPE,
    TUNNEL_NONE,
    PacketBatch,
    RowsView,
)
from . import judge as J
from . import linktypes as LT
from . import normalize as nz
from .impact import FlowGroups, FlowTally, flow_groups
from .judge import (  # noqa: F401 (the verdict and reason codes, re-exported)
    FALSE_MATCH,
    MISSED,
    NOT_AUDITED,
    OK,
    R_EXT_HEADER,
    R_FRAGMENT,
    R_LINKTYPE,
    R_NONE,
    R_NOT_IP,
    R_REJECTED,
    R_TRUNCATED,
    R_TUNNEL,
    REASON_NAMES,
    VERDICT_NAMES,
)
from .libpcap import DEFAULT_SNAPLEN, CompiledFilter, FilterError, FilterGroup, FilterSet
from .libpcap import load as load_libpcap
from .suggest import has_l4_index, rewrite

_SKIP_REASON = np.array([R_NONE, R_NOT_IP, R_TUNNEL, R_FRAGMENT, R_TRUNCATED], np.uint8)  # by why_not_batch code


@dataclass
class FlowImpact:
    """One directional 5-tuple with mis-classified packets, and what they carry (true lengths)."""

    src: str
    sport: int
    dst: str
    dport: int
    proto: str
    packets: int
    missed: int
    false_matches: int
    wire_bytes: int  # sum of the frames' original lengths
    payload_bytes: int  # sum of the true L4 payload (TCP payload from the IP length, never caplen)

    def to_json(self) -> dict:
        return dict(self.__dict__)


CUT_NOTE = ("records longer than the file's snaplen are cut to {snap} bytes by libpcap (tcpdump -r) before a "
            "filter runs: they are judged as cut (frames_cut), against the whole frame's truth; where the cut "
            "changes the verdict the reason is cut_by_file_snaplen, which no rewrite of the filter fixes. A header "
            "snaplen of 0 keeps them whole: printf '\\0\\0\\0\\0' | dd of=FILE bs=1 seek=16 conv=notrunc")
SKIPPED_NOTE = ("{n} frames that no BIG TCP encoding or extension header can affect were not run through the "
                "filter: matched/truth count only the others, and the suggestion was verified on those; "
                "'bigtcp-pcap audit-filter' checks every frame")


def reportable(result: dict) -> bool:
    """Whether the default audit reports an expression's result (its summary form; ``AuditResult.clean`` and
    ``complete``): only when it found a missed or falsely matched frame, or frames it could not audit."""
    return bool(result["missed"] or result["false_matches"] or result["not_audited_frames"])


@dataclass
class AuditResult:
    """Verdict counts, reasons, affected flows and per-frame arrays for one expression on one capture."""

    expr: str
    linktypes: list[int]
    frames_total: int
    matched: int  # the raw filter's matches (what tcpdump would keep)
    truth: int  # audited packets that should match
    missed: int
    false_matches: int
    not_audited_frames: int = 0  # frames whose verdict cannot be known (reasons in ``not_audited``)
    judged_on: str = "normalized"  # "raw": the expression tests the raw header (``raw_header``)
    raw_header: list[str] = field(default_factory=list)
    normalized: dict | None = None  # judged_on "raw": the normalized copy's truth and the raw verdict's misses
    rejected: dict[int, str] = field(default_factory=dict)  # linktype -> libpcap's message
    reasons: dict[str, int] = field(default_factory=dict)
    flows: list[FlowImpact] = field(default_factory=list)
    frame: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))  # uint64, the misclassified frames (verdict != ok); totals are the counts above
    verdict: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))  # uint8, VERDICT_NAMES codes
    reason: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))  # uint8, REASON_NAMES (0 for ok)
    raw_match: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    truth_match: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    suggestion: str | None = None
    suggestion_verified: bool | None = None
    suggestion_kernel_ok: bool | None = None  # False: needs userland filtering on Linux (backward jumps)
    suggestion_mismatches: int | None = None  # frames where the candidate disagreed with the truth
    suggestions_by_linktype: dict[int, str] = field(default_factory=dict)
    alternative: str | None = None  # protochain form, verified, userland-only
    not_audited: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # the capture could not be read to its end; counts cover the frames before
    frames_skipped: int = 0  # candidates_only: frames not run through the filter (their verdict is ok by construction)
    frames_cut: int = 0  # audited records longer than libpcap's snapshot of the file, judged as libpcap cuts them
    frames_cut_changed: int = 0  # of those, the ones the cut judges unlike the whole frame
    spill: _Spill | None = field(default=None, repr=False)  # the rows before ``frame``..``truth_match``, when spilled

    def chunks(self) -> Iterable[tuple[np.ndarray, ...]]:
        """The per-frame rows in frame order as (frame, verdict, reason, raw_match, truth_match) chunks: those
        the audit spilled to disk (``FilterAudit(spill=True)``), then the ones in memory."""
        if self.spill is not None:
            yield from self.spill.chunks()
        yield self.frame, self.verdict, self.reason, self.raw_match, self.truth_match

    def _all(self) -> tuple[np.ndarray, ...]:
        parts = list(self.chunks())
        return tuple(np.concatenate([p[j] for p in parts]) for j in range(5)) if len(parts) > 1 else parts[0]

    @property
    def clean(self) -> bool:
        """No audited frame is missed or falsely matched."""
        return self.missed == 0 and self.false_matches == 0

    @property
    def complete(self) -> bool:
        """Every frame was audited (nothing counted apart as not audited)."""
        return self.not_audited_frames == 0

    def misclassified_frames(self) -> list[dict]:
        frame, verdict, reason, _, _ = self._all()
        idx = np.flatnonzero(verdict != OK)
        return [{"frame": int(frame[i]), "verdict": VERDICT_NAMES[verdict[i]],
                 "reason": REASON_NAMES[reason[i]]} for i in idx]

    def to_json(self, frames: bool = True) -> dict:
        """One JSON-able document; ``frames`` lists only the mis-classified frames (all are in frames_table).

        ``frames=False`` leaves out ``frames`` and ``flows`` (the summary's form: a BIG TCP capture can have
        hundreds of thousands of mis-classified frames)."""
        doc = {
            "expr": self.expr,
            "linktypes": self.linktypes,
            "frames_total": self.frames_total,
            "matched": self.matched,
            "truth": self.truth,
            "missed": self.missed,
            "false_matches": self.false_matches,
            "not_audited_frames": self.not_audited_frames,
            "judged_on": self.judged_on,
            "raw_header": self.raw_header,
            "normalized": self.normalized,
            "rejected": {str(k): v for k, v in self.rejected.items()},
            "reasons": self.reasons,
            "suggestion": self.suggestion,
            "suggestion_verified": self.suggestion_verified,
            "suggestion_kernel_ok": self.suggestion_kernel_ok,
            "suggestions_by_linktype": ({str(k): v for k, v in self.suggestions_by_linktype.items()}
                                        if len(set(self.suggestions_by_linktype.values())) > 1 else {}),
            "alternative": self.alternative,
            "flows": [f.to_json() for f in self.flows] if frames else None,
            "frames": self.misclassified_frames() if frames else None,
            "not_audited": self.not_audited,
            "notes": self.notes,
            "frames_skipped": self.frames_skipped,
            "frames_cut": self.frames_cut,
            "frames_cut_changed": self.frames_cut_changed,
            "error": self.error,
        }
        if not frames:
            del doc["flows"], doc["frames"]
        return doc

    def frames_table(self):
        """Rows for ``filter_audit.parquet``: frame, verdict, reason, matched, truth of every frame whose verdict
        is not ok (missed, false_match, not_audited); the ok frames are only counted."""
        import pyarrow as pa

        from ..output import arrow as A

        frame, verdict, reason, raw, truth = self._all()
        return pa.table({"frame": A.array(frame, pa.uint64()), **verdict_columns(verdict, reason),
                         "matched": A.array(raw, pa.bool_()), "truth": A.array(truth, pa.bool_())},
                        metadata={b"bigtcp_pcap.filter": self.expr.encode()})


def verdict_columns(verdict: np.ndarray, reason: np.ndarray) -> dict:
    """The ``verdict`` and ``reason`` dictionary columns of per-frame audit rows (reason null for none), as
    frames_table and filter_audit.parquet write them."""
    from ..output import arrow as A

    return {"verdict": A.dictionary(verdict, VERDICT_NAMES),
            "reason": A.dictionary(reason, REASON_NAMES, mask=reason == R_NONE)}


class _Spill:
    """Per-frame audit rows written to an unnamed temporary file (Arrow IPC stream) and read back in chunks."""

    COLUMNS = ("frame", "verdict", "reason", "raw", "truth")

    def __init__(self, directory: str | os.PathLike | None) -> None:
        import tempfile

        import pyarrow as pa

        # (the flags as uint8: numeric columns come back as numpy views without pandas, which bool would import)
        self.schema = pa.schema([("frame", pa.uint64()), ("verdict", pa.uint8()), ("reason", pa.uint8()),
                                 ("raw", pa.uint8()), ("truth", pa.uint8())])
        # unnamed, gone when closed or when the process ends; it lives as long as the audit result
        self.file = tempfile.TemporaryFile(dir=directory, prefix=".bigtcp-audit-")  # noqa: SIM115
        self._writer = pa.ipc.new_stream(self.file, self.schema)
        self.rows = 0

    def write(self, cols: tuple[np.ndarray, ...]) -> None:
        import pyarrow as pa

        from ..output import arrow as A  # (pa.record_batch on numpy arrays imports pandas: ~50 MiB)

        self._writer.write_batch(pa.record_batch([A.array(np.asarray(c).view(f.type.to_pandas_dtype()), f.type)
                                                  for c, f in zip(cols, self.schema, strict=True)], schema=self.schema))
        self.rows += len(cols[0])

    def close(self) -> None:
        """Drop the rows: the stream, then the file (gone with it)."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        self.file.close()

    def chunks(self) -> Iterable[tuple[np.ndarray, ...]]:
        import pyarrow as pa

        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.file.seek(0)
        for b in pa.ipc.open_stream(self.file):  # numpy views of the columns' data buffers (no nulls here);
            # Array.to_numpy would import pandas
            frame, verdict, reason, raw, truth = (
                np.frombuffer(c.buffers()[1], f.type.to_pandas_dtype(), count=len(c), offset=c.offset * f.type.bit_width // 8)
                for c, f in zip(b.columns, self.schema, strict=True))
            yield frame, verdict, reason, raw.view(bool), truth.view(bool)


class _Candidate:
    """One rewritten expression, compiled per linktype, checked against the truth frame by frame."""

    def __init__(self, mode: str, expr: str, snaplen: int):
        self.mode, self.expr, self.snaplen = mode, expr, snaplen
        self.by_linktype: dict[int, tuple[str, CompiledFilter | None]] = {}
        self.mismatches = 0
        self.changed = False
        self.kernel_ok = True
        self.errors: list[str] = []
        self.unsupported: list[str] = []

    def program(self, key: int) -> CompiledFilter | None:
        """The rewritten expression compiled for compile key ``key`` (None when libpcap rejects it)."""
        if key not in self.by_linktype:
            linktype, swapped = LT.split_key(key)
            rw = rewrite(self.expr, self.mode, LT.header_len(linktype))
            self.changed |= rw.changed
            self.unsupported += [u for u in rw.unsupported if u not in self.unsupported]
            try:
                cf = CompiledFilter(rw.text, linktype, self.snaplen, swapped)
                self.kernel_ok &= cf.kernel_compatible
            except FilterError as e:
                cf = None
                self.errors.append(f"{rw.text}: {e.for_linktype()}")
            self.by_linktype[key] = (rw.text, cf)
        return self.by_linktype[key][1]

    @property
    def texts(self) -> dict[int, str]:
        """The candidate's text per link type."""
        return {LT.split_key(k)[0]: t for k, (t, _) in self.by_linktype.items()}

    @property
    def ok(self) -> bool:
        return self.changed and not self.errors and self.mismatches == 0


class _Rows:
    """The two RecordBatch columns the audit reads, for a subset of rows."""

    def __init__(self, buf: np.ndarray, off: np.ndarray):
        self.buf = buf
        self.off = off


@dataclass
class PreparedBatch:
    """The frames of one batch an audit runs, with their normalized copies (see ``prepare_batch``)."""

    pb: PacketBatch
    buf: np.ndarray
    off: np.ndarray
    cap: np.ndarray
    wire: np.ndarray
    lts: np.ndarray
    linktypes: list[int]
    keys: np.ndarray  # linktypes.compile_key per row: the program that runs the row
    key_list: list[int]
    na_reason: np.ndarray  # uint8 per row: R_* why the row's verdict cannot be known, R_NONE when audited
    norm_idx: np.ndarray  # rows of pb that have a normalized copy
    nbuf: np.ndarray
    n_off: np.ndarray
    n_cap: np.ndarray
    n_wire: np.ndarray
    skipped: int  # frames left out by candidates_only
    not_audited: Counter[str]
    cut: np.ndarray  # rows libpcap cuts to ``snap`` bytes when it reads the file (``libpcap_snapshot``)
    snap: int
    _groups: FlowGroups | None = None

    def flow_groups(self) -> FlowGroups:
        """The rows' flows, computed once for all the audits sharing this batch."""
        if self._groups is None:
            self._groups = flow_groups(self.pb)
        return self._groups


def prepare_batch(rb, pb: PacketBatch, candidates_only: bool, l4_index: bool) -> PreparedBatch:
    """Select the frames to audit and normalize them once; the result is the same for every expression of a
    kind (``candidates_only``, ``l4_index``), so the default audit's filters share it."""
    skipped = 0
    snap = int(getattr(rb, "libpcap_snap", 0))
    if candidates_only and len(pb):
        v6 = pb.ip_version == 6
        need = (v6 & ((pb.ext_len > 0) | (pb.ip_len_field == 0))) | ((pb.ip_version == 4) & (pb.ip_len_field == 0))
        need |= (pb.tunnel != TUNNEL_NONE) | ((pb.status & ST_UNKNOWN_LINKTYPE) != 0)
        if l4_index:
            need |= v6
        if snap:
            need |= pb.caplen > snap  # what libpcap reads of it is not the frame
        idx = np.flatnonzero(need)
        skipped = len(pb) - idx.size
        if idx.size < len(pb):
            rb = _Rows(rb.buf, np.asarray(rb.off)[idx])
            pb = RowsView(pb, idx)  # the audit reads a few columns of these rows
    n = len(pb)
    buf = np.ascontiguousarray(rb.buf, dtype=np.uint8)
    off = np.asarray(rb.off, dtype=np.int64)[:n]
    cap, wire, lts = pb.caplen.astype(np.int64), pb.wirelen.astype(np.int64), pb.linktype.astype(np.int64)
    keys = LT.compile_keys(lts, buf, off, cap)
    # normalized copies of the frames whose encoding differs from a plain packet; tunnel frames are candidates
    # for their outer length fields too
    v6 = pb.ip_version == 6
    v4 = pb.ip_version == 4
    tunnel = pb.tunnel != TUNNEL_NONE
    cand = np.flatnonzero((v6 & ((pb.ext_len > 0) | (pb.ip_len_field == 0))) | (v4 & (pb.ip_len_field == 0))
                          | tunnel)
    ov, ou = nz.outer_udp_batch(pb, buf, off, cap, cand)
    why = nz.why_not_batch(pb, cand, cap, ov)
    t = np.flatnonzero(why == 2)  # a tunnel the copy cannot rewrite (GRE, ERSPAN, IPIP): judged as it is when
    if t.size:  # neither its outer header nor its inner packet needs normalizing
        fine = nz.plain_outer_batch(pb, buf, off, cap, cand[t]) & ~nz.needs_normalizing_batch(pb, cand[t])
        why[t[fine]] = 0
    na_reason = np.zeros(n, np.uint8)
    na_reason[cand] = _SKIP_REASON[why]
    na_reason[(pb.status & ST_UNKNOWN_LINKTYPE) != 0] = R_LINKTYPE
    ok = why == 0
    todo = cand[ok][nz.needs_normalizing_batch(pb, cand[ok], buf, off, ov[ok], ou[ok])]
    norm_idx, nbuf, n_off, n_cap, n_wire = nz.normalize_rows(pb, buf, off, cap, wire, todo)
    not_audited: Counter[str] = Counter()
    if n:
        for code, count in enumerate(np.bincount(na_reason, minlength=len(REASON_NAMES)).tolist()):
            if code and count:
                not_audited[REASON_NAMES[code]] += count
    linktypes = np.flatnonzero(np.bincount(lts)).tolist() if n else []  # (np.unique would import numpy.ma)
    key_list = np.flatnonzero(np.bincount(keys)).tolist() if n else []
    cut = np.flatnonzero(cap > snap) if snap else np.zeros(0, np.int64)
    return PreparedBatch(pb, buf, off, cap, wire, lts, linktypes, keys, key_list, na_reason, norm_idx, nbuf, n_off,
                         n_cap, n_wire, skipped, not_audited, cut, snap)


class FilterAudit:
    """Streaming audit: ``feed(record_batch, packet_batch)`` for each batch, then ``result()``.

    ``record_batch`` needs ``buf`` (uint8) and ``off`` (int64) columns (packet i is
    ``buf[off[i]:off[i]+caplen[i]]``); ``packet_batch`` is the decoder's PacketBatch for the same frames.
    Raises LibpcapMissing at construction when the library is absent, and FilterError (libpcap's message) when
    the expression does not compile for a linktype met.
    """

    SPILL_ROWS = 1 << 18  # with ``spill_dir``: per-frame rows kept in memory before they go to the spill file

    def __init__(self, expr: str, snaplen: int = DEFAULT_SNAPLEN, suggest: bool = True,
                 candidates_only: bool = False, spill: bool = False, spill_dir: str | os.PathLike | None = None,
                 flows: bool = True, emit: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None):
        """``spill``: keep at most ``SPILL_ROWS`` per-frame rows in memory and write the others to an unnamed
        temporary file in ``spill_dir`` (None: the system's temporary directory; ``AuditResult.chunks`` reads
        them back), so memory does not grow with the capture (``analyze`` hands its rows on instead: ``emit``).
        ``flows``: tally the affected flows (``AuditResult.flows``, which ``audit-filter`` prints); ``analyze``
        reports none, and the tally is one entry per affected flow for the whole run. ``emit``: hand each batch's
        per-frame rows (frame, verdict, reason; the frames whose verdict is not ok) to ``emit`` instead of keeping
        them (``analyze`` writes them to filter_audit.parquet as it goes: ``AuditResult`` then has none)."""
        load_libpcap()
        self._emit = emit
        self.expr = expr
        self._spill_on, self._spill_dir = spill, spill_dir
        self._spill: _Spill | None = None
        self._kept = 0  # per-frame rows in memory
        # candidates_only: run libpcap only on the frames a BIG TCP encoding or an extension header can affect
        # (and on IPv6 frames for tcp[]/udp[] indexing); every other frame gives the same verdict on its raw and
        # normalized form, so misses and false matches are complete while matched/truth cover those frames only
        self.candidates_only = candidates_only
        self.snaplen = snaplen
        self.filters = FilterSet(expr, snaplen)
        self.l4_index = has_l4_index(expr)
        # an expression testing a field the normalization rewrites is judged on the raw frame
        self.raw_header = nz.raw_header_reads(expr)
        self.truth_filters: dict[int, CompiledFilter] = {}
        self.rejected: dict[int, FilterError] = {}  # linktype -> libpcap's rejection
        self._rejected_frames: Counter[int] = Counter()  # linktype -> its frames left unaudited by that
        self._compiled_any = False
        # the HBH form (what Linux BIG TCP writes), the protochain form, and the form for one extension header of
        # any kind (tried when the HBH form does not verify)
        self.candidates = [_Candidate("suggest", expr, snaplen), _Candidate("protochain", expr, snaplen),
                           _Candidate("ext", expr, snaplen)] if suggest else []
        self.notes: list[str] = []
        # per-frame arrays are kept only for misclassified frames, so memory stays bounded on long captures;
        # the totals of the others are counters
        self._n_frames = 0
        self._n_skipped = 0  # frames not run through the filter (candidates_only)
        self._n_raw = 0
        self._n_truth = 0
        self._frames: list[np.ndarray] = []
        self._verdict: list[np.ndarray] = []
        self._reason: list[np.ndarray] = []
        self._raw: list[np.ndarray] = []
        self._truth: list[np.ndarray] = []
        self._n_missed = 0
        self._n_false = 0
        self._n_cut = 0  # audited records libpcap cuts to its snapshot (``_snap`` bytes) when it reads the file
        self._n_cut_changed = 0  # of those, the ones whose verdict the cut changes
        self._snap = 0
        self._reason_counts = np.zeros(len(REASON_NAMES), np.int64)  # of the missed and falsely matched frames
        self._n_alt_truth = 0  # raw-header expressions: the normalized copy's verdicts, side by side
        self._n_alt_missed = 0
        self._n_alt_false = 0
        self._n_not_audited = 0
        self._tally = FlowTally(("missed", "false_matches")) if flows else None
        self._not_audited: Counter[str] = Counter()
        self._linktypes: set[int] = set()
        self._groups: dict[int, tuple[FilterGroup, FilterGroup, list[_Candidate]]] = {}

    # -- truth program (tcp[]/udp[] on IPv6) --
    def _truth_filter(self, key: int) -> CompiledFilter:
        cf = self.truth_filters.get(key)
        linktype, swapped = LT.split_key(key)
        if cf is None:
            rw = rewrite(self.expr, "truth")
            if rw.unsupported or not rw.changed:
                self.notes.append("tcp[]/udp[] indexing is IPv4-only in libpcap and this expression could not be "
                                  "extended to IPv6, so IPv6 packets are judged by libpcap's own reading")
                cf = self.filters.for_key(key)
            else:
                try:
                    cf = CompiledFilter(rw.text, linktype, self.snaplen, swapped)
                except FilterError as e:
                    self.notes.append(f"could not compile the IPv6-extended truth expression {rw.text!r}: "
                                      f"{e.for_linktype()}")
                    cf = self.filters.for_key(key)
            self.truth_filters[key] = cf
        return cf

    def _groups_of(self, key: int, cf: CompiledFilter) -> tuple[FilterGroup, FilterGroup, list[_Candidate]]:
        """The programs of compile key ``key``, made once: for the frames, the expression (``cf``), its truth
        form (tcp[]/udp[] indexing) and the candidates libpcap compiles; for the normalized copies, the first
        one or two; and those candidates, in the order of their verdicts."""
        if key not in self._groups:
            truth = [self._truth_filter(key)] if self.l4_index else []
            cands = [(c, c.program(key)) for c in self.candidates]
            cands = [(c, p) for c, p in cands if p is not None]
            self._groups[key] = (FilterGroup([cf, *truth, *(p for _, p in cands)]), FilterGroup([cf, *truth]),
                                 [c for c, _ in cands])
        return self._groups[key]

    @property
    def frames_fed(self) -> int:
        return self._n_frames

    def feed(self, rb, pb: PacketBatch) -> None:
        """Audit one batch (the PacketBatch of the RecordBatch ``rb``)."""
        self.feed_prepared(prepare_batch(rb, pb, self.candidates_only, self.l4_index))

    def feed_prepared(self, b: PreparedBatch) -> None:
        """Audit one batch prepared by ``prepare_batch`` (shared by every audit with the same selection)."""
        self._n_frames += b.skipped
        self._n_skipped += b.skipped
        n = len(b.pb)
        if n == 0:
            return
        pb, buf, off, cap, wire, keys = b.pb, b.buf, b.off, b.cap, b.wire, b.keys
        norm_idx, nbuf, n_off, n_cap, n_wire = b.norm_idx, b.nbuf, b.n_off, b.n_cap, b.n_wire
        self._linktypes.update(b.linktypes)

        raw = np.zeros(n, np.uint8)
        norm = np.zeros(n, np.uint8)
        truth = np.zeros(n, np.uint8) if self.l4_index else norm  # the normalized truth (tcp[]/udp[] on IPv6 too)
        na = b.na_reason.copy()
        cand = np.zeros((len(self.candidates), n), np.uint8)
        row_of = {id(c): i for i, c in enumerate(self.candidates)}
        whole = len(b.key_list) == 1  # (one link type: every row, without gathering them)
        # records libpcap cuts to its snapshot: the expression runs on what libpcap reads (as tcpdump -r does),
        # the truth on the whole frame; clip = 1 for those, 2 where the cut changes the expression's verdict
        clip = np.zeros(n, np.uint8)
        rcap = np.minimum(cap, b.snap) if b.cut.size else cap
        for key in b.key_list:
            sel = slice(None) if whole else np.flatnonzero(keys == key)
            try:
                cf = self.filters.for_key(key)
            except FilterError as e:
                lt = LT.split_key(key)[0]
                self.rejected.setdefault(lt, e)
                self._rejected_frames[lt] += n if whole else int(sel.size)
                na[sel] = R_REJECTED
                continue
            self._compiled_any = True
            if whole:
                view, nsel, cut = (buf, off, rcap, wire), norm_idx, b.cut
                nview = (nbuf, n_off, n_cap, n_wire)
            else:
                view = (buf, off[sel], rcap[sel], wire[sel])
                cut = b.cut[keys[b.cut] == key]
                nsel_mask = keys[norm_idx] == key
                nsel = norm_idx[nsel_mask]
                nview = (nbuf, n_off[nsel_mask], n_cap[nsel_mask], n_wire[nsel_mask])
            # every program of this key on the frames in one pass, then on the normalized copies (_groups)
            frames, copies, cands = self._groups_of(key, cf)
            got = frames.match_batch(*view)
            raw[sel] = got[0]
            norm[sel] = got[0]
            if cut.size:  # the whole frames of the cut ones (their normalized copies, below, are of whole frames)
                whole_got = copies.match_batch(buf, off[cut], cap[cut], wire[cut])
                norm[cut] = whole_got[0]
                clip[cut] = 1 + (whole_got[0] != raw[cut].view(bool))
            ngot = copies.match_batch(*nview)
            norm[nsel] = ngot[0]
            if self.l4_index:
                truth[sel] = got[1]
                if cut.size:
                    truth[cut] = whole_got[1]
                truth[nsel] = ngot[1]
            for c, v in zip(cands, got[len(copies.filters):], strict=True):
                cand[row_of[id(c)], sel] = v
        # verdicts, reasons and counts in one pass (judge.py)
        verdict, reason = np.empty(n, np.uint8), np.empty(n, np.uint8)
        keep = np.empty(n, np.int64)
        st = np.zeros(J.stats_size(len(self.candidates)), np.int64)
        k = J.judge(raw, norm, truth, na, clip, cand, int(bool(self.raw_header)), *J.pb_columns(pb), verdict, reason,
                    keep, st)
        for i, c in enumerate(self.candidates):
            c.mismatches += int(st[J.S_CANDIDATES + i])
        self._n_alt_truth += int(st[J.S_ALT_TRUTH])
        self._n_alt_missed += int(st[J.S_ALT_MISSED])
        self._n_alt_false += int(st[J.S_ALT_FALSE])
        for code, count in enumerate(st[J.S_NA_REASONS: J.S_NA_REASONS + J.NREASONS].tolist()):
            if code and count:
                self._not_audited[REASON_NAMES[code]] += count
        self._n_frames += n
        self._n_not_audited += int(st[J.S_NOT_AUDITED])
        self._n_raw += int(st[J.S_RAW])
        self._n_truth += int(st[J.S_TRUTH])
        self._n_missed += int(st[J.S_MISSED])
        self._n_cut += int(st[J.S_CUT])
        self._n_cut_changed += int(st[J.S_CUT_CHANGED])
        self._snap = b.snap or self._snap
        self._n_false += int(st[J.S_FALSE])
        self._reason_counts += st[J.S_REASONS: J.S_REASONS + J.NREASONS]
        if k == 0:
            return
        keep = keep[:k]
        kv = verdict[keep]
        if self._emit is not None:
            self._emit(np.asarray(pb.frame)[keep].astype(np.uint64), kv, reason[keep])
            self._tally_batch(b, keep, kv, verdict, st)
            return
        self._frames.append(np.asarray(pb.frame)[keep].astype(np.uint64))
        self._verdict.append(kv)
        self._reason.append(reason[keep])
        self._raw.append(raw[keep].view(bool))
        self._truth.append((raw if self.raw_header else truth)[keep].view(bool))
        self._kept += k
        if self._spill_on and self._kept >= self.SPILL_ROWS:
            if self._spill is None:
                self._spill = _Spill(self._spill_dir)
            self._spill.write(self._joined_rows())
            self._frames, self._verdict, self._reason, self._raw, self._truth = [], [], [], [], []
            self._kept = 0
        self._tally_batch(b, keep, kv, verdict, st)

    def _tally_batch(self, b: PreparedBatch, keep: np.ndarray, kv: np.ndarray, verdict: np.ndarray,
                     st: np.ndarray) -> None:
        if self._tally is not None and (st[J.S_MISSED] or st[J.S_FALSE]):
            bad = keep[(kv == MISSED) | (kv == FALSE_MATCH)]
            self._tally.add(b.pb, bad, b.flow_groups(), missed=verdict == MISSED,
                            false_matches=verdict == FALSE_MATCH)

    @property
    def compiled(self) -> bool:
        """libpcap compiled the expression for a link type met so far (every row before that is of a link type
        that rejects it)."""
        return self._compiled_any

    def result(self) -> AuditResult:
        """The audit so far. With no frames at all, the expression is still compiled (for Ethernet), so that a
        bad expression is reported whatever the capture holds. Raises FilterError (with the link type) when
        libpcap rejected the expression for every link type met."""
        if not self._linktypes:
            self.filters.for_linktype(1)
        elif not self._compiled_any and self.rejected:
            raise next(iter(self.rejected.values()))
        frame, verdict, reason, raw, truth = self._joined_rows()
        reasons = Counter({REASON_NAMES[r]: int(c) for r, c in enumerate(self._reason_counts.tolist()) if c})
        res = AuditResult(
            expr=self.expr, linktypes=sorted(self._linktypes), frames_total=self._n_frames,
            matched=self._n_raw, truth=self._n_truth, missed=self._n_missed,
            false_matches=self._n_false, not_audited_frames=self._n_not_audited,
            reasons=dict(reasons.most_common()), spill=self._spill,
            flows=self._flows(), frame=frame, verdict=verdict, reason=reason, raw_match=raw, truth_match=truth,
            not_audited={k: v for k, v in self._not_audited.items() if v}, notes=list(dict.fromkeys(self.notes)),
            frames_skipped=self._n_skipped, frames_cut=self._n_cut, frames_cut_changed=self._n_cut_changed,
            rejected={lt: e.message for lt, e in self.rejected.items()})
        for lt, e in self.rejected.items():
            res.notes.append(f"libpcap rejects this expression for linktype {LT.name(lt)} ({e.message}): its "
                             f"{self._rejected_frames[lt]} frames were not audited")
        if self.raw_header:
            res.judged_on, res.raw_header = "raw", list(self.raw_header)
            res.normalized = {"truth": self._n_alt_truth, "missed": self._n_alt_missed,
                              "false_matches": self._n_alt_false}
        if self._n_skipped:
            res.notes.append(SKIPPED_NOTE.format(n=self._n_skipped))
        if self._n_cut:
            res.notes.append(CUT_NOTE.format(snap=self._snap))
        # judged on the raw frame, a suggestion is for the normalized meaning, and only when that selects frames
        differs = not res.clean or (res.normalized is not None and res.normalized["truth"] > 0
                                    and (res.normalized["missed"] or res.normalized["false_matches"]))
        if differs and self.candidates:
            self._pick_suggestion(res)
        return res

    def _pick_suggestion(self, res: AuditResult) -> None:
        main, alt, ext = self.candidates
        if not main.ok and ext.ok:
            main = ext
            res.notes.append("the packets carry other extension headers than one Hop-by-Hop header: the suggestion "
                             "also skips one routing, destination-options or AH header")
        elif not main.ok and res.reasons.get(REASON_NAMES[R_EXT_HEADER]):
            res.notes.append("no fixed-offset suggestion handles these packets' chains of extension headers (it "
                             "handles one Hop-by-Hop, routing, destination-options or AH header); the "
                             "protochain form below, when verified, walks any chain")
        texts = sorted(set(main.texts.values()))
        res.suggestions_by_linktype = main.texts
        res.suggestion_mismatches = main.mismatches
        res.suggestion_kernel_ok = main.kernel_ok
        if main.ok and len(texts) == 1:
            res.suggestion, res.suggestion_verified = texts[0], True
        elif main.ok:
            res.suggestion_verified = True
            res.notes.append("the suggestion depends on the link header length; see suggestions_by_linktype")
        else:
            res.suggestion_verified = False
            why = (main.errors or main.unsupported or
                   ([f"the rewritten expression disagreed with the truth on {main.mismatches} frames"]
                    if main.changed else ["no rewrite rule applies to this expression"]))
            res.notes.append("no verified suggestion could be built: " + "; ".join(why))
        alt_texts = set(alt.texts.values())
        if alt.ok and len(alt_texts) == 1 and alt_texts != set(texts):
            res.alternative = alt_texts.pop()
            res.notes.append(f"alternative (verified, but protochain is userland-only on Linux: the kernel rejects "
                             f"its backward jump): {res.alternative}")
        res.notes.extend(u for c in (main,) for u in c.unsupported if u not in res.notes)

    def _joined_rows(self) -> tuple[np.ndarray, ...]:
        """The per-frame rows in memory as (frame, verdict, reason, raw, truth), each list joined into one array."""
        cols = []
        for name, dt in (("_frames", np.uint64), ("_verdict", np.uint8), ("_reason", np.uint8), ("_raw", bool),
                         ("_truth", bool)):
            xs = getattr(self, name)
            cols.append(np.concatenate(xs) if xs else np.zeros(0, dt))
            setattr(self, name, [cols[-1]] if xs else [])
        return tuple(cols)

    def _flows(self) -> list[FlowImpact]:
        return [] if self._tally is None else [FlowImpact(**r) for r in self._tally.rows()]


def audit_batches(expr: str, batches: Iterable[tuple[object, PacketBatch]], snaplen: int = DEFAULT_SNAPLEN,
                  suggest: bool = True) -> AuditResult:
    """Audit ``expr`` over (RecordBatch, PacketBatch) pairs (no file I/O here)."""
    audit = FilterAudit(expr, snaplen, suggest)
    for rb, pb in batches:
        audit.feed(rb, pb)
    return audit.result()


def audit_capture(expr: str, capture: str | os.PathLike, snaplen: int = DEFAULT_SNAPLEN,
                  suggest: bool = True) -> AuditResult:
    """Read ``capture`` with the project's reader and decoder and audit ``expr`` on every frame.

    A capture damaged part-way is audited up to the fault and ``AuditResult.error`` says where; CaptureError is
    raised only when not a single frame could be read.
    """
    audit = FilterAudit(expr, snaplen, suggest)
    error = feed_capture(audit, capture)
    res = audit.result()
    res.error = error
    return res


def feed_capture(audit, capture: str | os.PathLike) -> str | None:
    """Feed every decoded batch of ``capture`` to an audit (anything with ``feed(rb, pb)`` and ``frames_fed``).

    Returns the one-line error when the capture is damaged part-way (the audit keeps the frames before it);
    re-raises CaptureError when not a single frame could be read.
    """
    from ..capture import read_batches
    from ..decode import decode
    from ..errors import CaptureError

    try:
        for rb in read_batches(capture):
            pb, _findings = decode(rb)
            audit.feed(rb, pb)
    except CaptureError as e:
        if not audit.frames_fed:
            raise
        return e.one_line()
    return None
