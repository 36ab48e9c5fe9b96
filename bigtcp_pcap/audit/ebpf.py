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

import ctypes
import ctypes.util
import errno as errno_mod
import os
import platform
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Self

import numpy as np

from ..decode.schema import TUNNEL_NONE, PacketBatch
from ..errors import UsageError
from . import normalize as nz
from .cbpf import R_NONE, REASON_NAMES, FilterAudit, feed_capture
from .impact import FlowTally

_LIB_NAMES = ("libbpf.so.1", "libbpf.so")
INSTALL_HINT = "install it with: apt-get install libbpf1"
LINKTYPE_ETHERNET = 1
ETH_HLEN = 14
OUT_BUF = 1 << 17  # room for a program that grows the packet (bpf_skb_change_tail, adjust_room)

# enum bpf_prog_type (uapi/linux/bpf.h)
PROG_SOCKET_FILTER, PROG_SCHED_CLS, PROG_SCHED_ACT, PROG_XDP, PROG_CGROUP_SKB = 1, 3, 4, 6, 8
PROG_LWT_IN, PROG_LWT_OUT, PROG_LWT_XMIT = 10, 11, 12
SKB_TYPES = {PROG_SOCKET_FILTER, PROG_SCHED_CLS, PROG_SCHED_ACT, PROG_CGROUP_SKB, PROG_LWT_IN, PROG_LWT_OUT,
             PROG_LWT_XMIT}
L2_TYPES = {PROG_SCHED_CLS, PROG_SCHED_ACT, PROG_XDP}  # test data starts at the Ethernet header
SUPPORTED_TYPES = SKB_TYPES | {PROG_XDP}
_TYPE_NAMES = {1: "socket_filter", 3: "sched_cls", 4: "sched_act", 6: "xdp", 8: "cgroup_skb", 10: "lwt_in",
               11: "lwt_out", 12: "lwt_xmit"}
TC_ACT = {0xFFFFFFFF: "TC_ACT_UNSPEC", 0: "TC_ACT_OK", 1: "TC_ACT_RECLASSIFY", 2: "TC_ACT_SHOT", 3: "TC_ACT_PIPE",
          4: "TC_ACT_STOLEN", 5: "TC_ACT_QUEUED", 6: "TC_ACT_REPEAT", 7: "TC_ACT_REDIRECT", 8: "TC_ACT_TRAP"}
XDP_ACT = {0: "XDP_ABORTED", 1: "XDP_DROP", 2: "XDP_PASS", 3: "XDP_TX", 4: "XDP_REDIRECT"}
CAVEAT_NOTE = ("test data is the captured bytes (skb->len = caplen; the __sk_buff wire_len is rejected above 65536, "
               "so real BIG TCP lengths and GSO state are not reproduced)")


# --- errors ---------------------------------------------------------------------------------------------------------
class EbpfError(UsageError, RuntimeError):
    """Base of the eBPF audit's errors; ``str(e)`` is one line for the user."""


class LibbpfMissing(EbpfError):
    """The system libbpf (libbpf.so.1) could not be loaded or lacks a function we need."""

    def __init__(self, detail: str = ""):
        self.detail = detail
        super().__init__(f"libbpf not found ({detail}); {INSTALL_HINT}" if detail else f"libbpf not found; "
                         f"{INSTALL_HINT}")


class EbpfPermissionError(EbpfError):
    """Not root, or the kernel said EPERM: BPF_PROG_TEST_RUN needs CAP_BPF and CAP_NET_ADMIN."""


class EbpfUsageError(EbpfError):
    """A bad object path, an unknown section, an unsupported program type or capture linktype."""


class EbpfLoadError(EbpfError):
    """libbpf or the kernel (verifier) refused the object; ``errno`` and libbpf's log lines are kept."""

    def __init__(self, message: str, err: int, log: list[str] | None = None):
        self.errno = err
        self.log = log or []
        super().__init__(message)


