"""``bigtcp-pcap analyze`` with several captures, a directory, a glob, ``--jobs N`` or ``--dask ADDRESS``.

Several captures -> a hive-partitioned dataset in OUTDIR (``many.analyze_many``); one capture with ``--jobs``
or ``--dask`` -> the ordinary tables, the capture cut at idle gaps and analysed in parallel
(``many.analyze_split``; the rows equal the serial run's).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from .errors import UsageError


def wants_many(captures: list[str], jobs: int, dask: str | None) -> bool:
    """True when ``analyze`` must take the multi-capture path."""
    from .many import expand_paths

    glob = any(c != "-" and any(x in c for x in "*?[") and not Path(c).exists() for c in captures)
    return len(captures) > 1 or jobs > 1 or dask is not None or glob or len(expand_paths(captures)) != 1 \
        or any(Path(c).is_dir() for c in captures)


def single_capture(captures: list[str]) -> bool:
    """One capture file (cut into parts with --jobs/--dask): the output is one capture's tables."""
    return len(captures) == 1 and captures[0] != "-" and Path(captures[0]).is_file()


# link types a filter expression is tried on before a multi-capture run: one it compiles for is audited where the
# captures have it (a capture of another link type reports it as not audited), one it compiles for none of is a typo
FILTER_CHECK_LINKTYPES = (1, 101, 113, 276)  # Ethernet, raw IP, Linux cooked v1 and v2


def check_many(captures: list[str], *, plots: bool, report: bool, wireshark_sidecar: bool,
               filters: list[str] | None = None) -> None:
    """Refuse, before any work, what the multi-capture and parallel forms cannot do, and a ``--filter`` libpcap
    compiles for no common link type (a UsageError, exit 2, once rather than once per capture)."""
    from .audit.libpcap import CompiledFilter, FilterError, LibpcapMissing

    for expr in filters or []:
        errors = []
        for lt in FILTER_CHECK_LINKTYPES:
            try:
                CompiledFilter(expr, lt)
                break
            except FilterError as e:
                errors.append(e)
            except LibpcapMissing:  # the run says so (and skips the audit) as the one-capture form does
                return
        else:
            raise UsageError(f"bad filter expression {expr!r}: {errors[0].message}")
    if "-" in captures:
        raise UsageError("'-' (stdin) is read by one process: analyse it alone, without other captures")
    if wireshark_sidecar:
        raise UsageError("--wireshark-sidecar needs one capture analysed by one process (no --jobs/--dask, "
                         "one CAPTURE): the sidecar is written with packets.parquet in one pass")
    if (plots or report) and not single_capture(captures):
        opts = " and ".join(o for o, on in (("--plots", plots), ("--report", report)) if on)
        raise UsageError(f"{opts} need one capture's tables, not a dataset of several: run 'bigtcp-pcap analyze "
                         f"CAPTURE --plots --report' per capture")


def local_workers(address: str) -> int | None:
    """Workers of a ``--dask local`` / ``local:N`` LocalCluster (2 for ``local``), None for a scheduler address
    (``localhost:8786`` is one: it was read as local with 8786 workers); a malformed ``local:`` is a usage error."""
    m = re.fullmatch(r"local(?::(.*))?", address)
    if m is None:
        return None
    if m.group(1) is None:
        return 2
    if not m.group(1).isdigit() or int(m.group(1)) < 1:
        raise UsageError(f"--dask {address}: give local, local:N with N >= 1 workers, or a scheduler address "
                         "(tcp://HOST:PORT)")
    return int(m.group(1))


def _client(address: str):
    from .extras import dask_distributed

    dd = dask_distributed()
    n = local_workers(address)
    if n is not None:  # a LocalCluster of n one-thread workers here
        return dd.Client(dd.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                         dashboard_address=None))
    try:
        return dd.Client(address)
    except (ValueError, OSError, TimeoutError) as e:  # a bad address, nothing listening there
        raise UsageError(f"--dask {address}: cannot reach a Dask scheduler there: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def run(captures: list[str], outdir: Path, jobs: int, dask: str | None, as_json: bool, err: Console,
        plots: bool = False, report: bool = False, **kw: Any) -> int:
    """Run the multi-capture or parallel form; print the summary; the exit code (0, 1 findings, 3 failed)."""
    from .findings import BY_CODE, NOTE
    from .many import analyze_many, analyze_split, expand_paths

    files = expand_paths(captures)
    if not files:
        err.print(f"bigtcp-pcap: no capture files in {' '.join(captures)}", highlight=False)
        return 2
    client = _client(dask) if dask else None
    try:
        single = len(files) == 1 and single_capture(captures)
        if single:
            from .output.report import write_extras
            from .output.summary import render

            a = analyze_split(files[0], outdir, jobs=jobs, client=client, **kw)
            extras = write_extras(a.summary, outdir, plots=plots, report=report)
            if as_json:
                typer.echo(json.dumps(a.summary, default=str))
            else:
                out = Console()
                render(a.summary, out if out.is_terminal else Console(width=160))
                why = a.params.get("serial_because")
                how = f"run serially: {why}" if why else f"{a.params.get('parts', 1)} part(s)"
                if a.error is None:  # an error run says where the tables are in its one error line
                    err.print(f"tables written to {outdir}/ ({how})", highlight=False)
                for extra in extras:
                    err.print(f"wrote {extra}", highlight=False)
            if a.error is not None:
                err.print(f"bigtcp-pcap: {a.error.one_line()} (tables written to {outdir}/, marked partial)",
                          highlight=False, markup=False)
                return a.error.exit_code
            bad = any(BY_CODE[c].severity != NOTE for c in a.summary["findings"] if c in BY_CODE)
            return 1 if bad else 0
        m = analyze_many(files, outdir, jobs=jobs, client=client, **kw)
    finally:
        if client is not None:
            cluster = getattr(client, "cluster", None)
            client.close()
            if cluster is not None and dask and local_workers(dask) is not None:
                cluster.close()
    s = m.summary
    if as_json:
        typer.echo(json.dumps(s, default=str))
    else:
        render_many(s, Console() if Console().is_terminal else Console(width=160))
        err.print(f"dataset written to {outdir}/<table>/capture=<name>/", highlight=False)
    for c in m.failed:
        err.print(f"bigtcp-pcap: {c['error']}", highlight=False, markup=False)
    if m.failed:
        return 3
    bad = any(BY_CODE[k].severity != NOTE for c in m.captures if c["summary"]
              for k in c["summary"]["findings"] if k in BY_CODE)
    return 1 if bad else 0


def render_many(s: dict, console: Console) -> None:
    """One line per capture and a totals line."""
    t = Table(title=f"{s['totals']['captures']} captures -> {s['dataset']}")
    cols = ("capture", "packets", "bigtcp_share", "flows", "largest_superpacket", "findings", "filter_misses",
            "error")
    for c in cols:
        t.add_column(c.replace("_", " "), justify="left" if c in ("capture", "error") else "right")
    def cell(v):
        if v is None:
            return "-"
        return f"{v:.1%}" if isinstance(v, float) else str(v)
    for line in s["captures"]:
        t.add_row(*(cell(line[c]) for c in cols))
    tot = s["totals"]
    t.add_row("total", *(cell(tot.get(c)) for c in cols[1:-1]), f"{tot['failed']} failed" if tot["failed"] else "")
    console.print(t)
