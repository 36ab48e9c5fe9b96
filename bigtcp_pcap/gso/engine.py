"""EgressEngine: what an egress device with a given profile transmits for the skbs a sender handed it.

Sans-IO, like the GRO engine: ``feed(PacketBatch, flow_id)`` in capture order returns an ``EgressBatch`` (one
row per packet or skb leaving the device); no files, no pandas. Each input row is one skb as the sender's
TX tap recorded it (a super-packet when TSO/GSO is on). The rules are the functions of ``rules.py``
(docs/gso-spec.md G1-G14), applied to whole columns at once: the number of outputs per input is computed
first, then the outputs are expanded with ``np.repeat`` and every field is one vectorized rule call.

The only state is the MSS per connection, learnt from SYN/SYN-ACK MSS options (G14): one dict entry per
connection, touched once per SYN and once per distinct connection per batch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..decode.schema import (
    BIGTCP_HBH_JUMBO,
    BIGTCP_NONE,
    BIGTCP_V4_TOTLEN0,
    BIGTCP_V6_PLEN0,
    TH_SYN,
    PacketBatch,
)
from ..gro.config import parse_kernel
from . import rules as G
from .config import EgressProfile

ACTION_PASSED, ACTION_SEGMENTED, ACTION_RESEGMENTED, ACTION_DROPPED = 0, 1, 2, 3
ACTION_NAMES = ("passed", "segmented", "resegmented", "dropped")
REASON_NONE, REASON_SIZE, REASON_SEGS, REASON_TSO_OFF, REASON_MTU, REASON_FIXEDID = 0, 1, 2, 3, 4, 5
REASON_NOT_TCP = 6  # passed as it is: a non-TCP frame larger than the MTU (a UDP GSO skb), outside the model
REASON_NAMES = ("none", "gso_max_size", "gso_max_segs", "tso_off", "mtu", "fixedid_df0", "not_tcp_gso")
IPV6_MAXPLEN = 65535

COLUMN_TYPES: dict[str, type] = {
    "source_frame": np.uint64,  # frame number of the input skb (1-based, as Wireshark)
    "source_index": np.int64,  # its row in the fed batch (for building output packets)
    "out_index": np.uint32,  # k: position of this output among the outputs of its input
    "ts_ns": np.int64,  # the input's capture time (outputs of one skb leave back to back)
    "flow_id": np.int64,
    "ip_version": np.uint8,
    "sport": np.uint16,
    "dport": np.uint16,
    "seq": np.uint32,  # raw TCP seq
    "payload_len": np.uint32,
    "l3_len": np.uint32,  # true L3 length (without a synthetic HBH)
    "frame_len": np.uint32,  # what tcpdump on the egress device records as the original length
    "gso_segs": np.uint32,  # 1 for a plain packet
    "gso_size": np.uint32,  # 0 for a plain packet
    "action": np.uint8,  # ACTION_*
    "reason": np.uint8,  # REASON_*: why the input was cut (none when passed)
    "ip_id": np.uint16,
    "tcp_flags": np.uint16,
    "bigtcp": np.uint8,  # decode.schema BIGTCP_* of the output as captured on the device
}


@dataclass
class EgressBatch:
    """Columns of egress rows (``COLUMN_TYPES``), in transmit order."""

    source_frame: np.ndarray
    source_index: np.ndarray
    out_index: np.ndarray
    ts_ns: np.ndarray
    flow_id: np.ndarray
    ip_version: np.ndarray
    sport: np.ndarray
    dport: np.ndarray
    seq: np.ndarray
    payload_len: np.ndarray
    l3_len: np.ndarray
    frame_len: np.ndarray
    gso_segs: np.ndarray
    gso_size: np.ndarray
    action: np.ndarray
    reason: np.ndarray
    ip_id: np.ndarray
    tcp_flags: np.ndarray
    bigtcp: np.ndarray

    def __len__(self) -> int:
        return int(self.source_frame.shape[0])

    @classmethod
    def empty(cls) -> EgressBatch:
        """No rows, the documented column types."""
        return cls(**{k: np.zeros(0, t) for k, t in COLUMN_TYPES.items()})

    @classmethod
    def concat(cls, parts: list[EgressBatch]) -> EgressBatch:
        """Rows of all parts, in order."""
        if not parts:
            return cls.empty()
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)})

    def to_dict(self) -> dict[str, np.ndarray]:
        """Column name -> array."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def conn_key(pb: PacketBatch) -> np.ndarray:
    """A 64-bit digest of the unordered endpoint pair of each row (both directions of a connection agree)."""
    def side(addr: np.ndarray, port: np.ndarray) -> np.ndarray:
        w = np.ascontiguousarray(addr).view(np.uint64)
        with np.errstate(over="ignore"):
            h = (w[:, 0] * np.uint64(0x9E3779B97F4A7C15)) ^ w[:, 1]
            h = (h ^ (h >> np.uint64(29))) * np.uint64(0xBF58476D1CE4E5B9)
            h ^= port.astype(np.uint64) * np.uint64(0x94D049BB133111EB)
            return h ^ (h >> np.uint64(32))
    with np.errstate(over="ignore"):
        return side(pb.src, pb.sport) + side(pb.dst, pb.dport)  # + is symmetric, and 0 only by accident


