"""``egress`` and ``explode``: the command-line faces of ``gso.api.egress`` and ``gso.explode.explode``.
Registered on the main app by ``register(app)``. The egress profile options are generated from the
``EgressProfile`` fields (their docstrings are the help), so a new field is a new option.

Exit codes: 0 done, 2 bad option or profile file, 3 unreadable or corrupt capture (tables still written).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from ..errors import CaptureError
from ..flows.points import point_suffix
from .config import EgressProfile, ProfileError, field_docs

EXIT_CLEAN, EXIT_USAGE, EXIT_CAPTURE = 0, 2, 3


def _fail(msg: str, code: int) -> typer.Exit:
    from ..cli import _fail as fail  # the one error line of every command (the main CLI registers this one)

    return fail(msg, code)


def _profile_options(func):
    """Append one option per EgressProfile field to ``func``'s signature; they arrive in ``**profile_kw``."""
    sig = inspect.signature(func, eval_str=True)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    docs = field_docs()
    for f in fields(EgressProfile):
        if f.name == "name":
            continue
        opt = "--" + f.name.replace("_", "-")
        help_text = docs.get(f.name, "").split(". ")[0].replace("``", "'") + " [profile's value when omitted]"
        if f.name == "tso":
            ann: Any = Annotated[str | None, typer.Option(opt, metavar="on|off", help=help_text)]
        elif "bool" in str(f.type):
            ann = Annotated[bool | None, typer.Option(f"{opt}/--no-{opt[2:]}", help=help_text, show_default=False)]
        elif "int" in str(f.type):
            ann = Annotated[int | None, typer.Option(opt, help=help_text, show_default=False)]
        else:
            ann = Annotated[str | None, typer.Option(opt, help=help_text, show_default=False)]
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann))
        func.__annotations__[f.name] = ann
    func.__signature__ = sig.replace(parameters=params)
    return func


def _parse_tso(v: str | None) -> bool | None:
    if v is None:
        return None
    if v.lower() in ("on", "true", "1", "yes"):
        return True
    if v.lower() in ("off", "false", "0", "no"):
        return False
    raise ProfileError(f"--tso must be 'on' or 'off', got {v!r}")


@_profile_options
def egress_cmd(
    capture: Annotated[str, typer.Argument(metavar="CAPTURE", help="a sender's TX capture (TSO/GSO on), "
                                           "pcap/pcapng, compressed ok, '-' for stdin")],
    outdir: Annotated[Path, typer.Option("-o", "--outdir", help="where egress.parquet goes")] = Path("egress-out"),
    profile: Annotated[str | None, typer.Option(
        "--profile", metavar="FILE|NAME", help="'ip -d -j link show DEV' JSON of the egress device, or veth, ice, "
        "mlx4, legacy (default: veth at its defaults)")] = None,
    then_gro: Annotated[bool, typer.Option("--then-gro", help="feed the device's output to the receiver's GRO "
                                           "engine and write superpackets.parquet")] = False,
    gro_max_size: Annotated[int | None, typer.Option(help="receiver gro_max_size (implies --then-gro)")] = None,
    gro_ipv4_max_size: Annotated[int | None, typer.Option(help="receiver gro_ipv4_max_size (implies --then-gro)"
                                                          )] = None,
    napi_weight: Annotated[int | None, typer.Option(help="receiver NAPI weight (implies --then-gro)")] = None,
    hz: Annotated[int | None, typer.Option(help="receiver kernel HZ (implies --then-gro)")] = None,
    poll_gap_us: Annotated[float | None, typer.Option(help="receiver poll gap in us (implies --then-gro)")] = None,
    mss: Annotated[int | None, typer.Option(help="the sender's gso_size for every flow (default: SYN MSS option "
                                            "minus the option bytes, else from --mtu)")] = None,
    fixedid: Annotated[bool, typer.Option("--fixedid", help="the skbs are SKB_GSO_TCP_FIXEDID: every IPv4 "
                                          "segment keeps the first IP ID (G8)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as one JSON document")] = False,
    **profile_kw: Any,
) -> None:
    """What would an egress device with this profile transmit for the skbs in a sender's capture?

    Writes OUTDIR/egress.parquet (one row per packet or skb leaving the device: passed, segmented,
    resegmented) and prints per flow: skbs in, packets out, amplification, bytes conserved.

    Example: bigtcp-pcap egress sender.pcap -o out --gso-max-size 65536 --then-gro --gro-max-size 185000
    """
    from ..gro.config import GroConfig
    from .api import egress

    try:
        kw = dict(profile_kw)
        kw["tso"] = _parse_tso(kw.get("tso"))
        prof = EgressProfile.load(profile, **kw) if profile else EgressProfile(name="veth").with_overrides(**kw)
        gro_kw = {k: v for k, v in (("gro_max_size", gro_max_size), ("gro_ipv4_max_size", gro_ipv4_max_size),
                                    ("napi_weight", napi_weight), ("hz", hz), ("poll_gap_us", poll_gap_us))
                  if v is not None}
        gro = GroConfig(kernel=prof.kernel, **gro_kw) if (then_gro or gro_kw) else None
        if mss is not None and not 1 <= mss <= 65535:
            raise ProfileError(f"--mss must be in 1..65535, got {mss}")
    except (ProfileError, ValueError) as e:
        raise _fail(str(e), EXIT_USAGE) from None
    try:
        result = egress(capture, outdir=outdir, profile=prof, then_gro=gro, mss=mss, fixedid=fixedid)
    except CaptureError as e:
        raise _fail(e.one_line(), EXIT_CAPTURE) from None
    if as_json:
        typer.echo(json.dumps(result.summary, default=str))
    else:
        out = Console(highlight=False)
        render(result.summary, out if out.is_terminal else Console(width=160, highlight=False))
        if result.error is None:  # an error run says where the table is in its one error line
            Console(stderr=True).print(f"table written to {outdir}/egress.parquet", highlight=False)
    if result.error is not None:
        raise _fail(f"{result.error.one_line()} (table written to {outdir}/egress.parquet, marked partial)",
                    EXIT_CAPTURE)


