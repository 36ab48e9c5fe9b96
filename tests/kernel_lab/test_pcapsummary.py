"""pcapsummary.py against tshark on the committed kernel captures: every frame, then the summary of each file."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
from oracle import KERNEL, tshark_fields

from tools.kernel_lab.pcapsummary import parse_frame, pcap_header, read_pcap, summarize_pcap

CAPTURES = sorted(KERNEL.glob("*.pcap")) + sorted((KERNEL / "linktypes").glob("*.pcap"))
FIELDS = ["frame.len", "frame.protocols", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "ip.len", "ipv6.plen",
          "ipv6.opt.jumbo", "tcp.srcport", "tcp.dstport", "tcp.seq_raw", "tcp.len", "tcp.flags.syn",
          "tcp.options.mss_val", "tcp.options.timestamp.tsval", "ieee8021ad.id", "vlan.id", "tcp.analysis.lost_segment",
          "tcp.analysis.retransmission", "tcp.analysis.out_of_order", "tcp.analysis.spurious_retransmission"]
ids = [str(p.relative_to(KERNEL)) for p in CAPTURES]


def _last(v: str) -> str:
    return v.split(",")[-1]


def _tshark_tcp(path: Path) -> list[dict | None]:
    """Per frame: the innermost TCP segment as tshark decodes it (None: no TCP, or TCP quoted inside ICMP)."""
    out: list[dict | None] = []
    for r in tshark_fields(path, FIELDS):
        protos = r["frame.protocols"].split(":")
        if not r["tcp.srcport"] or "tcp" not in protos or any(p.startswith("icmp") for p in protos):
            out.append(None)
            continue
        before_tcp = protos[: len(protos) - protos[::-1].index("tcp")]
        fam = 6 if [p for p in before_tcp if p in ("ip", "ipv6")][-1] == "ipv6" else 4
        key = "ipv6" if fam == 6 else "ip"
        jumbo = int(_last(r["ipv6.opt.jumbo"])) if r["ipv6.opt.jumbo"] else None
        if fam == 4:
            l3 = int(_last(r["ip.len"]))
        else:
            plen = int(_last(r["ipv6.plen"]))
            l3 = 40 + (plen if plen else jumbo)
        out.append({
            "family": fam, "src": _last(r[f"{key}.src"]), "dst": _last(r[f"{key}.dst"]),
            "sport": int(_last(r["tcp.srcport"])), "dport": int(_last(r["tcp.dstport"])),
            "seq": int(_last(r["tcp.seq_raw"])), "payload": int(_last(r["tcp.len"])), "frame_len": int(r["frame.len"]),
            "l3": l3, "jumbo": jumbo, "syn": r["tcp.flags.syn"] in ("1", "True"),
            "mss": int(r["tcp.options.mss_val"]) if r["tcp.options.mss_val"] else None,
            "syn_ts": bool(r["tcp.options.timestamp.tsval"]),
            # tshark names an 802.1ad S-tag ieee8021ad (here always the outer tag) and an 802.1Q C-tag vlan
            "vlans": tuple(int(v) for f in ("ieee8021ad.id", "vlan.id") if r[f] for v in r[f].split(",")),
            "tunnel": "vxlan" if "vxlan" in protos else ("geneve" if "geneve" in protos else None),
            "hole": bool(r["tcp.analysis.lost_segment"]),
            "retrans": any(r[f"tcp.analysis.{k}"] for k in ("retransmission", "out_of_order", "spurious_retransmission")),
        })  # fmt: skip
    return out


@pytest.fixture(scope="module")
def tshark_cache() -> dict[Path, list[dict | None]]:
    return {}


def _oracle(cache: dict, path: Path) -> list[dict | None]:
    if path not in cache:
        cache[path] = _tshark_tcp(path)
    return cache[path]


@pytest.mark.parametrize("path", CAPTURES, ids=ids)
def test_every_frame_decodes_as_tshark_decodes_it(path, tshark_cache):
    want = _oracle(tshark_cache, path)
    lt = pcap_header(path)["linktype"]
    frames = list(read_pcap(path, None))
    assert len(frames) == len(want)
    for i, (rec, t) in enumerate(zip(frames, want), 1):
        p = parse_frame(*rec, lt)
        if t is None:
            assert p is None, f"frame {i}: tshark sees no TCP, we do"
            continue
        assert p is not None, f"frame {i}: tshark sees TCP, we do not"
        got = {"family": p.family, "src": p.src, "dst": p.dst, "sport": p.sport, "dport": p.dport, "seq": p.seq,
               "payload": p.payload, "frame_len": p.frame_len, "l3": p.l3_len, "jumbo": p.hbh_jumbo,
               "vlans": p.vlans, "tunnel": p.tunnel}
        assert got == {k: t[k] for k in got}, f"frame {i}"
        if t["syn"]:
            assert (p.mss_opt, p.syn_ts_opt) == (t["mss"], t["syn_ts"]), f"frame {i}"


@pytest.mark.parametrize("path", CAPTURES, ids=ids)
def test_summary_counts_match_tshark(path, tshark_cache):
    want = _oracle(tshark_cache, path)
    tcp = [t for t in want if t is not None]
    s = summarize_pcap(path)
    assert s["packets"] == len(want)
    assert s["tcp_packets"] == len(tcp)
    assert s["largest_frame"] == max((t["frame_len"] for t in tcp), default=0)
    assert s["ipv6_hbh_jumbo"] == sum(t["jumbo"] is not None for t in tcp)
    assert s["l3_over_65535"] == sum(t["l3"] > 65535 for t in tcp)
    assert s["tunneled_tcp_packets"] == dict(Counter(t["tunnel"] for t in tcp if t["tunnel"]))
    assert s["syn_mss_options"] == sorted({t["mss"] for t in tcp if t["syn"] and t["mss"]})
    mss: dict[int, int] = {}
    for t in tcp:
        if t["syn"] and t["mss"]:
            m = t["mss"] - (12 if t["syn_ts"] else 0)
            mss[t["family"]] = min(mss.get(t["family"], m), m)
    assert s["mss_from_syn"] == mss
    flows: dict[str, list[dict]] = {}
    for t in tcp:
        if t["payload"] > 0:
            flows.setdefault(f"{t['src']}.{t['sport']} > {t['dst']}.{t['dport']}", []).append(t)
    big = {k: v for k, v in flows.items() if sum(t["payload"] for t in v) >= 100_000}
    assert [f["flow"] for f in s["flows"]] == list(big)  # same flows, in order of first appearance
    for f in s["flows"]:
        data = big[f["flow"]]
        m = max(t["payload"] for t in data)  # no mss given: the flow's largest payload
        assert f["data_packets"] == len(data)
        assert f["payload_bytes"] == sum(t["payload"] for t in data)
        assert f["max_payload"] == f["mss_for_segment_count"] == m
        assert f["largest_frame"] == max(t["frame_len"] for t in data)
        assert f["largest_l3"] == max(t["l3"] for t in data)
        assert f["hbh_jumbo"] == sum(t["jumbo"] is not None for t in data)
        hist = Counter(math.ceil(t["payload"] / m) for t in data)
        assert f["segments_histogram"] == {str(k): v for k, v in sorted(hist.items())}
        # tshark's "previous segment not captured" / retransmission flags on the flow's data packets
        assert f["sequence_holes"] == sum(t["hole"] for t in data)
        assert f["out_of_order_or_retransmitted"] == sum(t["retrans"] for t in data)


def test_given_mss_sets_the_segment_count():
    path = KERNEL / "v6_80000.rcv.pcap"
    s = summarize_pcap(path, {6: 1000})
    (f,) = s["flows"]
    data = [t for t in _tshark_tcp(path) if t and t["payload"] > 0 and t["sport"] == int(f["flow"].split(" ")[0]
                                                                                          .rsplit(".", 1)[1])]
    assert f["mss_for_segment_count"] == 1000
    assert f["segments_histogram"] == {str(k): v for k, v in sorted(Counter(math.ceil(t["payload"] / 1000)
                                                                            for t in data).items())}
    assert f["packets_payload_gt_mss"] == sum(t["payload"] > 1000 for t in data)
