"""One self-contained HTML report of an analysis directory: summary, diagnosis, filter audit, flows, plots.

Everything is inline (CSS in a <style> element, the PNGs of ``plots.py`` as ``data:`` URIs, no script, no
external font or stylesheet), so the file opens offline and can be mailed or attached to a ticket. It reads only
``summary.json`` (written by ``analyze``) and the Parquet tables, like ``plot``.
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from pathlib import Path
from typing import Any

from ..errors import OutputError, UsageError
from .summary import flow_name

REPORT_NAME = "report.html"

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:18px 22px 40px}
h1{font-size:22px;margin:6px 0 2px}h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid #d8dce3;padding-bottom:3px}
h3{font-size:15px;margin:16px 0 6px}
.sub{color:#5a6372;margin:0 0 12px}
.card{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 14px;margin:8px 0}
.warn{border-left:4px solid #d08a00}.ok{border-left:4px solid #2d8a4e}.bad{border-left:4px solid #c0392b}
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px;margin:6px 0}
th,td{border:1px solid #dde1e7;padding:4px 7px;text-align:left;vertical-align:top}
th{background:#eef1f5;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#eef1f5;padding:1px 4px;border-radius:3px;
word-break:break-all}
dl{display:grid;grid-template-columns:max-content 1fr;gap:3px 14px;margin:0}dt{color:#5a6372}dd{margin:0}
figure{margin:12px 0;background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}figcaption{color:#5a6372;font-size:12.5px;margin-top:4px}
ul{margin:4px 0 4px 20px;padding:0}
"""

PLOT_CAPTIONS = {
    "superpacket_sizes.png": "Super-packet IP length per flow (histogram and CDF), with 64 KiB and the modelled "
                             "limits drawn",
    "segments_per_superpacket.png": "Segments per super-packet (a wall at 64 is the NAPI budget)",
    "superpackets_over_time.png": "Super-packet size (dots) and goodput (lines) over time",
    "flush_reasons_over_time.png": "Flush reasons over time (observed = already aggregated in the capture)",
}


def _e(x: Any) -> str:
    return html.escape("-" if x is None else str(x))


def _n(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.1f}"
    return f"{x:,}" if isinstance(x, int) else _e(x)


def _table(head: list[str], rows: list[list[Any]], numeric: set[int] = frozenset()) -> str:
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    body = []
    for r in rows:
        cells = "".join(f'<td class="n">{_n(v)}</td>' if i in numeric else f"<td>{v}</td>" for i, v in enumerate(r))
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{h}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _summary_html(s: dict) -> str:
    cap = s["capture"]
    big = s.get("bigtcp", {})
    g = s.get("gro", {})
    sp = s.get("superpackets", {})
    items = [
        ("capture", (f"<code>{_e(cap['name'])}</code> ({_e(cap['format'])}"
                    f"{', ' + _e(cap['compression']) if cap.get('compression') else ''})")),
        ("packets", f"{_n(cap['packets'])} ({_n(cap['bytes_on_wire'])} bytes on the wire, {cap['duration_s']:.3f} s)"),
        ("linktypes / snaplen", f"{_e(cap['linktypes'])} / {_e(cap['snaplen'])}"),
        ("BIG TCP encodings", ", ".join(f"{_e(k)} {_n(v)}" for k, v in big.items())
         + (f" (largest IP length {_n(s.get('max_bigtcp_ip_len'))})" if any(big.values()) else "")),
        ("capture kind", _e((s.get("capture_kind") or {}).get("kind"))),
        ("GRO model (assumed)", (f"gro_max_size {_n(g.get('gro_max_size'))}, gro_ipv4_max_size "
                                f"{_n(g.get('effective_gro_ipv4_max_size'))}, napi_weight {_n(g.get('napi_weight'))}, "
                                f"HZ {_n(g.get('hz'))}, kernel {_e(g.get('kernel'))}")),
        ("super-packets", f"{_n(sp.get('count'))}; flush reasons: "
                          + ", ".join(f"{_e(k)} {_n(v)}" for k, v in (sp.get("flush_reasons") or {}).items())),
        ("flows", _n(s.get("flows"))),
    ]
    if cap.get("partial"):
        items.append(("partial", f"<b>{_e(cap.get('error'))}</b>"))
    return "<div class='card'><dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl></div>"


