"""bpfasm.py: instruction encoding against LLVM's BPF assembler, and the verifier's verdict (root)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tools.kernel_lab import bpfasm

from .conftest import ROOT, need_root

# The two programs written in LLVM's BPF assembly syntax from their meaning (bpf_vlan_programs's docstring):
# htons(0x8100) = 0x0081 = 129, htons(0x88a8) = 0xa888 = 43144 on a little-endian host; helper 18 =
# bpf_skb_vlan_push(skb, proto, tci), 19 = bpf_skb_vlan_pop(skb); r0 = TC_ACT_OK.
PUSH_ASM = """r6 = r1
r2 = 129
r3 = 200
call 18
r1 = r6
r2 = 43144
r3 = 100
call 18
r0 = 0
exit
"""
POP_ASM = """r6 = r1
call 19
r1 = r6
call 19
r0 = 0
exit
"""


def _llvm_encode(asm: str) -> bytes:
    mc = shutil.which("llvm-mc")
    if mc is None:
        pytest.skip("llvm-mc (LLVM's assembler, the encoding oracle) is not installed")
    cp = subprocess.run([mc, "-triple", "bpfel", "-show-encoding"], input=asm, capture_output=True, text=True,
                        timeout=30, check=False)
    if cp.returncode != 0:
        pytest.skip(f"llvm-mc has no BPF target: {cp.stderr.strip()[:200]}")
    out = b""
    for enc in re.findall(r"encoding: \[([^\]]*)\]", cp.stdout):
        out += bytes(int(x, 16) for x in enc.split(","))
    return out


@pytest.mark.skipif(sys.byteorder != "little", reason="the LLVM oracle is run for bpfel")
def test_vlan_programs_encode_as_llvm_assembles_them():
    push, pop = bpfasm.bpf_vlan_programs(outer_id=100, inner_id=200)
    assert push == _llvm_encode(PUSH_ASM)
    assert pop == _llvm_encode(POP_ASM)
    assert len(push) == 10 * 8 and len(pop) == 6 * 8


@pytest.mark.skipif(sys.byteorder != "little", reason="the LLVM oracle is run for bpfel")
def test_single_instructions_with_negative_offset_and_immediate():
    # off and imm are signed: "if r1 > r2 goto -3" style fields and a negative immediate
    assert bpfasm.bpf_insn(bpfasm.MOV64_IMM, 4, imm=-2) == _llvm_encode("r4 = -2\n")
    assert bpfasm.bpf_insn(bpfasm.MOV64_REG, 9, 10) == _llvm_encode("r9 = r10\n")
    assert bpfasm.bpf_insn(0x2D, 1, 2, off=-3) == _llvm_encode("if r1 > r2 goto -3\n")  # BPF_JMP|BPF_JGT|BPF_X


def test_kernel_verifier_accepts_both_programs():
    need_root()
    push, pop = bpfasm.bpf_vlan_programs(100, 200)
    for insns, name in ((push, "kl_push"), (pop, "kl_pop")):
        try:
            fd = bpfasm.bpf_prog_load(insns, name)
        except OSError as e:
            if e.errno == 1:
                pytest.skip(f"BPF_PROG_LOAD not permitted here: {e}")
            raise
        assert fd >= 0
        os.close(fd)


def test_kernel_verifier_rejects_a_program_that_falls_off_the_end():
    need_root()
    push, _ = bpfasm.bpf_vlan_programs(100, 200)
    with pytest.raises(OSError) as exc:
        bpfasm.bpf_prog_load(push[:-8], "kl_noexit")  # without the final exit
    assert exc.value.errno in (13, 22)  # EACCES / EINVAL from the verifier
    assert "BPF_PROG_LOAD kl_noexit" in str(exc.value)


def test_tcbpf_helper_attaches_both_filters_as_tc_shows_them(veth_ns):
    if shutil.which("tc") is None:
        pytest.skip("iproute2 'tc' is not installed")
    subprocess.run(["ip", "-n", veth_ns, "link", "set", "klva", "up"], check=True, timeout=10)
    subprocess.run(["ip", "netns", "exec", veth_ns, "tc", "qdisc", "add", "dev", "klva", "clsact"], check=True,
                   timeout=10)
    cp = subprocess.run(["ip", "netns", "exec", veth_ns, sys.executable, str(ROOT / "tools" / "kernel_lab"),
                         "--_tcbpf", "klva", "100", "200"], capture_output=True, text=True, timeout=30, check=False)
    assert cp.returncode == 0, cp.stderr
    for direction, name in (("egress", "qinq_push"), ("ingress", "qinq_pop")):
        shown = subprocess.run(["ip", "netns", "exec", veth_ns, "tc", "filter", "show", "dev", "klva", direction],
                               capture_output=True, text=True, timeout=10, check=True).stdout
        assert f"protocol all pref 1 bpf chain 0 handle 0x1 {name} direct-action" in shown, shown
        assert f"name {name} " in shown, shown


# --rx-drop's XDP program in LLVM's BPF assembly, from xdp_random_drop_program's docstring: frames of at least
# 200 bytes dropped when bpf_get_prandom_u32() (helper 7) >> 1 < 2**31 // N (N = 300: 7158278); XDP_DROP = 1,
# XDP_PASS = 2.
XDP_DROP_ASM = """r2 = *(u32 *)(r1 + 0)
r3 = *(u32 *)(r1 + 4)
r2 += 200
if r2 > r3 goto +5
call 7
r0 >>= 1
if r0 >= 7158278 goto +2
r0 = 1
exit
r0 = 2
exit
"""


@pytest.mark.skipif(sys.byteorder != "little", reason="the LLVM oracle is run for bpfel")
def test_xdp_drop_program_encodes_as_llvm_assembles_it():
    assert bpfasm.xdp_random_drop_program(300) == _llvm_encode(XDP_DROP_ASM)
    with pytest.raises(ValueError):
        bpfasm.xdp_random_drop_program(1)


def _test_run(fd: int, frame: bytes) -> int:
    """BPF_PROG_TEST_RUN (10) once over ``frame``: the program's return value (bpf_attr.test layout)."""
    import ctypes
    import struct

    buf = ctypes.create_string_buffer(frame, len(frame))
    rc, err, out = bpfasm.bpf_syscall(10, struct.pack("=IIIIQQII", fd, 0, len(frame), 0, ctypes.addressof(buf), 0, 1, 0))
    assert rc == 0, os.strerror(err)
    return struct.unpack_from("=I", out, 4)[0]


