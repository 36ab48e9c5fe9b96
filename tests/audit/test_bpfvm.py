"""The compiled cBPF interpreter (bpfvm) and the native translation (bpfc) against libpcap's own ``bpf_filter``
(the oracle, called through ctypes)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from bigtcp_pcap.audit import bpfc, bpfvm
from bigtcp_pcap.audit.libpcap import BpfInsn, CompiledFilter, FilterError, FilterGroup, load
from bigtcp_pcap.capture import CaptureReader

KERNEL = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"

# every instruction class libpcap emits: absolute and indirect loads of each size, MSH (IPv4 header length),
# LEN, ALU with constants, JSET, scratch memory and backward jumps (protochain), on IPv4/IPv6/VLAN/tunnels
EXPRESSIONS = [
    "tcp", "ip6 and tcp", "tcp port 5201", "ip6 protochain 6", "ip protochain 6", "tcp[13] & 2 != 0",
    "tcp[tcpflags] & (tcp-syn|tcp-fin) != 0", "len > 1000", "greater 65536", "less 100", "ip[2:2] > 100",
    "vlan and tcp", "ip6[6] == 0", "ether[0] & 1 = 0", "udp port 4789", "ip and (ip[6:2] & 0x1fff) = 0",
    "icmp6", "not tcp", "tcp[((tcp[12] & 0xf0) >> 2):4] = 0x47455420", "ip[0] & 0xf > 5", "portrange 5000-5300",
    "ip6 and tcp[20:2] > 0", "(tcp[2:2] + tcp[0:2]) % 7 = 3", "ip[8] * 2 - 1 > 100", "ip6 multicast",
]


def _values(backend: str, prog, buf, offs, caps, wires) -> list[int]:
    """A program's return values on one backend: "vm" (bpfvm.run_batch) or "native" (bpfc)."""
    if backend == "native":
        fn = bpfc.native(prog)
        assert fn is not None, "no native build: is a C compiler (cc) installed?"
        return bpfc.run(fn, buf, offs, caps, wires).astype(np.int64).tolist()
    got = np.zeros(len(offs), np.int64)
    bpfvm.run_batch(*bpfvm.program_columns(prog), buf, offs, caps, wires, np.zeros(16, np.int64), got)
    return got.tolist()


@pytest.fixture(params=["vm", "native"])
def backend(request, monkeypatch):
    """Which path ``CompiledFilter.match_batch`` takes: the interpreter, or native code where it translates."""
    if request.param == "vm":
        monkeypatch.setenv(bpfc.ENV_DISABLE, "1")
    else:
        monkeypatch.delenv(bpfc.ENV_DISABLE, raising=False)
    return request.param


def _captures() -> list[Path]:
    caps = sorted(p for p in KERNEL.rglob("*.pcap*") if p.is_file())
    assert len(caps) >= 40
    return caps


def test_libpcap_programs_on_the_kernel_captures(backend):
    compared = mismatched = native = runs = 0
    for cap in _captures():
        for rb in CaptureReader(cap):
            for lt in np.unique(rb.linktype).tolist():
                sel = np.flatnonzero(rb.linktype == lt)
                for expr in EXPRESSIONS:
                    try:
                        cf = CompiledFilter(expr, lt)
                    except FilterError:  # an expression that does not apply to this linktype
                        continue
                    args = (rb.buf, rb.off[sel], rb.caplen[sel], rb.wirelen[sel])
                    ref, got = cf.match_batch_libpcap(*args), cf.match_batch(*args)
                    native += cf._native is not None
                    runs += 1
                    compared += len(sel)
                    mismatched += int((ref != got).sum())
                    assert (ref == got).all(), (cap.name, expr, np.flatnonzero(ref != got)[:5])
    assert compared > 250_000 and mismatched == 0
    # every program ran as native code on that backend (protochain's backward jumps too)
    assert (native == runs) if backend == "native" else (native == 0)