def _kind_html(ck: dict) -> str:
    if not ck:
        return ""
    cls = "warn" if ck.get("post_gro") else "ok"
    title = f"This capture is {ck['kind']}" if ck.get("post_gro") else f"Capture kind: {ck.get('kind')}"
    parts = [f"<div class='card {cls}'><b>{_e(title)}</b><ul>"]
    parts += [f"<li>evidence: {_e(x)}</li>" for x in ck.get("evidence", [])]
    parts += [f"<li>capturing host: {_e(h['text'])}</li>" for h in ck.get("host", [])]
    parts.append("</ul></div>")
    for c in ck.get("contradictions", []):
        parts.append(f"<div class='card bad'><b>The model contradicts the capture:</b> {_e(c)}</div>")
    return "".join(parts)


def _diagnosis_html(d: dict) -> str:
    flows = d.get("flows") or []
    if not flows:
        return "<p>No flow carries TCP payload.</p>"
    out = []
    for f in flows:
        out.append(f"<h3>flow {_e(f['flow_id'])}: <code>{_e(flow_name(f))}</code> ({_n(f['payload_bytes'])} payload "
                   f"bytes)</h3>")
        out.append(f"<div class='card'>{_e(f['text'])}</div>")
        rows = []
        for r in f["reasons"]:
            whatif = "<br>".join(_e(k["text"]) + f"<br><small>{_e(k['suggest'])}</small>" for k in r.get("knobs", []))
            rows.append([f"{r['share']:.1%}", _n(r["bytes"]), _n(r["superpackets"]), f"<code>{_e(r['reason'])}</code>",
                         _e(r["text"]), _e(r.get("knob")), whatif or "-"])
        out.append(_table(["bytes %", "bytes", "super-packets", "reason", "what ended them", "knob",
                           "what-if (GRO stage re-run)"], rows, numeric={0, 1, 2}))
    note = (d.get("what_if_input") or {}).get("note")
    if note:
        out.append(f"<p class='sub'>{_e(note)}</p>")
    return "".join(out)


def _audit_html(fa: dict) -> str:
    if not fa:
        return "<p>The filter audit did not run.</p>"
    out = []
    if fa.get("note"):
        out.append(f"<div class='card warn'>{_e(fa['note'])}</div>")
    rows = []
    skipped = 0
    for r in fa.get("results", []):
        bad = r["missed"] or r["false_matches"]
        skipped = max(skipped, r.get("frames_skipped") or 0)
        judged = (r.get("frames_total") or 0) - (r.get("frames_skipped") or 0)
        rows.append([f"<code>{_e(r['expr'])}</code>", "MIS-PARSES" if bad else "ok", judged, r.get("matched"),
                     r.get("truth"), r["missed"], r["false_matches"],
                     _e(", ".join(f"{k} {v}" for k, v in (r.get("reasons") or {}).items()) or "-"),
                     f"<code>{_e(r['suggestion'])}</code>" if r.get("suggestion") else "-"])
    if rows:
        out.append(_table(["filter", "verdict", "frames judged", "matched", "truth", "missed", "false matches",
                           "reasons", "use instead"], rows, numeric={2, 3, 4, 5, 6}))
        if skipped:  # the default audit judges only the frames a BIG TCP encoding or extension header can affect
            out.append(f"<p class='sub'>matched and truth count the frames judged only: {skipped:,} frames that "
                       "no BIG TCP encoding or extension header can affect were not run through the filters "
                       "('bigtcp-pcap audit-filter' judges every frame).</p>")
    if fa.get("audited") and not fa.get("results"):
        out.append(f"<div class='card ok'>Filters audited, none mis-parses this capture: "
                   f"{_e(', '.join(fa['audited']))}</div>")
    return "".join(out) or "<p>No filter audited.</p>"


def _flows_html(s: dict) -> str:
    rows = []
    for f in s.get("top_flows", []):
        rows.append([f"{_e(f['flow_id'])}: <code>{_e(flow_name(f))}</code>", f["packets"], f["payload_bytes"],
                     f["bigtcp_packets"], f["mss"],
                     f["p50_payload_len"], f["max_payload_len"], f["superpackets"], f["p50_superpacket_len"],
                     f["max_superpacket_len"], f["retransmissions"], f.get("out_of_order"), f["capture_gap_bytes"],
                     f.get("poll_ends_evidenced"), f.get("poll_ends_guessed")])
    return _table(["flow", "packets", "payload", "BIG TCP", "MSS", "seen p50", "seen max", "super-packets",
                   "super-packet p50", "super-packet max", "retx", "out of order", "gap bytes",
                   "poll ends evidenced", "poll ends guessed"], rows, numeric=set(range(1, 15)))


