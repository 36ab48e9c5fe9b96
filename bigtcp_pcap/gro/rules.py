"""Every GRO rule once: small functions named and cited by their gro-spec.md R-number.

Both engines call these and nothing else decides a rule. ``compiled.CompiledGroEngine`` inlines them into its
numba loop; the reference ``engine.GroEngine`` calls the very same source as plain Python (a private copy of
this module in which nothing is compiled: ``_native.python_twin``), so the
reference keeps only its state bookkeeping (Python objects instead of flat arrays) and the differential test
between the two checks that bookkeeping, while the rule tests (tests/gro/test_rules.py, run on both engines),
the kernel's own GRO selftest vectors and the kernel capture pairs check the rules themselves.

The functions take and return plain integers and booleans (numba scalars in the compiled loop). The
per-packet words of R7/R11/R14.2/R8 also accept numpy arrays (``prepare.prepare`` computes them for a whole
batch with the same functions): they use only arithmetic and bitwise operators.

``grep -n R14 bigtcp_pcap/gro/rules.py`` lands on the merge test; the reason names and their order are in
``reasons.py``.
"""

from __future__ import annotations

import math

import numpy as np

from .._native import njit
from ..decode.schema import (
    BIGTCP_HBH_JUMBO,
    BIGTCP_NONE,
    BIGTCP_V4_TOTLEN0,
    BIGTCP_V6_PLEN0,
    TH_ALL,
    TH_CWR,
    TH_FIN,
    TH_PSH,
    TH_RST,
    TH_SYN,
    TH_URG,
)
from . import reasons as R
from .config import GRO_LEGACY_MAX_SIZE, GroConfig

M32 = 0xFFFFFFFF
NO_LIMIT = 1 << 62  # R2 detection off (input_is_gso=False): no payload is "larger than one segment"
IPV6_MAXPLEN = 65535
ETH_MIN_FRAME = 60  # R7: frames shorter than this are padded on Ethernet (without FCS)
FLAG_BITS = TH_ALL  # the 12-bit TCP flag word the decoder keeps (tcp_flags, reserved bits too), compared by R14.2
ALONE_FLAGS = TH_URG | TH_PSH | TH_RST | TH_SYN | TH_FIN  # R16/R17: these complete p / keep a packet out
ORED_FLAGS = TH_PSH | TH_FIN  # R16: ORed into p's header on merge
MERGE = 0  # merge_verdict: the packet joins p (reasons.py has no code 0)


# --- configuration-level rules (Python: evaluated once per engine) ------------------------------------------
def r15_limits(cfg: GroConfig) -> tuple[int, int]:
    """R15a/R15b: (IPv4 limit, IPv6 limit) that ``p->len + len`` must stay below.

    R15a picks the limit by protocol (netif_get_gro_max_size); R15b: without 8 bytes of headroom for the HBH,
    IPv6 (<= 6.19) cannot pass 64 KiB."""
    lim6 = cfg.gro_max_size
    if cfg.ipv6_hbh and not cfg.hbh_headroom_ok:
        lim6 = min(lim6, GRO_LEGACY_MAX_SIZE)
    return cfg.ipv4_limit, lim6


def r14_1_cwr_mask(cfg: GroConfig) -> int:
    """R14.1: the CWR bit forces a flush on kernels <= 6.19 (7.0 compares it in the flag word instead)."""
    return TH_CWR if cfg.cwr_flushes else 0


def r14_2_kept_flags(cfg: GroConfig) -> int:
    """R14.1/R14.2: the flag bits the flag-word comparison keeps: all but FIN and PSH (and CWR up to 6.19)."""
    ignored = (TH_CWR | TH_FIN | TH_PSH) if cfg.cwr_flushes else (TH_FIN | TH_PSH)
    return FLAG_BITS & ~ignored


def r21_3_flush_old_on_full_budget(cfg: GroConfig) -> bool:
    """R21.3: a full-budget poll flushes everything at HZ < 1000, only older jiffies' entries at HZ >= 1000."""
    return cfg.hz >= 1000


