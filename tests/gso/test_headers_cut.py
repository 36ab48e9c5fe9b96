"""Egress and explode on sender captures whose snaplen cut the TCP header (gso/engine.py, gso/explode.py).

Headers-only captures are the usual kind. A TSO skb whose TCP options alone were cut is still a TCP skb (the
fixed 20 bytes give the true header length): the device cuts it as it cuts the uncut one. It was passed as a
frame without TCP. One whose fixed header was cut has no MSS or payload length in the capture: passed as it
is (``not_tcp_gso``), never "dropped" by the MTU as it was. Kernel egress captures cut by editcap; the oracles
are the uncut capture's rows and tshark on the exploded file.
"""

from __future__ import annotations

import lzma
import subprocess

import pandas as pd
import pytest
from oracle import KERNEL, need_tshark, tshark_fields

from bigtcp_pcap.gso.api import egress, explode
from tests.gso.test_explode import expert_problems

EGRESS = KERNEL / "egress"
COLS = ["source_frame", "out_index", "seq", "payload_len", "frame_len", "gso_segs", "gso_size", "action", "reason"]
# (fixture, snaplen that ends 6 bytes into the TCP options: Ethernet + IPv4 + 20, or + IPv6 + 8-byte HBH + 20)
OPTIONS_CUT = {"v4_gso65536": 14 + 20 + 20 + 6, "v6_gso65536": 14 + 40 + 8 + 20 + 6}


def _cut(tmp_path, name: str, snaplen: int):
    raw = tmp_path / "in.pcap"
    with lzma.open(EGRESS / f"{name}.a0.pcap.xz") as f:
        raw.write_bytes(f.read())
    cut = tmp_path / "cut.pcap"
    subprocess.run(["editcap", "-s", str(snaplen), str(raw), str(cut)], check=True, capture_output=True, timeout=120)
    return raw, cut


@pytest.mark.parametrize("name", sorted(OPTIONS_CUT))
def test_options_cut_are_segmented_as_the_uncut_capture(name, tmp_path):
    need_tshark()
    raw, cut = _cut(tmp_path, name, OPTIONS_CUT[name])
    a = pd.read_parquet(egress(raw, outdir=tmp_path / "a", gso_max_size=65536).outdir / "egress.parquet")
    b = pd.read_parquet(egress(cut, outdir=tmp_path / "b", gso_max_size=65536).outdir / "egress.parquet")
    assert (a.action.astype(str) == "segmented").sum() > 400
    assert b[COLS].astype(str).reset_index(drop=True).equals(a[COLS].astype(str).reset_index(drop=True))
    # explode cannot rewrite headers the capture does not hold: a super-packet whose header was cut is copied as
    # it is (on IPv4 every one; IPv6's without HBH kept their whole header at this snaplen and are cut)
    out = tmp_path / "x.pcap"
    res = explode(cut, out)
    assert not expert_problems(out)
    if name.startswith("v4"):
        assert res.summary["frames_out"] == res.summary["frames_in"] and res.summary["segments_out"] == 0
        fields = ["frame.len", "frame.cap_len", "tcp.seq_raw", "tcp.srcport"]
        assert tshark_fields(out, fields) == tshark_fields(cut, fields)


def test_fixed_header_cut_is_passed_not_dropped(tmp_path):
    """IPv6 BIG TCP with its 8-byte HBH at -s 80: the TCP header is cut 2 bytes into its fixed part."""
    need_tshark()
    _, cut = _cut(tmp_path, "v6_gso65536", 80)
    big = tshark_fields(cut, ["frame.number", "frame.len"], display_filter="ipv6.nxt == 0 && frame.len > 1514")  # BIG TCP
    b = pd.read_parquet(egress(cut, outdir=tmp_path / "b", gso_max_size=65536).outdir / "egress.parquet")
    assert len(big) >= 5
    assert not (b.action.astype(str) == "dropped").any()
    rows = b[b.source_frame.isin([int(r["frame.number"]) for r in big])]
    assert len(rows) == len(big) and set(rows.reason.astype(str)) == {"not_tcp_gso"}
