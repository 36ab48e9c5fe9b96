"""A tiny eBPF assembler and loader for the qinq fallback: two SCHED_CLS programs pushing/popping VLAN tags.

When the kernel has no 802.1Q/802.1ad devices, the qinq topology puts a clsact eBPF program on each veth: egress
pushes 802.1Q 200 then 802.1ad 100, ingress pops both. The programs are ten and six instructions, encoded here
(struct bpf_insn, include/uapi/linux/bpf.h), loaded with the raw bpf(2) syscall (no libbpf) and attached with
rtnetlink (``netlink.tc_attach_bpf``).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import socket
import struct
import sys

from .netlink import TC_H_CLSACT_EGRESS, TC_H_CLSACT_INGRESS, tc_attach_bpf, xdp_attach

BPF_PROG_LOAD, BPF_PROG_TYPE_SCHED_CLS, BPF_PROG_TYPE_XDP = 5, 3, 6
BPF_FUNC_GET_PRANDOM_U32 = 7
BPF_FUNC_SKB_VLAN_PUSH, BPF_FUNC_SKB_VLAN_POP = 18, 19  # include/uapi/linux/bpf.h __BPF_FUNC_MAPPER
SYS_BPF = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "ppc64le": 361, "s390x": 351}
# opcodes: BPF_ALU64|BPF_MOV|BPF_X (dst = src), BPF_ALU64|BPF_MOV|BPF_K (dst = imm), BPF_JMP|BPF_CALL, BPF_JMP|BPF_EXIT
MOV64_REG, MOV64_IMM, CALL, EXIT = 0xBF, 0xB7, 0x85, 0x95
# BPF_LDX|BPF_MEM|BPF_W, BPF_ALU64|BPF_ADD|BPF_K, BPF_ALU64|BPF_RSH|BPF_K, BPF_JMP|BPF_JGT|BPF_X, BPF_JMP|BPF_JGE|BPF_K
LDX_W, ADD64_IMM, RSH64_IMM, JGT_REG, JGE_IMM = 0x61, 0x07, 0x77, 0x2D, 0x35
TC_ACT_OK = 0
XDP_DROP, XDP_PASS = 1, 2
RX_DROP_MIN_LEN = 200  # frames shorter than this (pure ACKs, ARP, ND) always pass


def bpf_insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """struct bpf_insn {u8 code; u8 dst_reg:4, src_reg:4; s16 off; s32 imm} in host order."""
    regs = (src << 4) | dst if sys.byteorder == "little" else (dst << 4) | src
    return struct.pack("=BBhi", code, regs, off, imm)


def bpf_vlan_programs(outer_id: int, inner_id: int) -> tuple[bytes, bytes]:
    """(egress, ingress) SCHED_CLS programs: push 802.1Q inner_id then 802.1ad outer_id; pop two tags.

    bpf_skb_vlan_push() puts the new tag into the skb's VLAN metadata and moves an existing one into the
    packet, so the wire order is 88a8 outer_id, 8100 inner_id. Both programs return TC_ACT_OK (direct action).
    bpf_skb_vlan_pop() on an untagged skb changes nothing.
    """
    push = [
        bpf_insn(MOV64_REG, 6, 1),  # r6 = skb
        bpf_insn(MOV64_IMM, 2, imm=socket.htons(0x8100)),
        bpf_insn(MOV64_IMM, 3, imm=inner_id),
        bpf_insn(CALL, imm=BPF_FUNC_SKB_VLAN_PUSH),
        bpf_insn(MOV64_REG, 1, 6),
        bpf_insn(MOV64_IMM, 2, imm=socket.htons(0x88A8)),
        bpf_insn(MOV64_IMM, 3, imm=outer_id),
        bpf_insn(CALL, imm=BPF_FUNC_SKB_VLAN_PUSH),
        bpf_insn(MOV64_IMM, 0, imm=TC_ACT_OK),
        bpf_insn(EXIT),
    ]
    pop = [
        bpf_insn(MOV64_REG, 6, 1),
        bpf_insn(CALL, imm=BPF_FUNC_SKB_VLAN_POP),
        bpf_insn(MOV64_REG, 1, 6),
        bpf_insn(CALL, imm=BPF_FUNC_SKB_VLAN_POP),
        bpf_insn(MOV64_IMM, 0, imm=TC_ACT_OK),
        bpf_insn(EXIT),
    ]
    return b"".join(push), b"".join(pop)


def xdp_random_drop_program(one_in: int) -> bytes:
    """An XDP program dropping each frame of at least RX_DROP_MIN_LEN bytes with probability 1/one_in.

    On the receiver's veth it drops data segments after the sender's capture saw them and before GRO: the loss a
    field capture taken on the sender shows as a segment the receiver never got (then SACKs and a retransmission).
    A frame is dropped when bpf_get_prandom_u32() >> 1 (31 random bits) is below 2**31 // one_in."""
    if one_in < 2:
        raise ValueError("one_in must be >= 2")
    return b"".join([
        bpf_insn(LDX_W, 2, 1, 0),  # r2 = ctx->data
        bpf_insn(LDX_W, 3, 1, 4),  # r3 = ctx->data_end
        bpf_insn(ADD64_IMM, 2, imm=RX_DROP_MIN_LEN),
        bpf_insn(JGT_REG, 2, 3, off=5),  # shorter: pass
        bpf_insn(CALL, imm=BPF_FUNC_GET_PRANDOM_U32),
        bpf_insn(RSH64_IMM, 0, imm=1),
        bpf_insn(JGE_IMM, 0, off=2, imm=(1 << 31) // one_in),
        bpf_insn(MOV64_IMM, 0, imm=XDP_DROP),
        bpf_insn(EXIT),
        bpf_insn(MOV64_IMM, 0, imm=XDP_PASS),
        bpf_insn(EXIT),
    ])  # fmt: skip


def bpf_syscall(cmd: int, attr: bytes) -> tuple[int, int, bytes]:
    """bpf(2) with ``attr`` as the start of a zeroed 128-byte union bpf_attr: (return value, errno, the union as
    the kernel left it, for commands that write results into it)."""
    nr = SYS_BPF.get(platform.machine())
    if nr is None:
        raise OSError(f"bpf(2) syscall number unknown for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    abuf = ctypes.create_string_buffer(attr, 128)  # the rest of union bpf_attr stays zero
    rc = libc.syscall(ctypes.c_long(nr), ctypes.c_long(cmd), abuf, ctypes.c_long(len(abuf)))
    return rc, ctypes.get_errno() if rc < 0 else 0, abuf.raw


def bpf_prog_load(insns: bytes, name: str, prog_type: int = BPF_PROG_TYPE_SCHED_CLS) -> int:
    """BPF_PROG_LOAD a program (SCHED_CLS unless ``prog_type``) through the raw bpf(2) syscall; return its fd.

    OSError (with the verifier's log) when the kernel refuses the program.
    """
    ibuf = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(1 << 16)
    attr = struct.pack(
        "=IIQQIIQII16s", prog_type, len(insns) // 8, ctypes.addressof(ibuf),
        ctypes.addressof(lic), 1, len(log), ctypes.addressof(log), 0, 0, name.encode()[:15],
    )  # fmt: skip
    fd, err, _ = bpf_syscall(BPF_PROG_LOAD, attr)
    if fd < 0:
        raise OSError(err, f"BPF_PROG_LOAD {name}: {os.strerror(err)}: {log.value.decode(errors='replace')}")
    return fd


def tcbpf_helper(argv: list[str]) -> int:
    """Hidden entry point ``--_tcbpf DEV OUTER_ID INNER_ID`` run inside the namespace (clsact must exist)."""
    dev, outer_id, inner_id = argv[0], int(argv[1]), int(argv[2])
    push, pop = bpf_vlan_programs(outer_id, inner_id)
    fds = {"egress": bpf_prog_load(push, "qinq_push"), "ingress": bpf_prog_load(pop, "qinq_pop")}
    tc_attach_bpf(dev, fds["egress"], TC_H_CLSACT_EGRESS, "qinq_push")
    tc_attach_bpf(dev, fds["ingress"], TC_H_CLSACT_INGRESS, "qinq_pop")
    print(json.dumps({
        "egress": f"bpf_skb_vlan_push 802.1Q {inner_id}, then 802.1ad {outer_id} ({len(push) // 8} insns)",
        "ingress": f"bpf_skb_vlan_pop twice ({len(pop) // 8} insns)",
        "egress_insns_hex": push.hex(), "ingress_insns_hex": pop.hex(),
    }))  # fmt: skip
    return 0


def xdpdrop_helper(argv: list[str]) -> int:
    """Hidden entry point ``--_xdpdrop DEV ONE_IN`` run inside the namespace: attach the random-drop XDP program
    (driver mode) to DEV. The program stays attached after this process exits (the link holds it)."""
    dev, one_in = argv[0], int(argv[1])
    insns = xdp_random_drop_program(one_in)
    fd = bpf_prog_load(insns, "rx_drop", BPF_PROG_TYPE_XDP)
    xdp_attach(dev, fd)
    print(json.dumps({
        "program": f"XDP on {dev}: drop a frame of >= {RX_DROP_MIN_LEN} bytes when bpf_get_prandom_u32() >> 1 "
                   f"< 2**31 // {one_in} ({len(insns) // 8} insns)",
        "insns_hex": insns.hex(),
    }))  # fmt: skip
    return 0
