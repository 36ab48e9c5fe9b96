"""``audit-ebpf``: the command-line face of the eBPF audit (ebpf.py). Registered on the main app by
``register(app)``; options in, one ``audit_ebpf`` call, output out.

Exit codes: 0 the program treats every packet like its normalized copy, 1 some packet differs (verdict or output
packet), 2 usage (object, section, program type, linktype), not root / EPERM, libbpf missing, or the kernel
refused the program, 3 capture unreadable (as the main CLI).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from ..errors import BigtcpError
from .cli import _fail, render_reasons_and_flows

if TYPE_CHECKING:
    from .ebpf import EbpfAuditResult

EXIT_CLEAN, EXIT_DIFFERS, EXIT_USAGE, EXIT_CAPTURE = 0, 1, 2, 3

REASON_HELP = {
    "ipv6_hbh_jumbo": "IPv6 Hop-by-Hop Jumbo header (BIG TCP) between IPv6 and TCP: the program reads or writes "
                      "at fixed offsets",
    "ipv6_ext_header": "IPv6 extension header before the transport header",
    "v6_plen0": "IPv6 payload length 0 (BIG TCP without HBH)",
    "v4_totlen0": "IPv4 total length 0 (BIG TCP / TSO)",
    "other": "differs for another reason",
}


def audit_ebpf_command(
    prog: Annotated[Path, typer.Argument(metavar="PROG.o", help="BPF object file (ELF, from clang -target bpf)")],
    capture: Annotated[str, typer.Argument(metavar="CAPTURE", help="pcap/pcapng file (compressed ok), Ethernet")],
    section: Annotated[str | None, typer.Option(
        "--section", help="the program to run: its ELF section (tc, xdp, socket, ...) or its name; needed when "
                          "the object has several")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
    max_flows: Annotated[int, typer.Option(help="affected flows to list (text output)")] = 10,
) -> None:
    """Does a compiled eBPF program treat BIG TCP packets differently? (root only; loads it for test runs)

    Loads the program with the system libbpf (map pinning disabled, nothing attached).

    Every packet, then its normalized copy without the BIG TCP encoding, runs through BPF_PROG_TEST_RUN.

    Prints the frames whose verdict or output packet differs, with reasons and affected flows.

    Example: sudo bigtcp-pcap audit-ebpf filter.o receiver.pcap --section tc
    """
    from .ebpf import audit_ebpf  # imported by this command only (~10 ms)

    try:
        result = audit_ebpf(prog, capture, section)
    except BigtcpError as e:  # EbpfError (usage, 2), CaptureError (3)
        raise _fail(e.one_line(), e.exit_code) from None
    if as_json:
        doc = result.to_json()
        doc["capture"] = str(capture)
        typer.echo(json.dumps(doc))
    else:
        render(result, capture, Console(highlight=False), max_flows)
    if result.error is not None:
        raise _fail(f"{result.error} (audited the frames before it)", EXIT_CAPTURE)
    raise typer.Exit(EXIT_CLEAN if result.clean else EXIT_DIFFERS)


def _rv(r: EbpfAuditResult, v: str) -> str:
    name = r.retval_name(int(v))
    return f"{v} ({name})" if name else v


def render(r: EbpfAuditResult, capture: str, out: Console, max_flows: int = 10) -> None:
    """The human summary of an eBPF audit."""
    start = "Ethernet" if r.l2 else "network"
    out.print(f"eBPF program {r.program} (section {r.section}, {r.prog_type}; test data from the {start} header) "
              f"of {r.object_path} on {capture}: {r.frames_total} frames, linktypes "
              f"{', '.join(map(str, r.linktypes)) or '-'}", markup=False, soft_wrap=True)
    out.print(f"  test-run {r.frames_run} frames; {r.compared} carry a BIG TCP / extension-header encoding and ran "
              f"again normalized", markup=False, soft_wrap=True)
    out.print(f"  differing [bold]{r.differing}[/]   verdict {r.verdict_differs}   output packet {r.output_differs}")
    out.print("  verdicts of all frames: " + ", ".join(f"{_rv(r, k)} x{n}" for k, n in r.retvals.items()),
              markup=False, soft_wrap=True)
    for pair, n in r.retval_pairs.items():
        a, b = pair.split("->")
        out.print(f"  {n:>8}  raw {_rv(r, a)} -> normalized {_rv(r, b)}", markup=False)
    render_reasons_and_flows(r, out, max_flows,
                             lambda f: f"{f.verdict_differs} verdict, {f.output_differs} output", "differing",
                             REASON_HELP)
    if r.clean:
        out.print("  every packet gets the same verdict and output as its normalized copy")
    for note in r.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add the ``audit-ebpf PROG.o CAPTURE [--section NAME] [--json]`` command to ``app``."""
    app.command("audit-ebpf")(audit_ebpf_command)
