#!/usr/bin/env python3
"""Sweep a tree of field captures: the toolkit's reader and decoder against tshark, frame by frame.

    .venv/bin/python scripts/sweep_field_captures.py DIR [DIR ...] [--json OUT.json] [--jobs 2] [--per-file]
                                                    [--show-missing 20]

For every capture below the directories (``*.pcap``, ``*.pcapng``, ``*.cap`` and their ``.gz``), it reads the
file with ``bigtcp_pcap.capture.CaptureReader`` + ``bigtcp_pcap.decode.decode`` (the API's own path) and runs
``tshark -T fields`` on it (with the BIG TCP preferences the tests use, IP reassembly off), then counts per file:

* ``tshark_whole``: tshark read every record (exit 0, no "cut short" / "appears to be damaged" message);
* ``refused``: our reader stopped with a ``CaptureError`` (the frames before it are still compared);
* ``tshark_tcp``: frames tshark decodes as TCP (its last TCP layer is not one quoted inside an ICMP error);
* ``our_tcp``: frames we decode to a TCP header (``l4_proto == 6`` and an L4 offset);
* ``both_tcp`` and, per field, the frames where we disagree: ports, seq, ack, the 12-bit flag word, window,
  TCP header length, TCP payload length (tshark's ``tcp.len``) and the IP length field (IPv4 total length, or
  the substituted length for a BIG TCP ``tot_len`` 0; the IPv6 payload length, or the substituted one), each
  taken from the occurrence of the field that belongs to the layer on the path.

tshark's TCP frames we do not decode are grouped by their protocol path (``frame.protocols`` up to the TCP
layer) and link type, so that the floor ("every frame tshark decodes as TCP over the supported link types and
encapsulations is decoded to TCP with the same fields") can be checked per encapsulation. It prints a totals
table, the per-link-type table and the missing paths, and writes everything (per file) to the JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bigtcp_pcap.capture import CaptureReader
from bigtcp_pcap.decode import PacketBatch, decode
from bigtcp_pcap.errors import CaptureError

# BIG TCP lengths as the tests read them; no IP reassembly, so that tshark describes each frame's own headers
# (a reassembled datagram's TCP would show on its last fragment, which carries no TCP header)
PREFS = ["-o", "ipv6.tso_support:TRUE", "-o", "ip.tso_support:TRUE", "-o", "ip.defragment:FALSE",
         "-o", "ipv6.defragment:FALSE"]
TFIELDS = ["frame.number", "frame.len", "frame.protocols", "frame.encap_type", "ip.len", "ipv6.plen",
           "tcp.srcport", "tcp.dstport", "tcp.seq_raw", "tcp.ack_raw", "tcp.flags", "tcp.window_size_value",
           "tcp.hdr_len", "tcp.len"]
FIELDS = ["sport", "dport", "seq", "ack", "flags", "win", "tcp_hdr_len", "tcp_len", "ip_len"]
SUFFIXES = (".pcap", ".pcapng", ".cap", ".pcap.gz", ".pcapng.gz", ".cap.gz", ".gz", ".trace", ".dmp")
DAMAGED = ("cut short", "appears to be damaged", "corrupt", "isn't a capture file", "unknown file format",
           "doesn't support", "can't be read", "isn't supported", "not supported")


def captures(roots: list[Path]) -> list[Path]:
    """Every file below the roots that looks like a capture by its name."""
    out = []
    for r in roots:
        for p in sorted(r.rglob("*")):
            if p.is_file() and p.name.lower().endswith(SUFFIXES):
                out.append(p)
    return out


def run_tshark(path: Path, timeout: int = 600) -> tuple[bool, str, list[list[str]]]:
    """(read whole?, first stderr line, rows of TFIELDS with every occurrence of a field joined by '|')."""
    cmd = ["tshark", "-n", "-r", str(path), *PREFS, "-T", "fields", "-E", "separator=\t", "-E", "occurrence=a",
           "-E", "aggregator=|"]
    for f in TFIELDS:
        cmd += ["-e", f]
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return False, "timeout", []
    err = r.stderr.decode(errors="replace")
    lines = [x for x in err.splitlines() if x.strip() and "Running as user" not in x]
    whole = r.returncode == 0 and not any(k in err for k in DAMAGED)
    rows = [line.split("\t") for line in r.stdout.decode(errors="replace").splitlines()]
    return whole, (lines[0] if lines else ""), rows


def run_ours(path: Path) -> tuple[PacketBatch, str | None]:
    """Every frame our reader delivers, decoded; the CaptureError line if it stopped early."""
    parts, err = [], None
    try:
        for rb in CaptureReader(path):
            parts.append(decode(rb)[0])
    except CaptureError as e:
        err = e.one_line()
    except Exception as e:  # noqa: BLE001 (a crash is a result of the sweep, not the end of it)
        err = f"CRASH {type(e).__name__}: {e}"
    return PacketBatch.concat(parts), err


def tshark_tcp_path(protocols: str) -> str | None:
    """The protocol path up to tshark's last TCP layer, None when there is no TCP or it is quoted in ICMP."""
    names = protocols.split(":")
    if "tcp" not in names:
        return None
    k = len(names) - 1 - names[::-1].index("tcp")
    path = names[:k + 1]
    if any(n in ("icmp", "icmpv6") for n in path):
        return None
    return ":".join(path)