def test_fused_programs_give_each_programs_libpcap_verdicts(backend):
    """``FilterGroup`` runs several programs in one native pass over the packets (``bpfc.native_multi``) and
    falls back to one pass per program elsewhere: either way each program's verdicts are libpcap's own."""
    fused = 0
    for cap in _captures()[::4]:
        for rb in CaptureReader(cap):
            for lt in np.unique(rb.linktype).tolist():
                sel = np.flatnonzero(rb.linktype == lt)
                filters = []
                for expr in EXPRESSIONS:
                    try:
                        filters.append(CompiledFilter(expr, lt))
                    except FilterError:
                        continue
                args = (rb.buf, rb.off[sel], rb.caplen[sel], rb.wirelen[sel])
                got = FilterGroup(filters).match_batch(*args)
                assert len(got) == len(filters)
                for cf, g in zip(filters, got, strict=True):
                    ref = cf.match_batch_libpcap(*args)
                    assert g.dtype == np.bool_ and (g == ref).all(), (cap.name, cf.expr)
                fused += bpfc.native_multi([f.instructions for f in filters]) is not None
    assert (fused > 0) if backend == "native" else (fused == 0)


def _libpcap_values(prog: list[tuple[int, int, int, int]], packets: list[tuple[bytes, int]]) -> list[int]:
    lib = load()
    insns = (BpfInsn * len(prog))(*[BpfInsn(c, jt, jf, k) for c, jt, jf, k in prog])
    out = []
    for data, wirelen in packets:
        buf = (ctypes.c_ubyte * max(len(data), 1)).from_buffer_copy(data or b"\0")
        out.append(int(lib.bpf_filter(insns, ctypes.addressof(buf), wirelen, len(data))))
    return out


def _random_program(rng: np.random.Generator, n: int) -> list[tuple[int, int, int, int]]:
    """A valid program: scratch memory initialized first (libpcap 1.10 leaves it undefined), forward jumps only,
    shifts below 32 and no constant division by zero (which libpcap 1.10 would execute), ending in RET A."""
    prog = [(0x02, 0, 0, m) for m in range(16)]  # ST M[m] (A = 0)
    for _ in range(n):
        r = int(rng.integers(0, 14))
        k32 = int(rng.integers(0, 1 << 32))
        if r == 0:
            prog.append((int(rng.choice([0x20, 0x28, 0x30])), 0, 0, int(rng.integers(0, 90))))  # LD ABS
        elif r == 1:
            prog.append((int(rng.choice([0x40, 0x48, 0x50])), 0, 0, int(rng.integers(0, 60))))  # LD IND
        elif r == 2:
            prog.append((0xB1, 0, 0, int(rng.integers(0, 60))))  # LDX MSH
        elif r == 3:
            prog.append((int(rng.choice([0x00, 0x01])), 0, 0, int(rng.choice([k32, int(rng.integers(0, 40))]))))
        elif r == 4:
            prog.append((int(rng.choice([0x80, 0x81])), 0, 0, 0))  # LD/LDX LEN
        elif r == 5:
            prog.append((int(rng.choice([0x60, 0x61, 0x02, 0x03])), 0, 0, int(rng.integers(0, 16))))  # MEM
        elif r in (6, 7):
            op = int(rng.choice([0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x90, 0xA0]))
            if op in (0x60, 0x70):  # shifts: a constant below 32, or X set below 32 first
                if rng.random() < 0.5:
                    prog.append((0x04 | op, 0, 0, int(rng.integers(0, 32))))
                else:
                    prog += [(0x01, 0, 0, int(rng.integers(0, 32))), (0x0C | op, 0, 0, 0)]
            elif op in (0x30, 0x90) and rng.random() < 0.5:
                prog.append((0x04 | op, 0, 0, int(rng.integers(1, 1 << 32))))  # constant divisor, not 0
            else:
                prog.append(((0x0C if op in (0x30, 0x90) else int(rng.choice([0x04, 0x0C]))) | op, 0, 0, k32))
        elif r == 8:
            prog.append((0x84, 0, 0, 0))  # NEG
        elif r == 9:
            prog.append((int(rng.choice([0x07, 0x87])), 0, 0, 0))  # TAX, TXA
        elif r in (10, 11, 12):
            op = int(rng.choice([0x10, 0x20, 0x30, 0x40]))
            prog.append((0x05 | op | int(rng.choice([0x00, 0x08])), -1, -1,
                         int(rng.choice([k32, int(rng.integers(0, 300))]))))
        else:
            prog.append((int(rng.choice([0x06, 0x16])), 0, 0, int(rng.integers(0, 1 << 32))))  # RET K / A
    prog.append((0x16, 0, 0, 0))
    last = len(prog) - 1
    out = []
    for pc, (c, jt, jf, k) in enumerate(prog):
        if jt == -1:  # a conditional jump: targets forward, inside the program
            room = min(255, last - pc - 1)
            jt, jf = int(rng.integers(0, room + 1)), int(rng.integers(0, room + 1))
        out.append((c, jt, jf, k))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_random_programs_return_libpcaps_values(seed, backend):
    rng = np.random.default_rng(seed)
    packets = []
    for _ in range(60):
        n = int(rng.integers(0, 110))
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        packets.append((data, n + int(rng.integers(0, 3)) * int(rng.integers(0, 100000))))
    buf = np.frombuffer(b"".join(d for d, _ in packets), np.uint8)
    caps = np.array([len(d) for d, _ in packets], np.int64)
    offs = np.concatenate([[0], np.cumsum(caps)[:-1]]).astype(np.int64)
    wires = np.array([w for _, w in packets], np.int64)
    nonzero = 0
    for _ in range(40):
        prog = _random_program(rng, int(rng.integers(5, 60)))
        got = _values(backend, prog, buf, offs, caps, wires)
        ref = _libpcap_values(prog, packets)
        assert got == ref, prog
        nonzero += sum(1 for v in ref if v)
    assert nonzero > 100  # the programs do accept packets, with various return values


