"""ctypes binding to the system libpcap: compile a capture filter and run it on packets we read ourselves.

We borrow libpcap's *compiler*, so a program here is exactly what tcpdump (and, for programs the kernel
accepts, the kernel's socket filter) would run. Batches run it on a compiled interpreter with the semantics of
libpcap's own (bpfvm.py), because a ctypes call per packet cost ~0.55 us; ``matches`` and
``match_batch_libpcap`` run libpcap's ``bpf_filter`` itself, the tests' oracle for that interpreter.
Packets are never read with ``pcap_open_offline``: libpcap 1.10 refuses pcapng files that mix linktypes
(ecosystem.md section 1a), and our reader already gives us the bytes, caplen and the true wire length.

The compile itself runs against a savefile, as ``tcpdump -r`` does: a 24-byte pcap header (the link type,
the writer's byte order) opened with ``pcap_fopen_offline`` from memory. libpcap compiles some primitives
differently for savefiles and for live captures (``pcap_open_dead`` counts as live): on DLT_NULL/DLT_LOOP
``ip6`` tests all three BSD AF_INET6 values (24, 28, 30) instead of this host's AF_INET6 (10 on Linux), NULL's
host-byte-order family is compared in the file writer's byte order, and ``inbound``/``outbound`` are refused
on link types without a direction field instead of becoming a load that fails offline. The netmask is 0, as
tcpdump passes when it reads a file (so ``ip broadcast`` compiles as it does there).

Why not a PyPI binding: cypcap and pcapy-ng bundle their own libpcap, pypcap/pcap-ct have wrong wirelen or
shared-state bugs (ecosystem.md section 1a); the system library is the one tcpdump uses and is ~40 lines away.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
import sys
import tempfile
from collections.abc import Sequence

import numpy as np

from ..errors import UsageError
from ..linktypes import LIBPCAP_MAXIMUM_SNAPLEN
from . import bpfc, bpfvm
from . import linktypes as LT

PCAP_NETMASK_UNKNOWN = 0xFFFFFFFF
SAVEFILE_NETMASK = 0  # what tcpdump -r passes to pcap_compile (no interface to look a netmask up on)
PCAP_ERRBUF_SIZE = 256
DEFAULT_SNAPLEN = LIBPCAP_MAXIMUM_SNAPLEN  # as tcpdump compiles
_LIB_NAMES = ("libpcap.so.0.8", "libpcap.so.1", "libpcap.so", "libpcap.dylib")
INSTALL_HINT = "install it with: apt-get install libpcap0.8"


class LibpcapMissing(UsageError, RuntimeError):
    """The system libpcap shared library could not be loaded."""

    def __init__(self, detail: str = ""):
        self.detail = detail
        super().__init__(f"libpcap not found ({detail}); {INSTALL_HINT}" if detail else f"libpcap not found; "
                         f"{INSTALL_HINT}")


class FilterError(UsageError, ValueError):
    """libpcap rejected the filter expression; ``message`` is libpcap's own text (as tcpdump prints it)."""

    def __init__(self, expr: str, message: str, linktype: int | None = None):
        self.expr = expr
        self.message = message
        self.linktype = linktype
        super().__init__(message)

    def for_linktype(self) -> str:
        """libpcap's text followed by the link type it was compiled for: 'expression rejects all packets
        (linktype 228 (IPV4))'."""
        return self.message if self.linktype is None else f"{self.message} (linktype {LT.name(self.linktype)})"


class BpfInsn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class BpfProgram(ctypes.Structure):
    _fields_ = [("bf_len", ctypes.c_uint), ("bf_insns", ctypes.POINTER(BpfInsn))]


class Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class PcapPkthdr(ctypes.Structure):
    _fields_ = [("ts", Timeval), ("caplen", ctypes.c_uint32), ("len", ctypes.c_uint32)]


_lib: ctypes.CDLL | None = None


