"""GroConfig: every knob of the GRO engine, with the kernel's defaults (gro-spec.md sections 4 and 6).

The receiver's settings cannot be read from a capture, so they are parameters; ``to_metadata()`` records them
next to the output so a reader knows what the rebuilt super-packets assumed.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

GRO_MAX_SIZE = 8 * 65535  # 524280: upper bound for gro_max_size / gro_ipv4_max_size (rtnetlink validate_linkmsg)
GRO_LEGACY_MAX_SIZE = 65536  # default limits, and the coupling threshold of netif_set_gro_max_size()
MIN_KERNEL = (6, 3)  # the spec covers 6.3+ (gro_ipv4_max_size exists)
DEFAULT_FALLBACK_MTU = 1500  # fallback_mtu where neither the option nor the capture gives one


def parse_kernel(kernel: str) -> tuple[int, int]:
    """``"6.18"`` / ``"6.18.44-foo"`` / ``"7.0"`` -> (major, minor); ValueError if it is not a version."""
    m = re.match(r"^\s*(\d+)\.(\d+)", str(kernel))
    if not m:
        raise ValueError(f"kernel must look like '6.18' or '7.0', got {kernel!r}")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class GroConfig:
    """Receiver settings the GRO engine assumes (gro-spec.md section 6). All fields validated on creation.

    Example: ``GroConfig(gro_max_size=185000)`` models ``ip link set dev X gro_max_size 185000`` on a 6.18
    kernel with HZ=250: IPv6 limit 185000, IPv4 limit still 65536 (kernel coupling, section 4).
    """

    kernel: str = "6.18"
    """Version behaviour: IP-ID rule (<= 6.17 needs DF for fixed IDs), CWR flush (<= 6.19), IPv6 > 64 KiB
    representation (<= 6.19 HBH jumbo, 7.0+ payload_len 0)."""
    gro_max_size: int = 65536
    """IPv6 limit (R15a): the largest super-packet has an L3 length of gro_max_size - 1."""
    gro_ipv4_max_size: int | None = None
    """IPv4 limit. None = kernel coupling: gro_max_size if it is <= 65536, else 65536."""
    napi_weight: int = 64
    """Packets per NAPI poll per RX queue (all packets of the queue count, not only TCP)."""
    hz: int = 250
    """Kernel HZ: < 1000 flushes everything at a full-budget poll; >= 1000 only entries of older jiffies."""
    jiffy_phase_ns: int = 0
    """Offset of the jiffy boundaries against capture time (unknowable; 0 or sweep it)."""
    poll_gap_us: float = 20.0
    """Idle gap that ends a NAPI poll: packets further apart land in different polls (section 7.1)."""
    poll_push_gap_us: float = 6.0
    """R21.2b: the shorter idle gap that ends a poll after a segment with PSH (veth: the sender's push ends its
    transmit, and the poll runs right after it). math.inf turns the rule off; not used with rx_usecs/rx_frames."""
    gro_flush_timeout_ns: int = 0
    """R21.5: > 0 keeps young entries across polls and re-polls after this timeout."""
    napi_defer_hard_irqs: int = 0
    """R21.5: polls that keep IRQs masked and re-poll from the timer (needs gro_flush_timeout_ns > 0)."""
    rx_queues: int = 1
    """NAPI instances; flows are spread over them by the flow hash (a stand-in for RSS)."""
    gro_hash_buckets: int = 8
    """GRO_HASH_BUCKETS: bucket = flow hash % buckets."""
    max_gro_skbs: int | float = 8
    """MAX_GRO_SKBS per bucket (R18); math.inf disables eviction (flow hash unknown, few flows)."""
    checksum_ok: bool = True
    """Treat IP/TCP checksums as valid. False is rejected: PacketBatch carries no checksum status yet."""
    treat_padding_as_flush: bool = True
    """R7/R11: a frame with more L3 bytes than its length field (Ethernet padding) is flush-marked."""
    input_is_gso: bool | str = "auto"
    """"auto" (or True): a packet whose payload exceeds the flow's MSS is an already aggregated (GSO) input
    (R2, R14.6). False: every packet is a plain segment."""
    hbh_headroom_ok: bool = True
    """R15b: IPv6 (<= 6.19) may pass 64 KiB only with 8 bytes of headroom for the HBH; assume it is there."""
    fallback_mtu: int | None = None
    """Without a SYN MSS option for a flow, a payload that cannot fit this L3 MTU marks an aggregated input.
    None: read off the capture where it is unambiguous (a jumbo-frame link: at least half the data segments of
    the first batch have one IP length from 1501 to 9216 bytes without PSH and none is longer;
    rules.r2_capture_mtu), else 1500."""
    rx_usecs: int = 0
    """NIC interrupt coalescing (``ethtool -c``'s rx-usecs): the IRQ, and with it the NAPI poll, comes this
    many microseconds after the first packet that arrives while NAPI is idle; the poll takes what arrived by
    then, later packets wait for the next one. 0: no coalescing window (veth, or rx-usecs 0)."""
    rx_frames: int = 0
    """``ethtool -c``'s rx-frames: the IRQ fires as soon as this many packets wait, if before rx-usecs.
    0: no frame limit."""
    split_receivers: bool = True
    """One GRO/NAPI model per receiving host (destination MAC, the cooked capture's direction, or the
    destination address), so that ACKs coming back never count into the data receiver's NAPI budget."""
    ack_evidence: bool = True
    """Poll inference from the capture: a data segment whose end the receiver ACKed exactly, and that no rule
    ended a super-packet at, ends the NAPI poll (an ACK can only cover whole super-packets, gro-spec 7.1)."""

    def __post_init__(self) -> None:
        ver = parse_kernel(self.kernel)
        if ver < MIN_KERNEL:
            raise ValueError(f"kernel {self.kernel!r}: the GRO model covers Linux 6.3 and later")
        _check_size("gro_max_size", self.gro_max_size)
        if self.gro_ipv4_max_size is not None:
            _check_size("gro_ipv4_max_size", self.gro_ipv4_max_size)
        _check_int("napi_weight", self.napi_weight, 1)
        _check_int("hz", self.hz, 1)
        _check_int("jiffy_phase_ns", self.jiffy_phase_ns, None)
        gap = self.poll_gap_us
        if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not gap >= 0:
            raise ValueError(f"poll_gap_us must be a number >= 0 (math.inf: no gap rule), got {self.poll_gap_us!r}")
        pgap = self.poll_push_gap_us
        if isinstance(pgap, bool) or not isinstance(pgap, (int, float)) or not pgap >= 0:
            raise ValueError(f"poll_push_gap_us must be a number >= 0 (math.inf: no push-gap rule), got {pgap!r}")
        _check_int("gro_flush_timeout_ns", self.gro_flush_timeout_ns, 0)
        _check_int("napi_defer_hard_irqs", self.napi_defer_hard_irqs, 0)
        _check_int("rx_queues", self.rx_queues, 1, 65536)  # (a device has at most a few thousand)
        _check_int("gro_hash_buckets", self.gro_hash_buckets, 1, 65536)  # (the kernel's GRO_HASH_BUCKETS is 8)
        if not (self.max_gro_skbs == math.inf or (isinstance(self.max_gro_skbs, int)
                                                  and not isinstance(self.max_gro_skbs, bool)
                                                  and self.max_gro_skbs >= 1)):
            raise ValueError(f"max_gro_skbs must be an int >= 1 or math.inf, got {self.max_gro_skbs!r}")
        if self.checksum_ok is not True:
            raise ValueError("checksum_ok=False needs per-packet checksum status, which PacketBatch does not "
                             "carry yet; R12 bad-checksum packets cannot be modelled")
        if self.treat_padding_as_flush not in (True, False):
            raise ValueError(f"treat_padding_as_flush must be True or False, got {self.treat_padding_as_flush!r}")
        if not (self.input_is_gso == "auto" or self.input_is_gso is True or self.input_is_gso is False):
            raise ValueError(f"input_is_gso must be 'auto', True or False, got {self.input_is_gso!r}")
        if self.hbh_headroom_ok not in (True, False):
            raise ValueError(f"hbh_headroom_ok must be True or False, got {self.hbh_headroom_ok!r}")
        if self.fallback_mtu is not None:
            _check_int("fallback_mtu", self.fallback_mtu, 68)
        _check_int("rx_usecs", self.rx_usecs, 0)
        _check_int("rx_frames", self.rx_frames, 0)
        if self.rx_usecs > 10**9:
            raise ValueError(f"rx_usecs must be <= 10**9 (1000 s), got {self.rx_usecs!r}")
        for name in ("split_receivers", "ack_evidence"):
            if getattr(self, name) not in (True, False):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    # --- derived values -----------------------------------------------------------------------------------
    @property
    def mtu(self) -> int:
        """The fallback MTU the engines use (``fallback_mtu``, else ``DEFAULT_FALLBACK_MTU``)."""
        return DEFAULT_FALLBACK_MTU if self.fallback_mtu is None else self.fallback_mtu

    @property
    def kernel_version(self) -> tuple[int, int]:
        """(major, minor) of ``kernel``."""
        return parse_kernel(self.kernel)

    @property
    def ipv4_limit(self) -> int:
        """Effective gro_ipv4_max_size (section 4: netif_set_gro_max_size copies sizes <= 65536)."""
        if self.gro_ipv4_max_size is not None:
            return self.gro_ipv4_max_size
        return min(self.gro_max_size, GRO_LEGACY_MAX_SIZE)

    @property
    def cwr_flushes(self) -> bool:
        """R14.1: CWR on a new segment forces a flush up to 6.19; 7.0 compares it like the other flags."""
        return self.kernel_version < (7, 0)

    @property
    def fixedid_needs_df(self) -> bool:
        """R14.5: before 6.18 the fixed-IP-ID mode needed DF=1 on the second packet."""
        return self.kernel_version < (6, 18)

    @property
    def ipv6_hbh(self) -> bool:
        """R20: IPv6 super-packets > 64 KiB get an 8-byte HBH jumbo header up to 6.19 (7.0: payload_len 0)."""
        return self.kernel_version < (7, 0)

    def to_metadata(self) -> dict[str, Any]:
        """Every field plus the derived values, JSON-friendly (for Parquet/provenance metadata)."""
        d: dict[str, Any] = asdict(self)
        if d["max_gro_skbs"] == math.inf:
            d["max_gro_skbs"] = "inf"
        for k in ("poll_gap_us", "poll_push_gap_us"):
            if d[k] == math.inf:
                d[k] = "inf"
        d["effective_gro_ipv4_max_size"] = self.ipv4_limit
        d["cwr_flushes"] = self.cwr_flushes
        d["fixedid_needs_df"] = self.fixedid_needs_df
        d["ipv6_big_representation"] = "hbh_jumbo" if self.ipv6_hbh else "v6_plen0"
        d["spec"] = "gro-spec.md R1-R24"
        return d


def _check_size(name: str, v: Any) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not (1 <= v <= GRO_MAX_SIZE):
        raise ValueError(f"{name} must be an int in 1..{GRO_MAX_SIZE} (the kernel's GRO_MAX_SIZE), got {v!r}")


def _check_int(name: str, v: Any, lo: int | None, hi: int | None = None) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or (lo is not None and v < lo) or (hi is not None and v > hi):
        bound = "" if lo is None else f" >= {lo}" if hi is None else f" from {lo} to {hi}"
        raise ValueError(f"{name} must be an int{bound}, got {v!r}")
