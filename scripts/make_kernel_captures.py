#!/usr/bin/env python3
"""Make real Linux BIG TCP / GRO capture pairs in two network namespaces (a wrapper of ``tools/kernel_lab``).

The code lives in the package ``tools/kernel_lab`` (see its ``__init__.py`` for the module map); this path
stays so that ``python scripts/make_kernel_captures.py ...`` keeps working with the same options, and so that
``import make_kernel_captures`` (with ``scripts/`` on ``sys.path``) keeps giving the names it always gave.
``python -m tools.kernel_lab ...`` from the repository root is the same command.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tools.kernel_lab.bpfasm import (
    BPF_FUNC_SKB_VLAN_POP,
    BPF_FUNC_SKB_VLAN_PUSH,
    BPF_PROG_LOAD,
    BPF_PROG_TYPE_SCHED_CLS,
    SYS_BPF,
    bpf_prog_load,
    bpf_vlan_programs,
)
from tools.kernel_lab.bpfasm import bpf_insn as _bpf_insn
from tools.kernel_lab.bpfasm import tcbpf_helper as _tcbpf_helper
from tools.kernel_lab.cli import main
from tools.kernel_lab.cpu import CpuPlan, counter_delta, cpu_counters
from tools.kernel_lab.cpu import read_text as _read_text
from tools.kernel_lab.derive import derive_all, derive_loopback_pcap
from tools.kernel_lab.experiment import Experiment, one_line_summary
from tools.kernel_lab.host import check_prerequisites, kernel_hz, tool_versions
from tools.kernel_lab.napitrace import NAPI_POLL_RE, TRACEFS, NapiTrace
from tools.kernel_lab.netlink import (
    IFLA,
    IFLA_GRO_IPV4_MAX_SIZE,
    IFLA_GSO_IPV4_MAX_SIZE,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    RTM_GETLINK,
    RTM_NEWLINK,
    RTM_NEWTFILTER,
    TC_H_CLSACT_EGRESS,
    TC_H_CLSACT_INGRESS,
    TCA_BPF_FD,
    TCA_BPF_FLAG_ACT_DIRECT,
    TCA_BPF_FLAGS,
    TCA_BPF_NAME,
    TCA_KIND,
    TCA_OPTIONS,
    nl_get_link_sizes,
    nl_set_ipv4_sizes,
    tc_attach_bpf,
)
from tools.kernel_lab.netlink import netlink_helper as _netlink_helper
from tools.kernel_lab.netlink import nl_attr as _nl_attr
from tools.kernel_lab.netlink import nl_request as _nl_request
from tools.kernel_lab.netlink import nl_send as _nl_send
from tools.kernel_lab.pcapsummary import (
    BURST_GAP_S,
    PCAP_MAGICS,
    TcpPacket,
    _ether_payload,
    _link_payload,
    _parse_ip,
    mss_from_syn,
    parse_frame,
    pcap_header,
    read_pcap,
    summarize_pcap,
)
from tools.kernel_lab.relays import (
    CLONE_NEWNET,
    IFF_NO_PI,
    IFF_TAP,
    IFF_TUN,
    IFF_VNET_HDR,
    PROBE_PORT,
    TUN_F_CSUM,
    TUN_F_TSO4,
    TUN_F_TSO6,
    TUNSETIFF,
    TUNSETOFFLOAD,
    _open_tun,
    _relay_signals,
    _setns,
)
from tools.kernel_lab.relays import geneve_relay as _geneve_relay
from tools.kernel_lab.relays import probe as _probe
from tools.kernel_lab.relays import tun_relay as _tun_relay
from tools.kernel_lab.runner import CaptureError, Runner, stop_process
from tools.kernel_lab.scenarios import (
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
    "BIG", "BPF_FUNC_SKB_VLAN_POP", "BPF_FUNC_SKB_VLAN_PUSH", "BPF_PROG_LOAD", "BPF_PROG_TYPE_SCHED_CLS",
    "BURST_GAP_S", "CLONE_NEWNET", "DEFAULT_BYTES", "DEFAULT_CAPTURES", "DEFAULT_SNAPLEN", "DERIVED", "GENEVE_MTU",
    "GENEVE_PORT", "IFF_NO_PI", "IFF_TAP", "IFF_TUN", "IFF_VNET_HDR", "IFLA", "IFLA_GRO_IPV4_MAX_SIZE",
    "IFLA_GSO_IPV4_MAX_SIZE", "IPERF_LEN", "IPV4_RCV", "IPV4_SND", "IPV6_RCV", "IPV6_SND", "KERNEL_FIXTURES",
    "LINKTYPE_NAMES", "NAPI_POLL_RE", "NLMSG_ERROR", "NLM_F_ACK", "NLM_F_CREATE", "NLM_F_EXCL", "NLM_F_REQUEST",
    "OVERLAY", "OVERLAY_PREFIX", "PCAP_MAGICS", "PORT_V4", "PORT_V6", "PROBE_PORT", "QINQ_INNER_ID",
    "QINQ_OUTER_ID", "RTM_GETLINK", "RTM_NEWLINK", "RTM_NEWTFILTER", "SAMPLE_SOURCE", "SCENARIOS", "SIDE_NAMES",
    "SYS_BPF", "TCA_BPF_FD", "TCA_BPF_FLAGS", "TCA_BPF_FLAG_ACT_DIRECT", "TCA_BPF_NAME", "TCA_KIND", "TCA_OPTIONS",
    "TC_H_CLSACT_EGRESS", "TC_H_CLSACT_INGRESS", "TRACEFS", "TUNNEL_VNI", "TUNSETIFF", "TUNSETOFFLOAD",
    "TUN_F_CSUM", "TUN_F_TSO4", "TUN_F_TSO6", "VXLAN_MTU", "VXLAN_PORT", "CaptureError", "CpuPlan", "Experiment",
    "NapiTrace", "Runner", "Scenario", "TcpPacket", "_bpf_insn", "_ether_payload", "_geneve_relay", "_link_payload",
    "_netlink_helper", "_nl_attr", "_nl_request", "_nl_send", "_open_tun", "_parse_ip", "_probe", "_read_text",
    "_relay_signals", "_setns", "_tcbpf_helper", "_tun_relay", "bpf_prog_load",
    "bpf_vlan_programs", "check_prerequisites", "counter_delta", "cpu_counters", "derive_all",
    "derive_loopback_pcap", "kernel_hz", "main", "mss_from_syn", "nl_get_link_sizes", "nl_set_ipv4_sizes",
    "one_line_summary", "parse_frame", "pcap_header", "read_pcap", "stop_process", "summarize_pcap",
    "tc_attach_bpf", "tool_versions",
]  # fmt: skip

if __name__ == "__main__":
    sys.exit(main())
