"""The Wireshark sidecar: per-frame toolkit results in a TSV file that ``dissectors/bigtcp.lua`` reads.

Lua inside Wireshark cannot read Parquet, so ``analyze --wireshark-sidecar`` writes this small text file and
the plugin shows its contents as ``bigtcp.superpacket``, ``bigtcp.flush_reason``, ``bigtcp.filter_miss``,
``bigtcp.finding`` (plus expert info per finding code).

Format, version 1 (UTF-8, ``\\n`` line ends, fields separated by one TAB)::

    # bigtcp-pcap sidecar v1
    # capture<TAB>NAME<TAB>SIZE<TAB>FIRST_TS_NS
    # frames<TAB>N                                  (optional: frames in the capture)
    # filter<TAB>ID<TAB>EXPRESSION                  (zero or more: the audited filters, ID = 1, 2, ...)
    frame<TAB>superpacket<TAB>flush_reason<TAB>filter_miss<TAB>filter_false_match<TAB>findings<TAB>wirelen<TAB>ts_ns
    7<TAB>3<TAB>psh<TAB>1,2<TAB><TAB>ipv6.jumbo.too_small=1028<TAB>94<TAB>1764684846123456789
    ...

* Line 1 is the magic/version line; every other line starting with ``#`` is a header line ``# KEY<TAB>...``.
  Readers ignore header keys they do not know (room for later versions).
* ``capture``: the capture's file name (basename), its size in bytes, and the timestamp of its first frame in
  integer nanoseconds since the epoch (UTC). ``FIRST_TS_NS`` is the plugin's main identity check.
* The first line not starting with ``#`` is the column header; readers find columns by name, so columns may be
  added later. ``frame`` is required; it is Wireshark's ``frame.number`` (1-based).
* Data rows are sorted by frame, one per frame at most. An empty cell means "none".
  ``superpacket``: integer id. ``flush_reason``: text. ``filter_miss``: comma-separated IDs (``# filter`` lines) of the
  filters that miss the frame; ``filter_false_match``: the same for filters that match it wrongly. ``findings``: comma-separated codes from ``bigtcp_pcap.findings`` (``[a-z0-9._]``).
  ``wirelen`` / ``ts_ns``: the frame's original length and timestamp (ns), optional but recommended: when
  present the plugin checks them on every row it applies. ``sp_segments``: the super-packet's segment count
  (optional; the plugin shows a ``bigtcp`` tree on frames of super-packets of more than one segment).
  ``findings`` items are ``CODE`` or ``CODE=VALUE``; VALUE fills ``{value}`` in the code's message template.
* Text cells (names, filter expressions, flush reasons, finding values) escape ``\\`` as ``\\\\``, TAB as
  ``\\t``, LF as ``\\n`` and CR as ``\\r``; readers also decode ``\\xHH`` (the writer uses ``\\x2c`` for a
  comma inside a finding value).

How the plugin decides the sidecar belongs to the capture (Wireshark 4.0's Lua API has no capture file name
or size): the first frame's timestamp must equal ``FIRST_TS_NS`` exactly (compared as seconds and nanoseconds,
not as a float); every applied row's ``wirelen``/``ts_ns`` must equal the frame's; no frame number may exceed
``frames``. Otherwise the sidecar is refused with the expert warning ``bigtcp.sidecar.refused`` and
``bigtcp.sidecar == "refused: ..."``; nothing from it is shown. Name and size are checked on the Python side
(``check_sidecar``) before ``bigtcp-pcap wireshark open`` wires a sidecar, and shown by the plugin.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAGIC = "# bigtcp-pcap sidecar v1"
COLUMNS = ("frame", "superpacket", "flush_reason", "filter_miss", "filter_false_match", "findings", "wirelen",
           "ts_ns", "sp_segments")
SUFFIX = ".bigtcp.tsv"

_ESC = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_UNESC = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}


def escape(s: str) -> str:
    return "".join(_ESC.get(c, c) for c in s)


def unescape(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            hexd = s[i + 2:i + 4]
            if s[i + 1] == "x" and len(hexd) == 2 and all(h in "0123456789abcdefABCDEF" for h in hexd):
                out.append(chr(int(hexd, 16)))
                i += 4
                continue
            out.append(_UNESC.get(s[i + 1], s[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def default_sidecar_path(capture: str | os.PathLike) -> Path:
    """Where ``open`` looks for a sidecar when none is given: ``CAPTURE.bigtcp.tsv`` beside the capture."""
    p = Path(capture)
    return p.with_name(p.name + SUFFIX)


def _missing(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    try:  # pandas.NA / NaT
        import pandas as pd

        return v is pd.NA or v is pd.NaT
    except ImportError:  # pragma: no cover
        return False


def _get(row: Any, name: str) -> Any:
    if isinstance(row, Mapping):
        return row.get(name)
    return getattr(row, name, None)


def _as_list(v: Any) -> list[str]:
    if isinstance(v, str):
        return [v] if v else []
    if not hasattr(v, "__iter__"):  # None, NaN, pd.NA: no list
        return []
    return [str(x) for x in v if not _missing(x) and str(x) != ""]


_CODE_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _escape_item(s: str) -> str:
    """Escape a list item value: the sidecar escapes plus ',' (list separator) as \\x2c."""
    return escape(s).replace(",", "\\x2c")


def _finding_items(v: Any) -> list[tuple[str, Any]]:
    """findings as (code, value or None): items may be 'code', 'code=value', (code, value) or mappings."""
    out: list[tuple[str, Any]] = []
    if v is None or isinstance(v, float):
        return out
    if isinstance(v, str):
        v = [v] if v else []
    for item in v:
        if isinstance(item, str):
            code, eq, value = item.partition("=")
            out.append((code, value if eq else None))
        elif isinstance(item, Mapping):
            value = item.get("value")
            out.append((str(item["code"]), None if _missing(value) else value))
        else:
            code, value = item
            out.append((str(code), None if _missing(value) else value))
    return out


def _int_cell(v: Any) -> str:
    return "" if _missing(v) else str(int(v))


def _rows_iter(rows: Any) -> Iterable[Any]:
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):  # a pandas DataFrame
        return rows.to_dict("records")
    return rows


def write_sidecar(path: str | os.PathLike, *, capture_name: str, capture_size: int, first_ts_ns: int,
                  rows: Iterable[Any], frames: int | None = None, filters: Iterable[str] = ()) -> Path:
    """Write a sidecar v1 file (format in the module docstring) and return its path.

    ``rows``: per-frame records (mappings, objects with attributes, or a pandas DataFrame) with ``frame`` (int)
    and any of ``superpacket`` (int or None), ``flush_reason`` (str or None), ``filter_miss`` and
    ``filter_false_match`` (lists of filter expressions), ``findings`` (codes: ``"code"``, ``"code=value"``,
    ``(code, value)`` or ``{"code":, "value":}``; the value fills the code's message template), ``wirelen`` and ``ts_ns`` (ints, optional: enable the
    plugin's per-frame check). Rows are written sorted by frame; a frame given twice is an error.
    ``frames``: total frames in the capture (optional; the plugin refuses the sidecar past that frame).
    ``filters``: every audited filter expression, so that the header lists them all (those that miss no frame
    too); filters named only in rows are added after them.
    """
    if "/" in capture_name or "\\" in capture_name:
        capture_name = os.path.basename(capture_name)
    filter_ids: dict[str, int] = {}
    for expr in filters:
        filter_ids.setdefault(str(expr), len(filter_ids) + 1)
    out_rows: list[tuple[int, str]] = []
    seen: set[int] = set()
    for row in _rows_iter(rows):
        fr = int(_get(row, "frame"))
        if fr < 1:
            raise ValueError(f"sidecar row with frame {fr}: frames are 1-based")
        if fr in seen:
            raise ValueError(f"sidecar row for frame {fr} given twice")
        seen.add(fr)
        ids: dict[str, list[str]] = {}
        for key in ("filter_miss", "filter_false_match"):
            ids[key] = []
            for expr in _as_list(_get(row, key)):
                if expr not in filter_ids:
                    filter_ids[expr] = len(filter_ids) + 1
                ids[key].append(str(filter_ids[expr]))
        codes = []
        for item in _finding_items(_get(row, "findings")):
            code, value = item
            if not _CODE_RE.match(code):
                raise ValueError(f"bad finding code {code!r} for frame {fr}")
            codes.append(code if value is None else f"{code}={_escape_item(str(value))}")
        reason = _get(row, "flush_reason")
        cells = [
            str(fr),
            _int_cell(_get(row, "superpacket")),
            "" if _missing(reason) else escape(str(reason)),
            ",".join(ids["filter_miss"]),
            ",".join(ids["filter_false_match"]),
            ",".join(codes),
            _int_cell(_get(row, "wirelen")),
            _int_cell(_get(row, "ts_ns")),
            _int_cell(_get(row, "sp_segments")),
        ]
        out_rows.append((fr, "\t".join(cells)))
    out_rows.sort()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(MAGIC + "\n")
        fh.write(f"# capture\t{escape(capture_name)}\t{int(capture_size)}\t{int(first_ts_ns)}\n")
        if frames is not None:
            fh.write(f"# frames\t{int(frames)}\n")
        for expr, i in filter_ids.items():
            fh.write(f"# filter\t{i}\t{escape(expr)}\n")
        fh.write("\t".join(COLUMNS) + "\n")
        fh.writelines(line + "\n" for _, line in out_rows)
    os.replace(tmp, path)
    return path


@dataclass
class SidecarRow:
    frame: int
    superpacket: int | None = None
    flush_reason: str | None = None
    filter_miss: list[str] = field(default_factory=list)  # filter expressions (resolved from the ids)
    filter_false_match: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)  # codes
    finding_values: dict[str, str] = field(default_factory=dict)  # code -> VALUE of CODE=VALUE items
    wirelen: int | None = None
    ts_ns: int | None = None
    sp_segments: int | None = None


@dataclass
class Sidecar:
    path: Path
    capture_name: str
    capture_size: int
    first_ts_ns: int
    frames: int | None
    filters: dict[int, str]
    rows: dict[int, SidecarRow]


def read_sidecar(path: str | os.PathLike) -> Sidecar:
    """Parse a sidecar v1 file (the Python twin of the plugin's reader; raises ValueError when malformed)."""
    path = Path(path)
    with open(path, encoding="utf-8", newline="") as fh:
        lines = fh.read().split("\n")
    if not lines or not lines[0].rstrip("\r").startswith(MAGIC):
        raise ValueError(f"{path}: not a bigtcp-pcap sidecar v1")
    cap = None
    frames = None
    filters: dict[int, str] = {}
    cols: dict[str, int] | None = None
    rows: dict[int, SidecarRow] = {}
    for ln in lines[1:]:
        ln = ln.rstrip("\r")
        if not ln:
            continue
        if ln.startswith("#"):
            parts = ln[1:].lstrip(" ").split("\t")
            if parts[0] == "capture":
                cap = (unescape(parts[1]), int(parts[2]), int(parts[3]))
            elif parts[0] == "frames":
                frames = int(parts[1])
            elif parts[0] == "filter":
                filters[int(parts[1])] = unescape(parts[2])
            continue
        parts = ln.split("\t")
        if cols is None:
            cols = {c: i for i, c in enumerate(parts)}
            if "frame" not in cols:
                raise ValueError(f"{path}: column header has no 'frame' column")
            continue

        def cell(name: str, parts=parts, cols=cols) -> str:
            i = cols.get(name)
            return parts[i] if i is not None and i < len(parts) else ""

        fr = int(cell("frame"))
        codes, values = [], {}
        for item in cell("findings").split(","):
            if item:
                code, eq, value = item.partition("=")
                codes.append(code)
                if eq:
                    values[code] = unescape(value)
        rows[fr] = SidecarRow(
            frame=fr,
            superpacket=int(cell("superpacket")) if cell("superpacket") else None,
            flush_reason=unescape(cell("flush_reason")) if cell("flush_reason") else None,
            filter_miss=[filters.get(int(i), i) for i in cell("filter_miss").split(",") if i],
            filter_false_match=[filters.get(int(i), i) for i in cell("filter_false_match").split(",") if i],
            findings=codes,
            finding_values=values,
            wirelen=int(cell("wirelen")) if cell("wirelen") else None,
            ts_ns=int(cell("ts_ns")) if cell("ts_ns") else None,
            sp_segments=int(cell("sp_segments")) if cell("sp_segments") else None,
        )
    if cap is None or cols is None:
        raise ValueError(f"{path}: missing '# capture' header line or column header")
    return Sidecar(path, cap[0], cap[1], cap[2], frames, filters, rows)


def check_sidecar(sidecar: str | os.PathLike | Sidecar, capture: str | os.PathLike,
                  first_ts_ns: int | None = None) -> list[str]:
    """Problems that make ``sidecar`` not belong to ``capture`` (empty list: it belongs).

    Checks the size in bytes and the first frame's timestamp (read with the toolkit's reader, or given);
    a different file *name* alone is not a problem (captures get renamed) and is not reported.
    """
    sc = sidecar if isinstance(sidecar, Sidecar) else read_sidecar(sidecar)
    capture = Path(capture)
    problems = []
    size = capture.stat().st_size
    if size != sc.capture_size:
        problems.append(f"sidecar {sc.path} is for {sc.capture_name} of {sc.capture_size} bytes; "
                        f"{capture} has {size} bytes")
    if first_ts_ns is None:
        first_ts_ns = first_timestamp_ns(capture)
    if first_ts_ns is not None and first_ts_ns != sc.first_ts_ns:
        problems.append(f"sidecar {sc.path} is for a capture whose first frame is at {sc.first_ts_ns} ns; "
                        f"{capture} starts at {first_ts_ns} ns")
    return problems


def first_timestamp_ns(capture: str | os.PathLike) -> int | None:
    """Timestamp of the capture's first frame in ns (toolkit reader, else tshark), None if unknown."""
    try:
        from ..capture.reader import read_batches

        for batch in read_batches(capture):
            if len(batch):
                return int(batch.ts_ns[0])
        return None
    except ImportError:
        pass
    except Exception:  # noqa: BLE001, S110 - an unreadable capture: fall back to tshark
        pass
    from .plugin import find_tshark

    tshark = find_tshark()
    if not tshark:
        return None
    import subprocess

    r = subprocess.run([tshark, "-r", str(capture), "-c", "1", "-T", "fields", "-e", "frame.time_epoch"],
                       capture_output=True, text=True, check=False)
    s = r.stdout.strip()
    if r.returncode != 0 or not s:
        return None
    return epoch_string_to_ns(s)


def epoch_string_to_ns(s: str) -> int:
    """'1764684846.123456789' (tshark frame.time_epoch) -> integer ns, exactly."""
    secs, _, frac = s.strip().partition(".")
    return int(secs) * 1_000_000_000 + int((frac + "000000000")[:9])
