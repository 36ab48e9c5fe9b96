"""A compiled classic-BPF interpreter for the programs libpcap compiles: one call runs a program on a batch.

libpcap compiles every filter (``pcap_compile``, libpcap.py); this only executes the resulting instructions,
with the semantics of libpcap's own interpreter (``bpf_filter``, bpf_filter.c): unsigned 32-bit registers A and
X, 16 scratch words, big-endian loads, and a rejection (0) for a load outside the captured bytes, a division
or modulo by zero, an unknown opcode or a jump off the program. Linux ancillary loads (``SKF_AD_OFF + n``) are
out of range here as they are in libpcap's offline filter, which passes no auxiliary data. Backward jumps
(``protochain``) are followed up to a step limit, after which the packet is rejected; libpcap's programs
terminate long before.

Why: the audit runs up to a dozen programs over every frame BIG TCP can affect. Called through ctypes, one
``bpf_filter`` call cost ~0.6 us, which made the default audit 3-4x the rest of an analysis on a receiver-side
BIG TCP capture. ``tests/audit/test_bpfvm.py`` checks this interpreter against libpcap's ``bpf_filter`` on the
kernel captures for a set of expressions covering every instruction class libpcap emits.
"""

from __future__ import annotations

import numpy as np

from .._native import njit

# opcode classes (bpf.h)
LD, LDX, ST, STX, ALU, JMP, RET, MISC = range(8)
MAX_STEPS = 1 << 16


@njit(cache=True, inline="always")
def _load(p, end, k, size):
    """Big-endian load of ``size`` bytes at packet offset k (buffer position p + k); -1 when out of range."""
    if k + size > end:
        return np.int64(-1)
    u = np.uint64(k)
    if size == 1:
        return np.int64(p[u])
    if size == 2:
        return (np.int64(p[u]) << 8) | np.int64(p[u + np.uint64(1)])
    return (np.int64(p[u]) << 24) | (np.int64(p[u + np.uint64(1)]) << 16) | (np.int64(p[u + np.uint64(2)]) << 8) \
        | np.int64(p[u + np.uint64(3)])


@njit(cache=True, entry=True,
      sig=["i64[::1], i64[::1], i64[::1], i64[::1], u8[::1], i64[::1], i64[::1], i64[::1], i64[::1], i64[::1]",
           "i64[::1], i64[::1], i64[::1], i64[::1], ro u8[::1], i64[::1], i64[::1], i64[::1], i64[::1], i64[::1]"
           ])  # a writable buffer, or the audit's read-only normalized copy
