"""``bigtcp-pcap wireshark ...`` commands. The main CLI calls ``register(app)``."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from ..errors import OutputError
from .plugin import (
    find_tshark,
    install_plugin,
    installed_plugin,
    personal_plugin_dir,
    plugin_is_current,
    plugin_path,
    tshark_command,
)
from .sidecar import SUFFIX, check_sidecar, default_sidecar_path


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


def install(
    dest: Annotated[Path | None, typer.Option("--dest", help="Folder (or .lua path) to install into "
                                                 "instead of Wireshark's personal Lua plugin folder")] = None,
) -> None:
    """Copy the bigtcp.lua plugin into Wireshark's personal Lua plugin folder."""
    try:
        target = install_plugin(dest)
    except OSError as e:  # an unwritable or impossible destination is an output error (exit 4)
        fault = OutputError.from_os(str(dest or personal_plugin_dir()), e)
        _err(f"bigtcp-pcap: {fault.one_line()}")
        raise typer.Exit(fault.exit_code) from None
    typer.echo(f"installed {plugin_path().name} -> {target}")
    if dest is None:
        typer.echo("Wireshark and tshark load it at start-up: no -X lua_script needed; "
                   "fields: bigtcp.kind, bigtcp.ip_len, bigtcp.tcp_len, bigtcp.gso_segs, ...")


def open_(
    capture: Annotated[Path, typer.Argument(help="Capture file (pcap/pcapng)", exists=True, dir_okay=False)],
    extra: Annotated[list[str] | None, typer.Argument(help="More tshark/wireshark arguments (after --)")] = None,
    sidecar: Annotated[Path | None, typer.Option("--sidecar", help="Sidecar TSV from 'analyze "
                                                    "--wireshark-sidecar' (default: CAPTURE.bigtcp.tsv if present)")]
    = None,
    outdir: Annotated[Path | None, typer.Option("--outdir", "-o", help="Take the sidecar from this 'analyze -o' "
                                               "folder (OUTDIR/<capture name>.bigtcp.tsv)")] = None,
    run: Annotated[bool, typer.Option("--run", help="Run the command instead of printing it")] = False,
    gui: Annotated[bool, typer.Option("--gui", help="Use wireshark instead of tshark")] = False,
    force: Annotated[bool, typer.Option("--force", help="Wire the sidecar even if it does not match the capture "
                                        "(the plugin will still refuse it)")] = False,
) -> None:
    """Print (or --run) the tshark/wireshark command line with the plugin and sidecar wired."""
    if sidecar is None and outdir is not None:
        sidecar = outdir / (capture.name + SUFFIX)
    if sidecar is None:
        cand = default_sidecar_path(capture)
        if cand.is_file():
            sidecar = cand
    elif not sidecar.is_file():
        _err(f"bigtcp-pcap: wireshark open: sidecar {sidecar} does not exist")
        raise typer.Exit(2)
    if sidecar is not None:
        try:
            problems = check_sidecar(sidecar, capture)
        except (ValueError, OSError) as e:
            problems = [str(e)]
        if problems:  # one line either way
            why = "; ".join(problems)
            if not force:
                _err(f"bigtcp-pcap: wireshark open: {sidecar} does not belong to {capture} ({why}); use --force "
                     "to wire it anyway")
                raise typer.Exit(2)
            _err(f"bigtcp-pcap: warning: {sidecar} does not belong to {capture} ({why}); wired anyway (--force)")
    program = "wireshark" if gui else "tshark"
    inst = installed_plugin()
    if inst is not None and not plugin_is_current(inst):
        _err(f"bigtcp-pcap: warning: {inst} differs from this version's plugin and Wireshark loads it first; "
             "run 'bigtcp-pcap wireshark install' to update it")
    cmd = tshark_command(capture, sidecar, program=program, extra=list(extra or []))
    if not run:
        typer.echo(shlex.join(cmd))
        return
    if find_tshark(program) is None:
        _err(f"bigtcp-pcap: wireshark open: {program} not found on PATH (Debian/Ubuntu: apt-get install {program})")
        raise typer.Exit(127)
    sys.stdout.flush()
    rc = subprocess.call(cmd, env=os.environ.copy())
    raise typer.Exit(rc)


def where() -> None:
    """Print the packaged plugin path and Wireshark's personal Lua plugin folder."""
    typer.echo(f"plugin: {plugin_path()}")
    typer.echo(f"personal Lua plugins: {personal_plugin_dir()}")
    inst = installed_plugin()
    state = "not installed" if inst is None else ("installed, current" if plugin_is_current(inst)
                                                  else "installed, differs from this version")
    typer.echo(f"state: {state}")


def make_app() -> typer.Typer:
    ws = typer.Typer(help="Wireshark companion plugin (bigtcp.lua) and sidecar.", no_args_is_help=True)
    ws.command("install")(install)
    ws.command("open", context_settings={"allow_interspersed_args": True})(open_)
    ws.command("where")(where)
    return ws


def register(app: typer.Typer) -> None:
    """Add the ``wireshark`` sub-app (install / open / where) to the main CLI."""
    app.add_typer(make_app(), name="wireshark")