# --- per-packet words (scalars in the compiled loop, arrays in prepare) -------------------------------------
@njit(cache=True, inline="always")
def r7_r11_flushmark(declared, frame_l3, l3_off, pad_flush, v4, evil):
    """R7/R11 (and R2's BIG TCP input): flush-marked when the IP length field (``declared``, IPv6 incl. the
    fixed header) disagrees with the L3 bytes of the frame, or (IPv4) the reserved evil bit is set.

    With ``pad_flush`` false, Ethernet padding (a short frame with more L3 bytes than declared) is not a
    mismatch. Bitwise operators only: works on numpy arrays too. The ``np.any`` guards only skip work that
    cannot change the result (no length mismatch: no padding to excuse; no IPv4 row: no evil bit), so the
    compiled loop branches past both on the common packet instead of computing every term branch-free."""
    fm = declared != frame_l3
    if np.any(fm) and not pad_flush:
        padded = (declared > 0) & (declared < frame_l3) & (l3_off + declared < ETH_MIN_FRAME)
        fm = fm & (padded ^ True)
    if np.any(v4):
        fm = fm | (v4 & (evil != 0))
    return fm


@njit(cache=True, inline="always")
def r12_header_pulls(tcp_hdr_len):
    """R12 (the header half) on captured data: the kernel always had the whole TCP header, a capture may not.
    The fixed 20 bytes must be there (the decoder gives ``tcp_hdr_len`` only then: ports, sequence numbers, flags,
    window, data offset); options cut by the snaplen are no reason to deliver a packet alone, they are compared
    as far as they were captured (R14.4 on ``tcp_opt_hash``, a digest of the captured option bytes). Array-safe."""
    return tcp_hdr_len >= 20


@njit(cache=True, inline="always")
def r14_2_flag_word(tcp_hdr_len, tcp_flags, tcp_win, kept):
    """R14.2: tcp_flag_word as compared: data offset, the kept flag bits and the 16-bit window, packed."""
    return ((tcp_hdr_len >> 2) << 28) | ((tcp_flags & kept) << 16) | tcp_win


@njit(cache=True, inline="always")
def r8_r11_l3_word(ttl, tos, df):
    """R8/R11: TTL/hop limit, TOS/traffic class and (IPv4) DF packed; any difference prevents merging.
    ``df`` must be 0 for IPv6. Bit 0 is DF (R14.5 reads it)."""
    return (ttl << 16) | (tos << 8) | df


# --- R2: already aggregated input ---------------------------------------------------------------------------
@njit(cache=True, inline="always")
def r2_syn_mss(a, b):
    """The connection's MSS bound from SYN options of both directions: the smaller one seen, 0 if none."""
    if a and b:
        return min(a, b)
    return a if a else b


JUMBO_MTU_MAX = 9216  # the largest MTU jumbo-frame links commonly take (r2_capture_mtu's ceiling)


def r2_capture_mtu(ip_len, payload_len, tcp_flags, l4_proto):
    """R2 without a SYN MSS needs the link's MTU, which a capture does not record, but a pre-GRO capture of a
    jumbo-frame link shows it: a bulk sender's full segments fill the MTU, one after another without PSH (a
    write's last segment has it), so most data segments have the one largest IP length, a little over 1500 up
    to 9216 bytes (``JUMBO_MTU_MAX``). Taken from per-row columns (numpy) of the capture's first batch: that
    length when at least 16 TCP data segments (not SYN) are there, at least half of them have it without PSH and
    none is longer; else None (1500 stays). An aggregated capture (post-GRO, TSO side) has lengths far past 9216
    or spread over many sizes, one of an application's fixed-size writes has PSH on each (TSO skb or GRO
    super-packet), and a 1500-byte link has none above 1500."""
    data = (l4_proto == 6) & (payload_len > 0) & ((tcp_flags & TH_SYN) == 0)
    n = int(data.sum())
    if n < 16:
        return None
    lens = ip_len[data]
    top = int(lens.max())
    full = (lens == top) & ((tcp_flags[data] & TH_PSH) == 0)
    if not 1500 < top <= JUMBO_MTU_MAX or 2 * int(full.sum()) < n:
        return None
    return top


