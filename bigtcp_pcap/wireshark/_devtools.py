"""Developer helper: keep the plugin's FINDINGS table in step with findings.py.

    python -m bigtcp_pcap.wireshark._devtools sync

rewrites the FINDINGS block of ``bigtcp_pcap/wireshark/bigtcp.lua`` (the one file, installed as package data;
``dissectors/bigtcp.lua`` is a symlink to it) from ``bigtcp_pcap.findings``. tests/wireshark/test_package.py
checks it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from .. import findings

BEGIN = "    -- BEGIN FINDINGS (generated from bigtcp_pcap/findings.py: code, severity, message template)\n"
END = "    -- END FINDINGS\n"
CANONICAL = Path(__file__).resolve().parent / "bigtcp.lua"
PACKAGE_COPY = CANONICAL  # dissectors/bigtcp.lua links here


def _lua_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def findings_block() -> str:
    lines = [BEGIN]
    for c in sorted(findings.BY_ID.values(), key=lambda c: c.id):
        lines.append(f"    {{ {_lua_str(c.code)}, {_lua_str(c.severity)}, {_lua_str(c.template)} }},\n")
    lines.append(END)
    return "".join(lines)


def lua_findings_block(text: str) -> str | None:
    m = re.search(r"^    -- BEGIN FINDINGS.*?^    -- END FINDINGS\n", text, re.DOTALL | re.MULTILINE)
    return m.group(0) if m else None


def sync() -> None:
    text = CANONICAL.read_text(encoding="utf-8")
    old = lua_findings_block(text)
    if old is None:
        raise SystemExit(f"{CANONICAL}: no FINDINGS block")
    new_text = text.replace(old, findings_block())
    if new_text != text:
        CANONICAL.write_text(new_text, encoding="utf-8")
        print(f"updated FINDINGS in {CANONICAL}")


if __name__ == "__main__":
    if sys.argv[1:] != ["sync"]:
        raise SystemExit(__doc__)
    sync()