def _findings_html(s: dict) -> str:
    f = s.get("findings") or {}
    if not f:
        return "<p>No findings.</p>"
    return _table(["code", "count"], [[f"<code>{_e(k)}</code>", v] for k, v in f.items()], numeric={1})


def _plots_html(pngs: list[Path]) -> str:
    out = []
    for p in pngs:
        data = base64.b64encode(p.read_bytes()).decode("ascii")
        cap = PLOT_CAPTIONS.get(p.name, p.stem)
        out.append(f"<figure><img alt='{_e(cap)}' src='data:image/png;base64,{data}'>"
                   f"<figcaption>{_e(cap)}</figcaption></figure>")
    return "".join(out) or "<p>No super-packets to plot.</p>"


def render_report(summary: dict, pngs: list[Path]) -> str:
    """The report's HTML text from a summary dict and PNG files (embedded)."""
    name = summary["capture"]["name"]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>bigtcp-pcap report: {_e(name)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>bigtcp-pcap report</h1><p class='sub'><code>{_e(name)}</code></p>"
        f"<h2 id='summary'>Summary</h2>{_summary_html(summary)}{_kind_html(summary.get('capture_kind') or {})}"
        f"<h2 id='diagnosis'>Diagnosis: why the super-packets end where they do</h2>"
        f"{_diagnosis_html(summary.get('diagnosis') or {})}"
        f"<h2 id='filters'>Filter audit</h2>{_audit_html(summary.get('filter_audit') or {})}"
        f"<h2 id='flows'>Top flows</h2>{_flows_html(summary)}"
        f"<h2 id='findings'>Findings</h2>{_findings_html(summary)}"
        f"<h2 id='plots'>Plots</h2>{_plots_html(pngs)}"
        "</main></body></html>\n"
    )


def write_summary(path: str | Path, summary: dict[str, Any]) -> Path:
    """The run's summary (with the diagnosis) as ``summary.json`` beside the tables, for ``report OUTDIR``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summary, default=str, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def write_extras(summary: dict, outdir: str | Path, *, plots: bool, report: bool) -> list[str]:
    """``analyze --plots --report`` after the tables: the PNGs, then the report (which shows them). Their paths go
    into ``summary`` ("plots", "report") and are returned, in that order."""
    if plots:
        from .plots import plot_dir

        summary["plots"] = [str(p) for p in plot_dir(outdir)]
    if report:
        summary["report"] = str(write_report(outdir))
    return summary.get("plots", []) + ([summary["report"]] if report else [])


def write_report(outdir: str | Path, dest: str | Path | None = None) -> Path:
    """Write ``OUTDIR/report.html`` (or ``dest``) for an analyze output directory; returns its path.

    Raises FileNotFoundError when ``OUTDIR/summary.json`` is missing (a directory from an older version or not an
    analyze output).
    """
    from .plots import plot_dir

    outdir = Path(outdir)
    sj = outdir / "summary.json"
    if not sj.is_file():
        raise FileNotFoundError(f"{outdir}: no summary.json here (run 'bigtcp-pcap analyze CAPTURE -o {outdir}')")
    try:
        summary = json.loads(sj.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{outdir}: cannot read summary.json: {e} (re-run 'bigtcp-pcap analyze CAPTURE -o "
                         f"{outdir}')") from None
    with tempfile.TemporaryDirectory(prefix="bigtcp-report-") as tmp:
        pngs = plot_dir(outdir, tmp) if (outdir / "superpackets.parquet").is_file() else []
        text = render_report(summary, pngs)
    path = Path(dest) if dest else outdir / REPORT_NAME
    if path.is_dir():  # a folder: the report goes into it
        path = path / REPORT_NAME
    tmp_path = path.with_name(path.name + ".tmp")
    try:
        tmp_path.write_text(text, encoding="utf-8")
        tmp_path.replace(path)
    except OSError as e:
        tmp_path.unlink(missing_ok=True)
        raise OutputError.from_os(str(path), e) from None
    return path
