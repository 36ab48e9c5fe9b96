"""EgressProfile: the limits and features of the device a GSO skb is handed to (docs/gso-spec.md section 3).

The egress device's settings are not in a capture, so they are parameters, validated to the ranges the kernel
accepts (rtnetlink ``validate_linkmsg``/``do_setlink``, ``netif_set_tso_max_size``). ``from_ip_link_json()``
reads them from ``ip -d -j link show DEV``; ``PROFILES`` holds a few named devices, each with its source.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ..gro.config import parse_kernel

GSO_MAX_SIZE = 8 * 65535  # 524280, netdevice.h; netif_set_tso_max_size() clamps a driver's size to it
GSO_MAX_SEGS = 65535  # netdevice.h
GSO_LEGACY_MAX_SIZE = 65536  # default gso_max_size / gso_ipv4_max_size, and the coupling threshold
MIN_MTU, MAX_MTU = 68, 65535  # ETH_MIN_MTU .. IP_MAX_MTU


class ProfileError(ValueError):
    """A profile file or value that is not usable; the message is one line and names the file (exit 2)."""


@dataclass(frozen=True)
class EgressProfile:
    """What the egress device allows (gso-spec G2-G4, G11-G12). All fields validated on creation.

    Example: ``EgressProfile(gso_max_size=65536)`` is a veth or bridge port at its defaults:
    IPv6 and IPv4 limit 65536, 65535 segments, TSO on, MTU 1500, today's segmentation.
    """

    gso_max_size: int = 65536
    """IPv6 limit (G2): a GSO skb whose length, L2 and HBH jumbo header (<= 6.19) included, is >= this is cut.
    ``ip link set DEV gso_max_size N``; at most ``tso_max_size``."""
    gso_ipv4_max_size: int | None = None
    """Limit for every other skb->protocol (IPv4, and VLAN-tagged frames today, G3). None = the kernel
    coupling: ``gso_max_size`` if that is <= 65536, else 65536 (netif_set_gso_max_size)."""
    gso_max_segs: int = GSO_MAX_SEGS
    """G2: a GSO skb of more than this many segments is cut. ``ip link set DEV gso_max_segs N``."""
    tso_max_size: int = GSO_MAX_SIZE
    """The driver's ceiling (``netif_set_tso_max_size``); user space cannot set gso sizes above it. Default
    524280: a BIG TCP capable device such as veth (the kernel's generic default is 65536)."""
    tso_max_segs: int = GSO_MAX_SEGS
    """The driver's segment ceiling (``netif_set_tso_max_segs``); gso_max_segs cannot exceed it."""
    tso: bool = True
    """G4: False is ``ethtool -K DEV tso off``: every GSO TCP skb is cut in software."""
    mtu: int = 1500
    """G12: a plain (non-GSO) frame whose L3 length exceeds it is dropped; also gives the MSS when a flow's SYN
    is not in the capture (mtu - IP header - TCP header)."""
    kernel: str = "6.18"
    """Kernel behaviour: before 6.18 a FIXEDID IPv4 skb with DF=0 cannot be segmented (G8); whether the skbs
    carry the HBH jumbo header (<= 6.19) is read from the capture."""
    resegment: bool = False
    """G10/G11: the re-segmentation series (seed 003) instead of today's MSS segmentation. Also switches the
    limit lookup to the L3 protocol (G3, the series' patch 1) unless ``vlan_l3_limit`` says otherwise."""
    vlan_l3_limit: bool | None = None
    """G3: True picks the limit by the L3 protocol under a VLAN tag (series patch 1), False by skb->protocol
    (today: a VLAN-tagged IPv6 skb gets gso_ipv4_max_size). None follows ``resegment``."""
    vlan_hwaccel: bool = True
    """G3: the outermost VLAN tag of a tagged frame is held out of band (skb->vlan_tci; veth and NICs with
    tx-vlan offload): it is neither in skb->len nor skb->protocol, only the tags under it are in-band. False:
    every tag the capture shows is in the packet data."""
    name: str = "custom"
    """Where the profile came from (a named profile, a file, or "custom"); recorded in the metadata."""

    def __post_init__(self) -> None:
        _check_int("tso_max_size", self.tso_max_size, 1, GSO_MAX_SIZE,
                   "netif_set_tso_max_size clamps to GSO_MAX_SIZE")
        _check_int("tso_max_segs", self.tso_max_segs, 1, GSO_MAX_SEGS, "GSO_MAX_SEGS")
        _check_int("gso_max_size", self.gso_max_size, 1, self.tso_max_size, "tso_max_size")
        if self.gso_ipv4_max_size is not None:
            _check_int("gso_ipv4_max_size", self.gso_ipv4_max_size, 1, self.tso_max_size, "tso_max_size")
        _check_int("gso_max_segs", self.gso_max_segs, 1, self.tso_max_segs, "tso_max_segs")
        _check_int("mtu", self.mtu, MIN_MTU, MAX_MTU, "IP_MAX_MTU")
        for flag in ("tso", "resegment", "vlan_hwaccel"):
            if getattr(self, flag) not in (True, False):
                raise ProfileError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if self.vlan_l3_limit not in (None, True, False):
            raise ProfileError(f"vlan_l3_limit must be True, False or None, got {self.vlan_l3_limit!r}")
        try:
            parse_kernel(self.kernel)
        except ValueError as e:
            raise ProfileError(str(e)) from None

    @property
    def ipv4_limit(self) -> int:
        """Effective gso_ipv4_max_size (netif_set_gso_max_size copies sizes <= 65536 to it)."""
        if self.gso_ipv4_max_size is not None:
            return self.gso_ipv4_max_size
        return min(self.gso_max_size, GSO_LEGACY_MAX_SIZE)

    @property
    def limit_by_l3(self) -> bool:
        """G3: whether a VLAN-tagged skb gets the limit of its L3 protocol (series) or of skb->protocol."""
        return self.resegment if self.vlan_l3_limit is None else self.vlan_l3_limit

    def to_metadata(self) -> dict[str, Any]:
        """Every field plus the derived values, JSON-friendly."""
        d = asdict(self)
        d["effective_gso_ipv4_max_size"] = self.ipv4_limit
        d["limit_lookup"] = "vlan_l3" if self.limit_by_l3 else "skb_protocol"
        d["policy"] = "resegment_gso" if self.resegment else "mss_segment"
        d["spec"] = "docs/gso-spec.md G1-G14"
        return d

    def with_overrides(self, **kw: Any) -> EgressProfile:
        """A copy with the fields in ``kw`` that are not None replaced (for CLI options over a profile)."""
        kw = {k: v for k, v in kw.items() if v is not None}
        return replace(self, **kw) if kw else self

    @classmethod
    def from_ip_link_json(cls, doc: str | bytes | list | dict, source: str = "<json>", **overrides: Any
                          ) -> EgressProfile:
        """A profile from ``ip -d -j link show DEV`` output (the JSON array with one link, or that link).

        ``gso_max_size``, ``gso_max_segs``, ``tso_max_size``, ``tso_max_segs`` and ``mtu`` must be present
        (``ip -d`` prints them); ``gso_ipv4_max_size`` is used when present (iproute2 >= 6.3 prints it).
        ``ip link`` does not show TSO on/off: give ``tso=False`` in ``overrides`` for ``ethtool -K DEV tso off``.
        Raises ProfileError (one line naming ``source``) for anything that is not that output.
        """
        if isinstance(doc, (str, bytes)):
            try:
                doc = json.loads(doc)
            except ValueError as e:
                raise ProfileError(f"{source}: not JSON ({e.msg} at byte offset {e.pos}); expected the output of "
                                   "'ip -d -j link show DEV'") from None
        if isinstance(doc, list):
            if len(doc) != 1 or not isinstance(doc[0], dict):
                raise ProfileError(f"{source}: expected the output of 'ip -d -j link show DEV' (a JSON array "
                                   f"with one link), got an array of {len(doc)} items")
            doc = doc[0]
        if not isinstance(doc, dict) or "ifname" not in doc:
            raise ProfileError(f"{source}: not 'ip -d -j link show DEV' output (no 'ifname' in the link object)")
        need = ("gso_max_size", "gso_max_segs", "tso_max_size", "tso_max_segs", "mtu")
        missing = [k for k in need if k not in doc]
        if missing:
            raise ProfileError(f"{source}: link {doc.get('ifname')!r} has no {', '.join(missing)} (run 'ip -d -j "
                               "link show DEV': without -d the GSO limits are not printed)")
        kw: dict[str, Any] = {k: doc[k] for k in need}
        if "gso_ipv4_max_size" in doc:
            kw["gso_ipv4_max_size"] = doc["gso_ipv4_max_size"]
        kw["name"] = f"{os.path.basename(source)}:{doc['ifname']}"
        kw.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls(**kw)
        except ProfileError as e:
            raise ProfileError(f"{source}: {e}") from None

    @classmethod
    def load(cls, spec: str, **overrides: Any) -> EgressProfile:
        """A named profile (``PROFILES``) or a file of ``ip -d -j link show`` JSON; ProfileError otherwise."""
        if spec in PROFILES:
            return PROFILES[spec].with_overrides(**overrides)
        try:
            with open(spec, "rb") as f:
                text = f.read()
        except OSError as e:
            raise ProfileError(f"{spec}: {e.strerror or e} (not a file, and not one of the named profiles "
                               f"{', '.join(sorted(PROFILES))})") from None
        return cls.from_ip_link_json(text, source=spec, **overrides)


PROFILE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EgressProfile) if f.name != "name")
"""The fields a user sets (CLI options are generated from them)."""