def r2_fallback_limit(fallback_mtu, v4):
    """R2 detection without a SYN MSS: what fits the MTU (less the IP and TCP headers), a static fact of the flow
    (its IP version); the engines compute it once per flow key for ``r2_plain_limit``."""
    return fallback_mtu - (20 if v4 else 40) - 20


@njit(cache=True, inline="always")
def r2_plain_limit(gso_auto, syn_mss, fallback_limit):
    """R2 detection: a payload above this cannot be one wire segment (the SYN MSS, else ``r2_fallback_limit``)."""
    if not gso_auto:
        return NO_LIMIT
    if syn_mss:
        return syn_mss
    return fallback_limit


@njit(cache=True, inline="always")
def r2_gso_size(syn_mss, largest_plain, plain_limit, tcp_hdr_len):
    """R2/R14.6: gso_size of an aggregated input: the SYN MSS less the option bytes, else the largest plain
    segment seen on the flow, else the plain limit less the option bytes."""
    if syn_mss:
        return max(1, syn_mss - (tcp_hdr_len - 20))
    if largest_plain:
        return largest_plain
    return max(1, plain_limit - (tcp_hdr_len - 20))


@njit(cache=True, inline="always")
def r2_gso_segs(ln, gso_size):
    """R2: gso_segs of an aggregated input: DIV_ROUND_UP(payload, gso_size)."""
    return (ln + gso_size - 1) // gso_size


# --- R14/R15: can the new packet join the held p? -----------------------------------------------------------
@njit(cache=True, inline="always")
def merge_verdict(fm, f, cwr_mask, fwm, ack, opt, l3w, seq, ln, gsz, ipid, needs_df, v4,
                  p_fwm, p_ack, p_opt, p_l3w, p_nxt, p_mss, p_plen, p_limit, p_id0, p_count, p_fixed):
    """R14 (every check against p's first segment) and R15a/R15c: (MERGE or the reason, p's fixed-ID mode).

    The kernel ORs its checks; when several fail, the reason is the most specific one, in the order of
    reasons.py (``_mismatch_reason``). The second value is p's IPv4 fixed-ID mode after this packet (R14.5),
    meaningful on a merge. p never holds a segment with RST, SYN or URG (R17), so an equal flag word rules them
    out. The common case (a contiguous segment with the same headers) takes the first branch; the checks left
    after it come last in the reason order too, so both branches give the same verdict."""
    # (RST, SYN and URG are in the flag word, so fwm == p_fwm excludes them: see above)
    if not fm and (f & cwr_mask) == 0 and ln != 0 and seq == p_nxt and ack == p_ack and fwm == p_fwm \
            and opt == p_opt and l3w == p_l3w:
        fixed = v4 and p_fixed  # (R14.5 is IPv4's: an IPv6 p is never in fixed-ID mode)
        if v4:
            # R14.5: IPv4 ID fixed (delta 0) or incrementing (delta == count), the mode decided on packet 2;
            # before 6.18 the fixed mode needed DF
            dlt = (ipid - p_id0) & 0xFFFF
            fixed = p_fixed or (p_count == 1 and dlt == 0 and ((l3w & 1) != 0 or not needs_df))
            if dlt != (0 if fixed else p_count):
                return R.IP_ID, p_fixed
        if gsz:
            if gsz != p_mss:
                return R.GSO_SIZE_MISMATCH, p_fixed  # R14.6: a GSO input's gso_size must equal p's mss
        elif ln > p_mss:
            return R.MSS_EXCEEDED, p_fixed  # R14.6: (len - 1) >= mss
        if p_plen + ln >= p_limit:
            return R.SIZE_LIMIT, p_fixed  # R15a/R15b: p->len + len >= limit refuses
        return MERGE, fixed
    return _mismatch_reason(fm, f, cwr_mask, fwm, ack, opt, l3w, seq, ln, p_fwm, p_ack, p_opt, p_l3w, p_nxt), p_fixed