def run_batch(code, jt, jf, kk, buf, off, caplen, wirelen, mem, out):
    """out[i] = the program's return value for packet i (``buf[off[i]:off[i] + caplen[i]]``, length wirelen[i]).

    code/jt/jf/kk: the instructions as int64 columns (k as an unsigned 32-bit value); mem: 16 int64 of scratch
    (the kernels do not allocate)."""
    M32 = np.int64(0xFFFFFFFF)
    n_ins = code.shape[0]
    for i in range(off.shape[0]):
        base = np.int64(off[i])
        end = base + np.int64(caplen[i])
        wl = np.int64(wirelen[i])
        a = np.int64(0)
        x = np.int64(0)
        for m in range(16):
            mem[m] = 0
        pc = np.int64(0)
        ret = np.int64(0)
        steps = 0
        while True:
            if pc < 0 or pc >= n_ins or steps >= MAX_STEPS:
                ret = 0
                break
            steps += 1
            c = code[pc]
            k = kk[pc]
            cls = c & 7
            if cls == RET:
                ret = a if c == 0x16 else (k if c == 0x06 else 0)  # RET A, RET K
                break
            elif cls == LD or cls == LDX:
                # exactly the load opcodes libpcap's interpreter accepts; any other is a rejection there too
                if c == 0x20 or c == 0x28 or c == 0x30:  # LD W/H/B ABS
                    v = _load(buf, end, base + k, 4 if c == 0x20 else (2 if c == 0x28 else 1))
                elif c == 0x40 or c == 0x48 or c == 0x50:  # LD W/H/B IND
                    v = _load(buf, end, base + x + k, 4 if c == 0x40 else (2 if c == 0x48 else 1))
                elif c == 0xB1:  # LDX MSH: 4 * (P[k] & 0xf)
                    v = _load(buf, end, base + k, 1)
                    if v >= 0:
                        v = (v & 0xF) << 2
                elif c == 0x80 or c == 0x81:  # LD/LDX LEN
                    v = wl & M32
                elif c == 0x00 or c == 0x01:  # LD/LDX IMM
                    v = k
                elif c == 0x60 or c == 0x61:  # LD/LDX MEM
                    v = mem[k] if k < 16 else np.int64(-1)
                else:
                    v = np.int64(-1)
                if v < 0:
                    ret = 0
                    break
                if cls == LD:
                    a = v
                else:
                    x = v
                pc += 1
            elif c == 0x02 or c == 0x03:  # ST, STX
                if k >= 16:
                    ret = 0
                    break
                mem[k] = a if cls == ST else x
                pc += 1
            elif cls == ALU:
                op = c & 0xF0
                if (c & 0x08) and op == 0x80:
                    ret = 0
                    break
                v = x if (c & 0x08) else k
                if op == 0x00:
                    a = (a + v) & M32
                elif op == 0x10:
                    a = (a - v) & M32
                elif op == 0x20:
                    a = (a * v) & M32
                elif op == 0x30:
                    if v == 0:
                        ret = 0
                        break
                    a = a // v
                elif op == 0x90:
                    if v == 0:
                        ret = 0
                        break
                    a = a % v
                elif op == 0x50:
                    a = a & v
                elif op == 0x40:
                    a = a | v
                elif op == 0xA0:
                    a = a ^ v
                elif op == 0x60:
                    a = ((a << v) & M32) if v < 32 else 0
                elif op == 0x70:
                    a = (a >> v) if v < 32 else 0
                elif op == 0x80:
                    a = (-a) & M32
                else:
                    ret = 0
                    break
                pc += 1
            elif cls == JMP:
                op = c & 0xF0
                if c == 0x0D:
                    ret = 0
                    break
                if op == 0x00:  # JA: a signed 32-bit offset
                    off32 = k - 0x100000000 if k >= 0x80000000 else k
                    pc += 1 + off32
                    continue
                v = x if (c & 0x08) else k
                if op == 0x10:
                    cond = a == v
                elif op == 0x20:
                    cond = a > v
                elif op == 0x30:
                    cond = a >= v
                elif op == 0x40:
                    cond = (a & v) != 0
                else:
                    ret = 0
                    break
                pc += 1 + (jt[pc] if cond else jf[pc])
            elif cls == MISC:
                if c == 0x87:  # TXA
                    a = x
                elif c == 0x07:  # TAX
                    x = a
                else:
                    ret = 0
                    break
                pc += 1
            else:
                ret = 0
                break
        out[i] = ret


# every opcode libpcap's interpreter executes (bpf_filter.c; the same list as its validator's); run_batch
# implements exactly these
KNOWN_OPCODES = frozenset({
    0x06, 0x16,  # RET K, RET A
    0x20, 0x28, 0x30, 0x40, 0x48, 0x50, 0x80, 0x00, 0x60,  # LD W/H/B ABS, W/H/B IND, LEN, IMM, MEM
    0x81, 0xB1, 0x01, 0x61,  # LDX LEN, MSH, IMM, MEM
    0x02, 0x03,  # ST, STX
    0x05, 0x15, 0x1D, 0x25, 0x2D, 0x35, 0x3D, 0x45, 0x4D,  # JA, JEQ/JGT/JGE/JSET with K and X
    *(0x04 | op | src for op in (0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x90, 0xA0) for src in (0, 8)),
    0x84,  # NEG
    0x07, 0x87,  # TAX, TXA
})


def supported(instructions: list[tuple[int, int, int, int]]) -> bool:
    """True when every instruction is one this interpreter executes like libpcap (a newer libpcap could emit
    others; such a program is then run by libpcap itself)."""
    return all(code in KNOWN_OPCODES for code, _jt, _jf, _k in instructions)


def program_columns(instructions: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, ...]:
    """(code, jt, jf, k) columns for ``run_batch`` from libpcap's instructions."""
    ins = np.asarray(instructions, dtype=np.int64).reshape(-1, 4)
    return tuple(np.ascontiguousarray(ins[:, j]) for j in range(4))


def match_batch(program: tuple[np.ndarray, ...], buf: np.ndarray, off: np.ndarray, caplen: np.ndarray,
                wirelen: np.ndarray) -> np.ndarray:
    """Verdicts (non-zero return) of ``program`` for packets ``buf[off[i]:off[i] + caplen[i]]``."""
    n = len(off)
    out = np.zeros(n, np.int64)
    if n:
        run_batch(*program, np.ascontiguousarray(buf, dtype=np.uint8), np.ascontiguousarray(off, dtype=np.int64),
                  np.ascontiguousarray(caplen, dtype=np.int64), np.ascontiguousarray(wirelen, dtype=np.int64),
                  np.zeros(16, np.int64), out)
    return out != 0
