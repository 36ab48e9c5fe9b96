"""The terminal summary of an analysis (rich tables), and the byte-based progress bar."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from ..flows.points import point_suffix, points_text


def _n(x) -> str:
    return "-" if x is None else f"{x:,}"


def render(summary: dict, console: Console) -> None:
    cap = summary["capture"]
    head = Table.grid(padding=(0, 2))
    head.add_row("capture", f"{cap['name']} ({cap['format']}{', ' + cap['compression'] if cap['compression'] else ''})")
    head.add_row("packets", f"{_n(cap['packets'])} ({_n(cap['bytes_on_wire'])} bytes on the wire, "
                 f"{cap['duration_s']:.3f} s)")
    head.add_row("linktypes / snaplen", f"{cap['linktypes']} / {cap['snaplen']}")
    big = summary["bigtcp"]
    head.add_row("BIG TCP encodings", ", ".join(f"{k} {_n(v)}" for k, v in big.items()) +
                 (f" (largest IP length {_n(summary['max_bigtcp_ip_len'])})" if any(big.values()) else ""))
    sp = summary["superpackets"]
    g = summary["gro"]
    ck = summary.get("capture_kind") or {}
    if ck.get("kind"):
        head.add_row("capture kind", f"this capture is {ck['kind']}" if ck.get("post_gro") else ck["kind"])
    head.add_row("GRO model", f"gro_max_size {g.get('gro_max_size')}, gro_ipv4_max_size "
                 f"{g.get('effective_gro_ipv4_max_size')}, napi_weight {g.get('napi_weight')}, hz {g.get('hz')}, "
                 f"kernel {g.get('kernel')} (assumed, not read from the capture"
                 + ("; rebuilds only the segments the capture shows" if ck.get("post_gro") else "") + ")"
                 + (f"; MTU {_n(g.get('fallback_mtu'))} read off the capture (a jumbo-frame link: its data segments "
                    "fill that IP length), used for the flows without a SYN MSS; --fallback-mtu sets it"
                    if g.get("fallback_mtu_from") == "capture" else ""))
    head.add_row("super-packets", f"{_n(sp['count'])}; flush reasons: " +
                 ", ".join(f"{k} {_n(v)}" for k, v in sp["flush_reasons"].items()))
    pe = sp.get("poll_ends") or {}
    ends = sum(pe.values())
    if ends:
        words = {"ack": "evidenced by the receiver's ACKs", "gap": "guessed from timestamp gaps",
                 "push_gap": "guessed from a short gap after the sender's push", "budget": "the NAPI budget",
                 "timer": "flush-timeout polls", "trace": "a recorded poll trace",
                 "coalescing": "the NIC's interrupt coalescing", "end_of_capture": "the end of the capture"}
        head.add_row("poll ends", f"{_n(ends)} super-packets ended at a NAPI poll end: " +
                     ", ".join(f"{100 * v / ends:.0f} % {words.get(k, k)}" for k, v in pe.items() if v))
    if sp.get("late_segments"):
        head.add_row("late segments", f"{_n(sp['late_segments'])} reached the receiver after later data of their "
                     "flow (its SACK, then an ACK before any resend): rebuilt where it got them, each alone, "
                     "ending the super-packet before it (on veth: a full ring with several flows)")
    if sp.get("lost_segments"):
        head.add_row("lost segments", f"{_n(sp['lost_segments'])} never reached the receiver (its SACKs showed the "
                     "hole, then the segment was sent again, and the receiver never reported that data twice): left "
                     "out of the rebuild, the copy is rebuilt where it was sent")
    pts = points_text(summary.get("capture_points") or [])
    if pts:
        head.add_row("capture points", pts)
    rx = sp.get("receivers") or {}
    if len(rx) > 1:
        head.add_row("receivers", "one GRO/NAPI model each: " + ", ".join(f"{k} ({_n(v)} rows)"
                                                                           for k, v in list(rx.items())[:6]))
    console.print(head)
    render_capture_kind(ck, console)

    if summary["top_flows"]:
        t = Table(title=f"Top flows by payload bytes ({summary['flows']} flows)", title_justify="left")
        for col in ("flow", "pkts", "payload", "BIG TCP", "MSS", "seen p50/max", "GRO n p50/max", "retx", "ooo",
                    "gap", "cuts ev/guess"):
            t.add_column(col, justify="right" if col != "flow" else "left", no_wrap=True)
        for f in summary["top_flows"]:
            t.add_row(f"{f['flow_id']}: {flow_name(f)}", _n(f["packets"]),
                      _n(f["payload_bytes"]), _n(f["bigtcp_packets"]), _n(f["mss"]),
                      f"{_n(f['p50_payload_len'])} / {_n(f['max_payload_len'])}",
                      f"{_n(f['superpackets'])} / {_n(f['p50_superpacket_len'])} / {_n(f['max_superpacket_len'])}",
                      _n(f["retransmissions"]), _n(f.get("out_of_order")), _n(f["capture_gap_bytes"]),
                      f"{_n(f.get('poll_ends_evidenced'))} / {_n(f.get('poll_ends_guessed'))}")
        console.print(t)
        console.print("  cuts ev/guess: super-packets that ended at a NAPI poll end the receiver's ACKs (or a trace) "
                      "show / that only the timestamps suggest", highlight=False, markup=False)
    render_diagnosis(summary.get("diagnosis") or {}, console)
    if summary["findings"]:
        from ..findings import BY_CODE

        t = Table(title="Findings", title_justify="left")
        t.add_column("code", no_wrap=True)
        t.add_column("count", justify="right")
        t.add_column("what it says (findings.parquet has each one's value and frame)")
        for code, cnt in summary["findings"].items():
            c = BY_CODE.get(code)
            t.add_row(code, _n(cnt), c.template.replace("{value}", "N") if c else "")
        console.print(t)
    fa = summary.get("filter_audit") or {}
    if fa.get("note"):
        console.print(f"[yellow]{fa['note']}[/]")
    for r in fa.get("results", []):
        verdict = "ok" if not (r["missed"] or r["false_matches"]) else "MIS-PARSES"
        # matched: libpcap's verdict on every frame; truth: the audited frames only (not "N of M": frames not
        # audited count in the first and not in the second)
        counts = "" if r.get("frames_skipped") else f"libpcap matched {_n(r['matched'])}, truth {_n(r['truth'])}, "
        console.print(f"filter [bold]{r['expr']}[/]: {verdict}: {counts}missed {_n(r['missed'])}, "
                      f"false matches {_n(r['false_matches'])} "
                      f"({', '.join(f'{k} {v}' for k, v in r['reasons'].items()) or 'no reasons'})"
                      + (f", not audited {_n(r['not_audited_frames'])} ("
                         + ", ".join(f"{k} {v}" for k, v in r["not_audited"].items()) + ")"
                         if r.get("not_audited_frames") else ""),
                      highlight=False)
        if r.get("suggestion"):
            console.print(f"    use instead: {r['suggestion']}", highlight=False, markup=False)
    if fa.get("audited") and not fa.get("results"):
        console.print(f"filters audited, none mis-parses this capture: {', '.join(fa['audited'])}",
                      highlight=False)
    nfd = summary.get("not_fully_decoded") or {}
    if nfd:
        console.print("frames not fully decoded: " + ", ".join(f"{k} {_n(v)}" for k, v in nfd.items()),
                      highlight=False)
        if nfd.get("truncated_l4"):
            oc = summary.get("tcp_options_cut") or 0
            console.print(f"  truncated_l4: a TCP/UDP header or its options cut by the snaplen; {_n(oc)} of them only "
                          "TCP options (each still counts in its flow and in the GRO rebuild, its options compared "
                          "as far as captured: a TSval change past the cut is not seen)", highlight=False)
    for line in summary.get("suspect", []):
        console.print(f"[bold yellow]suspect capture:[/] {line}")
    for lt, frames in (cap.get("linktypes_not_decoded") or {}).items():
        console.print(f"[bold yellow]not decoded:[/] {_n(frames)} frames of linktype {lt} (counted, not analysed)")
    if cap["partial"]:
        console.print(f"[bold red]partial:[/] {cap['error']}")


def render_capture_kind(ck: dict, console: Console) -> None:
    """The post-GRO evidence and what the observed sizes say about the capturing host."""
    if not ck.get("post_gro"):
        return
    for line in ck.get("evidence", []):
        console.print(f"  evidence: {line}", highlight=False, markup=False)
    for h in ck.get("host", []):
        console.print(f"  capturing host: {h['text']}", highlight=False, markup=False)
    for c in ck.get("contradictions", []):
        console.print(f"  [bold yellow]model contradicts the capture:[/] {c}", highlight=False)


def flow_name(f) -> str:
    """A flow direction as text, ``src.sport > dst.dport``, with its capture point where known
    (``flows/points.point_suffix``): the same connection seen at two points is two rows. ``f``: a mapping or a
    row with those fields."""
    def get(k):
        return f.get(k) if isinstance(f, dict) else getattr(f, k, None)

    return (f"{get('src')}.{get('sport')} > {get('dst')}.{get('dport')}"
            f"{point_suffix(get('if_id'), get('ifindex'), get('direction'))}")


def render_diagnosis(diag: dict, console: Console) -> None:
    """Per top flow: what ended its super-packets, ranked by bytes, with the knob and the measured what-if."""
    flows = diag.get("flows") or []
    if not flows:
        return
    console.print("[bold]Diagnosis[/]: what ended the super-packets (share of payload bytes)")
    for f in flows:
        console.print(f"  flow {f['flow_id']} {flow_name(f)}:", highlight=False,
                      markup=False)
        for r in f["reasons"][:4]:
            knob = f" [knob: {r['knob']}]" if r.get("knob") else ""
            console.print(f"    {r['share']:6.1%} {r['reason']} ({_n(r['superpackets'])}): {r['text']}{knob}",
                          highlight=False, markup=False)
            for k in r.get("knobs", []):
                console.print(f"           what-if {k['text']}", highlight=False, markup=False)
    note = (diag.get("what_if_input") or {}).get("note")
    if note:
        console.print(f"  ({note})", highlight=False, markup=False)


@contextmanager
def progress_bar(enabled: bool, console: Console):
    """Yields a callback(bytes_read, total) drawing a transient byte-based bar on stderr, or a no-op."""
    if not enabled:
        yield None
        return
    prog = Progress(TextColumn("reading"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=console, transient=True)
    task = prog.add_task("read", total=None)
    with prog:
        def update(done: int, total: int | None) -> None:
            prog.update(task, completed=done, total=total)
        yield update
