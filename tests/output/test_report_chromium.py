"""The HTML report in a real headless Chromium (Debian's chromium): it renders, logs no console error, loads
nothing but its own data: URIs, and every figure decodes to a real image."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bigtcp_pcap.api import analyze
from bigtcp_pcap.output.report import write_report

REPO = Path(__file__).resolve().parents[2]
KERNEL = REPO / "tests" / "fixtures" / "kernel"

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000"]

# Appended to a copy of the report (the report itself has no script): after load, record what the page saw.
PROBE = """<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || e)));
window.addEventListener('load', () => {
  const imgs = [...document.images].map(i => ({w: i.naturalWidth, h: i.naturalHeight, ok: i.complete,
                                              data: i.src.startsWith('data:image/png;base64,')}));
  const res = performance.getEntriesByType('resource').map(r => r.name).filter(n => !n.startsWith('data:'));
  const out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({imgs, res, errors: window.__errors, title: document.title,
    h2: [...document.querySelectorAll('h2')].map(h => h.id),
    width: document.documentElement.scrollWidth, viewport: window.innerWidth});
  document.body.appendChild(out);
});
</script>"""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    analyze(KERNEL / "v6_185000.rcv.pcap", outdir=out)
    return write_report(out)


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_report_is_self_contained(report):
    text = report.read_text()
    assert "<script" not in text
    # no URL the browser would fetch: every src/href is a data: URI or an in-page anchor
    refs = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]+)""", text)
    assert refs and all(r.startswith(("data:", "#")) for r in refs), [r for r in refs if not r.startswith("data:")]
    assert "@import" not in text and "url(" not in text
    for section in ("Summary", "Diagnosis", "Filter audit", "Top flows", "Plots"):
        assert f">{section}" in text
    assert "post-GRO (or TSO-side)" in text and "NAPI budget" in text
    # the suggested filter of the audit is in the report (HTML-escaped)
    assert "ip6[6]=0 and ip6[40]=6" in text


@needs_chromium
def test_report_renders_in_chromium_with_figures_and_no_console_errors(report, tmp_path):
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    r = _chromium(["--window-size=1366,900", "--dump-dom", probe.as_uri()], tmp_path / "profile1")
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', r.stdout, re.DOTALL)
    assert m, r.stdout[-2000:]
    got = json.loads(m.group(1).replace("&quot;", '"').replace("&gt;", ">").replace("&lt;", "<")
                     .replace("&amp;", "&"))
    assert got["errors"] == []
    assert got["res"] == []  # nothing fetched beyond the page itself
    assert len(got["imgs"]) == 4
    assert all(i["ok"] and i["data"] and i["w"] > 300 and i["h"] > 200 for i in got["imgs"]), got["imgs"]
    assert got["h2"] == ["summary", "diagnosis", "filters", "flows", "findings", "plots"]
    # readable on a laptop screen: nothing wider than the 1366 px window (no horizontal scrolling)
    assert got["width"] <= got["viewport"], got
    console = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert console == []


@needs_chromium
def test_report_screenshot(report, tmp_path):
    shot = tmp_path / "report.png"
    r = _chromium(["--window-size=1366,2400", f"--screenshot={shot}", report.as_uri()], tmp_path / "profile2")
    assert r.returncode == 0, r.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (w, h) == (1366, 2400)
    keep = REPO / "tests" / "output" / "last-report-screenshot.png"
    if keep.parent.is_dir():  # for a person to look at (git-ignored)
        shutil.copyfile(shot, keep)


def test_report_audit_counts_say_which_frames_were_judged(report):
    # the default audit judges only the frames a BIG TCP encoding or extension header can affect; the report's
    # "matched 0, truth 21" read as whole-capture counts (libpcap matches 119 of that capture's 147 frames)
    text = report.read_text()
    s = json.loads((report.parent / "summary.json").read_text())
    r = next(x for x in s["filter_audit"]["results"] if x["expr"] == "tcp")
    assert r["frames_skipped"] > 0
    judged = r["frames_total"] - r["frames_skipped"]
    row = re.search(r"<code>tcp</code>.*?</tr>", text, re.DOTALL).group(0)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)  # from the verdict on (the filter's cell began the match)
    assert cells[:4] == ["MIS-PARSES", f"{judged:,}", f"{r['matched']:,}", f"{r['truth']:,}"], cells
    assert f"{r['frames_skipped']:,} frames that no BIG TCP encoding" in text
