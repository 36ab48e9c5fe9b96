"""Users script Wireshark through pyshark: the plugin and the sidecar through custom_parameters/override_prefs."""

from __future__ import annotations

import pytest

from bigtcp_pcap.wireshark import first_timestamp_ns, plugin_path, write_sidecar

from .conftest import fields, kernel_captures, needs_tshark

pyshark = pytest.importorskip("pyshark")
pytestmark = needs_tshark


def _receiver():
    caps = [c for c in kernel_captures() if c.name.endswith(".rcv.pcap")]
    if not caps:
        pytest.skip("no kernel receiver captures")
    return caps[0]


def _read(capture, **kw) -> dict[int, dict]:
    cap = pyshark.FileCapture(str(capture), custom_parameters=["-X", f"lua_script:{plugin_path()}"],
                              keep_packets=False, **kw)
    out = {}
    try:
        for p in cap:
            if "bigtcp" not in [lay.layer_name for lay in p.layers]:
                continue
            b = p.bigtcp
            out[int(p.number)] = {k: str(getattr(b, k)) for k in ("kind", "ip_len", "tcp_len", "gso_segs",
                                                                  "superpacket", "flush_reason")
                                  if k in b.field_names}
    finally:
        cap.close()
    return out


@pytest.mark.parametrize("use_json", [True, False], ids=["json", "pdml"])
def test_pyshark_sees_the_same_fields_as_tshark(ws_home, monkeypatch, use_json):
    monkeypatch.setenv("HOME", str(ws_home))
    capture = _receiver()
    got = _read(capture, use_json=use_json, override_prefs={"ipv6.tso_support": "TRUE"})
    rows = fields(ws_home, capture, ["frame.number", "bigtcp.kind", "bigtcp.ip_len", "bigtcp.tcp_len",
                                     "bigtcp.gso_segs"])
    want = {}
    for fr, kind, ip_len, tcp_len, segs in rows:
        if ip_len:
            d = {"ip_len": ip_len}
            for k, v in (("kind", kind), ("tcp_len", tcp_len), ("gso_segs", segs)):
                if v:
                    d[k] = v
            want[int(fr)] = d
    assert got == want
    assert sum(1 for d in got.values() if "kind" in d) > 0


def test_pyshark_display_filter_and_sidecar(ws_home, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(ws_home))
    capture = _receiver()
    rows = fields(ws_home, capture, ["frame.number", "bigtcp.gso_segs"], extra=["-Y", "bigtcp.gso_segs > 45"])
    big = [int(r[0]) for r in rows]
    sc = write_sidecar(tmp_path / "s.tsv", capture_name=capture.name, capture_size=capture.stat().st_size,
                       first_ts_ns=first_timestamp_ns(capture),
                       rows=[{"frame": fr, "superpacket": i, "flush_reason": "size_limit"} for i, fr in enumerate(big)])
    monkeypatch.setenv("BIGTCP_SIDECAR", str(sc))  # pyshark's tshark inherits the environment
    got = _read(capture, use_json=True, display_filter="bigtcp.gso_segs > 45",
                override_prefs={"ipv6.tso_support": "TRUE"})
    assert sorted(got) == big
    assert all(int(d["gso_segs"]) > 45 for d in got.values())
    assert [int(got[fr]["superpacket"]) for fr in big] == list(range(len(big)))
    assert {d["flush_reason"] for d in got.values()} <= {"size_limit"}
