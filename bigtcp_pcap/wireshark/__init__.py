"""Wireshark companion: the ``bigtcp.lua`` postdissector, its sidecar file and the ``wireshark`` CLI commands.

Public API::

    plugin_path()                      -> Path of the packaged bigtcp.lua
    personal_plugin_dir()              -> Wireshark's "Personal Lua Plugins" folder
    install_plugin(dest=None)          -> Path written
    tshark_command(capture, sidecar=None, *, program="tshark", extra=None) -> list[str]
    write_sidecar(path, *, capture_name, capture_size, first_ts_ns, rows, frames=None) -> Path
    read_sidecar(path) -> Sidecar;  check_sidecar(sidecar, capture) -> list[str] (problems)
    default_sidecar_path(capture)      -> CAPTURE.bigtcp.tsv

CLI: ``bigtcp_pcap.wireshark.cli.register(app)`` adds ``wireshark install`` and ``wireshark open``.
"""

from __future__ import annotations

from .plugin import (
    PLUGIN_NAME,
    find_tshark,
    install_plugin,
    installed_plugin,
    personal_plugin_dir,
    plugin_is_current,
    plugin_path,
    tshark_command,
    tshark_version,
)
from .sidecar import (
    Sidecar,
    SidecarRow,
    check_sidecar,
    default_sidecar_path,
    first_timestamp_ns,
    read_sidecar,
    write_sidecar,
)

__all__ = [
    "PLUGIN_NAME",
    "Sidecar",
    "SidecarRow",
    "check_sidecar",
    "default_sidecar_path",
    "find_tshark",
    "first_timestamp_ns",
    "install_plugin",
    "installed_plugin",
    "personal_plugin_dir",
    "plugin_is_current",
    "plugin_path",
    "read_sidecar",
    "tshark_command",
    "tshark_version",
    "write_sidecar",
]
