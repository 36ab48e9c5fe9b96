"""The audit's verdict per frame and the reason it gives, in one compiled pass over a batch.

A frame's verdict compares what the expression matched on the raw frame with the truth (what it matches on the
frame's normalized copy, with tcp[]/udp[] indexing extended to IPv6 where the expression uses it): ok, missed
(the truth matches, the raw frame does not) or false match; a frame whose truth cannot be known is not audited
(its reason says why: not IP, a tunnel the copy cannot rewrite, a fragment, a truncated header, a link type the
decoder does not know, or libpcap rejecting the expression for its link type). A mis-classified frame's reason is
the first rule of ``reason`` that holds. The verdict codes, the reasons and their names have their home here.
"""

from __future__ import annotations

import numpy as np

from .._native import njit
from ..decode.schema import BIGTCP_HBH_JUMBO, BIGTCP_V4_TOTLEN0, BIGTCP_V6_PLEN0
from . import normalize as nz

OK, MISSED, FALSE_MATCH, NOT_AUDITED = 0, 1, 2, 3
VERDICT_NAMES = ("ok", "missed", "false_match", "not_audited")
# reasons, in the order they are tried for a mis-classified frame; then why a frame was not audited
R_NONE, R_TCP_INDEX, R_UDP_INDEX, R_HBH_JUMBO, R_EXT_HEADER, R_V6_PLEN0, R_V4_TOTLEN0, R_OTHER = range(8)
R_NOT_IP, R_TUNNEL, R_FRAGMENT, R_TRUNCATED, R_LINKTYPE, R_REJECTED = range(8, 14)
R_SNAPLEN = 14  # (tried first) libpcap cuts the record to the file's snaplen, and the cut changes the verdict
REASON_NAMES = ("", "tcp_index_ipv4_only", "udp_index_ipv4_only", "ipv6_hbh_jumbo", "ipv6_ext_header", "v6_plen0",
                "v4_totlen0", "other", nz.SKIP_NOT_IP, nz.SKIP_TUNNEL, nz.SKIP_FRAGMENT, nz.SKIP_TRUNCATED,
                "linktype_not_decoded", "filter_rejected_for_linktype", "cut_by_file_snaplen")
NREASONS = len(REASON_NAMES)

# the counters ``judge`` adds to (stats[...]), then the reasons of the mis-classified frames (NREASONS), the reasons
# of the frames not audited (NREASONS) and the audited frames each candidate rewrite judges unlike the truth
(S_NOT_AUDITED, S_RAW, S_TRUTH, S_MISSED, S_FALSE, S_ALT_TRUTH, S_ALT_MISSED, S_ALT_FALSE, S_CUT,
 S_CUT_CHANGED) = range(10)
S_REASONS = 10
S_NA_REASONS = S_REASONS + NREASONS
S_CANDIDATES = S_NA_REASONS + NREASONS


def stats_size(candidates: int) -> int:
    return S_CANDIDATES + candidates


@njit(cache=True, inline="always")
def reason(index_gap, l4_proto, ver, has_jumbo, bigtcp, ext_len, ip_len_field):
    """Why a mis-classified frame is judged wrongly: the first rule that holds."""
    if index_gap:
        return np.int64(R_UDP_INDEX) if l4_proto == 17 else np.int64(R_TCP_INDEX)
    if ver == 6 and (has_jumbo != 0 or bigtcp == BIGTCP_HBH_JUMBO):
        return np.int64(R_HBH_JUMBO)
    if ver == 6 and ext_len > 0:
        return np.int64(R_EXT_HEADER)
    if bigtcp == BIGTCP_V6_PLEN0:
        return np.int64(R_V6_PLEN0)
    if bigtcp == BIGTCP_V4_TOTLEN0:
        return np.int64(R_V4_TOTLEN0)
    if ver == 4 and ip_len_field == 0:
        return np.int64(R_V4_TOTLEN0)
    if ver == 6 and ip_len_field == 0:
        return np.int64(R_V6_PLEN0)
    return np.int64(R_OTHER)