def test_kernel_runs_the_xdp_drop_program_as_specified():
    """The kernel's own test run: a short frame always passes, a long one is dropped about one time in N."""
    need_root()
    try:
        fd = bpfasm.bpf_prog_load(bpfasm.xdp_random_drop_program(4), "kl_rxdrop", bpfasm.BPF_PROG_TYPE_XDP)
    except OSError as e:
        if e.errno == 1:
            pytest.skip(f"BPF_PROG_LOAD not permitted here: {e}")
        raise
    try:
        short, long_ = b"\0" * (bpfasm.RX_DROP_MIN_LEN - 1), b"\0" * 1514
        assert {_test_run(fd, short) for _ in range(200)} == {bpfasm.XDP_PASS}
        got = [_test_run(fd, long_) for _ in range(2000)]
        assert set(got) == {bpfasm.XDP_PASS, bpfasm.XDP_DROP}
        assert 350 <= got.count(bpfasm.XDP_DROP) <= 650  # 500 expected; binomial sd 19
    finally:
        os.close(fd)


def test_xdpdrop_helper_attaches_in_driver_mode(veth_ns):
    cp = subprocess.run(["ip", "netns", "exec", veth_ns, sys.executable, str(ROOT / "tools" / "kernel_lab"),
                         "--_xdpdrop", "klvb", "1000"], capture_output=True, text=True, timeout=30, check=False)
    assert cp.returncode == 0, cp.stderr
    shown = subprocess.run(["ip", "-n", veth_ns, "-d", "link", "show", "klvb"], capture_output=True, text=True,
                           timeout=10, check=True).stdout
    assert re.search(r"\bxdp\b", shown) and "prog/xdp id" in shown, shown
