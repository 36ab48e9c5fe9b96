"""Build the Wireshark sidecar from the toolkit's tables (packets, superpackets, findings, filter audits).

``analyze --wireshark-sidecar`` calls ``write_analysis_sidecar``. Definitions of the plugin fields:

* ``bigtcp.superpacket`` = the row number (0-based) of the super-packet in ``superpackets.parquet``. A frame
  belongs to a super-packet when it is in the same flow (``flow_id``), between its ``first_frame`` and
  ``last_frame``, carries TCP payload and its sequence number lies in ``[seq_first, seq_first + payload_len)``
  (mod 2^32). Without the packets table only ``first_frame`` and ``last_frame`` are marked.
* ``bigtcp.flush_reason`` = that super-packet's ``flush_reason``; ``observed (N segments)`` for a packet the
  capture already shows aggregated (N = its segment count). The sidecar's ``sp_segments`` is that count.
* ``bigtcp.filter_miss`` = the audited filters whose verdict for the frame is ``missed``;
  ``bigtcp.filter_false_match`` = those whose verdict is ``false_match`` (filter_audit.parquet).
* ``bigtcp.finding`` = the frame's finding codes (findings.parquet rows with frame > 0); the value of the
  message template is recovered from the message so that the plugin shows the same message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .. import findings as F
from .sidecar import default_sidecar_path, write_sidecar


def _df(t: Any):
    """pyarrow Table / DataFrame / None -> DataFrame or None."""
    if t is None:
        return None
    if hasattr(t, "to_pandas") and not hasattr(t, "iloc"):
        return t.to_pandas()
    return t


def _ns(col) -> np.ndarray:
    """Timestamps (datetime64, tz-aware pandas, or int ns) -> int64 ns since the epoch."""
    dt = getattr(col, "dt", None)
    if dt is not None and getattr(dt, "tz", None) is not None:
        col = dt.tz_convert("UTC").dt.tz_localize(None)
    a = np.asarray(col)
    if np.issubdtype(a.dtype, np.datetime64):
        return a.astype("datetime64[ns]").astype(np.int64)
    return a.astype(np.int64)


def finding_value(code: str, message: str) -> str | None:
    """Recover {value} from a message made with the code's template (None if the template has no value)."""
    c = F.BY_CODE.get(code)
    if c is None or "{value}" not in c.template or not isinstance(message, str):
        return None
    pre, _, post = c.template.partition("{value}")
    if message.startswith(pre) and message.endswith(post) and len(message) >= len(pre) + len(post):
        return message[len(pre): len(message) - len(post)]
    return None


def _audit_tables(audits: Any) -> list[tuple[str, Any]]:
    """Normalise filter audits to [(expression, DataFrame with frame, verdict)].

    Accepts AuditResult objects, (expr, table) pairs, pyarrow tables carrying the ``bigtcp_pcap.filter``
    metadata, or one DataFrame with a ``filter`` column.
    """
    out: list[tuple[str, Any]] = []
    if audits is None:
        return out
    if hasattr(audits, "columns") and hasattr(audits, "iloc"):  # one DataFrame
        if "filter" in audits.columns:
            return [(str(k), g) for k, g in audits.groupby("filter", sort=False, observed=True)]
        raise ValueError("a filter-audit DataFrame needs a 'filter' column")
    if hasattr(audits, "schema") and hasattr(audits, "to_pandas"):  # one pyarrow table
        audits = [audits]
    for a in audits:
        if hasattr(a, "frames_table") and hasattr(a, "expr"):
            out.append((a.expr, a.frames_table().to_pandas()))
        elif isinstance(a, tuple):
            out.append((str(a[0]), _df(a[1])))
        elif hasattr(a, "schema"):
            meta = a.schema.metadata or {}
            expr = meta.get(b"bigtcp_pcap.filter")
            if expr is None:
                raise ValueError("filter-audit table without bigtcp_pcap.filter metadata; pass (expr, table)")
            out.append((expr.decode(), a.to_pandas()))
        else:
            raise TypeError(f"cannot use {type(a).__name__} as a filter audit")
    return out


