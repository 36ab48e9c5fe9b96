"""``audit-filter``: the command-line face of the cBPF filter audit (cbpf.py). Registered on the main app by
``register(app)``; options in, one ``audit_capture`` call, output out.

Exit codes: 0 every packet classified as the truth says, 1 some packet missed or falsely matched or some frame
could not be audited, 2 bad expression (libpcap's own text, with the link type it was compiled for; also an
expression libpcap rejects for every link type of the capture) or libpcap missing, 3 capture unreadable (as the
main CLI).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..errors import BigtcpError, OutputError
from .cbpf import AuditResult, audit_capture
from .libpcap import FilterError

EXIT_CLEAN, EXIT_MISCLASSIFIED, EXIT_USAGE, EXIT_CAPTURE = 0, 1, 2, 3

REASON_HELP = {
    "ipv6_hbh_jumbo": "IPv6 Hop-by-Hop Jumbo header (BIG TCP): libpcap reads the protocol and ports at fixed "
                      "offsets",
    "ipv6_ext_header": "IPv6 extension header before the transport header",
    "v6_plen0": "IPv6 payload length 0 (BIG TCP without HBH)",
    "v4_totlen0": "IPv4 total length 0 (BIG TCP / TSO)",
    "tcp_index_ipv4_only": "tcp[...] indexing only ever matches IPv4 in libpcap (not a BIG TCP problem)",
    "udp_index_ipv4_only": "udp[...] indexing only ever matches IPv4 in libpcap (not a BIG TCP problem)",
    "other": "differs for another reason",
    "cut_by_file_snaplen": "libpcap cuts the record to the file's snaplen before the filter runs (no filter fixes "
                           "that)",
}
NOT_AUDITED_HELP = {
    "tunnel_not_normalized": "tunnel with an outer header other than plain IP + UDP",
    "ip_fragment": "IP fragment (its transport header is not in every fragment)",
    "truncated_header": "header chain cut by the snaplen",
    "not_ip": "no IP header where one was expected",
    "linktype_not_decoded": "link type the decoder does not read",
    "filter_rejected_for_linktype": "libpcap rejects the expression for this link type",
}


def _fail(msg: str, code: int) -> typer.Exit:
    from ..cli import _fail as fail  # the one error line of every command (the main CLI registers this one)

    return fail(msg, code)


def audit_filter(
    expr: Annotated[str, typer.Argument(metavar="EXPR", help="pcap filter expression, as given to tcpdump")],
    capture: Annotated[str, typer.Argument(metavar="CAPTURE", help="pcap/pcapng file (compressed ok)")],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
    parquet: Annotated[Path | None, typer.Option(
        "--parquet", help="write the verdicts of the frames that are not ok (missed, false_match, not_audited; "
                          "the ok ones are only counted) to this Parquet file")] = None,
    max_flows: Annotated[int, typer.Option(min=0, help="affected flows to list (text output)")] = 10,
) -> None:
    """Which packets does a capture filter get wrong on this capture, and why (BIG TCP, extension headers)?

    The filter runs (compiled by libpcap, as tcpdump would) on every packet and on a normalized copy without the
    BIG TCP encoding; the copy's verdict is the truth. An expression that tests a header field the copy rewrites
    (ip[2:2], ip6[6], ip6 proto 51, ...) is judged on the raw frame instead, with the copy's verdict side by
    side. Prints the counts, reasons, affected flows and a suggested expression that was re-checked on every
    packet.

    Example: bigtcp-pcap audit-filter 'tcp port 5201' receiver.pcap
    """
    try:
        result = audit_capture(expr, capture)
    except BigtcpError as e:  # FilterError, LibpcapMissing (usage, 2), CaptureError (3)
        if isinstance(e, FilterError) and "unknown data link type" in e.message:  # the capture's, not the filter's
            msg = (f"{capture}: libpcap knows no link type {e.linktype}, so no filter can be compiled for its "
                   f"frames ({e.message})")
        elif isinstance(e, FilterError):
            msg = f"bad filter expression {expr!r}: {e.for_linktype()}{_hint(e)}"
        else:
            msg = e.one_line()
        raise _fail(msg, e.exit_code) from None
    if parquet is not None:
        import pyarrow.parquet as pq

        from ..output.parquet import provenance_metadata

        try:
            parquet.parent.mkdir(parents=True, exist_ok=True)
            table = result.frames_table()
            err = None if result.error is None else str(result.error)
            meta = {"filter": result.expr, "partial": err is not None, "error": err}  # as analyze marks its tables
            pq.write_table(table.replace_schema_metadata(provenance_metadata(table.schema, meta)), parquet)
        except OSError as e:  # an output error (exit 4), one line
            fault = OutputError.from_os(str(parquet), e)
            raise _fail(fault.one_line(), fault.exit_code) from None
    if as_json:
        doc = result.to_json()
        doc["capture"] = str(capture)
        typer.echo(json.dumps(doc))
    else:
        render(result, capture, Console(highlight=False), max_flows)
    if result.error is not None:
        raise _fail(f"{result.error} (audited the frames before it)", EXIT_CAPTURE)
    raise typer.Exit(EXIT_CLEAN if result.clean and result.complete else EXIT_MISCLASSIFIED)


def _hint(e: FilterError) -> str:
    if "rejects all packets" in e.message and ("tcp[" in e.expr or "udp[" in e.expr):
        return " (tcp[]/udp[] indexing is IPv4-only in libpcap; drop 'ip6 and' and audit again to get an " \
               "IPv6-aware suggestion)"
    return ""


def render(r: AuditResult, capture: str, out: Console, max_flows: int = 10) -> None:
    """The human summary of an audit."""
    out.print(f"filter {r.expr!r} on {capture}: {r.frames_total} frames, linktypes "
              f"{', '.join(map(str, r.linktypes)) or '-'}", markup=False, soft_wrap=True)
    if r.judged_on == "raw":
        out.print("  tests the raw header; judged on the raw frame: " + "; ".join(r.raw_header), markup=False,
                  soft_wrap=True)
    out.print(f"  matched {r.matched}   truth {r.truth}   missed [bold]{r.missed}[/]   "
              f"false matches [bold]{r.false_matches}[/]")
    nm = r.normalized
    if nm is not None:
        out.print(f"  on the normalized copy (true lengths, no extension headers): truth {nm['truth']}, the "
                  f"filter would miss {nm['missed']} and falsely match {nm['false_matches']}", soft_wrap=True)
    render_reasons_and_flows(r, out, max_flows, lambda f: f"{f.missed} missed, {f.false_matches} false",
                             "mis-classified", not_audited_help=NOT_AUDITED_HELP)
    audited = (f"every audited packet ({r.frames_total - r.not_audited_frames} of {r.frames_total})"
               if r.not_audited_frames else "every packet")
    verified = f"verified on all {r.frames_total - r.not_audited_frames} audited frames"
    normalized_differs = nm is not None and (nm["missed"] or nm["false_matches"])
    if r.clean and not normalized_differs:
        out.print(f"  {audited} is classified as the truth says" + ("; no change needed" if r.complete else ""))
    elif r.clean:
        out.print(f"  {audited} is classified as the raw header says")
    if r.clean and not normalized_differs:
        pass
    elif r.clean and nm["truth"] == 0:
        out.print("  no frame of the normalized copy matches: the expression selects the raw encoding itself, "
                  "so there is nothing to suggest", soft_wrap=True)
    elif r.suggestion:
        kernel = "kernel-compatible" if r.suggestion_kernel_ok else "userland-only on Linux (backward jump)"
        what = "for the normalized meaning" if r.clean else ""
        out.print(f"suggestion {what + ' ' if what else ''}({verified}, {kernel}):", soft_wrap=True)
        out.print(f"  {r.suggestion}", markup=False, soft_wrap=True)
    elif r.suggestion_verified:
        out.print(f"suggestion per linktype ({verified}; the link header length differs):")
        for lt, text in sorted(r.suggestions_by_linktype.items()):
            out.print(f"  linktype {lt}: {text}", markup=False, soft_wrap=True)
    for note in r.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)


def _ep(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def render_reasons_and_flows(r, out: Console, max_flows: int, flow_counts, what: str,
                             reason_help: dict[str, str] = REASON_HELP,
                             not_audited_help: dict[str, str] | None = None) -> None:
    """The part of an audit report the cBPF and eBPF audits share: reasons, frames not audited, flows."""
    for reason, n in r.reasons.items():
        out.print(f"  {n:>8}  {reason}: {reason_help.get(reason, '')}", markup=False, soft_wrap=True)
    if r.not_audited and not_audited_help is not None:
        out.print("  not audited (counted apart, neither right nor wrong):", markup=False)
        for reason, n in r.not_audited.items():
            out.print(f"  {n:>8}  {reason}: {not_audited_help.get(reason, '')}", markup=False, soft_wrap=True)
    elif r.not_audited:
        out.print("  not audited: " + ", ".join(f"{k} {v}" for k, v in r.not_audited.items()), markup=False)
    if r.flows:
        out.print("affected flows (true lengths):")
        for f in r.flows[:max_flows]:
            out.print(f"  {_ep(f.src, f.sport)} > {_ep(f.dst, f.dport)} {f.proto}: {f.packets} packets "
                      f"({flow_counts(f)}), {f.wire_bytes:,} wire bytes, "
                      f"{f.payload_bytes:,} payload bytes", markup=False, soft_wrap=True)
        if len(r.flows) > max_flows:
            out.print(f"  ... and {len(r.flows) - max_flows} more flows")
        out.print(f"  total: {sum(f.wire_bytes for f in r.flows):,} wire bytes, "
                  f"{sum(f.payload_bytes for f in r.flows):,} payload bytes in {what} packets", markup=False,
                  soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add the ``audit-filter EXPR CAPTURE [--json] [--parquet FILE]`` command to ``app``."""
    app.command("audit-filter")(audit_filter)
