"""Why a super-packet ended: small integer codes (one byte in the output) and their names.

A code says what completed the row, in the words of ``gro-spec.md``. Three families:

* the packet that arrived could not join the held super-packet p (R14/R15: p is flushed, R17);
* the packet joined p and then forced its completion (R16);
* something outside the flow completed p: a NAPI poll boundary (R21), a full bucket (R18), end of input.

Rows for packets that never entered aggregation (delivered alone, R5/R9/R12/R17) carry the reason they went
alone (``psh``, ``flush_marked``, ``not_mergeable_alone``, ...).

When several R14 checks fail at once (the kernel ORs them, so it has no "first" reason) the engine reports the
most specific one in this order: flush_marked, rst/syn/urg, cwr, no_payload/fin, seq_gap, ack_change,
flag word (option_change for a data-offset change, flags, window_change), option_change, ip_change, ip_id,
gso_size_mismatch/mss_exceeded, size_limit.
"""

from __future__ import annotations

import numpy as np

# --- the new packet could not merge into p (p flushed, R17) -------------------------------------------------
SIZE_LIMIT = 1  # R15a/R15b: p->len + len >= gro_max_size / gro_ipv4_max_size
ACK_CHANGE = 2  # R14.3: ack_seq differs from p's first segment
OPTION_CHANGE = 3  # R14.4: an option byte (TSval, SACK, ...) or the data offset differs
WINDOW_CHANGE = 4  # R14.2: only the 16-bit window of the flag word differs
FLAGS = 5  # R14.2: ECE/ACK/AE (or CWR on 7.0) differ in the flag word
SEQ_GAP = 6  # R14.7: seq != p.seq + payload(p) (hole, retransmission, reordering)
IP_CHANGE = 7  # R8/R11: TTL/hop limit, TOS/traffic class (ECN CE!) or DF differ
IP_ID = 8  # R14.5: IPv4 ID neither fixed nor incrementing as p's mode requires
CWR = 9  # R14.1: CWR set on the new segment (kernel <= 6.19)
MSS_EXCEEDED = 10  # R14.6: payload larger than p's first segment (mss)
GSO_SIZE_MISMATCH = 11  # R14.6: a GSO input whose gso_size != p's mss
NO_PAYLOAD = 12  # R14.6/R17: a zero-payload packet (pure ACK, dup ACK, window update) on the flow
FLUSH_MARKED = 13  # R2/R7/R11/R15c: length field != frame (padding, BIG TCP input, truncation) or evil bit
RST = 14  # R14.2/R17: RST set on the new packet
SYN = 15  # R14.2/R17: SYN set on the new packet
URG = 16  # R14.2/R16/R17: URG set on the new packet
# --- the new packet merged and then completed p (R16), or went alone for the same reason (R17) -------------
PSH = 17  # R16/R17: PSH on the last segment
FIN = 18  # R16/R17: FIN on the last segment (or a bare FIN arriving on the flow)
SHORT_SEGMENT = 19  # R16: last segment shorter than mss (GSO input: len != count * gso_size)
# --- completed from outside the flow ------------------------------------------------------------------------
NAPI_POLL = 20  # R21.2-R21.5: end of a NAPI poll (short poll, full budget at HZ < 1000, flush-old, timer)
BUCKET_EVICT = 21  # R18: its bucket was full (8 held) and a new flow needed the slot; oldest goes
END_OF_CAPTURE = 22  # section 3 step 7: GroEngine.flush() at end of input
NOT_MERGEABLE_ALONE = 23  # R5/R9/R12 (and R19 tunnels): GRO gave up, packet delivered alone, held p untouched
# --- not a flush at all ------------------------------------------------------------------------------------
OBSERVED = 24  # R2: the capture already shows an aggregate (post-GRO or TSO-side); n_segments = its gso_segs

REASON_NAMES: tuple[str, ...] = (
    "none",
    "size_limit",
    "ack_change",
    "option_change",
    "window_change",
    "flags",
    "seq_gap",
    "ip_change",
    "ip_id",
    "cwr",
    "mss_exceeded",
    "gso_size_mismatch",
    "no_payload",
    "flush_marked",
    "rst",
    "syn",
    "urg",
    "psh",
    "fin",
    "short_segment",
    "napi_poll",
    "bucket_evict",
    "end_of_capture",
    "not_mergeable_alone",
    "observed",
)
"""Name of each code, indexed by the code (``REASON_NAMES[SIZE_LIMIT] == "size_limit"``)."""

REASON_CODES: dict[str, int] = {name: code for code, name in enumerate(REASON_NAMES)}
"""Code of each name (the inverse of ``REASON_NAMES``)."""


def reason_name(code: int) -> str:
    """The name of a flush-reason code (``"size_limit"`` for 1)."""
    return REASON_NAMES[code]


# --- what ended a NAPI poll, for rows completed by one (``poll_end`` column; gro-spec 7.1) -----------------------
PE_NONE = 0  # the row did not end at a poll end (a rule completed it, or it went alone)
PE_ACK = 1  # evidence: the receiver ACKed exactly this super-packet's end and no rule had ended it
PE_GAP = 2  # guessed: an idle gap longer than poll_gap_us in the capture's timestamps
PE_BUDGET = 3  # model: the poll used its napi_weight budget (R21.3)
PE_TIMER = 4  # model: gro_flush_timeout / napi_defer_hard_irqs timer polls (R21.5)
PE_TRACE = 5  # known: a poll start given by the caller (the kernel's napi:napi_poll trace)
PE_END = 6  # the end of the capture
PE_COALESCE = 7  # model: the NIC's interrupt coalescing window (rx-usecs / rx-frames) closed
PE_PUSH_GAP = 8  # guessed from the sender: an idle gap longer than poll_push_gap_us after a PSH segment (R21.2b)
POLL_END_NAMES: tuple[str, ...] = ("none", "ack", "gap", "budget", "timer", "trace", "end_of_capture",
                                   "coalescing", "push_gap")
"""Name of each poll_end code."""
POLL_END_CUT = np.array([0, 1, 2, 0, 0, 1, 0, 0, 2], np.uint8)
"""Per poll_end code: 1 where the capture evidences the poll end (ack, trace), 2 where it is guessed from the
timestamps (gap, push_gap), 0 otherwise (no poll end, or the model's budget, timer, coalescing, end of capture):
flows.parquet's ``poll_ends_evidenced`` / ``poll_ends_guessed``."""
