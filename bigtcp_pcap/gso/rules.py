"""The egress rules of docs/gso-spec.md, one small function per rule, named and numbered after it.

Every function is plain arithmetic on its arguments, so the same function works on Python/numpy scalars (unit
tests, one packet) and elementwise on numpy arrays (the engine applies them to a whole batch at once: no
per-packet Python), and compiles unchanged with ``numba.njit`` on scalars (tests/gso/test_rules.py checks
that). Booleans are combined with ``&``/``|`` and turned into numbers by multiplication, never with ``not``
or ``if``, for that reason.
"""

from __future__ import annotations

import numpy as np

from ..decode.schema import TH_CWR, TH_FIN, TH_PSH

HBH_JUMBO_LEN = 8  # struct hop_jumbo_hdr
M32 = 0xFFFFFFFF
M16 = 0xFFFF


def g2_over_limit(skb_len, gso_segs, limit, max_segs):
    """G2 (gso_features_check, net/core/dev.c): a GSO skb loses every GSO feature when
    ``gso_segs > gso_max_segs`` or ``skb->len >= limit``; skb->len counts the L2 header (and the HBH)."""
    return (skb_len >= limit) | (gso_segs > max_segs)


def g3_limit(l3_is_ipv6, vlan_tagged, by_l3, gso_max_size, gso_ipv4_max_size):
    """G3 (netif_get_gso_max_size, include/linux/netdevice.h): IPv6 gets gso_max_size, everything else
    gso_ipv4_max_size, chosen by skb->protocol: an in-band VLAN tag makes an IPv6 skb "not IPv6" today;
    with ``by_l3`` (the series' patch 1, vlan_get_protocol) the L3 protocol under the tag decides."""
    v6 = l3_is_ipv6 & ((vlan_tagged == 0) | by_l3)
    return gso_ipv4_max_size + v6 * (gso_max_size - gso_ipv4_max_size)


def g3_inband_tags(vlan_tags, hwaccel):
    """G3: VLAN tags inside the packet data (skb->protocol is the first of them, and skb->len counts them): all
    the capture shows but the outermost when the device holds that one out of band (skb->vlan_tci)."""
    return vlan_tags - hwaccel * (vlan_tags > 0)


def g4_software_gso(is_gso, over_limit, tso):
    """G4 (netif_needs_gso / skb_gso_ok, net/core/dev.c): a GSO skb is segmented in software when G2 masked
    its features or the device does not offload its type (``ethtool -K DEV tso off``)."""
    return is_gso & (over_limit | (tso == 0))


def g5_gso_segs(payload, mss):
    """G5 (tcp_gso_segment -> skb_segment, net/ipv4/tcp_offload.c): ceil(payload / mss) outputs; all carry
    mss bytes but the last, which carries the rest (1..mss)."""
    return (payload + mss - 1) // mss


def g5_payload(payload, first_seg, nsegs, mss):
    """G5: payload bytes of an output covering segments ``first_seg .. first_seg + nsegs - 1``."""
    return np.minimum(nsegs * mss, payload - first_seg * mss)


def g6_seq(seq0, first_seg, mss):
    """G6 (tcp_gso_segment): seq of the output starting at segment ``first_seg`` = seq0 + first_seg * mss
    (mod 2**32); ack, window and options are copied from the head."""
    return (seq0 + first_seg * mss) & M32


def g7_flags(flags, is_first, is_last):
    """G7 (tcp_gso_segment): FIN and PSH stay only on the last output, CWR only on the first
    (``th->cwr &= ecn_cwr_mask``; SKB_GSO_TCP_ACCECN skbs, not visible in a capture, keep it on all)."""
    drop = (TH_FIN | TH_PSH) * (is_last == 0) | TH_CWR * (is_first == 0)
    return flags & (M16 ^ drop)


