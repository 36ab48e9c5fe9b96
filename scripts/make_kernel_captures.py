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

import tools.kernel_lab as _kernel_lab
from tools.kernel_lab import *  # the package's public names, as the single file had them

# The single file's other names: constants of its netlink, bpf and tun code, and its private helpers.
from tools.kernel_lab.bpfasm import BPF_PROG_LOAD, BPF_PROG_TYPE_SCHED_CLS, SYS_BPF
from tools.kernel_lab.bpfasm import bpf_insn as _bpf_insn
from tools.kernel_lab.bpfasm import tcbpf_helper as _tcbpf_helper
from tools.kernel_lab.cpu import read_text as _read_text
from tools.kernel_lab.napitrace import NAPI_POLL_RE, TRACEFS
from tools.kernel_lab.netlink import (
    NLM_F_CREATE,
    NLM_F_EXCL,
    RTM_NEWTFILTER,
    TC_H_CLSACT_EGRESS,
    TC_H_CLSACT_INGRESS,
    TCA_BPF_FD,
    TCA_BPF_FLAG_ACT_DIRECT,
    TCA_BPF_FLAGS,
    TCA_BPF_NAME,
    TCA_KIND,
    TCA_OPTIONS,
)
from tools.kernel_lab.netlink import netlink_helper as _netlink_helper
from tools.kernel_lab.netlink import nl_attr as _nl_attr
from tools.kernel_lab.netlink import nl_request as _nl_request
from tools.kernel_lab.netlink import nl_send as _nl_send
from tools.kernel_lab.pcapsummary import _ether_payload, _link_payload, _parse_ip
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

__all__ = [
    "BPF_PROG_LOAD", "BPF_PROG_TYPE_SCHED_CLS", "CLONE_NEWNET", "IFF_NO_PI", "IFF_TAP", "IFF_TUN", "IFF_VNET_HDR",
    "NAPI_POLL_RE", "NLM_F_CREATE", "NLM_F_EXCL", "PROBE_PORT", "RTM_NEWTFILTER", "SYS_BPF", "TCA_BPF_FD",
    "TCA_BPF_FLAGS", "TCA_BPF_FLAG_ACT_DIRECT", "TCA_BPF_NAME", "TCA_KIND", "TCA_OPTIONS", "TC_H_CLSACT_EGRESS",
    "TC_H_CLSACT_INGRESS", "TRACEFS", "TUNSETIFF", "TUNSETOFFLOAD", "TUN_F_CSUM", "TUN_F_TSO4", "TUN_F_TSO6",
    "_bpf_insn", "_ether_payload", "_geneve_relay", "_link_payload", "_netlink_helper", "_nl_attr", "_nl_request",
    "_nl_send", "_open_tun", "_parse_ip", "_probe", "_read_text", "_relay_signals", "_setns", "_tcbpf_helper",
    "_tun_relay",
]  # fmt: skip
__all__ += _kernel_lab.__all__

if __name__ == "__main__":
    sys.exit(_kernel_lab.main())