@njit(cache=True)
def _mismatch_reason(fm, f, cwr_mask, fwm, ack, opt, l3w, seq, ln, p_fwm, p_ack, p_opt, p_l3w, p_nxt):
    """merge_verdict's reason when one of its first checks failed (the order of reasons.py)."""
    if fm:
        return R.FLUSH_MARKED  # R15c (R2/R7/R11): a flush-marked packet never merges
    if f & TH_RST:
        return R.RST  # R14.2
    if f & TH_SYN:
        return R.SYN  # R14.2
    if f & TH_URG:
        return R.URG  # R14.2
    if f & cwr_mask:
        return R.CWR  # R14.1: CWR on the new segment flushes (<= 6.19)
    if ln == 0:
        return R.FIN if f & TH_FIN else R.NO_PAYLOAD  # R14.6: (len - 1) >= mss for len 0
    if seq != p_nxt:
        return R.SEQ_GAP  # R14.7: contiguous (mod 2^32)
    if ack != p_ack:
        return R.ACK_CHANGE  # R14.3: ack_seq must match
    d = fwm ^ p_fwm
    if d:
        if d >> 28:
            return R.OPTION_CHANGE  # R14.2: data offset differs (option length)
        if d >> 16:
            return R.CWR if (d >> 16) & TH_CWR else R.FLAGS  # R14.2 (CWR compared on 7.0)
        return R.WINDOW_CHANGE  # R14.2: the window field
    if opt != p_opt:
        return R.OPTION_CHANGE  # R14.4: every option byte must match
    return R.IP_CHANGE  # R8/R11/R14.5: TTL/hop limit, TOS/TC, DF (l3w != p_l3w: the only check left)


# --- R16/R17: after a merge, and packets that never join -----------------------------------------------------
@njit(cache=True, inline="always")
def r16_completes(ln, cnt, gsz, mss, f):
    """R16: after merging, p completes now if the segment is short (GSO input: len != count * gso_size) or
    carries URG, PSH, RST, SYN or FIN."""
    short = (ln != cnt * gsz) if gsz else (ln < mss)
    return short or (f & ALONE_FLAGS) != 0


@njit(cache=True, inline="always")
def r16_ored_flags(f):
    """R16: the new segment's PSH and FIN are ORed into p's header."""
    return f & ORED_FLAGS


@njit(cache=True)
def r16_reason(f):
    """R16: why p completed right after merging a segment with flags f (else it was short)."""
    if f & TH_FIN:
        return R.FIN
    if f & TH_PSH:
        return R.PSH
    if f & TH_URG:
        return R.URG
    if f & TH_RST:
        return R.RST
    if f & TH_SYN:
        return R.SYN
    return R.SHORT_SEGMENT


@njit(cache=True, inline="always")
def r17_goes_alone(fm, f, ln, cnt, gsz):
    """R17: a packet that did not merge is delivered alone (never held) if it is flush-marked, carries URG,
    PSH, RST, SYN or FIN, or has no payload (a GSO input: len != count * gso_size)."""
    return fm or (f & ALONE_FLAGS) != 0 or ((ln != cnt * gsz) if gsz else (ln == 0))


@njit(cache=True)
def r17_alone_reason(fm, f):
    """R17: why a payload-carrying packet was delivered alone instead of held."""
    if fm:
        return R.FLUSH_MARKED
    if f & TH_RST:
        return R.RST
    if f & TH_SYN:
        return R.SYN
    if f & ALONE_FLAGS:
        return r16_reason(f)
    return R.SHORT_SEGMENT  # a GSO input with len != count * gso_size


# --- R20: what the stack and tcpdump see ---------------------------------------------------------------------
@njit(cache=True, inline="always")
def r20_completed(l2, l3, count, mss, v4, hbh):
    """R20: (frame length, BIG TCP encoding, gso_size) of a completed p with L3 length ``l3``.

    count 1 goes up unchanged (gso_size 0). Above 64 KiB IPv4 gets tot_len 0; IPv6 gets the 8-byte HBH jumbo
    header (<= 6.19, ``hbh``) or payload_len 0 without it (7.0)."""
    frame_len = l2 + l3
    big = np.int64(BIGTCP_NONE)  # typed locals: numba.pycc refuses to re-bind a literal-typed one
    gso = np.int64(0)
    if count > 1:
        gso = np.int64(mss)
        if v4:
            if l3 > 65535:
                big = np.int64(BIGTCP_V4_TOTLEN0)
        elif l3 - 40 > IPV6_MAXPLEN:
            if hbh:
                big = np.int64(BIGTCP_HBH_JUMBO)
                frame_len += 8
            else:
                big = np.int64(BIGTCP_V6_PLEN0)
    return frame_len, big, gso


