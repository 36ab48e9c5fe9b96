"""Find, install and run the Wireshark companion plugin (``bigtcp.lua``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

PLUGIN_NAME = "bigtcp.lua"
# Wireshark uses the wire length for these; ipv6.tso_support is FALSE by default in 4.0, which makes IPv6
# payload_len 0 without HBH (new kernels) "Malformed" with no TCP layer.
TSO_PREFS = ("ipv6.tso_support:TRUE", "ip.tso_support:TRUE")


def plugin_path() -> Path:
    """The plugin shipped with this package (package data ``bigtcp_pcap/wireshark/bigtcp.lua``).

    ``dissectors/bigtcp.lua`` in the repository is the canonical source and the package copy is kept
    byte-identical to it (tests/wireshark/test_package.py). If the package data is missing (an unusual
    install), the repository file next to the checkout is used.
    """
    p = Path(str(resources.files(__package__).joinpath(PLUGIN_NAME)))
    if p.is_file():
        return p
    repo = Path(__file__).resolve().parents[2] / "dissectors" / PLUGIN_NAME
    if repo.is_file():
        return repo
    raise FileNotFoundError(f"{PLUGIN_NAME} is neither package data ({p}) nor in a checkout ({repo})")


def find_tshark(program: str = "tshark") -> str | None:
    return shutil.which(program)


def _env_home() -> Path:
    home = os.environ.get("HOME")
    return Path(home) if home else Path.home()


def personal_plugin_dir(tshark: str | None = None) -> Path:
    """Wireshark's "Personal Lua Plugins" folder.

    Asked from ``tshark -G folders`` when tshark is installed (the authority: Wireshark 4.0 derives it from
    $HOME only, XDG_* and WIRESHARK_CONFIG_DIR do not move it); otherwise ``$HOME/.local/lib/wireshark/plugins``
    (``%APPDATA%\\Wireshark\\plugins`` on Windows).
    """
    tshark = tshark or find_tshark()
    if tshark:
        try:
            r = subprocess.run([tshark, "-G", "folders"], capture_output=True, text=True, timeout=60, check=False)
            for line in r.stdout.splitlines():
                key, _, val = line.partition(":")
                if key.strip() == "Personal Lua Plugins" and val.strip():
                    return Path(val.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    if os.name == "nt" and os.environ.get("APPDATA"):
        return Path(os.environ["APPDATA"]) / "Wireshark" / "plugins"
    return _env_home() / ".local" / "lib" / "wireshark" / "plugins"


def installed_plugin(dest: str | os.PathLike | None = None) -> Path | None:
    """The installed copy in the personal plugin folder (or ``dest``), if any."""
    d = Path(dest) if dest else personal_plugin_dir()
    p = d if d.suffix == ".lua" else d / PLUGIN_NAME
    return p if p.is_file() else None


def install_plugin(dest: str | os.PathLike | None = None) -> Path:
    """Copy the plugin into Wireshark's personal Lua plugin folder (or ``dest``: a folder or a .lua path).

    Returns the path written. Wireshark/tshark load it at start-up, so ``-X lua_script:`` is no longer needed
    and the ``bigtcp.*`` fields also appear in ``tshark -G fields`` (and so in pyshark's EK mode).
    """
    d = Path(dest) if dest else personal_plugin_dir()
    target = d if d.suffix == ".lua" else d / PLUGIN_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    shutil.copyfile(plugin_path(), tmp)
    os.replace(tmp, target)
    return target


def plugin_is_current(path: Path) -> bool:
    return path.is_file() and path.read_bytes() == plugin_path().read_bytes()


SIDECAR_ENV = "BIGTCP_SIDECAR"
"""Environment variable the plugin reads the sidecar path from (never a saved preference)."""


def tshark_command(capture: str | os.PathLike, sidecar: str | os.PathLike | None = None, *,
                   program: str = "tshark", plugin: str | os.PathLike | None = None,
                   use_installed: bool | None = None, extra: list[str] | None = None) -> list[str]:
    """The command line that opens ``capture`` with the plugin and (optionally) the sidecar wired.

    ``program``: ``tshark`` (default) or ``wireshark``. The plugin is passed with ``-X lua_script:PATH``
    unless an identical copy is installed in the personal plugin folder (``use_installed`` None: decide by
    looking; True/False: force), because loading it twice would leave the second copy unused. The sidecar is
    given as ``env BIGTCP_SIDECAR=PATH`` in front of the program, which works for both ways of loading and,
    unlike a ``-o`` preference, is never written into the user's Wireshark profile (a saved preference would
    apply the sidecar to every later capture). All paths are absolute, so the command works from any folder.
    ``-o ipv6.tso_support:TRUE`` is always added so that Wireshark itself dissects TCP in IPv6 payload_len 0
    packets. ``extra`` is appended (for example ``["-Y", "bigtcp.kind"]``).
    """
    exe = find_tshark(program) or program
    cmd = [exe, "-r", str(Path(capture).absolute())]
    if use_installed is None:
        inst = installed_plugin()
        use_installed = inst is not None and plugin_is_current(inst)
    if not use_installed:
        cmd += ["-X", f"lua_script:{Path(plugin or plugin_path()).absolute()}"]
    for pref in TSO_PREFS:
        cmd += ["-o", pref]
    if extra:
        cmd += list(extra)
    if sidecar is not None:
        cmd = ["env", f"{SIDECAR_ENV}={Path(sidecar).absolute()}", *cmd]
    return cmd


def tshark_version(tshark: str | None = None) -> tuple[str, str | None] | None:
    """(Wireshark version, Lua version or None) of the installed tshark, None if there is no tshark."""
    import re

    tshark = tshark or find_tshark()
    if not tshark:
        return None
    r = subprocess.run([tshark, "-v"], capture_output=True, text=True, check=False)
    m = re.search(r"TShark \(Wireshark\) (\S+)", r.stdout)
    lua = re.search(r"with Lua (\d+\.\d+(?:\.\d+)?)", r.stdout)
    return (m.group(1) if m else "unknown"), (lua.group(1) if lua else None)