def _int(s: str, base: int = 10) -> int | None:
    try:
        return int(s, base)
    except ValueError:
        return None


def compare(path: Path) -> dict:
    """One file: the counts described in the module docstring."""
    t0 = time.perf_counter()
    whole, terr, rows = run_tshark(path)
    pb, err = run_ours(path)
    res = {"file": str(path), "tshark_whole": whole, "tshark_error": terr, "tshark_frames": len(rows),
           "refused": err is not None, "error": err, "our_frames": len(pb), "linktypes": {},
           "tshark_tcp": 0, "our_tcp": 0, "both_tcp": 0, "missing": {}, "extra": 0,
           "disagree": {f: 0 for f in FIELDS}, "examples": {}}
    n = len(pb)
    our_tcp = (pb.l4_proto == 6) & (pb.l4_off >= 0) if n else np.zeros(0, bool)
    res["our_tcp"] = int(our_tcp.sum())
    res["linktypes"] = {str(k): int(v) for k, v in Counter(pb.linktype.tolist()).items()}
    missing: Counter = Counter()
    for row in rows:
        row += [""] * (len(TFIELDS) - len(row))
        d = dict(zip(TFIELDS, row))
        fno = _int(d["frame.number"])
        tpath = tshark_tcp_path(d["frame.protocols"])
        if fno is None or tpath is None:
            continue
        res["tshark_tcp"] += 1
        i = fno - 1
        if i >= n:
            missing[f"(not read by us) {tpath}"] += 1
            continue
        if not our_tcp[i]:
            missing[f"lt{int(pb.linktype[i])} {tpath}"] += 1
            continue
        res["both_tcp"] += 1
        names = tpath.split(":")
        # the occurrence of each field that belongs to the layer on the path (tree order = protocol order): an
        # embedded frame (OpenFlow, an ICMP quote) after our TCP layer adds later occurrences
        t = names.count("tcp") - 1

        def nth(fieldname: str, k: int, base: int = 10, d: dict = d) -> int | None:
            vals = d[fieldname].split("|")
            return _int(vals[k], base) if 0 <= k < len(vals) else None

        ips = [x for x in names if x in ("ip", "ipv6")]
        ours_ip = their_ip = None
        if ips and ips[-1] == "ip":
            their_ip = nth("ip.len", names.count("ip") - 1)
            ours_ip = int(pb.ip_len[i]) if pb.ip_len_field[i] == 0 else int(pb.ip_len_field[i])
        elif ips:
            their_ip = nth("ipv6.plen", names.count("ipv6") - 1)
            ours_ip = int(pb.ip_len[i]) - 40 if pb.ip_len_field[i] == 0 and not pb.has_jumbo[i] \
                else int(pb.ip_len_field[i])
        fl = nth("tcp.flags", t, 16)
        pairs = {"sport": (int(pb.sport[i]), nth("tcp.srcport", t)),
                 "dport": (int(pb.dport[i]), nth("tcp.dstport", t)),
                 "seq": (int(pb.tcp_seq[i]), nth("tcp.seq_raw", t)),
                 "ack": (int(pb.tcp_ack[i]), nth("tcp.ack_raw", t)),
                 "flags": (int(pb.tcp_flags[i]), None if fl is None else fl & 0xFFF),
                 "win": (int(pb.tcp_win[i]), nth("tcp.window_size_value", t)),
                 "tcp_hdr_len": (int(pb.tcp_hdr_len[i]), nth("tcp.hdr_len", t)),
                 "tcp_len": (int(pb.tcp_payload_len[i]), nth("tcp.len", t)),
                 "ip_len": (ours_ip, their_ip)}
        for f, (a, b) in pairs.items():
            if b is not None and a != b:
                res["disagree"][f] += 1
                ex = res["examples"].setdefault(f, [])
                if len(ex) < 3:
                    ex.append(f"frame {fno}: ours {a}, tshark {b} ({tpath})")
    tshark_tcp_frames = {_int(r[0]) for r in rows if len(r) > 2 and tshark_tcp_path(r[2]) is not None}
    res["extra"] = int(sum(1 for i in np.flatnonzero(our_tcp) if int(i) + 1 not in tshark_tcp_frames))
    res["missing"] = dict(missing)
    res["seconds"] = round(time.perf_counter() - t0, 3)
    return res


