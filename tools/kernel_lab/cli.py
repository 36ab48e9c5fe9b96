"""Make real Linux BIG TCP / GRO capture pairs in two network namespaces.

This reproduces the experiment of ``gro-spec.md`` section 8 on the local kernel:

* two fresh network namespaces (``btp-snd-<pid>``, ``btp-rcv-<pid>``) joined by a veth pair,
  sender ``va`` and receiver ``vb``, MTU 1500, private addresses only inside those namespaces
  (``fd00:b1::1/64``/``::2`` with ``nodad``, ``10.199.0.1/30``/``.2``);
* ``ethtool -K va tso off gso off`` so that TCP's GSO skbs are cut into MSS segments before the
  driver, and ``ethtool -K vb gro on`` so that the receiving veth runs NAPI + GRO (spec R1);
* a ``pfifo limit 10000`` qdisc on ``va`` so the 256-slot veth ring does not drop (spec section 8.6);
* the BIG TCP limits of the scenario on each end (see ``SCENARIOS``): IPv6 with ``ip link set ...
  gso_max_size N gro_max_size N``; IPv4 ``gso_ipv4_max_size``/``gro_ipv4_max_size`` through
  rtnetlink (IFLA 63/64, iproute2 6.1 can neither set nor show them), all read back and checked;
* one bounded iperf3 transfer per address family (``-n BYTES -l 128K``; the ``mixed`` scenario runs
  an IPv6 and an IPv4 flow at once, BYTES/2 each), captured with tcpdump on BOTH sides with no
  filter (a ``tcp port`` filter hides every IPv6 HBH jumbo packet, spec R20).

Each scenario writes ``<name>.snd.pcap``, ``<name>.rcv.pcap`` and ``<name>.json`` (every setting
read back, every command line, tcpdump drop counters and a summary of what the captures show).

The ``linktype`` scenarios (``--linktypes``) reuse the same namespaces, veth pair and checks to get real
captures of every link type and tunnel the decoder claims (see ``Experiment.setup_topology``):

* ``sll2_v6_185000`` / ``sll_v4_185000``: BIG TCP runs captured on the receiver with ``tcpdump -i any``
  (``-y LINUX_SLL2`` / ``-y LINUX_SLL``);
* ``qinq``: every frame between va and vb tagged 802.1ad 100 + 802.1Q 200 (8021q devices, or a clsact eBPF
  push/pop program when the kernel has no 8021q);
* ``vxlan`` / ``geneve``: overlay traffic through VNI 42 on UDP 4789 / 6081, captured on the underlay veth
  (Geneve through a tap + userspace endpoint when the kernel has no geneve device);
* ``tun_raw``: a tun point-to-point link, captured on the tun devices (LINKTYPE_RAW);
* plus ``null_from_v6_185000.pcap`` / ``loop_from_v4.pcap``, NULL and LOOP files *derived* from Ethernet
  captures by ``derive_loopback_pcap()`` (Linux cannot capture those link types).

Only the sides listed in a scenario's ``captures`` are captured (``<name>.<side>.pcap``).

Usage (as root; ``python -m tools.kernel_lab`` from the repository root is the same command)::

    python scripts/make_kernel_captures.py --outdir tests/fixtures/kernel --all
    python scripts/make_kernel_captures.py --outdir /tmp/caps --scenario v6_80000 --bytes 3000000
    python scripts/make_kernel_captures.py --outdir tests/fixtures/kernel/linktypes --linktypes
    python scripts/make_kernel_captures.py --outdir /tmp/caps --derive   # NULL/LOOP only, no root

This module only parses the options; the work is in the package's other modules (see ``__init__.py``).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from .bpfasm import tcbpf_helper, xdpdrop_helper
from .cpu import CpuPlan
from .derive import derive_all
from .experiment import Experiment, one_line_summary
from .host import PROG, check_prerequisites
from .netlink import netlink_helper
from .relays import geneve_relay, probe, tun_relay
from .runner import CaptureError
from .scenarios import DEFAULT_BYTES, DEFAULT_SNAPLEN, KERNEL_FIXTURES, MIN_SNAPLEN, SAMPLE_SOURCE, SCENARIOS

# The hidden entry points the experiment runs inside a namespace (runner.helper_command): option -> function(argv)
HIDDEN: dict[str, Callable[[list[str]], int]] = {
    "--_netlink": netlink_helper, "--_tcbpf": tcbpf_helper, "--_xdpdrop": xdpdrop_helper,
    "--_tun_relay": tun_relay,
    "--_geneve_relay": geneve_relay, "--_probe": probe,
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in HIDDEN:
        return HIDDEN[argv[0]](argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--outdir",
        required=True,
        type=Path,
        help="directory for <scenario>.{snd,rcv}.pcap/.json",
    )
    ap.add_argument(
        "--scenario",
        action="append",
        choices=sorted(SCENARIOS),
        help="scenario to run (repeatable)",
    )
    ap.add_argument(
        "--all",
        action="store_true",
        help=f"run every GRO-pair scenario and copy {SAMPLE_SOURCE}.rcv.pcap to sample.pcap",
    )
    ap.add_argument(
        "--linktypes",
        action="store_true",
        help="run every linktype scenario (SLL, SLL2, qinq, VXLAN, Geneve, RAW) and derive the NULL/LOOP files",
    )
    ap.add_argument(
        "--derive",
        action="store_true",
        help="only derive the NULL/LOOP files (no root needed)",
    )
    ap.add_argument(
        "--derive-from",
        type=Path,
        default=KERNEL_FIXTURES,
        help=f"directory holding the Ethernet captures the NULL/LOOP files are derived from (default {KERNEL_FIXTURES})",
    )
    ap.add_argument(
        "--bytes",
        type=int,
        default=None,
        help=f"iperf3 -n (default: the scenario's, else {DEFAULT_BYTES})",
    )
    ap.add_argument(
        "--snaplen",
        type=int,
        default=None,
        help=f"tcpdump -s (default: the scenario's, else {DEFAULT_SNAPLEN})",
    )
    ap.add_argument(
        "--pin-cpu",
        type=int,
        default=None,
        metavar="N",
        help="run the iperf3 client and server with taskset -c N (default: unpinned); serializes transmit and "
        "the receiver's NAPI poll on one CPU so the sender timestamps show the poll boundaries",
    )
    ap.add_argument("--server-cpu", type=int, default=None, metavar="N",
                    help="taskset -c N for the iperf3 server only (overrides --pin-cpu for the server)")
    ap.add_argument("--tcpdump-cpu", type=int, default=None, metavar="N",
                    help="run both tcpdumps with taskset -c N (default: unpinned)")
    ap.add_argument("--threaded", type=int, choices=(0, 1), default=None,
                    help="write /sys/class/net/vb/threaded (threaded NAPI) in the receiver namespace (default: leave)")
    ap.add_argument("--trace-napi", action="store_true",
                    help="record every NAPI poll of vb (tracefs napi:napi_poll: time, CPU, context, work) to "
                    "<scenario>.napi.tsv, the kernel's actual poll boundaries")
    ap.add_argument("--sender-qdisc", default=None, metavar="SPEC",
                    help="tc qdisc on va instead of 'pfifo limit 10000', e.g. 'netem loss 0.5%% limit 10000' (drops "
                    "before the sender's capture) or 'noqueue' (the veth ring drops after it)")
    ap.add_argument("--rx-drop", type=int, default=None, metavar="N",
                    help="attach an XDP program to vb dropping one data frame in N at random (veth's driver-mode "
                    "XDP runs before GRO): loss after the sender's capture point, as on a field capture taken on the "
                    "sender; the drops are read back from vb's xdp_drops counter")
    ap.add_argument("--suffix", default="", help="appended to the scenario name in the output file names")
    args = ap.parse_args(argv)
    cpu = CpuPlan(
        client=args.pin_cpu,
        server=args.server_cpu if args.server_cpu is not None else args.pin_cpu,
        tcpdump=args.tcpdump_cpu,
        threaded=args.threaded,
        trace_napi=args.trace_napi,
    )
    names = [n for n in sorted(SCENARIOS) if SCENARIOS[n].group == "gro"] if args.all else []
    names += [n for n in sorted(SCENARIOS) if SCENARIOS[n].group == "linktype"] if args.linktypes else []
    names += [n for n in args.scenario or [] if n not in names]
    if args.derive and not names:
        args.outdir.mkdir(parents=True, exist_ok=True)
        return 1 if derive_all(args.outdir, args.derive_from) else 0
    if not names:
        ap.error("give --scenario NAME (repeatable), --all, --linktypes or --derive")
    if args.snaplen is not None and args.snaplen < MIN_SNAPLEN:
        ap.error(f"--snaplen must be >= {MIN_SNAPLEN} (Ethernet + IPv6 + HBH + TCP with timestamps)")
    check_prerequisites()
    args.outdir.mkdir(parents=True, exist_ok=True)

    def _term(signum: int, _frame: object) -> None:
        raise SystemExit(f"{PROG}: terminated by signal {signum}")

    signal.signal(signal.SIGTERM, _term)
    failed = 0
    for name in names:
        try:
            info = Experiment(SCENARIOS[name], args.outdir, args.bytes, args.snaplen, cpu, args.sender_qdisc,
                              args.suffix, args.rx_drop).run()
            print(one_line_summary(info))
        except CaptureError as e:
            print(f"{PROG}: {name}: {e}", file=sys.stderr)
            failed += 1
    if args.all and not failed:
        shutil.copyfile(args.outdir / f"{SAMPLE_SOURCE}.rcv.pcap", args.outdir / "sample.pcap")
    if args.linktypes or args.derive:
        failed += derive_all(args.outdir, args.derive_from)
    return 1 if failed else 0

