"""kernel_lab: real Linux BIG TCP / GRO captures made in two network namespaces (the kernel fixtures' source).

Run it as ``python -m tools.kernel_lab`` from the repository root, or as ``scripts/make_kernel_captures.py``
(a thin wrapper); both take the same options (see ``cli.py``). One module per job:

* ``scenarios``: the scenario table and the experiment's fixed facts (addresses, ports, MTUs, link types);
* ``runner``: running and recording commands, ``CaptureError``;
* ``netlink``: the rtnetlink client (IPv4 BIG TCP limits, size read-back, tc bpf filters);
* ``bpfasm``: the eBPF VLAN push/pop programs, their encoding and BPF_PROG_LOAD;
* ``relays``: tun and Geneve relays and the TCP probe (hidden entry points run inside a namespace);
* ``pcapsummary``: the stdlib pcap reader and the capture summary written into each JSON;
* ``derive``: the NULL/LOOP files derived from Ethernet captures;
* ``host``, ``cpu``, ``napitrace``: what is recorded about the host, CPU placement and NAPI polls;
* ``experiment``: one scenario run, start to finish; ``cli``: the options.

Importing the package has no side effects; the names below are its public interface (also re-exported by
``scripts/make_kernel_captures.py``).
"""

from __future__ import annotations

from .bpfasm import BPF_FUNC_SKB_VLAN_POP, BPF_FUNC_SKB_VLAN_PUSH, bpf_insn, bpf_prog_load, bpf_vlan_programs
from .cli import HIDDEN, main
from .cpu import CpuPlan, counter_delta, cpu_counters
from .derive import derive_all, derive_loopback_pcap
from .experiment import Experiment, one_line_summary
from .host import check_prerequisites, kernel_hz, source_sha256, tool_versions
from .napitrace import NapiTrace
from .netlink import (
    IFLA,
    IFLA_GRO_IPV4_MAX_SIZE,
    IFLA_GSO_IPV4_MAX_SIZE,
    NLM_F_ACK,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    RTM_GETLINK,
    RTM_NEWLINK,
    nl_get_link_sizes,
    nl_set_ipv4_sizes,
    tc_attach_bpf,
)
from .pcapsummary import (
    BURST_GAP_S,
    PCAP_MAGICS,
    TcpPacket,
    mss_from_syn,
    parse_frame,
    pcap_header,
    read_pcap,
    summarize_pcap,
)
from .runner import CaptureError, Runner, stop_process
from .scenarios import (
    BIG,
    DEFAULT_BYTES,
    DEFAULT_CAPTURES,
    DEFAULT_SNAPLEN,
    DERIVED,
    GENEVE_MTU,
    GENEVE_PORT,
    IPERF_LEN,
    IPV4_RCV,
    IPV4_SND,
    IPV6_RCV,
    IPV6_SND,
    KERNEL_FIXTURES,
    LINKTYPE_NAMES,
    OVERLAY,
    OVERLAY_PREFIX,
    PORT_V4,
    PORT_V6,
    QINQ_INNER_ID,
    QINQ_OUTER_ID,
    SAMPLE_SOURCE,
    SCENARIOS,
    SIDE_NAMES,
    TUNNEL_VNI,
    VXLAN_MTU,
    VXLAN_PORT,
    Scenario,
)

__all__ = [
    "BIG", "BPF_FUNC_SKB_VLAN_POP", "BPF_FUNC_SKB_VLAN_PUSH", "BURST_GAP_S", "DEFAULT_BYTES", "DEFAULT_CAPTURES",
    "DEFAULT_SNAPLEN", "DERIVED", "GENEVE_MTU", "GENEVE_PORT", "HIDDEN", "IFLA", "IFLA_GRO_IPV4_MAX_SIZE",
    "IFLA_GSO_IPV4_MAX_SIZE", "IPERF_LEN", "IPV4_RCV", "IPV4_SND", "IPV6_RCV", "IPV6_SND", "KERNEL_FIXTURES",
    "LINKTYPE_NAMES", "NLMSG_ERROR", "NLM_F_ACK", "NLM_F_REQUEST", "OVERLAY", "OVERLAY_PREFIX", "PCAP_MAGICS",
    "PORT_V4", "PORT_V6", "QINQ_INNER_ID", "QINQ_OUTER_ID", "RTM_GETLINK", "RTM_NEWLINK", "SAMPLE_SOURCE",
    "SCENARIOS", "SIDE_NAMES", "TUNNEL_VNI", "VXLAN_MTU", "VXLAN_PORT", "CaptureError", "CpuPlan", "Experiment",
    "NapiTrace", "Runner", "Scenario", "TcpPacket", "bpf_insn", "bpf_prog_load", "bpf_vlan_programs",
    "check_prerequisites", "counter_delta", "cpu_counters", "derive_all", "derive_loopback_pcap", "kernel_hz",
    "main", "mss_from_syn", "nl_get_link_sizes", "nl_set_ipv4_sizes", "one_line_summary", "parse_frame",
    "pcap_header", "read_pcap", "source_sha256", "stop_process", "summarize_pcap", "tc_attach_bpf",
    "tool_versions",
]  # fmt: skip