def load() -> ctypes.CDLL:
    """Load libpcap once (find_library("pcap"), then the usual sonames) and declare the prototypes we use."""
    global _lib
    if _lib is not None:
        return _lib
    names = [n for n in (ctypes.util.find_library("pcap"),) if n] + list(_LIB_NAMES)
    errors = []
    lib = None
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            errors.append(str(e))
    if lib is None:
        raise LibpcapMissing(errors[-1] if errors else "")
    lib.pcap_open_dead.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.pcap_open_dead.restype = ctypes.c_void_p
    lib.pcap_open_offline.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.pcap_open_offline.restype = ctypes.c_void_p
    lib.pcap_fopen_offline.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.pcap_fopen_offline.restype = ctypes.c_void_p
    lib.pcap_compile.argtypes = [ctypes.c_void_p, ctypes.POINTER(BpfProgram), ctypes.c_char_p, ctypes.c_int,
                                 ctypes.c_uint32]
    lib.pcap_compile.restype = ctypes.c_int
    lib.pcap_geterr.argtypes = [ctypes.c_void_p]
    lib.pcap_geterr.restype = ctypes.c_char_p
    lib.pcap_offline_filter.argtypes = [ctypes.POINTER(BpfProgram), ctypes.POINTER(PcapPkthdr), ctypes.c_void_p]
    lib.pcap_offline_filter.restype = ctypes.c_int
    lib.pcap_freecode.argtypes = [ctypes.POINTER(BpfProgram)]
    lib.pcap_freecode.restype = None
    lib.pcap_close.argtypes = [ctypes.c_void_p]
    lib.pcap_close.restype = None
    # bpf_filter(insns, pkt, wirelen, caplen): what pcap_offline_filter calls; used by the batch loop because it
    # needs no pkthdr struct per packet
    lib.bpf_filter.argtypes = [ctypes.POINTER(BpfInsn), ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    lib.bpf_filter.restype = ctypes.c_uint
    lib.pcap_lib_version.argtypes = []
    lib.pcap_lib_version.restype = ctypes.c_char_p
    _lib = lib
    return lib


def version() -> str:
    """libpcap's version string, e.g. 'libpcap version 1.10.3 (with TPACKET_V3)'."""
    return load().pcap_lib_version().decode()


def _fmemopen():
    """libc's fmemopen, or None (then the header goes through a temporary file)."""
    try:
        libc = ctypes.CDLL(None)
        f = libc.fmemopen
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    f.restype = ctypes.c_void_p
    return f


_FMEMOPEN = _fmemopen()


def savefile_header(linktype: int, snaplen: int, swapped: bool = False) -> bytes:
    """The 24-byte pcap file header of a capture written by a host of this byte order (or of the other one
    when ``swapped``) with ``linktype``; the link type is the one libpcap is told for it (linktypes.py)."""
    little = (sys.byteorder == "little") != bool(swapped)
    return struct.pack("<IHHiIII" if little else ">IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, snaplen,
                       LT.savefile_linktype(linktype))


def open_savefile(linktype: int, snaplen: int, swapped: bool = False) -> int:
    """A pcap_t for an empty savefile with this link type and writer byte order (libpcap reads only the header
    at open). The caller closes it with pcap_close (which also closes the stream)."""
    lib = load()
    hdr = savefile_header(linktype, snaplen, swapped)
    errbuf = ctypes.create_string_buffer(PCAP_ERRBUF_SIZE)
    if _FMEMOPEN is not None:
        data = ctypes.create_string_buffer(hdr, len(hdr))
        fp = _FMEMOPEN(data, len(hdr), b"rb")
        if fp:
            handle = lib.pcap_fopen_offline(fp, errbuf)
            if handle:
                return handle
            ctypes.CDLL(None).fclose(ctypes.c_void_p(fp))
            raise OSError(errbuf.value.decode(errors="replace"))
    with tempfile.NamedTemporaryFile(suffix=".pcap") as tmp:
        tmp.write(hdr)
        tmp.flush()
        handle = lib.pcap_open_offline(tmp.name.encode(), errbuf)
    if not handle:
        raise OSError(errbuf.value.decode(errors="replace"))
    return handle


class CompiledFilter:
    """One filter expression compiled by libpcap for one linktype as ``tcpdump -r`` compiles it for a file of
    that link type (a savefile handle, optimize=1, netmask 0). ``swapped``: the file was written by a host of
    the other byte order (matters for DLT_NULL only)."""

    def __init__(self, expr: str, linktype: int, snaplen: int = DEFAULT_SNAPLEN, swapped: bool = False):
        lib = load()
        self.expr = expr
        self.linktype = int(linktype)
        self.swapped = bool(swapped)
        self._lib = lib
        self._prog = BpfProgram()
        self._hdr = PcapPkthdr()
        try:
            handle = open_savefile(linktype, snaplen, swapped)
        except OSError as e:
            raise FilterError(expr, str(e) or f"libpcap cannot open a savefile of linktype {linktype}",
                              linktype) from None
        try:
            rc = lib.pcap_compile(handle, ctypes.byref(self._prog), expr.encode(), 1, SAVEFILE_NETMASK)
            if rc != 0:
                raise FilterError(expr, lib.pcap_geterr(handle).decode(errors="replace"), linktype)
        finally:
            lib.pcap_close(handle)
        self._compiled = True
        self._columns: tuple[np.ndarray, ...] | None = None
        self._vm_ok: bool | None = None  # every opcode is one bpfvm executes (else libpcap runs the batch)
        self._native = None  # the program compiled to native code (bpfc.py), where it can be

    def __del__(self) -> None:
        if getattr(self, "_compiled", False):
            self._lib.pcap_freecode(ctypes.byref(self._prog))
            self._compiled = False

    @property
    def instructions(self) -> list[tuple[int, int, int, int]]:
        """The program as (code, jt, jf, k) tuples (what ``tcpdump -ddd`` prints)."""
        p = self._prog
        return [(p.bf_insns[i].code, p.bf_insns[i].jt, p.bf_insns[i].jf, p.bf_insns[i].k) for i in range(p.bf_len)]

    @property
    def kernel_compatible(self) -> bool:
        """False when the program has a backward jump (``protochain``): Linux SO_ATTACH_FILTER rejects it and
        libpcap silently falls back to filtering in userland (ecosystem.md section 1a)."""
        for pc, (code, _jt, _jf, k) in enumerate(self.instructions):
            if code == 0x05 and (k >= 0x80000000 or pc + 1 + k < 0):  # BPF_JMP|BPF_JA with a negative offset
                return False
        return True

    def matches(self, data: bytes | bytearray | memoryview, wirelen: int | None = None) -> bool:
        """Run the program on one packet; ``wirelen`` is the true original length (defaults to len(data))."""
        buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
        self._hdr.caplen = len(data)
        self._hdr.len = len(data) if wirelen is None else int(wirelen)
        return self._lib.pcap_offline_filter(ctypes.byref(self._prog), ctypes.byref(self._hdr), buf) != 0

    @property
    def program(self) -> tuple[np.ndarray, ...]:
        """The instructions as columns for the compiled interpreter (bpfvm.py)."""
        if self._columns is None:
            self._columns = bpfvm.program_columns(self.instructions)
        return self._columns

    def _batch_args(self, buf, offsets, caplens) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        arr = np.ascontiguousarray(buf, dtype=np.uint8)
        offs = np.asarray(offsets, dtype=np.int64)
        caps = np.asarray(caplens, dtype=np.int64)
        if len(offs) and (int(offs.min()) < 0 or int((offs + caps).max()) > arr.shape[0]):
            raise ValueError("a packet lies outside the buffer")
        return arr, offs, caps

    def match_batch(self, buf: np.ndarray, offsets: Sequence[int] | np.ndarray, caplens: Sequence[int] | np.ndarray,
                    wirelens: Sequence[int] | np.ndarray) -> np.ndarray:
        """Verdicts for packets ``buf[offsets[i] : offsets[i] + caplens[i]]`` with original lengths ``wirelens``.

        Runs this program as native code (bpfc.py, compiled once per program), else on the compiled interpreter
        (bpfvm.py, ~15-30 ns per packet); ``match_batch_libpcap``
        runs it on libpcap's own ``bpf_filter`` (~0.55 us per packet through ctypes), the tests' oracle, and is
        used instead for a program with an opcode the interpreter does not know.
        """
        if self._native_fn() is None and not self._vm_ok:
            return self.match_batch_libpcap(buf, offsets, caplens, wirelens)
        arr, offs, caps = self._batch_args(buf, offsets, caplens)
        if self._native is not None:
            return bpfc.run(self._native, arr, offs, caps, wirelens) != 0
        return bpfvm.match_batch(self.program, arr, offs, caps, np.asarray(wirelens, dtype=np.int64))

    def _native_fn(self):
        """The native ``bpf_batch`` of this program, or None (bpfvm or libpcap runs it)."""
        if self._vm_ok is None:
            self._vm_ok = bpfvm.supported(self.instructions)
            self._native = bpfc.native(self.instructions) if self._vm_ok else None
        return self._native

    def match_batch_libpcap(self, buf: np.ndarray, offsets: Sequence[int] | np.ndarray,
                            caplens: Sequence[int] | np.ndarray, wirelens: Sequence[int] | np.ndarray) -> np.ndarray:
        """``match_batch`` on libpcap's ``bpf_filter``, one ctypes call per packet (read in place, no copy)."""
        arr, offs, caps = self._batch_args(buf, offsets, caplens)
        out = np.zeros(len(offs), dtype=bool)
        if len(offs) == 0:
            return out
        f = self._lib.bpf_filter
        insns = self._prog.bf_insns
        addrs = (offs + arr.ctypes.data).tolist()
        res = [f(insns, a, w, c) for a, w, c in zip(addrs, np.asarray(wirelens).tolist(), caps.tolist())]
        out[:] = np.asarray(res, dtype=np.uint64) != 0
        return out


class FilterGroup:
    """Several compiled filters run on the same packets: fused into one native pass over them when every one runs
    natively (bpfc.native_multi), so a packet's bytes are read once, not once per program; one pass per filter
    otherwise. The same verdicts either way (``tests/audit/test_bpfvm.py`` holds both against libpcap)."""

    def __init__(self, filters: list[CompiledFilter]):
        self.filters = list(filters)
        natively = len(self.filters) > 1 and all(f._native_fn() is not None for f in self.filters)
        self._fn = bpfc.native_multi([f.instructions for f in self.filters]) if natively else None

    def match_batch(self, buf: np.ndarray, offsets: np.ndarray, caplens: np.ndarray,
                    wirelens: np.ndarray) -> list[np.ndarray]:
        """``[f.match_batch(...) for f in filters]``."""
        if self._fn is None:
            return [f.match_batch(buf, offsets, caplens, wirelens) for f in self.filters]
        arr, offs, caps = self.filters[0]._batch_args(buf, offsets, caplens)
        return list(bpfc.run_multi(self._fn, len(self.filters), arr, offs, caps, wirelens))


class FilterSet:
    """One expression compiled lazily for each (linktype, writer byte order) met (a pcapng file may mix
    linktypes). Keys are ``linktypes.compile_key`` values."""

    def __init__(self, expr: str, snaplen: int = DEFAULT_SNAPLEN):
        self.expr = expr
        self.snaplen = snaplen
        self._by_key: dict[int, CompiledFilter] = {}

    def for_linktype(self, linktype: int, swapped: bool = False) -> CompiledFilter:
        """The program for frames of ``linktype`` (raises FilterError with the link type on rejection)."""
        key = LT.compile_key(linktype, swapped)
        f = self._by_key.get(key)
        if f is None:
            f = self._by_key[key] = CompiledFilter(self.expr, int(linktype), self.snaplen, swapped)
        return f

    def for_key(self, key: int) -> CompiledFilter:
        """``for_linktype`` by compile key."""
        return self.for_linktype(*LT.split_key(key))

    def match_batch(self, buf: np.ndarray, offsets: np.ndarray, caplens: np.ndarray, wirelens: np.ndarray,
                    linktypes: np.ndarray) -> np.ndarray:
        """Like ``CompiledFilter.match_batch`` with a per-packet linktype column."""
        out = np.zeros(len(offsets), dtype=bool)
        buf = np.ascontiguousarray(buf, dtype=np.uint8)
        offsets, caplens = np.asarray(offsets, np.int64), np.asarray(caplens, np.int64)
        keys = LT.compile_keys(np.asarray(linktypes), buf, offsets, caplens)
        for key in np.flatnonzero(np.bincount(keys)).tolist():  # np.unique imports numpy.ma
            sel = np.flatnonzero(keys == key)
            out[sel] = self.for_key(key).match_batch(buf, offsets[sel], caplens[sel], np.asarray(wirelens)[sel])
        return out