@njit(cache=True, inline="always")
def r20_observed(gso_input, npk):
    """R2/R20: a row is ``observed`` when it is one input packet that was already an aggregate and GRO added
    nothing to it (superpacket.SOURCE_OBSERVED = 1), else ``rebuilt`` (0)."""
    return 1 if (gso_input and npk == 1) else 0


# --- R21: NAPI polls ------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def r21_4_jiffy(now, phase, hz):
    """R21.4: jiffies at time ``now``: floor((now - phase) * hz / 1e9), without int64 overflow (hz <= 10**6)."""
    x = now - phase
    qd = x // 1_000_000_000
    r = x - qd * 1_000_000_000
    return qd * hz + (r * hz) // 1_000_000_000


def r21_2_push_gap_ns(cfg: GroConfig) -> float:
    """R21.2b: the idle gap (ns) after a PSH segment that ends a poll; inf with a NIC coalescing model.

    On veth the sender's CPU runs the receiver's NAPI poll itself, in the softirq that follows its transmit
    (local_bh_enable after dev_hard_start_xmit). A segment with PSH is the last of what one send call pushed
    (tcp_push marks it), so an idle gap right after it is the sender leaving the transmit path: the poll runs
    there and takes the ring empty. A NIC's poll comes from its interrupt coalescing instead, which the
    sender's pushes do not move."""
    if cfg.rx_usecs > 0 or cfg.rx_frames > 0:
        return math.inf
    return float(cfg.poll_push_gap_us) * 1000.0


@njit(cache=True, inline="always")
def r21_2_poll_ended(has_last, t, last, gap, marked, mark, last_push, push_gap):
    """R21.2 (section 7.1): the running poll ended before a packet at t: an idle gap longer than poll_gap_us
    since the poll's last packet, or (R21.2b) longer than poll_push_gap_us when that packet carried PSH
    (``last_push``); when poll starts are known (``marked``), the packet is marked."""
    return has_last and (mark if marked else (t - last > gap or (last_push and t - last > push_gap)))


@njit(cache=True, inline="always")
def r21_2_end_cause(marked, idle, gap):
    """``poll_end`` of a poll that r21_2_poll_ended ended: a trace mark, an idle gap longer than poll_gap_us,
    else the shorter gap after a push (R21.2b)."""
    return R.PE_TRACE if marked else R.PE_GAP if idle > gap else R.PE_PUSH_GAP


@njit(cache=True, inline="always")
def nic_window_closed(frames, t, window_start, rx_usecs_ns, rx_frames):
    """NIC interrupt coalescing (gro-spec 7.1: "for NICs use >= rx-usecs"): ``frames`` packets arrived since the
    first one that found NAPI idle, at ``window_start``; the IRQ fired rx-usecs after it (or once rx-frames
    were waiting), so a packet at t belongs to the next poll when t is past the window or the frame limit was
    reached. No window (rx-usecs 0 and rx-frames 0, or no packet yet): never."""
    if frames == 0 or (rx_usecs_ns == 0 and rx_frames == 0):
        return False
    return (rx_usecs_ns > 0 and t - window_start > rx_usecs_ns) or (rx_frames > 0 and frames >= rx_frames)


@njit(cache=True, inline="always")
def r21_5_poll_end(work, held, tmo, defer_hard_irqs, defer_count):
    """R21.2/R21.5 napi_complete_done(work): (timer timeout, IRQs stay masked, new defer count).

    A poll that did work with entries held arms gro_flush_timeout and refills the defer count; while the
    count lasts, the poll re-arms the timer with IRQs masked. A timeout of 0 flushes everything (R21.2), else
    only old entries (R21.4) and the timer poll follows."""
    timeout = tmo * 0  # 0, typed like tmo (numba.pycc refuses to re-bind a literal-typed local; the reference
    # engine runs this on Python ints that may exceed int64)
    if work:
        if held:
            timeout = tmo
        defer_count = defer_hard_irqs
    masked = False
    if defer_count > 0:
        defer_count -= 1
        timeout = tmo
        masked = tmo > 0
    return timeout, masked, defer_count