# --- the ctypes binding -----------------------------------------------------------------------------------------------
class BpfTestRunOpts(ctypes.Structure):
    """``struct bpf_test_run_opts`` as in libbpf 1.1's bpf.h (``sz`` first; 80 bytes on LP64)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p),
        ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),  # in: room in data_out; out: the output's length
        ("ctx_in", ctypes.c_void_p),
        ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),  # always 0 here: never BPF_F_TEST_XDP_LIVE_FRAMES
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_lib: ctypes.CDLL | None = None
_log: list[str] = []  # libbpf's warnings and info lines since the last _log.clear()
_print_cb = None  # the installed callback (kept alive for the process)


def _protos(lib: ctypes.CDLL) -> None:
    vp, cp, ci = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    decl = {
        "bpf_object__open_file": (vp, [cp, vp]),
        "bpf_object__load": (ci, [vp]),
        "bpf_object__close": (None, [vp]),
        "bpf_object__next_program": (vp, [vp, vp]),
        "bpf_object__find_program_by_name": (vp, [vp, cp]),
        "bpf_object__next_map": (vp, [vp, vp]),
        "bpf_map__name": (cp, [vp]),
        "bpf_map__pin_path": (cp, [vp]),
        "bpf_map__set_pin_path": (ci, [vp, cp]),
        "bpf_map__is_pinned": (ctypes.c_bool, [vp]),
        "bpf_program__name": (cp, [vp]),
        "bpf_program__section_name": (cp, [vp]),
        "bpf_program__type": (ci, [vp]),
        "bpf_program__fd": (ci, [vp]),
        "bpf_program__set_autoload": (ci, [vp, ctypes.c_bool]),
        "bpf_prog_test_run_opts": (ci, [ci, ctypes.POINTER(BpfTestRunOpts)]),
        "libbpf_set_print": (vp, [vp]),
    }
    for name, (res, args) in decl.items():
        fn = getattr(lib, name)  # AttributeError: an old libbpf
        fn.restype, fn.argtypes = res, args
    if hasattr(lib, "libbpf_bpf_prog_type_str"):
        lib.libbpf_bpf_prog_type_str.restype, lib.libbpf_bpf_prog_type_str.argtypes = cp, [ci]


def _install_print(lib: ctypes.CDLL) -> None:
    """Route libbpf's messages into ``_log`` instead of stderr (formatted with the C library's vsnprintf, which
    takes the callback's va_list as it came: a pointer on x86-64 and arm64). Elsewhere libbpf's default printer
    (stderr) stays."""
    global _print_cb
    if platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    vsnprintf = libc.vsnprintf
    vsnprintf.restype, vsnprintf.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                                          ctypes.c_void_p]

    def cb(level: int, fmt: bytes, ap: int) -> int:
        if level > 1:  # LIBBPF_WARN 0, LIBBPF_INFO 1, LIBBPF_DEBUG 2
            return 0
        buf = ctypes.create_string_buffer(4096)
        n = vsnprintf(buf, len(buf), fmt, ap)
        _log.extend(line for line in buf.value.decode("utf-8", "replace").splitlines() if line.strip())
        return n

    _print_cb = _PRINT_FN(cb)
    lib.libbpf_set_print(ctypes.cast(_print_cb, ctypes.c_void_p))


def load_libbpf() -> ctypes.CDLL:
    """Load the system libbpf once and declare the prototypes used here; LibbpfMissing when absent or too old."""
    global _lib
    if _lib is not None:
        return _lib
    names = list(_LIB_NAMES) + [n for n in (ctypes.util.find_library("bpf"),) if n]
    errors = []
    for name in names:
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError as e:
            errors.append(str(e))
            continue
        try:
            _protos(lib)
        except AttributeError as e:
            errors.append(f"{name} is too old (need libbpf >= 1.0): {e}")
            continue
        _install_print(lib)
        _lib = lib
        return lib
    raise LibbpfMissing("; ".join(errors[:1]))


def _s(p: bytes | None) -> str:
    return p.decode("utf-8", "replace") if p else ""


def _strerror(err: int) -> str:
    return f"{errno_mod.errorcode.get(err, str(err))} ({os.strerror(err)})" if err else "unknown error"


def prog_type_name(t: int) -> str:
    lib = _lib
    if lib is not None and hasattr(lib, "libbpf_bpf_prog_type_str"):
        name = lib.libbpf_bpf_prog_type_str(t)
        if name:
            return _s(name)
    return _TYPE_NAMES.get(t, f"type {t}")


def check_privileges() -> None:
    """Root only (BPF_PROG_TEST_RUN needs CAP_BPF + CAP_NET_ADMIN); EbpfPermissionError otherwise."""
    if os.geteuid() != 0:
        raise EbpfPermissionError("audit-ebpf must run as root (loading a program for BPF_PROG_TEST_RUN needs "
                                  "CAP_BPF and CAP_NET_ADMIN); run it with sudo")


@dataclass(frozen=True)
class ProgramInfo:
    name: str
    section: str
    prog_type: int
    type_name: str

    @property
    def l2(self) -> bool:
        """True when test data starts at the Ethernet header (tc, XDP); else at the network header."""
        return self.prog_type in L2_TYPES


@dataclass(frozen=True)
class PinnedMap:
    """A map that asked to be pinned; its pin path was cleared before the load (a private map was created)."""

    name: str
    pin_path: str


class BpfObject:
    """One opened BPF object file (``with BpfObject(path) as obj: obj.load(section); obj.test_run(data)``).

    Opening clears every map's pin path at once, so nothing from /sys/fs/bpf can be reused or pinned by the load.
    """

    def __init__(self, path: str | os.PathLike):
        self.lib = load_libbpf()
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise EbpfUsageError(f"{self.path}: no such BPF object file")
        self._obj = None
        self.program: ProgramInfo | None = None
        self._prog = None
        self.fd = -1
        _log.clear()
        ctypes.set_errno(0)
        obj = self.lib.bpf_object__open_file(self.path.encode(), None)
        if not obj:
            err = ctypes.get_errno() or errno_mod.EINVAL
            raise EbpfUsageError(f"{self.path}: libbpf cannot open it as a BPF object: {_strerror(err)}"
                                 f"{_last_log()}")
        self._obj = obj
        try:
            self.pinned_maps = self._disable_pinning()
            self.maps = self._map_names()
            self.programs = self._programs()
        except BaseException:
            self.close()
            raise

    # -- introspection --
    def _iter(self, nxt) -> Iterable[int]:
        p = nxt(self._obj, None)
        while p:
            yield p
            p = nxt(self._obj, p)

    def _programs(self) -> list[tuple[int, ProgramInfo]]:
        out = []
        for p in self._iter(self.lib.bpf_object__next_program):
            t = int(self.lib.bpf_program__type(p))
            out.append((p, ProgramInfo(_s(self.lib.bpf_program__name(p)), _s(self.lib.bpf_program__section_name(p)),
                                       t, prog_type_name(t))))
        return out

    def _map_names(self) -> list[str]:
        return [_s(self.lib.bpf_map__name(m)) for m in self._iter(self.lib.bpf_object__next_map)]

    def _disable_pinning(self) -> list[PinnedMap]:
        pinned = []
        for m in self._iter(self.lib.bpf_object__next_map):
            path = self.lib.bpf_map__pin_path(m)
            if path:
                pinned.append(PinnedMap(_s(self.lib.bpf_map__name(m)), _s(path)))
            rc = self.lib.bpf_map__set_pin_path(m, None)
            if rc != 0 or self.lib.bpf_map__pin_path(m):
                raise EbpfUsageError(f"{self.path}: could not disable pinning of map "
                                     f"{_s(self.lib.bpf_map__name(m))!r}; refusing to load it")
        return pinned

    def select(self, section: str | None = None) -> ProgramInfo:
        """The program to audit: the one whose section or name is ``section``, or the only one in the object."""
        progs = self.programs
        if not progs:
            raise EbpfUsageError(f"{self.path}: no BPF program in this object")
        listing = ", ".join(f"{i.name} (section {i.section}, {i.type_name})" for _, i in progs)
        if section is None:
            if len(progs) > 1:
                raise EbpfUsageError(f"{self.path} has {len(progs)} programs; choose one with --section: {listing}")
            chosen = progs[0]
        else:
            hits = [p for p in progs if p[1].section == section] or [p for p in progs if p[1].name == section]
            if not hits:
                raise EbpfUsageError(f"{self.path}: no program in section or named {section!r}; it has: {listing}")
            if len(hits) > 1:
                raise EbpfUsageError(f"{self.path}: {len(hits)} programs in section {section!r}; give the program "
                                     f"name instead: {', '.join(i.name for _, i in hits)}")
            chosen = hits[0]
        ptr, info = chosen
        if info.prog_type not in SUPPORTED_TYPES:
            raise EbpfUsageError(f"{info.name} (section {info.section}) is a {info.type_name} program; audit-ebpf "
                                 f"runs packet programs only (tc, xdp, socket filter, cgroup_skb, lwt)")
        self._prog, self.program = ptr, info
        return info

    def load(self, section: str | None = None) -> ProgramInfo:
        """Load the selected program (only it: the others get autoload off) into the kernel; nothing attached."""
        info = self.program if self._prog is not None and section is None else self.select(section)
        for p, _ in self.programs:
            self.lib.bpf_program__set_autoload(p, p == self._prog)
        _log.clear()
        ctypes.set_errno(0)
        rc = self.lib.bpf_object__load(self._obj)
        if rc != 0:
            err = -rc if rc < 0 else (ctypes.get_errno() or errno_mod.EINVAL)
            if err == errno_mod.EPERM:
                raise EbpfPermissionError(f"the kernel refused to load {info.name}: {_strerror(err)}; "
                                          "BPF_PROG_TEST_RUN needs CAP_BPF and CAP_NET_ADMIN")
            raise EbpfLoadError(f"{self.path}: the kernel refused {info.name} (section {info.section}): "
                                f"{_strerror(err)}{_last_log()}", err, list(_log))
        self.fd = int(self.lib.bpf_program__fd(self._prog))
        if self.fd < 0:
            raise EbpfLoadError(f"{self.path}: {info.name} has no fd after the load", -self.fd, list(_log))
        return info

    def close(self) -> None:
        if self._obj:
            self.lib.bpf_object__close(self._obj)  # closes the program and map fds
        self._obj, self._prog, self.fd = None, None, -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _last_log() -> str:
    """The most telling lines of libbpf's log (the verifier's last words), for a one-line error."""
    begin = [i for i, x in enumerate(_log) if x.endswith("-- BEGIN PROG LOAD LOG --")]
    if begin:
        block = []
        for x in _log[begin[-1] + 1:]:
            if x.startswith("-- END PROG LOAD LOG --"):
                break
            if not x.startswith(("processed ", "verification time")):
                block.append(x.strip())
        if block:
            return "; verifier: " + " | ".join(block[-2:])
    tail = [x.strip().removeprefix("libbpf: ") for x in _log[-3:] if not x.startswith("-- ")]
    return ("; libbpf: " + " | ".join(tail)) if tail else ""


class TestRunner:
    """``BPF_PROG_TEST_RUN`` on one loaded program: ``run(data) -> (retval, output bytes)``.

    Raises EbpfRunError (EbpfPermissionError for EPERM) when the kernel refuses the run. ``data_limit`` is the largest test-data length the
    kernel accepts, probed on the first EINVAL for a long frame (the kernel caps test data at about a page).
    """

    __test__ = False  # not a pytest class

    def __init__(self, lib: ctypes.CDLL, fd: int):
        self.lib, self.fd = lib, fd
        self.inbuf = ctypes.create_string_buffer(OUT_BUF)
        self.outbuf = ctypes.create_string_buffer(OUT_BUF)
        self.opts = BpfTestRunOpts()
        self.data_limit: int | None = None
        self.runs = 0

    def _raw_run(self, data: bytes) -> tuple[int, int, bytes]:
        o = self.opts
        ctypes.memset(ctypes.byref(o), 0, ctypes.sizeof(o))
        o.sz = ctypes.sizeof(BpfTestRunOpts)
        n = len(data)
        ctypes.memmove(self.inbuf, data, n)
        o.data_in = ctypes.cast(self.inbuf, ctypes.c_void_p)
        o.data_size_in = n
        o.data_out = ctypes.cast(self.outbuf, ctypes.c_void_p)
        o.data_size_out = OUT_BUF
        o.repeat = 1
        o.flags = 0
        rc = self.lib.bpf_prog_test_run_opts(self.fd, ctypes.byref(o))
        self.runs += 1
        err = -rc if rc < 0 else 0
        if err in (0, errno_mod.ENOSPC):
            return err, int(o.retval), self.outbuf.raw[:min(int(o.data_size_out), OUT_BUF)]
        return err, 0, b""

    def _probe_limit(self, n: int) -> int:
        lo, hi = ETH_HLEN, n  # lo accepted (else nothing works), hi refused
        if self._raw_run(bytes(lo))[0] == errno_mod.EINVAL:
            return 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._raw_run(bytes(mid))[0] == errno_mod.EINVAL:
                hi = mid
            else:
                lo = mid
        return lo

    def cut(self, data: bytes) -> bytes:
        """``data`` shortened to the kernel's test-data limit, when known."""
        return data if self.data_limit is None or len(data) <= self.data_limit else data[:self.data_limit]

    def run(self, data: bytes) -> tuple[int, bytes]:
        err, retval, out = self._raw_run(data)
        if err == errno_mod.EINVAL and len(data) > 1518 and self.data_limit is None:
            self.data_limit = self._probe_limit(len(data))
            if 0 < self.data_limit < len(data):
                raise _TooLong(self.data_limit)
        if err == errno_mod.EPERM:
            raise EbpfPermissionError(f"BPF_PROG_TEST_RUN refused: {_strerror(err)} (needs CAP_BPF and "
                                      "CAP_NET_ADMIN)")
        if err not in (0, errno_mod.ENOSPC):
            raise EbpfRunError(f"BPF_PROG_TEST_RUN failed on {len(data)} bytes of test data: {_strerror(err)}",
                               err)
        return retval, out


class EbpfRunError(EbpfError):
    """The kernel refused a BPF_PROG_TEST_RUN call (``errno``); ENOTSUPP (524) for a type without test runs."""

    def __init__(self, message: str, err: int):
        self.errno = err
        super().__init__(message)


class _TooLong(Exception):
    def __init__(self, limit: int):
        self.limit = limit


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
        reason = FilterAudit._reasons(pb, bad, np.zeros(n, bool))  # the cBPF audit's reason rules and names
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
