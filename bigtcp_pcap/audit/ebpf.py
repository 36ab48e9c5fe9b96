"""The eBPF audit: would this compiled eBPF program treat BIG TCP packets differently from plain ones?

BIG TCP's cover letter warns that it "might break some eBPF programs assuming TCP header immediately follows
IPv6 header". This module checks a given program object (``PROG.o``) against a capture, black-box, by
differential testing with ``BPF_PROG_TEST_RUN`` (ecosystem.md section 2b):

* the object is opened and loaded with the system libbpf (``libbpf.so.1``, Debian package ``libbpf1``) through
  ctypes; only the selected program is loaded (``bpf_program__set_autoload(other, false)``);
* every Ethernet frame of the capture is run through the program (``bpf_prog_test_run_opts``), and so is its
  normalized copy (normalize.py, the same copy the cBPF audit uses: extension headers removed, zero length
  fields restored). A frame is reported when the two runs disagree on the verdict (the program's return value)
  or on the output packet (the raw run's output, normalized the same way, is compared with the normalized
  run's output, so a program that rewrites a header at a fixed offset is caught too);
* differing frames get the cBPF audit's reason names (``ipv6_hbh_jumbo``, ``ipv6_ext_header``, ``v6_plen0``,
  ``v4_totlen0``, ``other``) and are grouped into affected flows.

Safety (this runs on the real kernel, as root):

* nothing is attached: only ``BPF_PROG_TEST_RUN``; ``BPF_F_TEST_XDP_LIVE_FRAMES`` is never passed (flags = 0);
* map pinning is disabled before the load (``bpf_map__set_pin_path(map, NULL)`` for every map, checked
  afterwards), so a Cilium/Katran-style object can never reuse, pin or mutate a live map under /sys/fs/bpf.
  Every map is therefore a fresh, empty, private one, shared by all the test runs of one audit;
* root only (``os.geteuid() == 0``); a refusal from the kernel (EPERM) is reported the same way. The command
  is opt-in: nothing else in the package calls it;
* every fd and object is closed (``bpf_object__close``) when the audit ends, also on errors.

Caveats (measured on Linux 6.18, ecosystem.md section 2b):

* the test data is the *captured* bytes: ``skb->len`` is the caplen, not the BIG TCP length, and a program that
  reads ``skb->len``, ``wire_len`` or the gso fields sees test values. The ``__sk_buff`` ``wire_len`` that could
  carry the real length is rejected by the kernel (EINVAL) above 65536, so real BIG TCP skb lengths and GSO
  state cannot be reproduced; no ctx is passed;
* the kernel limits skb test data to about one page (3712 bytes on 6.18 x86-64); longer captured frames are cut
  to the largest length the kernel accepts (probed once, ``data_limit``) before both runs. XDP takes longer
  frames (the rest goes into fragments, beyond data_end);
* tc programs (SCHED_CLS/SCHED_ACT) and XDP get the frame from the Ethernet header on; every other skb type
  (socket filters, cgroup_skb, lwt_*) gets it from the network header (the kernel's test run pulls ETH_HLEN),
  and its output packet comes back with a zeroed Ethernet header;
* maps start empty, tail-call program arrays are not populated (a tail call falls through), and map contents
  are not compared; a program whose verdict depends on state carried between packets can differ for that
  reason alone;
* only Ethernet captures (linktype 1); native XDP on a physical NIC runs before GRO and never sees the BIG TCP
  encoding, so an XDP result matters only for generic/veth XDP.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..decode.schema import TUNNEL_NONE, PacketBatch
from . import judge as J
from . import normalize as nz
from .cbpf import R_NONE, REASON_NAMES, feed_capture
from .impact import FlowTally
from .libbpf import (  # the binding; its errors and names are also this module's (callers of the audit)
    ETH_HLEN,
    TC_ACT,
    XDP_ACT,
    BpfObject,
    BpfTestRunOpts,
    EbpfError,
    EbpfLoadError,
    EbpfPermissionError,
    EbpfRunError,
    EbpfUsageError,
    LibbpfMissing,
    PinnedMap,
    ProgramInfo,
    TestRunner,
    _TooLong,
    check_privileges,
    load_libbpf,
)

LINKTYPE_ETHERNET = 1
CAVEAT_NOTE = ("test data is the captured bytes (skb->len = caplen; the __sk_buff wire_len is rejected above 65536, "
               "so real BIG TCP lengths and GSO state are not reproduced)")


# --- the audit ------------------------------------------------------------------------------------------------------
@dataclass
class EbpfFlowImpact:
    """One directional 5-tuple with frames the program treats differently, and what they carry (true lengths)."""

    src: str
    sport: int
    dst: str
    dport: int
    proto: str
    packets: int
    verdict_differs: int
    output_differs: int
    wire_bytes: int
    payload_bytes: int

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class EbpfAuditResult:
    """Counts, reasons, affected flows and per-frame arrays for one program on one capture.

    ``retval_raw`` is -1 for a frame not run (not Ethernet), ``retval_norm`` -1 when the frame has no normalized
    copy (its encoding is already plain, or it cannot be normalized: ``not_audited``).
    """

    object_path: str
    program: str
    section: str
    prog_type: str
    l2: bool  # test data starts at the Ethernet header
    linktypes: list[int]
    frames_total: int
    frames_run: int  # Ethernet frames test-run
    compared: int  # frames with a normalized copy, run twice
    differing: int
    verdict_differs: int
    output_differs: int
    reasons: dict[str, int]
    retvals: dict[str, int]  # raw verdicts of all frames run, "retval" -> count
    retval_pairs: dict[str, int]  # differing frames, "raw->normalized" -> count
    flows: list[EbpfFlowImpact]
    frame: np.ndarray  # uint64
    retval_raw: np.ndarray  # int64
    retval_norm: np.ndarray  # int64
    out_differs: np.ndarray  # bool
    reason: np.ndarray  # uint8, REASON_NAMES codes (0 when the runs agree)
    maps: list[str] = field(default_factory=list)
    pinning_disabled: list[dict] = field(default_factory=list)  # [{"name", "pin_path"}]
    data_limit: int | None = None
    frames_cut: int = 0  # frames shortened to data_limit for the test run
    runs: int = 0  # BPF_PROG_TEST_RUN calls
    not_audited: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def clean(self) -> bool:
        return self.differing == 0

    @property
    def differs(self) -> np.ndarray:
        return (self.reason != R_NONE)

    def retval_name(self, v: int) -> str:
        names = XDP_ACT if self.prog_type == "xdp" else TC_ACT if self.prog_type in ("sched_cls", "sched_act") \
            else {}
        return names.get(int(v) & 0xFFFFFFFF, "")

    def differing_frames(self) -> list[dict]:
        idx = np.flatnonzero(self.differs)
        return [{"frame": int(self.frame[i]), "retval_raw": int(self.retval_raw[i]),
                 "retval_normalized": int(self.retval_norm[i]), "output_differs": bool(self.out_differs[i]),
                 "reason": REASON_NAMES[self.reason[i]]} for i in idx]

    def to_json(self) -> dict:
        """One JSON-able document; ``frames`` lists only the differing frames (all are in frames_table)."""
        return {
            "object": self.object_path, "program": self.program, "section": self.section,
            "prog_type": self.prog_type, "data_starts_at": "ethernet" if self.l2 else "network",
            "linktypes": self.linktypes, "frames_total": self.frames_total, "frames_run": self.frames_run,
            "compared": self.compared, "differing": self.differing, "verdict_differs": self.verdict_differs,
            "output_differs": self.output_differs, "reasons": self.reasons, "retvals": self.retvals,
            "retval_pairs": self.retval_pairs, "flows": [f.to_json() for f in self.flows],
            "frames": self.differing_frames(), "maps": self.maps, "pinning_disabled": self.pinning_disabled,
            "data_limit": self.data_limit, "frames_cut": self.frames_cut, "runs": self.runs,
            "not_audited": self.not_audited, "notes": self.notes, "error": self.error,
        }

    def frames_table(self):
        """Per-frame rows: frame, retval_raw, retval_normalized (null when not run), output_differs, reason."""
        import pyarrow as pa

        from ..output import arrow as A

        return pa.table({
            "frame": A.array(self.frame, pa.uint64()),
            "retval_raw": A.array(self.retval_raw, pa.int64(), mask=self.retval_raw < 0),
            "retval_normalized": A.array(self.retval_norm, pa.int64(), mask=self.retval_norm < 0),
            "output_differs": A.array(self.out_differs, pa.bool_()),
            "reason": A.dictionary(self.reason, REASON_NAMES, mask=self.reason == R_NONE)},
            metadata={b"bigtcp_pcap.ebpf_program": f"{self.object_path}:{self.section}:{self.program}".encode()})


def _decode_one(data: bytes, wirelen: int) -> nz.L3Fields | None:
    """The decoder's fields of one Ethernet frame (a program's output whose length changed)."""
    from ..capture import RecordBatch
    from ..decode import decode

    n = len(data)
    rb = RecordBatch(buf=np.frombuffer(data, np.uint8).copy(), off=np.zeros(1, np.int64),
                     caplen=np.array([n], np.uint32), wirelen=np.array([max(wirelen, n)], np.uint32),
                     ts_ns=np.zeros(1, np.int64), linktype=np.array([LINKTYPE_ETHERNET], np.uint16),
                     if_id=np.zeros(1, np.uint32), frame=np.ones(1, np.uint64), file_off=np.zeros(1, np.int64))
    pb, _ = decode(rb)
    return nz.L3Fields.from_batch(pb, 0)


class EbpfAudit:
    """Streaming audit of one loaded program: ``feed(record_batch, packet_batch)`` per batch, then ``result()``.

    ``runner`` is a TestRunner on the loaded program (tests may pass any object with ``run``/``cut``/``data_limit``).
    """

    def __init__(self, runner: TestRunner, program: ProgramInfo, object_path: str = "",
                 maps: list[str] | None = None, pinned: list[PinnedMap] | None = None):
        self.runner, self.program, self.object_path = runner, program, object_path
        self.maps = maps or []
        self.pinned = pinned or []
        self._frames: list[np.ndarray] = []
        self._rraw: list[np.ndarray] = []
        self._rnorm: list[np.ndarray] = []
        self._odiff: list[np.ndarray] = []
        self._reason: list[np.ndarray] = []
        self._tally = FlowTally(("verdict_differs", "output_differs"))
        self._not_audited: Counter[str] = Counter()
        self._linktypes: set[int] = set()
        self._retvals: Counter[int] = Counter()
        self.frames_cut = 0
        self.notes: list[str] = []

    @property
    def frames_fed(self) -> int:
        return sum(len(f) for f in self._frames)

    def _run(self, data: bytes, frame: int) -> tuple[int, bytes]:
        try:
            return self.runner.run(data)
        except EbpfError as e:
            raise type(e)(f"frame {frame}: {e}") from None

    def _outputs_differ(self, raw_in: bytes, raw_out: bytes, norm_in: bytes, norm_out: bytes, wire: int,
                        f: nz.L3Fields) -> bool:
        if raw_out == raw_in and norm_out == norm_in:
            return False
        if len(raw_out) == len(raw_in):  # same layout: normalize the raw output like its input
            expect, _ = nz.normalize_frame(raw_out, wire, f)
            return expect != norm_out
        g = _decode_one(raw_out, wire + len(raw_out) - len(raw_in))
        if g is None or nz.why_not(g, raw_out) is not None:
            self._not_audited["output_not_normalizable"] += 1
            return (len(raw_out) - len(raw_in)) != (len(norm_out) - len(norm_in))
        expect = nz.normalize_frame(raw_out, wire, g)[0] if nz.needs_normalizing(g, raw_out) else raw_out
        return expect != norm_out

    def feed(self, rb, pb: PacketBatch) -> None:
        """Test-run one batch (the PacketBatch of the RecordBatch ``rb``)."""
        n = len(pb)
        if n == 0:
            return
        buf = np.ascontiguousarray(rb.buf, dtype=np.uint8)
        off = np.asarray(rb.off, dtype=np.int64)[:n]
        cap, wire, lts = pb.caplen.astype(np.int64), pb.wirelen.astype(np.int64), pb.linktype.astype(np.int64)
        self._linktypes.update(np.flatnonzero(np.bincount(lts)).tolist())
        v6, v4 = pb.ip_version == 6, pb.ip_version == 4
        cand = (v6 & ((pb.ext_len > 0) | (pb.ip_len_field == 0))) | (v4 & (pb.ip_len_field == 0))
        tunnel = pb.tunnel != TUNNEL_NONE
        rraw = np.full(n, -1, np.int64)
        rnorm = np.full(n, -1, np.int64)
        odiff = np.zeros(n, bool)
        for i in range(n):
            if lts[i] != LINKTYPE_ETHERNET:
                self._not_audited["linktype_not_supported"] += 1
                continue
            o = int(off[i])
            data = buf[o:o + int(cap[i])].tobytes()
            if len(data) < ETH_HLEN:
                self._not_audited["shorter_than_ethernet"] += 1
                continue
            frame_no = int(pb.frame[i])
            cut = self.runner.cut(data)
            try:
                ret, out = self._run(cut, frame_no)
            except _TooLong:
                cut = self.runner.cut(data)
                ret, out = self._run(cut, frame_no)
            if len(cut) < len(data):
                self.frames_cut += 1
                data = cut
            rraw[i] = ret
            self._retvals[ret] += 1
            if tunnel[i]:
                self._not_audited[nz.SKIP_TUNNEL] += 1
                continue
            if not cand[i]:
                continue
            f = nz.L3Fields.from_batch(pb, i)
            why = nz.why_not(f, data)
            if why is not None:
                self._not_audited[why] += 1
                continue
            if not nz.needs_normalizing(f, data):
                continue
            norm, _ = nz.normalize_frame(data, int(wire[i]), f)
            nret, nout = self._run(norm, frame_no)
            rnorm[i] = nret
            odiff[i] = self._outputs_differ(data, out, norm, nout, int(wire[i]), f)
        bad = (rnorm >= 0) & ((rraw != rnorm) | odiff)
        reason = J.reasons(pb, bad)  # the cBPF audit's reason rules and names (judge.py)
        self._frames.append(pb.frame.astype(np.uint64))
        self._rraw.append(rraw)
        self._rnorm.append(rnorm)
        self._odiff.append(odiff & bad)
        self._reason.append(reason)
        idx = np.flatnonzero(bad)
        if idx.size:
            self._tally.add(pb, idx, verdict_differs=rraw != rnorm, output_differs=odiff)

    def _flows(self) -> list[EbpfFlowImpact]:
        return [EbpfFlowImpact(**r) for r in self._tally.rows()]

    def result(self) -> EbpfAuditResult:
        """The audit so far. EbpfUsageError when the capture has frames but none of them is Ethernet."""
        cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt))
        frame, reason = cat(self._frames, np.uint64), cat(self._reason, np.uint8)
        rraw, rnorm, odiff = cat(self._rraw, np.int64), cat(self._rnorm, np.int64), cat(self._odiff, bool)
        other = sorted(lt for lt in self._linktypes if lt != LINKTYPE_ETHERNET)
        if frame.size and not (rraw >= 0).any() and other:
            raise EbpfUsageError(f"linktype {', '.join(map(str, other))} is not supported by audit-ebpf "
                                 "(Ethernet captures only)")
        bad = reason != R_NONE
        vdiff = bad & (rraw != rnorm)
        p = self.program
        notes = list(self.notes)
        if other:
            notes.append(f"frames of linktype {', '.join(map(str, other))} were not run (Ethernet only)")
        if not p.l2:
            notes.append(f"{p.type_name}: BPF_PROG_TEST_RUN starts the packet at the network header (the Ethernet "
                         "header is skipped; the output comes back with a zeroed Ethernet header)")
        notes.append(CAVEAT_NOTE)
        if self.runner.data_limit:
            notes.append(f"{self.frames_cut} frames were cut to {self.runner.data_limit} bytes, the kernel's "
                         "test-data limit")
        if self.pinned:
            notes.append("map pinning disabled (private, empty maps were used): "
                         + ", ".join(f"{m.name} ({m.pin_path})" for m in self.pinned))
        if self.maps:
            notes.append("maps start empty and are shared by all test runs; map contents are not compared")
        pairs = Counter(f"{int(a)}->{int(b)}" for a, b in zip(rraw[vdiff].tolist(), rnorm[vdiff].tolist()))
        return EbpfAuditResult(
            object_path=self.object_path, program=p.name, section=p.section, prog_type=p.type_name, l2=p.l2,
            linktypes=sorted(self._linktypes), frames_total=int(frame.size), frames_run=int((rraw >= 0).sum()),
            compared=int((rnorm >= 0).sum()), differing=int(bad.sum()), verdict_differs=int(vdiff.sum()),
            output_differs=int(odiff.sum()),
            reasons=dict(Counter(REASON_NAMES[r] for r in reason[bad].tolist()).most_common()),
            retvals={str(k): v for k, v in sorted(self._retvals.items())}, retval_pairs=dict(pairs.most_common()),
            flows=self._flows(), frame=frame, retval_raw=rraw, retval_norm=rnorm, out_differs=odiff, reason=reason,
            maps=list(self.maps), pinning_disabled=[dict(m.__dict__) for m in self.pinned],
            data_limit=self.runner.data_limit, frames_cut=self.frames_cut, runs=getattr(self.runner, "runs", 0),
            not_audited={k: v for k, v in self._not_audited.items() if v}, notes=list(dict.fromkeys(notes)))


def audit_ebpf(obj_path: str | os.PathLike, capture, section: str | None = None) -> EbpfAuditResult:
    """Load ``section`` (or the only program) of the BPF object ``obj_path`` and audit it on every frame of
    ``capture`` (a path or a binary file object, read with the project's reader and decoder).

    Raises EbpfPermissionError (not root / EPERM), LibbpfMissing, EbpfUsageError (object, section, program type,
    linktype), EbpfLoadError (libbpf or the verifier refused), CaptureError (not a single frame readable). A
    capture damaged part-way is audited up to the fault and ``error`` says where.
    """

    check_privileges()
    load_libbpf()
    with BpfObject(obj_path) as obj:
        obj.select(section)
        info = obj.load()
        audit = EbpfAudit(TestRunner(obj.lib, obj.fd), info, os.fspath(obj_path), obj.maps, obj.pinned_maps)
        error = feed_capture(audit, capture)
        res = audit.result()
    res.error = error
    return res


__all__ = ["BpfObject", "BpfTestRunOpts", "EbpfAudit", "EbpfAuditResult", "EbpfError", "EbpfFlowImpact",
           "EbpfLoadError", "EbpfPermissionError", "EbpfRunError", "EbpfUsageError", "LibbpfMissing", "ProgramInfo", "TestRunner",
           "audit_ebpf", "check_privileges", "load_libbpf"]