@njit(cache=True, inline="always")
def r21_3_budget_used(work, weight):
    """R21.3: the poll used its whole budget (napi_weight packets of the queue, every packet counts)."""
    return work >= weight



# --- poll inference from the capture's own evidence (gro-spec 7.1) -----------------------------------------------
@njit(cache=True, inline="always")
def acked_end_ends_poll(acked, still_held, next_would_merge):
    """The receiver ACKed exactly the end of this segment, so the stack saw a super-packet end here (an ACK can
    only acknowledge up to the end of a packet the stack received, and GRO delivers whole super-packets). When
    no rule ended it (the entry is still held, and the flow's next segment would merge into it: otherwise R14/
    R15 cut there anyway, e.g. at the size limit), the NAPI poll ended after this segment."""
    return acked and still_held and next_would_merge


@njit(cache=True, inline="always")
def acked_end_poll_waits(at_once, work, waiting):
    """Where the poll ends after an ACKed end of flow A's super-packet (``acked_end_ends_poll``). The ACK shows
    that A's next segment came in a later poll; the other flows' packets captured between the two may have come
    in either. A NAPI poll takes what the ring holds up to its budget (R21.3), and a receiver whose ACKs mark
    ends inside a burst is taking packets back to back, so they come in this one: the poll's end waits, and
    comes before A's next segment (``acked_flow_returns``), at the budget, at an idle gap or after another
    flow's ACKed end, whichever is first (True). False, the poll ends after this segment: the budget ended it on
    this very packet (``work`` 0), another flow's ACKed end is already waiting (``waiting`` >= 0: ending here
    keeps both flows' ends), or ``at_once``: gro_flush_timeout's timer model runs, or HZ >= 1000, where a full
    budget keeps this jiffy's entries (R21.3) and so would keep this one past its end. With a single flow
    nothing comes between, and the poll ends after the segment."""
    return not at_once and work != 0 and waiting < 0


@njit(cache=True, inline="always")
def acked_flow_returns(waiting, gid):
    """A packet of flow key ``gid`` comes while its ACKed end left the running poll's end waiting (``waiting``:
    that key, -1 for none; ``acked_end_poll_waits``): the poll ended before this packet."""
    return waiting >= 0 and gid == waiting


@njit(cache=True, inline="always")
def acked_row_poll_end(cause, waiting, gid):
    """``poll_end`` of a row of flow key ``gid`` that a poll end completed: the poll's ``cause``, but ``ack`` for
    the flow whose ACKed end left that poll's end waiting (``waiting``, -1: none): its end is the one the ACK
    shows, whatever then ended the poll (the budget, an idle gap, another flow's ACKed end, its own next segment)."""
    return R.PE_ACK if waiting >= 0 and gid == waiting else cause


ACK_NEXT_ROWS = 4096
"""How far on ``acked_end_ends_poll`` looks for the flow's next segment (rows of the capture, every direction and
receiver: 64 NAPI budgets): one further on is taken as none (the rule then ends the poll). A bound, so that the
engines can be given that many rows of lookahead past a batch (``feed(..., upto=)``) and the rows do not depend on
where batches end; before it the look reached the end of the batch (the same rows on the kernel pairs and on the
default reader's batches of a 20k-packet many-flows capture)."""

BUSY_SLACK_NS = 10_000
"""How much later than the next packet an ACK that does not cover the running poll's segments must come to count
as evidence that the poll was still running (10 us: the ACK's own way back to the capture point)."""


@njit(cache=True, inline="always")
def busy_poll_continues(busy, t, slack):
    """The receiver sent an ACK not yet covering a segment of the running poll at ``busy``, later than ``slack``
    after the next packet arrived at t (``evidence.evidence_scan``): the stack had not been handed that segment by
    then, so the poll that took it was still running when the packet came, and the idle gap before it did not
    end the poll (gro-spec 7.1; a receiver that is behind takes packets back to back whatever the sender's
    gaps). 0 = no evidence."""
    return busy > 0 and busy - t > slack

