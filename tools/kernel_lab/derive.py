"""NULL and LOOP captures derived from Ethernet kernel captures (Linux cannot capture these link types)."""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from .host import PROG, source_sha256
from .pcapsummary import pcap_header, summarize_pcap
from .scenarios import DERIVED, LINKTYPE_NAMES


def derive_loopback_pcap(src: Path, dst: Path, linktype: int, families: dict[int, int]) -> dict[str, Any]:
    """Rewrite the link header of every IP frame of Ethernet capture ``src`` into a NULL (0) or LOOP (108) file.

    Deterministic, stdlib only. The 14-byte Ethernet header (the source must carry no VLAN tag) becomes the
    4-byte address family ``families[ethertype]``: in the file's own byte order for NULL (BSD loopback, "host
    order" of the writer), in network order for LOOP (OpenBSD). Captured and original lengths shrink by 10,
    the snaplen too; timestamps, byte order and timestamp precision are kept; the IP packets are untouched.
    Frames with any other ethertype are left out and counted. Returns a record for the JSON.
    """
    if linktype not in (0, 108):
        raise ValueError(f"linktype {linktype}: only NULL (0) and LOOP (108) are derived")
    raw = src.read_bytes()
    h0 = pcap_header(src)
    e = h0["endian"]
    if h0["linktype"] != 1:
        raise ValueError(f"{src}: linktype {h0['linktype']}, expected Ethernet")
    fam_fmt = e + "I" if linktype == 0 else ">I"
    out = [raw[:16] + struct.pack(e + "II", h0["snaplen"] - 10, linktype)]
    kept, left_out = Counter(), Counter()
    pos = 24
    while pos + 16 <= len(raw):
        sec, sub, incl, orig = struct.unpack(e + "IIII", raw[pos : pos + 16])
        data = raw[pos + 16 : pos + 16 + incl]
        pos += 16 + incl
        etype = struct.unpack_from("!H", data, 12)[0] if incl >= 14 else -1
        if etype not in families:
            left_out[f"0x{etype:04x}"] += 1
            continue
        body = struct.pack(fam_fmt, families[etype]) + data[14:]
        out.append(struct.pack(e + "IIII", sec, sub, len(body), orig - 10) + body)
        kept[f"0x{etype:04x} -> family {families[etype]}"] += 1
    dst.write_bytes(b"".join(out))
    return {
        "derived_by": "tools/kernel_lab derive_loopback_pcap()",
        "script_sha256": source_sha256(),
        "source": src.name,
        "source_sha256": hashlib.sha256(raw).hexdigest(),
        "output": dst.name,
        "output_sha256": hashlib.sha256(dst.read_bytes()).hexdigest(),
        "linktype": linktype,
        "linktype_name": LINKTYPE_NAMES[linktype],
        "family_byte_order": ("file byte order (" + ("little" if e == "<" else "big") + " endian)")
        if linktype == 0 else "network (big endian)",
        "families": {f"0x{k:04x}": v for k, v in families.items()},
        "frames_kept": dict(kept),
        "frames_left_out": dict(left_out),
        "snaplen": h0["snaplen"] - 10,
        "lengths": "caplen and orig_len of every record = source - 10 (14-byte Ethernet -> 4-byte family)",
        "observed": summarize_pcap(dst),
    }  # fmt: skip


def derive_all(outdir: Path, source_dir: Path) -> int:
    """Write every DERIVED file (and its JSON) into ``outdir``; return the number of failures."""
    failed = 0
    for name, (src, linktype, fams) in DERIVED.items():
        try:
            rec = derive_loopback_pcap(source_dir / src, outdir / f"{name}.pcap", linktype, fams)
        except (OSError, ValueError) as e:
            print(f"{PROG}: {name}: {e}", file=sys.stderr)
            failed += 1
            continue
        (outdir / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
        print(f"{name}: {rec['frames_kept']} left out {rec['frames_left_out']}")
    return failed