def field_docs() -> dict[str, str]:
    """Field name -> the docstring under it in ``EgressProfile`` (the CLI's option help)."""
    from ..cli_options import field_docs as docs_of

    return docs_of(EgressProfile)


def _check_int(name: str, v: Any, lo: int, hi: int, why: str) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ProfileError(f"{name} must be an int in {lo}..{hi} ({why}), got {v!r}")


PROFILES: dict[str, EgressProfile] = {
    # drivers/net/veth.c: netif_set_tso_max_size(dev, GSO_MAX_SIZE); gso sizes at the kernel defaults
    "veth": EgressProfile(name="veth"),
    # seed 004 (ice BIG TCP v2): ICE_MAX_TSO_SIZE 131072 via netif_set_tso_max_size; gso_max_size raised to it
    "ice": EgressProfile(gso_max_size=131072, tso_max_size=131072, name="ice"),
    # seed 002 (mlx4 BIG TCP): "512KB limit has been tested", 512 * 1024, clamped to GSO_MAX_SIZE 524280
    "mlx4": EgressProfile(gso_max_size=GSO_MAX_SIZE, tso_max_size=GSO_MAX_SIZE, name="mlx4"),
    # a device without BIG TCP: the kernel's generic TSO_LEGACY_MAX_SIZE
    "legacy": EgressProfile(tso_max_size=GSO_LEGACY_MAX_SIZE, name="legacy"),
}
"""Named profiles; sources in the README ("Transmit side") and above."""
