"""The command line: a thin layer over ``bigtcp_pcap.api``. Options in, one library call, output out.

Exit codes: 0 clean, 1 findings of severity warn or error present, 2 usage error, 3 unreadable or corrupt
capture (the tables are still written, marked partial), 4 output error (a table could not be written), 130 / 143
interrupted by SIGINT / SIGTERM (the tables are written, marked partial). Each command has one
``except BigtcpError`` (errors.py): one stderr line, the error's exit code.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from contextlib import contextmanager

# The CLI process uses the system allocator for Arrow buffers (set before pyarrow is first imported): mimalloc,
# pyarrow's default, keeps freed row groups cached and measured ~30 MiB more peak RSS on long captures.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
# Nothing here calls BLAS, but numpy's bundled OpenBLAS starts a thread per core at import and those threads
# busy-wait: on 2 cores `perf stat -r 10` of a small analyze measured 560 -> 337 ms CPU, 0.51 -> 0.40 s wall with
# one thread. Set before numpy is first imported; a user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from .buffers import tune_malloc
from .capture.source import waiting_on_live_input
from .cli_options import config_options
from .errors import BigtcpError, Interrupted, UsageError
from .gro.config import GroConfig

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Decode BIG TCP captures, rebuild Linux GRO super-packets, audit capture filters.")
err = Console(stderr=True, soft_wrap=True, emoji=False)  # one line, however long its paths; ":x:" is not an emoji

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_CAPTURE, EXIT_OUTPUT = 0, 1, 2, 3, 4


def _fail(msg: str, code: int) -> typer.Exit:
    err.print(f"bigtcp-pcap: {msg}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"bigtcp-pcap {__version__}")
        raise typer.Exit(EXIT_CLEAN)


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", "-V", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """Decode BIG TCP captures, rebuild Linux GRO super-packets, audit capture filters."""


@contextmanager
def _stop_on_signals():
    """SIGINT / SIGTERM end a run at the next batch boundary, so that every table is finished (marked partial).

    Yields (progress check, signals received). The check, called by ``analyze`` after each batch, raises
    ``Interrupted``; a second signal, or one that comes while the run waits on a live input (a quiet pipe:
    ``waiting_on_live_input``), raises at once.
    """
    got: list[int] = []

    def handler(signum, _frame) -> None:
        again = bool(got)
        got.append(signum)
        if again or waiting_on_live_input():  # (a quiet pipe: no batch boundary may come)
            raise Interrupted(signum)

    def check(_done: int, _total: int | None) -> None:
        if got:
            raise Interrupted(got[0])

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield check, got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _error_line(e: BigtcpError, outdir: Path) -> str:
    """The one stderr line for an error of ``analyze``, saying what became of the tables."""
    if isinstance(e, Interrupted):
        return f"{e.one_line()} (tables written to {outdir}/, marked partial)"
    return e.one_line()


@app.command()
@config_options(GroConfig, "gro", exclude=("checksum_ok",), panel="Receiver GRO model")
def analyze(
    captures: Annotated[list[str] | None, typer.Argument(
        help="pcap/pcapng file (compressed ok), '-' for stdin; omitted: the bundled sample. Several files, a "
        "directory or a glob: one hive-partitioned dataset in OUTDIR", metavar="[CAPTURE]...")] = None,
    outdir: Annotated[Path, typer.Option("-o", "--outdir", help="where the Parquet tables go")] = Path("bigtcp-out"),
    packets: Annotated[bool, typer.Option("--packets", help="also write packets.parquet")] = False,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="no progress bar on stderr")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as one JSON document")] = False,
    filters: Annotated[list[str] | None, typer.Option(
        "--filter", help="pcap filter to audit (repeatable); default: tcp, ip6 and tcp, tcp port <busiest>")] = None,
    no_audit: Annotated[bool, typer.Option("--no-audit", help="skip the filter audit")] = False,
    plots: Annotated[bool, typer.Option("--plots", help="also write PNG plots to OUTDIR/plots")] = False,
    report: Annotated[bool, typer.Option("--report", help="also write OUTDIR/report.html (self-contained)")] = False,
    wireshark_sidecar: Annotated[bool, typer.Option(
        "--wireshark-sidecar", help="also write OUTDIR/<capture>.bigtcp.tsv for the Wireshark plugin")] = False,
    sha256: Annotated[bool, typer.Option(
        "--sha256", help="record the capture file's SHA-256 in the tables' metadata (~0.6 s per GiB)")] = False,
    flow_idle_timeout: Annotated[float, typer.Option(
        "--flow-idle-timeout", help="seconds a connection may be silent before its flows end (new rows after)")] = 120.0,
    flow_close_timeout: Annotated[float, typer.Option(
        "--flow-close-timeout", help="seconds after RST (or FIN both ways) and silence before the flows end")] = 5.0,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="worker processes (captures, and one capture "
                                      "cut at idle gaps)")] = 1,
    dask: Annotated[str | None, typer.Option("--dask", help="run the tasks on this dask.distributed scheduler "
                                             "(or 'local:N' for a LocalCluster of N workers)")] = None,
    gro: GroConfig | None = None,
) -> None:
    """Analyse a capture and write findings/flows/superpackets (and packets) Parquet tables.

    Example: bigtcp-pcap analyze trace.pcap.gz -o out --gro-max-size 185000
    """
    from .api import analyze as run
    from .api import sample_capture
    from .output.summary import progress_bar, render

    capture = captures[0] if captures else None
    if capture is None:
        err.print(f"no capture given: analysing the bundled sample {sample_capture()}", highlight=False)
    show = not no_progress and sys.stderr.isatty()
    try:
        try:
            cfg = gro if gro is not None else GroConfig()
            from .api import flow_timeout_ns

            flow_timeout_ns("--flow-idle-timeout", flow_idle_timeout)  # UsageError outside 1 us .. 1e9 s
            flow_timeout_ns("--flow-close-timeout", flow_close_timeout)
        except ValueError as e:
            raise UsageError(str(e)) from None
        from .many_cli import check_many, wants_many

        if captures == ["-"] and (jobs > 1 or dask is not None):  # a stream cannot be cut or handed to a worker
            err.print("stdin is read by this one process: --jobs/--dask ignored", highlight=False)
        elif captures and wants_many(captures, jobs, dask):  # several captures or --jobs/--dask: many_cli.py
            from .many_cli import run as run_many

            check_many(captures, plots=plots, report=report, wireshark_sidecar=wireshark_sidecar, filters=filters)
            raise typer.Exit(run_many(captures, outdir, jobs, dask, as_json, err, packets=packets, gro=cfg,
                                      filters=filters, audit=not no_audit, sha256=sha256, plots=plots,
                                      report=report, flow_idle_timeout_s=flow_idle_timeout,
                                      flow_close_timeout_s=flow_close_timeout))
        with _stop_on_signals() as (check, signals), progress_bar(show, err) as cb:
            def on_batch(done: int, total: int | None) -> None:
                check(done, total)
                if cb is not None:
                    cb(done, total)

            result = run(capture, outdir=outdir, packets=packets, gro=cfg, progress=on_batch, filters=filters,
                         audit=not no_audit, wireshark_sidecar=wireshark_sidecar, sha256=sha256,
                         flow_idle_timeout_s=flow_idle_timeout, flow_close_timeout_s=flow_close_timeout)
    except BigtcpError as e:  # usage (2), capture unreadable from the start (3), output (4), interrupted (130/143)
        raise _fail(_error_line(e, outdir), e.exit_code) from None
    from .output.report import write_extras

    extras = write_extras(result.summary, outdir, plots=plots, report=report)
    if as_json:
        typer.echo(json.dumps(result.summary, default=str))
    else:
        out = Console()
        render(result.summary, out if out.is_terminal else Console(width=160))
        if result.error is None:  # an error run says where the tables are in its one error line
            err.print(f"tables written to {outdir}/", highlight=False)
        for extra in extras + ([str(result.sidecar)] if result.sidecar else []):
            err.print(f"wrote {extra}", highlight=False)
    if result.error is not None:
        raise _fail(f"{result.error.one_line()} (tables written to {outdir}/, marked partial)",
                    result.error.exit_code)
    if signals:  # a signal while the last tables were being finished: they are complete
        raise _fail(f"{Interrupted(signals[0]).one_line()} after the tables were complete", 128 + signals[0])
    from .findings import BY_CODE, NOTE

    if any(BY_CODE[c].severity != NOTE for c in result.summary["findings"] if c in BY_CODE):
        raise typer.Exit(EXIT_FINDINGS)


@app.command()
def dissect(
    capture: Annotated[str, typer.Argument(help="pcap/pcapng file, '-' for stdin")],
    count: Annotated[int | None, typer.Option("-c", "--count", min=1, help="stop after N packets")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per packet")] = False,
    expr: Annotated[str | None, typer.Option("-f", "--filter", help="pcap filter expression, judged on the true "
                                             "lengths (BIG TCP frames included)")] = None,
    bigtcp_only: Annotated[bool, typer.Option("--bigtcp-only", help="only frames with a BIG TCP encoding")] = False,
) -> None:
    """One line per packet, like tcpdump -v, with the true lengths and the BIG TCP encoding.

    Example: bigtcp-pcap dissect trace.pcap -c 10 -f 'tcp port 5201' --bigtcp-only
    """
    from .audit import FilterError
    from .dissect import iter_blocks

    out = sys.stdout
    try:
        for block in iter_blocks(capture, count=count, as_json=as_json, expr=expr, bigtcp_only=bigtcp_only):
            out.write("\n".join(block))
            out.write("\n")
    except BigtcpError as e:
        msg = f"bad filter expression {expr!r}: {e.message}" if isinstance(e, FilterError) else e.one_line()
        raise _fail(msg, e.exit_code) from None
    except BrokenPipeError:  # `dissect ... | head`: stop quietly, do not flush into the closed pipe again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@app.command()
def plot(
    outdir: Annotated[Path, typer.Argument(help="an analyze output directory")],
    dest: Annotated[Path | None, typer.Option("--dest", help="where the PNGs go (default OUTDIR/plots)")] = None,
) -> None:
    """PNG plots of an analysis: super-packet size histogram/CDF, segments per super-packet, size over time.

    Example: bigtcp-pcap plot out/
    """
    from .output.plots import plot_dir

    if not (outdir / "superpackets.parquet").exists():
        raise _fail(f"{outdir}: no superpackets.parquet here (run 'bigtcp-pcap analyze CAPTURE -o {outdir}')",
                    EXIT_USAGE)
    for p in plot_dir(outdir, dest):
        typer.echo(str(p))


@app.command("report")
def report_cmd(
    outdir: Annotated[Path, typer.Argument(help="an analyze output directory")],
    dest: Annotated[Path | None, typer.Option("--dest", help="the HTML file to write (default OUTDIR/report.html)")]
    = None,
) -> None:
    """One self-contained HTML report (summary, diagnosis, filter audit, flows, plots) of an analysis.

    Example: bigtcp-pcap report out/
    """
    from .output.report import write_report

    try:
        typer.echo(str(write_report(outdir, dest)))
    except FileNotFoundError as e:
        raise _fail(str(e), EXIT_USAGE) from None


def _register_subcommands() -> None:
    from .audit.cli import register as register_audit
    from .audit.ebpf_cli import register as register_ebpf
    from .compare_cli import register as register_compare
    from .gso.cli import register as register_gso
    from .wireshark.cli import register as register_wireshark

    register_audit(app)
    register_ebpf(app)
    register_compare(app)
    register_wireshark(app)
    register_gso(app)


_register_subcommands()


def main() -> None:
    """Console entry point. Ends with os._exit once output is flushed and every file is closed: the interpreter's
    teardown of numba/LLVM and pyarrow state takes ~0.5 s and does nothing a finished run needs.
    """
    tune_malloc()  # state tables in their own memory maps, batch columns on the heap (buffers.py)
    try:  # typer >= 0.24 carries its own copy of click
        from typer._click import exceptions as cx
    except ImportError:
        from click import exceptions as cx
    try:
        rv = app(standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except cx.NoArgsIsHelpError as e:  # `bigtcp-pcap` alone, `bigtcp-pcap analyze` alone: the help
        e.show()
        code = EXIT_USAGE
    except cx.UsageError as e:  # a bad option or value: one line, as for every other user error
        cmd = e.ctx.command_path if e.ctx is not None else "bigtcp-pcap"
        msg = " ".join(e.format_message().split())
        print(f"{cmd}: {msg} (see '{cmd} -h')", file=sys.stderr)
        code = EXIT_USAGE
    except BigtcpError as e:  # a command that did not catch its own (an output path that cannot be written ...)
        print(f"bigtcp-pcap: {e.one_line()}", file=sys.stderr)
        code = e.exit_code
    except typer.Abort:
        print("bigtcp-pcap: interrupted by SIGINT", file=sys.stderr)
        code = 130
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        print("bigtcp-pcap: interrupted by SIGINT", file=sys.stderr)
        code = 130
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`) or an already closed stream
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
