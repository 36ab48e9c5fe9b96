"""RecordBatch -> (PacketBatch, FindingRows): the Python face of the compiled decoder."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..capture.reader import RecordBatch
from . import kernel as K
from .schema import PacketBatch


@dataclass
class FindingRows:
    """Findings as columns: frame number, code id (findings.BY_ID) and the kernel's numeric value."""

    frame: np.ndarray  # uint64
    code: np.ndarray  # int16
    value: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.frame.shape[0])

    @classmethod
    def empty(cls) -> FindingRows:
        return cls(np.zeros(0, np.uint64), np.zeros(0, np.int16), np.zeros(0, np.int64))

    @classmethod
    def concat(cls, parts: list[FindingRows]) -> FindingRows:
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("frame", "code", "value")))


def decode(rb: RecordBatch) -> tuple[PacketBatch, FindingRows]:
    """Decode one record batch. Pure function of its input; no state carries between batches."""
    n = len(rb)
    o64 = np.zeros((K.N_U64, n), np.uint64)
    o32 = np.zeros((K.N_U32, n), np.uint32)
    o16 = np.zeros((K.N_U16, n), np.uint16)
    o8 = np.zeros((K.N_U8, n), np.uint8)
    oi32 = np.zeros((K.N_I32, n), np.int32)
    oi8 = np.zeros((1, n), np.int8)
    src = np.zeros((n, 16), np.uint8)
    dst = np.zeros((n, 16), np.uint8)
    fcap = n * K.MAX_FINDINGS_PER_PACKET
    f_row = np.empty(fcap, np.int64)
    f_code = np.empty(fcap, np.int16)
    f_val = np.empty(fcap, np.int64)
    nf = K.decode_kernel(rb.buf, rb.off, rb.caplen, rb.wirelen, rb.linktype, o64, o32, o16, o8, oi32, oi8,
                         src, dst, f_row, f_code, f_val)
    pb = PacketBatch(
        frame=rb.frame, ts_ns=rb.ts_ns, caplen=rb.caplen, wirelen=rb.wirelen, linktype=rb.linktype,
        if_id=rb.if_id, status=o16[K.U16_STATUS], tunnel=o8[K.U8_TUNNEL], l2_hash=o64[K.U64_L2_HASH],
        l2_len=o16[K.U16_L2_LEN], vlan=o16[K.U16_VLAN], l3_off=oi32[K.I32_L3_OFF],
        ip_version=o8[K.U8_IP_VERSION], ip_hdr_len=o16[K.U16_IP_HDR_LEN], ip_len_field=o32[K.U32_IP_LEN_FIELD],
        ip_len=o32[K.U32_IP_LEN], bigtcp=o8[K.U8_BIGTCP], jumbo_len=o32[K.U32_JUMBO],
        has_jumbo=o8[K.U8_HAS_JUMBO].view(np.bool_), src=src, dst=dst, ttl=o8[K.U8_TTL], tos=o8[K.U8_TOS],
        ip_id=o16[K.U16_IP_ID], df=o8[K.U8_DF], ip_evil=o8[K.U8_EVIL], flow_label=o32[K.U32_FLOW_LABEL],
        ext_hash=o64[K.U64_EXT_HASH], ext_len=o16[K.U16_EXT_LEN], l4_proto=o8[K.U8_L4_PROTO],
        l4_off=oi32[K.I32_L4_OFF], sport=o16[K.U16_SPORT], dport=o16[K.U16_DPORT], tcp_seq=o32[K.U32_SEQ],
        tcp_ack=o32[K.U32_ACK], tcp_flags=o16[K.U16_FLAGS], tcp_win=o16[K.U16_WIN],
        tcp_hdr_len=o8[K.U8_TCP_HDR_LEN], tcp_payload_len=o32[K.U32_TCP_PAYLOAD],
        tcp_opt_hash=o64[K.U64_OPT_HASH], tcp_mss=o16[K.U16_MSS], tcp_wscale=oi8[0],
        tcp_sack_perm=o8[K.U8_SACK_PERM].view(np.bool_), tcp_sack_blocks=o8[K.U8_SACK_BLOCKS],
        tcp_has_ts=o8[K.U8_HAS_TS].view(np.bool_), tcp_ts_val=o32[K.U32_TS_VAL], tcp_ts_ecr=o32[K.U32_TS_ECR],
        udp_len=o32[K.U32_UDP_LEN], epb_flags=rb.epb_flags)
    fr = FindingRows(rb.frame[f_row[:nf]], f_code[:nf].copy(), f_val[:nf].copy())
    return pb, fr