def sidecar_rows(packets: Any = None, superpackets: Any = None, findings: Any = None,
                 audits: Any = None) -> list[dict]:
    """Per-frame sidecar rows from the toolkit's tables (see the module docstring)."""
    packets, superpackets, findings = _df(packets), _df(superpackets), _df(findings)
    rows: dict[int, dict] = {}

    def row(fr: int) -> dict:
        r = rows.get(fr)
        if r is None:
            r = rows[fr] = {"frame": fr, "superpacket": None, "flush_reason": None, "filter_miss": [],
                            "filter_false_match": [], "findings": []}
        return r

    if packets is not None and len(packets):
        for fr, wl, ts in zip(packets["frame"].to_numpy(np.int64), packets["wirelen"].to_numpy(np.int64),
                              _ns(packets["ts_ns"]), strict=True):
            r = row(int(fr))
            r["wirelen"], r["ts_ns"] = int(wl), int(ts)

    if superpackets is not None and len(superpackets):
        reasons = superpackets["flush_reason"].astype(str).to_numpy().astype(object)
        nseg = superpackets["n_segments"].to_numpy(np.int64) if "n_segments" in superpackets.columns else None
        if nseg is not None:
            obs = np.flatnonzero(reasons == "observed")
            reasons[obs] = [f"observed ({n} segments)" for n in nseg[obs].tolist()]
        first = superpackets["first_frame"].to_numpy(np.int64)
        last = superpackets["last_frame"].to_numpy(np.int64)
        if packets is not None and len(packets) and "flow_id" in packets.columns:
            pk_frame = packets["frame"].to_numpy(np.int64)
            pk_flow = packets["flow_id"].fillna(-1).to_numpy(np.int64)
            pk_seq = packets["tcp_seq"].fillna(0).to_numpy(np.int64)
            pk_pay = packets["tcp_payload_len"].fillna(0).to_numpy(np.int64)
            order = np.argsort(pk_frame, kind="stable")
            pk_frame, pk_flow, pk_seq, pk_pay = pk_frame[order], pk_flow[order], pk_seq[order], pk_pay[order]
            sp_flow = superpackets["flow_id"].to_numpy(np.int64)
            sp_seq = superpackets["seq_first"].to_numpy(np.int64)
            sp_len = superpackets["payload_len"].to_numpy(np.int64)
            for i in range(len(superpackets)):
                lo, hi = np.searchsorted(pk_frame, [first[i], last[i] + 1])
                sel = slice(lo, hi)
                m = ((pk_flow[sel] == sp_flow[i]) & (pk_pay[sel] > 0)
                     & (((pk_seq[sel] - sp_seq[i]) % (1 << 32)) < sp_len[i]))
                for fr in pk_frame[sel][m].tolist():
                    r = row(fr)
                    if r["superpacket"] is None:
                        r["superpacket"], r["flush_reason"] = i, reasons[i]
                        r["sp_segments"] = None if nseg is None else int(nseg[i])
        else:
            for i in range(len(superpackets)):
                for fr in {int(first[i]), int(last[i])}:
                    r = row(fr)
                    if r["superpacket"] is None:
                        r["superpacket"], r["flush_reason"] = i, reasons[i]
                        r["sp_segments"] = None if nseg is None else int(nseg[i])

    if findings is not None and len(findings):
        for fr, code, msg in zip(findings["frame"].to_numpy(np.int64), findings["code"].astype(str),
                                 findings["message"], strict=True):
            if fr <= 0:
                continue  # capture-level finding
            v = finding_value(code, msg)
            row(int(fr))["findings"].append(code if v is None else (code, v))

    for expr, t in _audit_tables(audits):
        verdict = t["verdict"].astype(str).to_numpy()
        frames = t["frame"].to_numpy(np.int64)
        for key, name in (("filter_miss", "missed"), ("filter_false_match", "false_match")):
            for fr in frames[verdict == name].tolist():
                row(int(fr))[key].append(expr)

    return [rows[k] for k in sorted(rows)]


def write_analysis_sidecar(path: str | os.PathLike | None = None, *, analysis: Any = None, capture: Any = None,
                           packets: Any = None, superpackets: Any = None, findings: Any = None,
                           audits: Any = None, capture_name: str | None = None, capture_size: int | None = None,
                           first_ts_ns: int | None = None, frames: int | None = None) -> Path:
    """Write the sidecar for an ``Analysis`` (``bigtcp_pcap.analyze``) or for explicit tables.

    ``path`` defaults to ``CAPTURE.bigtcp.tsv`` beside ``capture``. Identity facts (name, size, first
    timestamp, frame count) come from ``analysis.info`` unless given; ``packets`` (``analyze(packets=True)``)
    is strongly recommended: it adds the per-frame length/timestamp check and exact super-packet membership.
    ``audits``: AuditResult objects, (expr, table) pairs, or ``analysis.filter_audit``.
    """
    if analysis is not None:
        info = analysis.info
        packets = analysis.packets if packets is None else packets
        superpackets = analysis.superpackets if superpackets is None else superpackets
        findings = analysis.findings if findings is None else findings
        audited = []
        if audits is None:
            audits = getattr(analysis, "filter_audit", None)
            audited = list((getattr(analysis, "params", None) or {}).get("filters") or [])
        capture_name = capture_name or os.path.basename(str(info.name))
        capture_size = capture_size if capture_size is not None else info.size
        first_ts_ns = first_ts_ns if first_ts_ns is not None else info.first_ts_ns
        frames = frames if frames is not None else info.packets
    if capture is not None:
        capture = Path(capture)
        capture_name = capture_name or capture.name
        capture_size = capture_size if capture_size is not None else capture.stat().st_size
        if first_ts_ns is None:
            from .sidecar import first_timestamp_ns

            first_ts_ns = first_timestamp_ns(capture)
    if capture_name is None or capture_size is None or first_ts_ns is None:
        raise ValueError("capture name, size and first timestamp are needed (give analysis= or capture=)")
    if path is None:
        if capture is None:
            raise ValueError("give path= or capture=")
        path = default_sidecar_path(capture)
    audit_list = _audit_tables(audits)
    rows = sidecar_rows(packets, superpackets, findings, audit_list)
    # every audited filter in the header, also those that misclassify nothing (filter_audit.parquet has
    # rows only for misclassified frames)
    all_filters = audited if analysis is not None else []
    all_filters += [e for e, _ in audit_list if e not in all_filters]
    return write_sidecar(path, capture_name=capture_name, capture_size=int(capture_size),
                         first_ts_ns=int(first_ts_ns), rows=rows, frames=frames, filters=all_filters)