class EgressEngine:
    """The egress decision of one device (``EgressProfile``) over a stream of sender skbs.

    ``mss``: the sender's gso_size for every flow (default: per connection from the SYN MSS options, G14, or
    from the MTU when the SYNs are not in the capture). ``fixedid``: the inputs are SKB_GSO_TCP_FIXEDID skbs
    (G8; forwarded GRO output with fixed IP IDs; a local TCP sender never is).
    """

    def __init__(self, profile: EgressProfile | None = None, mss: int | None = None, fixedid: bool = False,
                 strip_hbh: bool = False) -> None:
        self.profile = profile or EgressProfile()
        self.strip_hbh = bool(strip_hbh)  # explode: remove the HBH from every segment, whatever G9 says
        if mss is not None and (not isinstance(mss, int) or isinstance(mss, bool) or not 1 <= mss <= 65535):
            raise ValueError(f"mss must be an int in 1..65535, got {mss!r}")
        self.mss = mss
        self.fixedid = bool(fixedid)
        self._syn_mss: dict[int, int] = {}  # connection key -> smaller SYN MSS option
        self._flow_mss = np.zeros(1024, np.int64)  # flow id -> gso_size once resolved (G14), 0 = not yet

    def _mss_of(self, pb: PacketBatch, tcp: np.ndarray, hbh: np.ndarray, flow_id: np.ndarray) -> np.ndarray:
        """G14: per row the sender's gso_size (0 for rows that are not TCP). Resolved once per flow, at its
        first data row (both SYNs are behind by then); rows of untracked flows (flow_id -1) are looked up
        each time."""
        n = len(pb)
        out = np.zeros(n, np.int64)
        if self.mss is not None:
            out[tcp] = self.mss
            return out
        syn = tcp & ((pb.tcp_flags & TH_SYN) != 0) & (pb.tcp_mss > 0)
        if syn.any():
            for k, m in zip(conn_key(pb.take(syn)).tolist(), pb.tcp_mss[syn].tolist()):  # per SYN: the smaller
                self._syn_mss[k] = min(m, self._syn_mss.get(k, m))
        fid = np.asarray(flow_id, np.int64)
        top = int(fid.max()) + 1 if n else 0
        if top > self._flow_mss.shape[0]:
            self._flow_mss = np.concatenate([self._flow_mss, np.zeros(max(top, 2 * self._flow_mss.shape[0])
                                                                      - self._flow_mss.shape[0], np.int64)])
        data = tcp & (pb.tcp_payload_len > 0)
        tracked = fid >= 0
        need = data & tracked
        need[need] = self._flow_mss[fid[need]] == 0
        ask = np.flatnonzero(need | (tcp & ~tracked))
        if ask.size:
            first = ask
            if need.any():  # one row per unresolved flow is enough
                _, pick = np.unique(fid[ask], return_index=True)
                first = np.union1d(ask[pick], ask[~tracked[ask]])
            sub = pb.take(first)
            syn_mss = np.array([self._syn_mss.get(k, 0) for k in conn_key(sub).tolist()], np.int64)
            thl = sub.tcp_hdr_len.astype(np.int64)
            ip_hdr = sub.ip_hdr_len.astype(np.int64) - G.HBH_JUMBO_LEN * hbh[first]
            got = np.maximum(1, np.where(syn_mss > 0, G.g14_mss(syn_mss, thl), self.profile.mtu - ip_hdr - thl))
            t = tracked[first] & data[first]
            self._flow_mss[fid[first][t]] = got[t]
            out[first] = got
        rows = tcp & tracked & (self._flow_mss[np.maximum(fid, 0)] > 0)
        out[rows] = self._flow_mss[fid[rows]]
        return out

    def feed(self, pb: PacketBatch, flow_id: np.ndarray) -> EgressBatch:
        """The rows the device transmits for this batch of sender skbs (capture order kept)."""
        n = len(pb)
        if n == 0:
            return EgressBatch.empty()
        prof = self.profile
        # (TCP options cut by the snaplen leave a TCP skb: tcp_hdr_len, its true header length, is there when the
        # fixed 20 bytes are; explode copies such an skb whole, as it cannot rewrite headers it does not have)
        tcp = (pb.l4_proto == 6) & (pb.l4_off >= 0) & (pb.tcp_hdr_len >= 20)
        hbh = (pb.bigtcp == BIGTCP_HBH_JUMBO).astype(np.int64)
        payload = pb.tcp_payload_len.astype(np.int64)
        mss = self._mss_of(pb, tcp, hbh, flow_id)
        is_gso = tcp & (payload > 0) & G.g14_is_gso(payload, np.maximum(mss, 1))
        mss1 = np.maximum(mss, 1)
        segs = np.where(is_gso, G.g5_gso_segs(payload, mss1), 1)
        tags = np.where((pb.linktype == 1) & (pb.vlan != 0xFFFF), (pb.l2_len.astype(np.int64) - 14) // 4, 0)
        inband = G.g3_inband_tags(tags, int(prof.vlan_hwaccel))
        skb_len = pb.wirelen.astype(np.int64) - 4 * (tags - inband)  # an out-of-band tag is not in skb->len
        limit = G.g3_limit(pb.ip_version == 6, inband > 0, prof.limit_by_l3, prof.gso_max_size, prof.ipv4_limit)
        strip = G.g9_hbh_removed(hbh, (inband == 0) | self.strip_hbh)
        over = G.g2_over_limit(skb_len, segs, limit, prof.gso_max_segs)
        software = G.g4_software_gso(is_gso, over, prof.tso)
        reseg = G.g10_resegment(is_gso, over, prof.tso, pb.tunnel, 0, prof.resegment)
        cut = software & ~reseg
        before_618 = parse_kernel(prof.kernel) < (6, 18)
        failed = cut & G.g8_fixedid_fails(self.fixedid, pb.ip_version == 4, pb.df, before_618)
        cut &= ~failed
        hdr = G.g9_header_len(pb.l4_off.astype(np.int64), pb.tcp_hdr_len.astype(np.int64), strip)
        dropped = (pb.ip_version > 0) & G.g12_mtu_drop(is_gso, pb.ip_len.astype(np.int64), prof.mtu)
        # IP fragments a datagram before the TX tap, so a non-TCP frame above the MTU there is a GSO skb (UDP GSO:
        # QUIC, WireGuard); its segment size is not in the capture, so it is not cut here, and not dropped. So is
        # a TCP one whose fixed header the snaplen cut (its MSS and payload length are not in the capture either)
        not_tcp = dropped & ~tcp
        dropped &= ~not_tcp

        unit = segs.copy()  # segments per output
        unit[cut] = 1
        if reseg.any():
            unit[reseg] = G.g11_group_segs(limit[reseg], prof.gso_max_segs, hdr[reseg], mss1[reseg])
        n_out = (segs + unit - 1) // unit
        action = np.where(cut, ACTION_SEGMENTED, np.where(reseg, ACTION_RESEGMENTED, ACTION_PASSED))
        action[dropped | failed] = ACTION_DROPPED
        reason = np.where(skb_len >= limit, REASON_SIZE, np.where(segs > prof.gso_max_segs, REASON_SEGS,
                                                                   REASON_TSO_OFF))
        reason = np.where(software, reason, REASON_NONE)
        reason[dropped] = REASON_MTU
        reason[not_tcp] = REASON_NOT_TCP
        reason[failed] = REASON_FIXEDID

        # expand: output j of input i
        src = np.repeat(np.arange(n), n_out)
        start = np.cumsum(n_out) - n_out
        k = np.arange(src.shape[0]) - np.repeat(start, n_out)
        s_unit, s_segs, s_mss = unit[src], segs[src], mss1[src]
        first = k * s_unit
        nseg = np.minimum(s_unit, s_segs - first)
        split = (action[src] == ACTION_SEGMENTED) | (action[src] == ACTION_RESEGMENTED)
        s_pay = payload[src]
        pay = np.where(split, G.g5_payload(s_pay, first, nseg, s_mss), s_pay)
        seq = np.where(split, G.g6_seq(pb.tcp_seq[src].astype(np.int64), first, s_mss), pb.tcp_seq[src])
        flags = G.g7_flags(pb.tcp_flags[src].astype(np.int64), k == 0, k == n_out[src] - 1)
        flags = np.where(split, flags, pb.tcp_flags[src])
        v4 = pb.ip_version[src] == 4
        ip_id = np.where(split & v4, G.g8_ip_id(pb.ip_id[src].astype(np.int64), first, self.fixedid),
                         pb.ip_id[src])
        s_hdr = hdr[src]
        frame_len = np.where(split, G.g9_frame_len(s_hdr, pay), pb.wirelen[src])  # as captured: all tags
        l3_hdr = s_hdr - pb.l3_off[src].astype(np.int64)
        l3_len = np.where(split, l3_hdr + pay, pb.ip_len[src])
        big = np.where(split, np.where(v4, np.where(l3_len > IPV6_MAXPLEN, BIGTCP_V4_TOTLEN0, BIGTCP_NONE),
                                       np.where(l3_len - 40 > IPV6_MAXPLEN, BIGTCP_V6_PLEN0, BIGTCP_NONE)),
                       pb.bigtcp[src])
        big = np.where(split & (hbh[src] - strip[src] == 1), BIGTCP_HBH_JUMBO, big)  # G9: the HBH stayed
        gso_segs = np.where(split, nseg, s_segs)
        gso_size = np.where(gso_segs > 1, s_mss, 0)
        return EgressBatch(
            source_frame=pb.frame[src], source_index=src.astype(np.int64), out_index=k.astype(np.uint32),
            ts_ns=pb.ts_ns[src], flow_id=np.asarray(flow_id, np.int64)[src], ip_version=pb.ip_version[src],
            sport=pb.sport[src], dport=pb.dport[src], seq=seq.astype(np.uint32), payload_len=pay.astype(np.uint32),
            l3_len=l3_len.astype(np.uint32), frame_len=frame_len.astype(np.uint32),
            gso_segs=gso_segs.astype(np.uint32), gso_size=gso_size.astype(np.uint32),
            action=action[src].astype(np.uint8), reason=reason[src].astype(np.uint8), ip_id=ip_id.astype(np.uint16),
            tcp_flags=flags.astype(np.uint16), bigtcp=big.astype(np.uint8))

    def flush(self) -> EgressBatch:
        """End of input: the egress decision holds nothing back, so no rows."""
        return EgressBatch.empty()


def output_packets(pb: PacketBatch, eb: EgressBatch) -> tuple[PacketBatch, np.ndarray]:
    """The egress rows as decoded packets (what a decoder would make of the device's capture) and their flow
    ids, for the GRO engine: the input rows repeated, with the per-output fields of G5-G9 replaced. Dropped
    rows are left out."""
    keep = eb.action != ACTION_DROPPED
    eb = EgressBatch(**{f.name: getattr(eb, f.name)[keep] for f in fields(eb)})
    out = pb.take(eb.source_index)
    split = (eb.action == ACTION_SEGMENTED) | (eb.action == ACTION_RESEGMENTED)
    hbh = split & (out.bigtcp == BIGTCP_HBH_JUMBO) & (eb.bigtcp != BIGTCP_HBH_JUMBO)  # G9 removed it
    out.wirelen = eb.frame_len.copy()
    out.caplen = np.minimum(out.caplen, eb.frame_len)
    out.tcp_seq = eb.seq.copy()
    out.tcp_payload_len = eb.payload_len.copy()
    out.tcp_flags = eb.tcp_flags.copy()
    out.ip_id = eb.ip_id.copy()
    out.ip_len = eb.l3_len.copy()
    out.bigtcp = eb.bigtcp.copy()
    v4 = out.ip_version == 4
    plain_len = np.where(v4, eb.l3_len, eb.l3_len.astype(np.int64) - 40)
    out.ip_len_field = np.where(split, np.where(plain_len > IPV6_MAXPLEN, 0, plain_len), out.ip_len_field
                                ).astype(np.uint32)
    out.has_jumbo = out.has_jumbo & ~hbh
    out.jumbo_len = np.where(hbh, 0, out.jumbo_len).astype(np.uint32)
    out.ext_len = np.where(hbh, out.ext_len.astype(np.int64) - G.HBH_JUMBO_LEN, out.ext_len).astype(np.uint16)
    out.ip_hdr_len = np.where(hbh, out.ip_hdr_len.astype(np.int64) - G.HBH_JUMBO_LEN, out.ip_hdr_len
                              ).astype(np.uint16)
    out.ext_hash = np.where(hbh & (out.ext_len == 0), 0, out.ext_hash).astype(np.uint64)
    out.l4_off = np.where(hbh, out.l4_off.astype(np.int64) - G.HBH_JUMBO_LEN, out.l4_off).astype(np.int32)
    return out, eb.flow_id
