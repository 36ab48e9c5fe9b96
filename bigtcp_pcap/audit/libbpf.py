"""A ctypes binding of the system libbpf (``libbpf.so.1``, Debian package ``libbpf1``) for ``BPF_PROG_TEST_RUN``.

Only what the eBPF audit (ebpf.py) needs: open an object, load one program with every map's pinning disabled,
run it on test data (``bpf_prog_test_run_opts``, flags 0: nothing is attached, no live frames), close everything.
The errors of the eBPF audit live here too (one base, ``EbpfError``, a UsageError). Safety and caveats: ebpf.py.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno as errno_mod
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

from ..errors import UsageError

_LIB_NAMES = ("libbpf.so.1", "libbpf.so")
INSTALL_HINT = "install it with: apt-get install libbpf1"
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
