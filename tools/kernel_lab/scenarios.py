"""The capture scenarios and the fixed facts of the experiment: addresses, ports, sizes, overlays, link types.

Pure data and arithmetic (no I/O): ``SCENARIOS`` is the table ``--scenario``, ``--all`` and ``--linktypes`` pick
from; ``DERIVED`` the NULL/LOOP files made from Ethernet captures (see ``derive.py``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

IPV6_SND, IPV6_RCV = "fd00:b1::1", "fd00:b1::2"
IPV4_SND, IPV4_RCV = "10.199.0.1", "10.199.0.2"
PORT_V6, PORT_V4 = 5201, 5202
DEFAULT_BYTES = 3_000_000
DEFAULT_SNAPLEN = 96
IPERF_LEN = "128K"
SAMPLE_SOURCE = "v6_185000"  # sample.pcap = copy of this scenario's receiver capture (with --all)
KERNEL_DEFAULT_SIZE = 65536  # GSO_LEGACY_MAX_SIZE: every gso/gro limit of a new device
MIN_SNAPLEN = 14 + 40 + 8 + 20 + 12  # --snaplen floor: Ethernet + IPv6 + HBH jumbo + TCP + timestamp option

# Linktype scenarios (group "linktype", written to tests/fixtures/kernel/linktypes/): extra topologies on top of
# the same veth underlay. Overlay addresses are private and exist only inside the two namespaces.
OVERLAY: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {
    # topology: ((IPv6 sender, IPv6 receiver), (IPv4 sender, IPv4 receiver))
    "vxlan": (("fd00:b2::1", "fd00:b2::2"), ("10.198.0.1", "10.198.0.2")),
    "geneve": (("fd00:b3::1", "fd00:b3::2"), ("10.198.1.1", "10.198.1.2")),
    "tun": (("fd00:b4::1", "fd00:b4::2"), ("10.198.2.1", "10.198.2.2")),
    "qinq": (("fd00:b5::1", "fd00:b5::2"), ("10.198.3.1", "10.198.3.2")),
}
OVERLAY_PREFIX = {6: 64, 4: 30}
VXLAN_PORT, GENEVE_PORT, TUNNEL_VNI = 4789, 6081, 42
VXLAN_MTU = 1450  # 1500 - IPv4 20 - UDP 8 - VXLAN 8 - Ethernet 14 (IPv4 underlay)
GENEVE_MTU = 1430  # 1500 - IPv6 40 - UDP 8 - Geneve 8 - Ethernet 14 (IPv6 underlay)
QINQ_OUTER_ID, QINQ_INNER_ID = 100, 200  # 802.1ad S-tag (outer), 802.1Q C-tag (inner)
LINKTYPE_NAMES = {
    0: "NULL", 1: "ETHERNET", 12: "RAW (DLT 12)", 101: "RAW", 108: "LOOP", 113: "LINUX_SLL", 276: "LINUX_SLL2",
}  # fmt: skip
SIDE_NAMES = {"snd": "sender", "rcv": "receiver"}
# (side, interface, tcpdump -y DLT or None, linktype the file must have): tcpdump on va and on vb, Ethernet
DEFAULT_CAPTURES: tuple[tuple[str, str, str | None, int], ...] = (("snd", "va", None, 1), ("rcv", "vb", None, 1))
REPO_ROOT = Path(__file__).resolve().parents[2]
KERNEL_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "kernel"


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One capture run: which address families carry traffic and which limits are set.

    Each size sets both the GSO and the GRO limit of that end (None: leave the kernel default
    65536). IPv6: ``gso_max_size``/``gro_max_size`` (``ip link``); IPv4: ``gso_ipv4_max_size``/
    ``gro_ipv4_max_size`` (rtnetlink IFLA 63/64). The receiver's GRO limit is what GRO enforces
    (spec R15a); the sender's GSO limit sets how large the sender's back-to-back bursts are (T1/T2).
    """

    name: str
    families: tuple[int, ...]  # 6 and/or 4; one iperf3 flow per family, run concurrently
    snd_v6: int | None  # va: gso_max_size = gro_max_size
    rcv_v6: int | None  # vb: gso_max_size = gro_max_size
    snd_v4: int | None  # va: gso_ipv4_max_size = gro_ipv4_max_size
    rcv_v4: int | None  # vb: gso_ipv4_max_size = gro_ipv4_max_size
    note: str = ""
    # veth: the plain pair; qinq / vxlan / geneve / tun: see Experiment.setup_topology()
    topology: str = "veth"
    # (side, interface, tcpdump -y DLT or None, linktype the file must have); side snd/rcv = namespace
    captures: tuple[tuple[str, str, str | None, int], ...] = DEFAULT_CAPTURES
    snaplen: int | None = None  # tcpdump -s for this scenario (--snaplen overrides; default DEFAULT_SNAPLEN)
    nbytes: int | None = None  # iperf3 -n for this scenario (--bytes overrides; default DEFAULT_BYTES)
    group: str = "gro"  # "gro": the --all set (GRO pairs); "linktype": the --linktypes set

    def sizes(self, dev: str) -> tuple[int | None, int | None]:
        """(IPv6 size, IPv4 size) to set on ``va`` (sender) or ``vb`` (receiver)."""
        return (self.snd_v6, self.snd_v4) if dev == "va" else (self.rcv_v6, self.rcv_v4)

    def expected_limits(self, dev: str) -> dict[str, int]:
        """The four size limits ``dev`` must read back after setup (what ``Experiment.check_limits`` checks).

        An unset size is the kernel default 65536. Setting the IPv6 ``gso_max_size``/``gro_max_size`` to 65536 or
        less also lowers the IPv4 limits to the same value (netif_set_gso/gro_max_size, gro-spec section 4).
        """
        v6, v4 = self.sizes(dev)
        if v4 is None and v6 is not None and v6 <= KERNEL_DEFAULT_SIZE:
            v4 = v6
        return {
            "gso_max_size": v6 or KERNEL_DEFAULT_SIZE,
            "gro_max_size": v6 or KERNEL_DEFAULT_SIZE,
            "gso_ipv4_max_size": v4 or KERNEL_DEFAULT_SIZE,
            "gro_ipv4_max_size": v4 or KERNEL_DEFAULT_SIZE,
        }

    def bytes_per_flow(self, nbytes: int) -> int:
        """iperf3 ``-n`` of each flow: scenarios with two families split the byte budget between their flows."""
        return nbytes // len(self.families)