def render(s: dict, out: Console) -> None:
    """The human summary of an egress run."""
    p = s["profile"]
    out.print(f"egress profile {p['name']}: gso_max_size {p['gso_max_size']}, gso_ipv4_max_size "
              f"{p['effective_gso_ipv4_max_size']}, gso_max_segs {p['gso_max_segs']}, tso "
              f"{'on' if p['tso'] else 'off'}, mtu {p['mtu']}, {p['policy']} (kernel {p['kernel']})",
              markup=False, soft_wrap=True)
    acts = s["inputs_by_action"]
    out.print(f"{s['frames_in']} frames in, {s['super_packets_in']} super-packets; inputs passed "
              f"{acts['passed']}, segmented {acts['segmented']}, resegmented {acts['resegmented']}, dropped "
              f"{acts['dropped']}", markup=False)
    if s["note"]:
        out.print(f"note: {s['note']}", markup=False, soft_wrap=True)
    for f in s["flows"]:
        ep = (lambda a, port: f"[{a}]:{port}" if ":" in a else f"{a}:{port}")
        gro = f", {f['superpackets_after_gro']} super-packets after GRO" if "superpackets_after_gro" in f else ""
        at = point_suffix(f.get("if_id"), f.get("ifindex"), f.get("direction"))
        out.print(f"  {ep(f['src'], f['sport'])} > {ep(f['dst'], f['dport'])}{at}: {f['skbs_in']} skbs in "
                  f"({f['super_packets_in']} super-packets, max frame {f['max_frame_in']}) -> {f['packets_out']} "
                  f"out (max frame {f['max_frame_out']}), x{f['amplification']}, payload {f['payload_in']:,} -> "
                  f"{f['payload_out']:,} ({'conserved' if f['bytes_conserved'] else 'NOT conserved'}){gro}",
                  markup=False, soft_wrap=True)
    if "superpackets_after_gro" in s:
        out.print(f"receiver GRO after the hop: {s['superpackets_after_gro']} super-packets "
                  "(superpackets.parquet)", markup=False)


def explode_cmd(
    capture: Annotated[str, typer.Argument(metavar="IN", help="a capture with super-packets (TX GSO or RX GRO)")],
    dest: Annotated[Path, typer.Argument(metavar="OUT", help="output capture (- for stdout); .pcapng gives "
                                         "pcapng, else pcap")],
    mss: Annotated[int | None, typer.Option(help="segment size for every flow (default: SYN MSS option minus "
                                            "the option bytes, else from --mtu)")] = None,
    mtu: Annotated[int, typer.Option(help="MTU used for the segment size of flows without a SYN")] = 1500,
    as_json: Annotated[bool, typer.Option("--json", help="print the counts as one JSON document")] = False,
    pcapng: Annotated[bool | None, typer.Option("--pcapng/--pcap", help="output format (default: pcapng when OUT "
                                                "ends in .pcapng, else pcap; stdout: pcap)")] = None,
) -> None:
    """Rewrite super-packets into the wire-sized packets they stand for, for tools that choke on them.

    Frames that are not super-packets are copied unchanged; snaplen kept; the HBH jumbo header is removed and
    the IP lengths fixed; the segments' timestamps are spread within the super-packet's time.

    Example: bigtcp-pcap explode receiver.pcap wire.pcap
    """
    from .explode import explode

    try:
        res = explode(capture, dest, mss=mss, mtu=mtu, pcapng=pcapng)
    except (ProfileError, ValueError) as e:
        raise _fail(str(e), EXIT_USAGE) from None
    except CaptureError as e:
        raise _fail(e.one_line(), EXIT_CAPTURE) from None
    to_stdout = str(dest) == "-"  # the capture goes to stdout: the counts go to stderr
    if as_json:
        typer.echo(json.dumps(res.summary), err=to_stdout)
    else:
        s = res.summary
        Console(highlight=False, stderr=to_stdout).print(
            f"{s['frames_in']} frames in, {s['super_packets']} super-packets exploded into {s['segments_out']} "
            f"packets; {s['frames_out']} frames written to {'stdout' if to_stdout else dest} ({s['format']})",
            markup=False, soft_wrap=True)
    if res.error is not None:
        raise _fail(res.error.one_line() + " (frames before it written)", EXIT_CAPTURE)


def register(app: typer.Typer) -> None:
    """Add ``egress CAPTURE -o DIR [profile options]`` and ``explode IN OUT`` to ``app``."""
    app.command("egress")(egress_cmd)
    app.command("explode")(explode_cmd)
