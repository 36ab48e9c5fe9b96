"""Classic BPF programs compiled to native code: each libpcap program becomes one C function, built once.

libpcap compiles a filter expression to cBPF (libpcap.py); bpfvm.py interprets those instructions, ~30 ns per
packet and program, which made the default audit (three filters, each run on the raw frames, their normalized
copies and the rewritten candidates) about half of an analysis of a BIG TCP receiver capture. A cBPF program
without backward jumps is straight-line code with forward branches, so it translates one instruction to one C
statement (a label per instruction, ``goto`` for the jumps); the C compiler then keeps A and X in registers
and folds the byte loads, ~3-5 ns per packet.

Semantics are those of libpcap's ``bpf_filter`` (bpf_filter.c), as bpfvm implements them: unsigned 32-bit A
and X, 16 scratch words cleared per packet, big-endian loads, and a return of 0 for a load outside the captured
bytes, a division or modulo by zero, an unknown opcode, a jump off the program or running off its end.
A program with a backward jump (``protochain``'s loop) counts its steps and rejects past bpfvm's limit, as
bpfvm does.

A program is compiled with the system C compiler (``$CC`` or ``cc``) into a shared object named by the digest of
its C source, in ``$BIGTCP_PCAP_CACHE`` (default ``~/.cache/bigtcp-pcap``)``/bpf``, and loaded with ctypes; a
later run loads it without compiling. Without a compiler, or when compiling fails, ``native`` returns None and
the caller keeps bpfvm. ``tests/audit/test_bpfvm.py`` holds both against libpcap's own ``bpf_filter``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .bpfvm import KNOWN_OPCODES, MAX_STEPS

ENV_CACHE = "BIGTCP_PCAP_CACHE"
ENV_DISABLE = "BIGTCP_PCAP_NO_NATIVE_BPF"  # "1": always interpret (bpfvm)
_LOADED: dict[str, Callable | None] = {}

_LOADERS = """#include <stdint.h>
static inline uint32_t ld4(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]; }
static inline uint32_t ld2(const uint8_t *p) { return ((uint32_t)p[0] << 8) | p[1]; }
"""
_FUNC = """static inline uint32_t {name}(const uint8_t *P, uint64_t cap, uint32_t wl) {{
    uint32_t A = 0, X = 0;
    uint32_t M[16] = {{0}};
    (void)M; (void)X; (void)wl;
"""
_TAIL = """void bpf_batch(const uint8_t *buf, const int64_t *off, const int64_t *cap, const int64_t *wl, int64_t n,
               uint32_t *out) {
    for (int64_t i = 0; i < n; i++)
        out[i] = run1(buf + off[i], (uint64_t)cap[i], (uint32_t)wl[i]);
}
"""
_SIZE = {0x20: 4, 0x28: 2, 0x30: 1, 0x40: 4, 0x48: 2, 0x50: 1}
_LOAD = {4: "ld4", 2: "ld2", 1: ""}
_ALU = {0x00: "+", 0x10: "-", 0x20: "*", 0x30: "/", 0x90: "%", 0x50: "&", 0x40: "|", 0xA0: "^", 0x60: "<<",
        0x70: ">>"}
_JMP = {0x10: "==", 0x20: ">", 0x30: ">=", 0x40: "&"}


def translatable(instructions: list[tuple[int, int, int, int]]) -> bool:
    """Known opcodes only (as bpfvm): the programs this module compiles."""
    return all(c in KNOWN_OPCODES for c, _jt, _jf, _k in instructions)


def _backward(instructions: list[tuple[int, int, int, int]]) -> bool:
    return any(c == 0x05 and (k & 0xFFFFFFFF) >= 0x80000000 for c, _jt, _jf, k in instructions)


def c_source(instructions: list[tuple[int, int, int, int]]) -> str:
    """The C function ``bpf_batch`` for one program (see the module docstring for the semantics)."""
    return _LOADERS + _function(instructions, "run1") + _TAIL


_MULTI_TAIL = """void bpf_multi(const uint8_t *buf, const int64_t *off, const int64_t *cap, const int64_t *wl, int64_t n,
               uint8_t *out) {
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *P = buf + off[i];
        uint64_t c = (uint64_t)cap[i];
        uint32_t w = (uint32_t)wl[i];
%s    }
}
"""


def c_source_multi(programs: list[list[tuple[int, int, int, int]]]) -> str:
    """The C function ``bpf_multi``: every program on each packet in turn, ``out[j * n + i]`` = program j's verdict
    (return value != 0) on packet i. One pass over the packets instead of one per program: a packet's bytes are
    read from memory once (the programs of the default audit read the same few header bytes)."""
    calls = "".join(f"        out[{j} * n + i] = run{j}(P, c, w) != 0;\n" for j in range(len(programs)))
    return _LOADERS + "".join(_function(ins, f"run{j}") for j, ins in enumerate(programs)) + _MULTI_TAIL % calls


def _function(instructions: list[tuple[int, int, int, int]], name: str) -> str:
    """One program as ``static inline uint32_t name(P, cap, wl)``."""
    n = len(instructions)
    out = [_FUNC.format(name=name)]
    # a backward jump (protochain's loop): count the steps as bpfvm does and reject past its limit
    step = f"if (steps++ >= {MAX_STEPS}) return 0; " if _backward(instructions) else ""
    if step:
        out.append("    uint32_t steps = 0;\n")

    def goto(t: int) -> str:
        return f"goto L{t};" if 0 <= t < n else "return 0;"

    for pc, (c, jt, jf, k) in enumerate(instructions):
        k &= 0xFFFFFFFF
        cls = c & 7
        s: str
        if c == 0x16:
            s = "return A;"
        elif c == 0x06:
            s = f"return {k}u;"
        elif c in (0x20, 0x28, 0x30):  # LD ABS
            size = _SIZE[c]
            s = (f"if ({k}ull + {size} > cap) return 0; A = {_LOAD[size]}(P + {k}ull);" if size > 1
                 else f"if ({k}ull + 1 > cap) return 0; A = P[{k}ull];")
        elif c in (0x40, 0x48, 0x50):  # LD IND: X + k, without wrapping (as bpf_filter checks it)
            size = _SIZE[c]
            at = f"(uint64_t)X + {k}ull"
            s = f"if ({at} + {size} > cap) return 0; A = {_LOAD[size]}(P + {at});" if size > 1 else \
                f"if ({at} + 1 > cap) return 0; A = P[{at}];"
        elif c == 0xB1:  # LDX MSH
            s = f"if ({k}ull + 1 > cap) return 0; X = (P[{k}ull] & 0xF) << 2;"
        elif c in (0x80, 0x81):  # LD/LDX LEN
            s = ("A" if c == 0x80 else "X") + " = wl;"
        elif c in (0x00, 0x01):  # LD/LDX IMM
            s = ("A" if c == 0x00 else "X") + f" = {k}u;"
        elif c in (0x60, 0x61):  # LD/LDX MEM
            s = (("A" if c == 0x60 else "X") + f" = M[{k}];") if k < 16 else "return 0;"
        elif c in (0x02, 0x03):  # ST, STX
            s = (f"M[{k}] = " + ("A;" if c == 0x02 else "X;")) if k < 16 else "return 0;"
        elif cls == 4:  # ALU
            op = c & 0xF0
            if op == 0x80:
                s = "return 0;" if c & 0x08 else "A = -A;"
            else:
                v = "X" if c & 0x08 else f"{k}u"
                sym = _ALU[op]
                if op in (0x30, 0x90):
                    s = (f"if (X == 0) return 0; A = A {sym} X;" if c & 0x08 else
                         ("return 0;" if k == 0 else f"A = A {sym} {v};"))
                elif op in (0x60, 0x70):
                    s = (f"A = X < 32 ? A {sym} X : 0;" if c & 0x08 else
                         (f"A = A {sym} {k};" if k < 32 else "A = 0;"))
                else:
                    s = f"A = A {sym} {v};"
        elif c == 0x05:  # JA: a signed 32-bit offset
            s = goto(pc + 1 + (k - (1 << 32) if k >= 0x80000000 else k))
        elif cls == 5:  # conditional jumps
            v = "X" if c & 0x08 else f"{k}u"
            op = c & 0xF0
            cond = f"(A & {v}) != 0" if op == 0x40 else f"A {_JMP[op]} {v}"
            s = f"if ({cond}) {goto(pc + 1 + jt)} else {goto(pc + 1 + jf)}"
        elif c == 0x07:
            s = "X = A;"
        elif c == 0x87:
            s = "A = X;"
        else:  # not reached: translatable() admits known opcodes only
            s = "return 0;"
        out.append(f"L{pc}: {step}{s}\n")
    out.append("return 0;\n}\n")  # ran off the end
    return "".join(out)


def cache_dir() -> Path:
    root = os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "bigtcp-pcap")
    return Path(root) / "bpf"


def _compiler() -> str | None:
    cc = os.environ.get("CC", "cc")
    return shutil.which(cc.split()[0]) if cc else None


def native(instructions: list[tuple[int, int, int, int]]) -> Callable | None:
    """The compiled ``bpf_batch`` of a program (ctypes function), or None where it cannot be had (an opcode
    bpfvm does not know either, no C compiler, a failed build, ``BIGTCP_PCAP_NO_NATIVE_BPF=1``)."""
    if os.environ.get(ENV_DISABLE) == "1" or not translatable(instructions):
        return None
    return _load(c_source(instructions), "bpf_batch")


def native_multi(programs: list[list[tuple[int, int, int, int]]]) -> Callable | None:
    """The compiled ``bpf_multi`` of several programs (``c_source_multi``), or None as ``native``."""
    if os.environ.get(ENV_DISABLE) == "1" or not all(translatable(p) for p in programs):
        return None
    return _load(c_source_multi(programs), "bpf_multi")


def _load(src: str, symbol: str) -> Callable | None:
    """The function ``symbol`` of ``src`` built once into the cache (by the digest of the source) and loaded."""
    digest = hashlib.sha256(src.encode()).hexdigest()[:32]
    if digest in _LOADED:
        return _LOADED[digest]
    fn = None
    try:
        so = cache_dir() / f"{digest}.so"
        if not so.exists():
            so = _build(src, so)
        if so is not None:
            fn = getattr(ctypes.CDLL(str(so)), symbol)
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                           ctypes.c_void_p]
    except (OSError, AttributeError, subprocess.SubprocessError):  # an unwritable cache, a compiler that hangs
        fn = None
    _LOADED[digest] = fn
    return fn


def _build(src: str, so: Path) -> Path | None:
    cc = _compiler()
    if cc is None:
        return None
    so.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=so.parent) as tmp:
        c_file, tmp_so = Path(tmp) / "prog.c", Path(tmp) / "prog.so"
        c_file.write_text(src)
        r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-w", "-o", str(tmp_so), str(c_file)],
                           capture_output=True, timeout=60, check=False)
        if r.returncode != 0 or not tmp_so.exists():
            return None
        os.replace(tmp_so, so)  # atomic: a concurrent run sees the whole file or none
    return so


def run(fn: Callable, buf: np.ndarray, off: np.ndarray, caplen: np.ndarray, wirelen: np.ndarray) -> np.ndarray:
    """The program's return value per packet ``buf[off[i]:off[i] + caplen[i]]`` (uint32)."""
    return _call(fn, np.zeros(len(off), np.uint32), buf, off, caplen, wirelen)


def run_multi(fn: Callable, k: int, buf: np.ndarray, off: np.ndarray, caplen: np.ndarray,
              wirelen: np.ndarray) -> np.ndarray:
    """The verdicts of the ``k`` programs of ``fn`` (``native_multi``) per packet: bool (k, n)."""
    return _call(fn, np.zeros((k, len(off)), np.uint8), buf, off, caplen, wirelen).view(np.bool_)


def _call(fn: Callable, out: np.ndarray, buf: np.ndarray, off: np.ndarray, caplen: np.ndarray,
          wirelen: np.ndarray) -> np.ndarray:
    n = len(off)
    if n:
        b = np.ascontiguousarray(buf, dtype=np.uint8)
        o = np.ascontiguousarray(off, dtype=np.int64)
        c = np.ascontiguousarray(caplen, dtype=np.int64)
        w = np.ascontiguousarray(wirelen, dtype=np.int64)
        fn(b.ctypes.data, o.ctypes.data, c.ctypes.data, w.ctypes.data, n, out.ctypes.data)
    return out
