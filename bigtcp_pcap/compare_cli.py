"""``bigtcp-pcap compare SENDER RECEIVER``: the thin CLI over ``bigtcp_pcap.compare.compare``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .cli_options import config_options
from .errors import CaptureError, UsageError
from .gro.config import GroConfig


def register(app: typer.Typer) -> None:
    """Add the ``compare`` command to the CLI."""

    @app.command("compare")
    @config_options(GroConfig, "gro", exclude=("checksum_ok",), panel="Receiver GRO model")
    def compare_cmd(
        sender: Annotated[str, typer.Argument(help="pre-GRO capture of the transfer (sender side, TSO off)")],
        receiver: Annotated[str, typer.Argument(help="capture taken on the receiving host (post-GRO)")],
        outdir: Annotated[Path | None, typer.Option("-o", "--outdir", help="write compare.parquet here")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the result as one JSON document")] = False,
        fit: Annotated[bool, typer.Option("--fit", help="also search the poll gap and the push gap that reproduce "
                                                        "the pair best")]
        = False,
        gro: GroConfig | None = None,
    ) -> None:
        """Rebuild the receiver's GRO super-packets from the sender's capture and compare them with the real ones.

        Exit 0 whenever the comparison ran, whatever the share (2: bad options, 3: an unreadable capture, or
        one that ends at a fault: the comparison of the packets before it is printed and written, marked
        partial).

        Example: bigtcp-pcap compare sender.pcap receiver.pcap --gro-max-size 185000 --fit
        """
        from .cli import EXIT_CAPTURE, EXIT_USAGE, _fail
        from .compare import compare

        try:
            res = compare(sender, receiver, gro=gro, fit=fit, outdir=outdir)
        except CaptureError as e:
            raise _fail(e.one_line(), EXIT_CAPTURE) from None
        except UsageError as e:
            raise _fail(str(e), EXIT_USAGE) from None
        if as_json:
            typer.echo(json.dumps(res.to_json()))
        else:
            _render(res)
        if res.errors:  # the comparison covers the packets before the fault; one line, as analyze says it
            raise _fail(f"{res.errors[0]} (compared the packets before it)", EXIT_CAPTURE)



def _render(res) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Console()
    out = out if out.is_terminal else Console(width=160)
    c = res.config
    out.print(f"receiver host {res.receiver_host['mac'] or ''} {', '.join(res.receiver_host['addresses'])}: "
              f"{res.reproduced} of {res.receiver_superpackets} super-packets reproduced exactly "
              f"({100 * res.share:.1f} %); the rebuild made {res.rebuilt_superpackets}", highlight=False)
    out.print(f"model: gro_max_size {c.gro_max_size}, gro_ipv4_max_size {c.ipv4_limit}, napi_weight "
              f"{c.napi_weight}, hz {c.hz}, poll_gap_us {c.poll_gap_us:g}, poll_push_gap_us {c.poll_push_gap_us:g}",
              highlight=False)
    missed = res.receiver_superpackets - res.reproduced
    if missed:
        words = {"poll_boundary": "a NAPI poll ended elsewhere (a capture does not record poll boundaries)",
                 "rule": "the rebuild cut for a rule or limit where the kernel did not (check the settings)",
                 "not_merged": "the rebuild delivered these packets alone where the kernel merged them (a tunnelled "
                               "flow, outside the model: R19; or IP options/flags: R5/R9/R12)",
                 "drop_or_retransmission": "the two captures do not carry the same bytes (drops, retransmits)"}
        for cause, n in res.causes.items():
            if n:
                out.print(f"  {n} not reproduced: {cause}: {words[cause]}", highlight=False)
    known = [b for b in res.by_delivery_delay if b["delay"] != "unknown"]
    if known:  # (one clock on both sides only when both captures were taken on one host, as on a veth pair)
        out.print("by delivery delay (receiver capture time less the sender's): " + "; ".join(
            f"{b['delay']}: {b['reproduced']} of {b['receiver_superpackets']}" for b in known), highlight=False)
    t = Table("flow", "receiver super-packets", "reproduced", "share")
    for f in res.flows[:10]:
        t.add_row(f"{f['src']}:{f['sport']} -> {f['dst']}:{f['dport']}", str(f["receiver_superpackets"]),
                  str(f["reproduced"]), f"{100 * f['share']:.1f} %")
    out.print(t)
    if res.fit:
        best = max(res.fit, key=lambda r: r["share"])
        push = best["poll_push_gap_us"]
        out.print(f"--fit: best poll gap {best['poll_gap_us']:g} us, push gap {push if push == 'inf' else f'{push:g}'}"
                  f" us reproduces {best['reproduced']} "
                  f"({100 * best['share']:.1f} %); for what-if runs on this host: bigtcp-pcap analyze SENDER "
                  f"{best['options']}", highlight=False)