def g8_ip_id(id0, first_seg, fixedid):
    """G8 (inet_gso_segment, net/ipv4/af_inet.c): IPv4 output k gets id0 + k, or id0 on every output of a
    SKB_GSO_TCP_FIXEDID skb; a GSO output (G11) advances the id by its gso_segs."""
    return (id0 + first_seg * (fixedid == 0)) & M16


def g8_fixedid_fails(fixedid, ipv4, df, before_6_18):
    """G8 (inet_gso_segment): before 6.18 software segmentation of a SKB_GSO_TCP_FIXEDID IPv4 skb with DF=0
    fails (-EPROTONOSUPPORT) and the skb is dropped; 6.18 segments it."""
    return fixedid & ipv4 & (df == 0) & before_6_18


def g9_hbh_removed(has_hbh, proto_ipv6):
    """G9 (ipv6_hopopt_jumbo_remove, net/ipv6/exthdrs_core.c): software GSO strips the HBH jumbo header only
    when skb->protocol is IPv6; under an in-band VLAN tag it stays on every segment (payload_len then counts
    it), as seen on 6.18 (QinQ pair)."""
    return has_hbh & proto_ipv6


def g9_header_len(l4_off, tcp_hdr_len, hbh_removed):
    """G9 (ipv6_gso_segment, net/ipv6/ip6_offload.c): bytes in front of an output's payload: every header as
    sent, less the 8-byte HBH jumbo header when G9 removed it."""
    return l4_off + tcp_hdr_len - HBH_JUMBO_LEN * hbh_removed


def g9_frame_len(header_len, payload):
    """G9/G8: the output's frame length (IPv4 tot_len / IPv6 payload_len are set to the output's own)."""
    return header_len + payload


def g10_resegment(is_gso, over_limit, tso, tunnel, frag_list, resegment):
    """G10 (series 4/5): re-segment only an unencapsulated TCP GSO skb without a frag_list that exceeds
    gso_max_size or gso_max_segs on a device offloading its GSO type; everything else keeps G4/G5."""
    return resegment & is_gso & over_limit & (tso != 0) & (tunnel == 0) & (frag_list == 0)


def g11_group_segs(limit, max_segs, header_len, mss):
    """G11 (series 3/5, skb_segment's max_segs): segments per output GSO skb, as many as fit: at most
    gso_max_segs and header_len + n * mss < limit (the G2 test the output must pass); at least 1."""
    return np.maximum(1, np.minimum(max_segs, (limit - 1 - header_len) // mss))


def g12_mtu_drop(is_gso, l3_len, mtu):
    """G12 (is_skb_forwardable, net/core/dev.c; bridge br_dev_queue_push_xmit): a plain frame whose L3 length
    exceeds the egress MTU is dropped; a GSO skb is exempt there (skb_is_gso)."""
    return (is_gso == 0) & (l3_len > mtu)


def g14_mss(syn_mss, tcp_hdr_len):
    """G14 (tcp_current_mss, net/ipv4/tcp_output.c): the sender's gso_size is the MSS the SYNs agreed on,
    less the option bytes every data segment carries (the timestamp option: 12)."""
    return syn_mss - (tcp_hdr_len - 20)


def g14_is_gso(payload, mss):
    """G14 (tcp_set_skb_tso_segs): an skb of at most one MSS is a plain packet (gso_size 0, gso_segs 1)."""
    return payload > mss


RULES = {
    "G2": g2_over_limit, "G3": g3_limit, "G3b": g3_inband_tags, "G4": g4_software_gso, "G5": g5_gso_segs, "G5b": g5_payload,
    "G6": g6_seq, "G7": g7_flags, "G8": g8_ip_id, "G8b": g8_fixedid_fails, "G9": g9_hbh_removed, "G9b": g9_header_len, "G9c": g9_frame_len,
    "G10": g10_resegment, "G11": g11_group_segs, "G12": g12_mtu_drop, "G14": g14_mss, "G14b": g14_is_gso,
}
"""Rule number -> function (the tests compile each with numba)."""
