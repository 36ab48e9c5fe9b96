"""The plugin file: single source, package copy, findings table, Lua 5.2 compatibility."""

from __future__ import annotations

import re
from pathlib import Path

from bigtcp_pcap import findings
from bigtcp_pcap.wireshark import plugin_path
from bigtcp_pcap.wireshark._devtools import CANONICAL, PACKAGE_COPY, findings_block, lua_findings_block

SYNC = "run: python -m bigtcp_pcap.wireshark._devtools sync"


def test_package_copy_is_byte_identical_to_dissectors_file():
    assert CANONICAL.is_file()
    assert PACKAGE_COPY.read_bytes() == CANONICAL.read_bytes(), f"package copy is stale; {SYNC}"


def test_plugin_path_is_the_package_data():
    p = plugin_path()
    assert p.name == "bigtcp.lua" and p.is_file()
    assert p.resolve() == PACKAGE_COPY.resolve()


def test_findings_table_matches_findings_py():
    text = CANONICAL.read_text(encoding="utf-8")
    assert lua_findings_block(text) == findings_block(), f"FINDINGS table is stale; {SYNC}"
    codes = re.findall(r'^    \{ "([^"]+)", "(\w+)"', lua_findings_block(text), re.MULTILINE)
    assert dict(codes) == {c.code: c.severity for c in findings.BY_CODE.values()}


def test_lua52_compatible_syntax():
    """No Lua 5.3+ operators (integer division, bitwise &, |, <<, >>, unary ~); bit32 is used instead."""
    code = re.sub(r"--[^\n]*", "", Path(CANONICAL).read_text(encoding="utf-8"))
    code = re.sub(r'"(\\.|[^"\\])*"', '""', code)  # drop string literals
    for op in ("//", "<<", ">>", "&", "|"):
        assert op not in code, f"Lua 5.3 operator {op!r} in bigtcp.lua"
    assert re.search(r"~(?!=)", code) is None, "Lua 5.3 operator '~' in bigtcp.lua"
    assert "bit32." in code