def test_a_jump_off_the_program_or_an_unknown_opcode_rejects(backend):
    buf = np.zeros(64, np.uint8)
    one = np.zeros(1, np.int64)
    for prog in ([(0x05, 0, 0, 5), (0x06, 0, 0, 1)],  # JA beyond the end
                 [(0x15, 7, 7, 0), (0x06, 0, 0, 1)],  # a conditional jump beyond the end
                 [(0x05, 0, 0, 0xFFFFFFFE), (0x06, 0, 0, 1)],  # JA before the start
                 [(0x05, 0, 0, 0xFFFFFFFF), (0x06, 0, 0, 1)],  # JA to itself: the step limit ends it
                 [(0xFF, 0, 0, 0), (0x06, 0, 0, 1)],  # no such opcode
                 [(0x00, 0, 0, 7)],  # falls off the end without a RET
                 [(0x00, 0, 0, 7), (0x34, 0, 0, 0), (0x16, 0, 0, 0)],  # A / 0
                 [(0x00, 0, 0, 7), (0x60, 0, 0, 16), (0x16, 0, 0, 0)]):  # scratch word 16
        if backend == "native" and not bpfc.translatable(prog):
            assert bpfc.native(prog) is None  # left to the interpreter
            continue
        assert _values(backend, prog, buf, one, one + 60, one + 60) == [0], prog


def test_known_opcodes_cover_what_libpcap_emits_and_the_rest_goes_to_libpcap(monkeypatch):
    seen = set()
    for lt in (1, 101, 113, 276):
        for expr in EXPRESSIONS:
            try:
                seen |= {c for c, _jt, _jf, _k in CompiledFilter(expr, lt).instructions}
            except FilterError:
                continue
    assert seen <= bpfvm.KNOWN_OPCODES and len(seen) >= 15
    assert not bpfvm.supported([(0x0E, 0, 0, 0)])  # RET X: not classic BPF (libpcap 1.10 aborts on it)
    # a program with an opcode the interpreter does not know runs on libpcap's bpf_filter, not on bpfvm
    cf = CompiledFilter("tcp port 5201", 1)
    cf._vm_ok = False
    monkeypatch.setattr(bpfvm, "match_batch", lambda *a: pytest.fail("bpfvm ran an unsupported program"))
    rb = next(iter(CaptureReader(KERNEL / "v6_185000.snd.pcap")))
    got = cf.match_batch(rb.buf, rb.off, rb.caplen, rb.wirelen)
    assert got.sum() > 100 and (got == cf.match_batch_libpcap(rb.buf, rb.off, rb.caplen, rb.wirelen)).all()