BIG = 185000
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("v6_185000", (6,), BIG, BIG, None, None, "IPv6 BIG TCP; >64 KiB super-packets carry HBH"),
        Scenario("v6_80000", (6,), 80000, 80000, None, None, "IPv6 80000 both ends: 55-segment limit"),
        Scenario("v6_65536", (6,), None, None, None, None, "IPv6 default limits (65536)"),
        Scenario("v4_185000", (4,), None, None, BIG, BIG, "IPv4 BIG TCP via IFLA 63/64: tot_len 0"),
        Scenario("v4_65536", (4,), None, None, None, None, "IPv4 default limits (65536)"),
        Scenario(
            "v6_snd185000_rcv80000", (6,), BIG, 80000, None, None,
            "sender bursts up to 185000, receiver gro_max_size 80000 (gro-spec 8: 55 + 9 pattern)",
        ),
        Scenario(
            "v4_snd185000_rcv65536", (4,), None, None, BIG, None,
            "sender gso_ipv4 185000, receiver gro_ipv4 65536 (gro-spec 8: 45 + 19 pattern)",
        ),
        Scenario("mixed_185000", (6, 4), BIG, BIG, BIG, BIG, "IPv6 + IPv4 flows at once, both BIG TCP"),
        # --- linktype scenarios (--linktypes; outdir tests/fixtures/kernel/linktypes) -------------------------
        Scenario(
            "sll2_v6_185000", (6,), BIG, BIG, None, None,
            "v6_185000 captured on the receiver with tcpdump -i any -y LINUX_SLL2 (HBH jumbo in SLL2)",
            captures=(("rcv", "any", "LINUX_SLL2", 276),), snaplen=128, group="linktype",
        ),
        Scenario(
            "sll_v4_185000", (4,), None, None, BIG, BIG,
            "v4_185000 captured on the receiver with tcpdump -i any -y LINUX_SLL (tot_len 0 in SLL)",
            captures=(("rcv", "any", "LINUX_SLL", 113),), snaplen=128, group="linktype",
        ),
        Scenario(
            "qinq", (6, 4), BIG, BIG, BIG, BIG,
            "IPv6 + IPv4 over 802.1ad 100 / 802.1Q 200 stacked tags, captured on both veths",
            topology="qinq", captures=(("snd", "va", None, 1), ("rcv", "vb", None, 1)), snaplen=128,
            nbytes=1_000_000, group="linktype",
        ),
        Scenario(
            "vxlan", (6, 4), BIG, BIG, BIG, BIG,
            "IPv6 + IPv4 over VXLAN 42 (UDP 4789, IPv4 underlay), captured on both veths",
            topology="vxlan", captures=(("snd", "va", None, 1), ("rcv", "vb", None, 1)), snaplen=192,
            nbytes=1_000_000, group="linktype",
        ),
        Scenario(
            "geneve", (6, 4), BIG, BIG, BIG, BIG,
            "IPv6 + IPv4 over Geneve 42 (UDP 6081, IPv6 underlay), captured on the receiver's veth",
            topology="geneve", captures=(("rcv", "vb", None, 1),), snaplen=192, nbytes=600_000, group="linktype",
        ),
        Scenario(
            "tun_raw", (6, 4), None, None, None, None,
            "IPv6 + IPv4 through a tun point-to-point link (vnet_hdr, TSO): LINKTYPE_RAW on both ends",
            topology="tun", captures=(("snd", "tn0", None, 101), ("rcv", "tn0", None, 101)), snaplen=128,
            group="linktype",
        ),
    )
}  # fmt: skip

# NULL and LOOP cannot be captured on Linux: these files are derived from Ethernet kernel captures by
# derive_loopback_pcap() (name: source capture in KERNEL_FIXTURES, linktype, ethertype -> address family).
# The IPv6 family values are the BSD ones tshark and tcpdump know (24 OpenBSD/NetBSD, 28 FreeBSD, 30 Darwin);
# Linux's AF_INET6 (10) never appears in a NULL/LOOP file and tshark does not dissect it.
DERIVED: dict[str, tuple[str, int, dict[int, int]]] = {
    "null_from_v6_185000": ("v6_185000.rcv.pcap", 0, {0x0800: 2, 0x86DD: 30}),
    "loop_from_v4": ("v4_185000.rcv.pcap", 108, {0x0800: 2, 0x86DD: 24}),
}