def summarize(results: list[dict], show_missing: int) -> dict:
    tot = Counter()
    dis = Counter()
    per_lt: dict[str, Counter] = defaultdict(Counter)
    miss = Counter()
    refusals = Counter()
    for r in results:
        tot["files"] += 1
        tot["tshark_whole"] += r["tshark_whole"]
        tot["refused"] += r["refused"]
        tot["refused_tshark_whole"] += r["refused"] and r["tshark_whole"]
        tot["crash"] += bool(r["error"] and r["error"].startswith("CRASH"))
        for k in ("tshark_tcp", "our_tcp", "both_tcp", "extra"):
            tot[k] += r[k]
        for f, v in r["disagree"].items():
            dis[f] += v
        for k, v in r["missing"].items():
            miss[k] += v
        if r["refused"] and r["error"]:
            msg = r["error"].split(": ", 1)[-1]
            refusals[msg.split(" (supported")[0] if "linktype" in msg else msg[:60]] += 1
        lts = sorted(r["linktypes"], key=lambda k: -r["linktypes"][k])
        key = lts[0] if lts else "-"
        c = per_lt[key]
        c["files"] += 1
        c["refused"] += r["refused"]
        for k in ("tshark_tcp", "our_tcp", "both_tcp"):
            c[k] += r[k]
        c["disagree"] += sum(r["disagree"].values())
    tot["disagreeing_fields"] = sum(dis.values())
    print("== totals ==")
    for k in ("files", "tshark_whole", "refused", "refused_tshark_whole", "crash", "tshark_tcp", "our_tcp",
              "both_tcp", "extra", "disagreeing_fields"):
        print(f"  {k:22s} {tot[k]:>9d}")
    print("  missing (tshark TCP, not ours):", tot["tshark_tcp"] - tot["both_tcp"])
    print("== field disagreements on frames both decode as TCP ==")
    for f in FIELDS:
        print(f"  {f:12s} {dis[f]:>7d}")
    print("== per link type (the file's main one) ==")
    print(f"  {'linktype':>8s} {'files':>6s} {'refused':>7s} {'tshark_tcp':>10s} {'our_tcp':>8s} {'both':>8s} "
          f"{'disagree':>8s}")
    for lt, c in sorted(per_lt.items(), key=lambda kv: -kv[1]["files"]):
        print(f"  {lt:>8s} {c['files']:>6d} {c['refused']:>7d} {c['tshark_tcp']:>10d} {c['our_tcp']:>8d} "
              f"{c['both_tcp']:>8d} {c['disagree']:>8d}")
    print("== refusals ==")
    for k, v in refusals.most_common(15):
        print(f"  {v:>5d}  {k}")
    print(f"== tshark TCP frames we do not decode, by path (top {show_missing}) ==")
    for k, v in miss.most_common(show_missing):
        print(f"  {v:>7d}  {k}")
    return {"totals": dict(tot), "disagree": dict(dis), "per_linktype": {k: dict(v) for k, v in per_lt.items()},
            "refusals": dict(refusals), "missing_paths": dict(miss)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, default=None, help="write the per-file results and totals here")
    ap.add_argument("--jobs", type=int, default=2, help="tshark processes at once (default 2)")
    ap.add_argument("--per-file", action="store_true", help="print one line per file too")
    ap.add_argument("--show-missing", type=int, default=25)
    a = ap.parse_args(argv)
    files = captures(a.roots)
    if not files:
        print(f"no captures below {', '.join(map(str, a.roots))}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max(1, a.jobs)) as ex:
        results = list(ex.map(compare, files))
    if a.per_file:
        for r in results:
            print(f"{r['file']}\twhole={int(r['tshark_whole'])}\trefused={int(r['refused'])}\t"
                  f"tshark_tcp={r['tshark_tcp']}\tour_tcp={r['our_tcp']}\tboth={r['both_tcp']}\t"
                  f"disagree={sum(r['disagree'].values())}")
    summary = summarize(results, a.show_missing)
    print(f"({len(files)} files in {time.perf_counter() - t0:.0f} s)")
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "files": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