@njit(cache=True, entry=True,
      sig=("u8[::1], u8[::1], u8[::1], u8[::1], u8[::1], u8[:, ::1], i64, u8[::1], u8[::1], u8[::1], u8[::1], "
           "u16[::1], u32[::1], u8[::1], u8[::1], i64[::1], i64[::1]"))
def judge(raw, norm, truth, na, clip, cand, raw_header, l4_proto, ver, has_jumbo, bigtcp, ext_len, ip_len_field,
          verdict, why, keep, stats):
    """Verdict and reason of each frame, the frames to keep (not ok) in ``keep``, their count returned, and the
    batch's counts added to ``stats`` (layout above).

    ``raw``/``norm``/``truth``: the expression on the raw frame, on its normalized copy, and the truth (0/1);
    ``na``: R_NONE for an audited frame, else why not; ``clip``: 1 for a record libpcap cuts to its snapshot
    (``raw`` is then the expression on what libpcap reads, the others are of the whole frame), 2 where that cut
    changes the expression's verdict; ``cand[c]``: candidate rewrite c on the frame (not judged on cut records:
    no rewrite reads what libpcap left out). With
    ``raw_header`` the expression reads a field the normalization rewrites: it is judged on the raw frame (every
    audited frame is ok) and the normalized truth is counted beside it (S_ALT_*)."""
    k = 0
    for i in range(raw.shape[0]):
        audited = na[i] == R_NONE
        t = truth[i]
        r = raw[i]
        if audited:
            if clip[i] == 0:
                for c in range(cand.shape[0]):
                    if cand[c, i] != t:
                        stats[S_CANDIDATES + c] += 1
            else:
                stats[S_CUT] += 1
                if clip[i] == 2:
                    stats[S_CUT_CHANGED] += 1
            if raw_header:
                stats[S_ALT_TRUTH] += t
                if t and not r:
                    stats[S_ALT_MISSED] += 1
                if r and not t:
                    stats[S_ALT_FALSE] += 1
        if raw_header:
            t = r
        stats[S_RAW] += r
        v = np.int64(OK)
        w = np.int64(R_NONE)
        if not audited:
            v = np.int64(NOT_AUDITED)
            w = np.int64(na[i])
            stats[S_NOT_AUDITED] += 1
            stats[S_NA_REASONS + w] += 1
        else:
            stats[S_TRUTH] += t
            if r != t:
                v = np.int64(MISSED) if t else np.int64(FALSE_MATCH)
                if clip[i] == 2:
                    w = np.int64(R_SNAPLEN)
                else:
                    w = reason(norm[i] != t, l4_proto[i], ver[i], has_jumbo[i], bigtcp[i], ext_len[i], ip_len_field[i])
                stats[S_MISSED if t else S_FALSE] += 1
                stats[S_REASONS + w] += 1
        verdict[i] = v
        why[i] = w
        if v != OK:
            keep[k] = i
            k += 1
    return k


def pb_columns(pb) -> tuple[np.ndarray, ...]:
    """The columns of a PacketBatch (or RowsView) the reasons read, as ``judge`` takes them."""
    return (np.ascontiguousarray(pb.l4_proto, np.uint8), np.ascontiguousarray(pb.ip_version, np.uint8),
            np.ascontiguousarray(pb.has_jumbo).view(np.uint8), np.ascontiguousarray(pb.bigtcp, np.uint8),
            np.ascontiguousarray(pb.ext_len, np.uint16), np.ascontiguousarray(pb.ip_len_field, np.uint32))


def reasons(pb, bad: np.ndarray) -> np.ndarray:
    """The reason of each frame in ``bad`` (R_NONE for the others), with no tcp[]/udp[] indexing gap."""
    n = len(pb)
    zero = np.zeros(n, np.uint8)
    verdict, why = np.empty(n, np.uint8), np.empty(n, np.uint8)
    judge(np.ascontiguousarray(bad, bool).view(np.uint8), zero, zero, zero, zero, np.zeros((0, n), np.uint8), 0,
          *pb_columns(pb), verdict, why, np.empty(n, np.int64), np.zeros(stats_size(0), np.int64))
    return why
