"""``bigtcp-pcap egress`` and ``bigtcp_pcap.egress``: bad input, profiles from files, metadata, --then-gro."""

from __future__ import annotations

import collections
import json
import lzma
import math
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

import bigtcp_pcap
from bigtcp_pcap.gro.config import GroConfig
from bigtcp_pcap.gso.table import EGRESS_SCHEMA
from bigtcp_pcap.output.parquet import read_metadata

from .test_kernel_egress import EGRESS_DIR, SERVER_PORT, recorded_profile

CLI = [sys.executable, "-m", "bigtcp_pcap.cli"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, check=False)


def test_capture_without_super_packets_says_so(tmp_path):
    """b1 with TSO off sent only MSS packets: nothing to cut. Empty table with the schema, exit 0."""
    cap = EGRESS_DIR / "v6_tso_off.b1.pcap.xz"
    r = cli("egress", str(cap), "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "no super-packets" in r.stdout
    t = pq.read_table(tmp_path / "egress.parquet")
    assert t.num_rows == 0 and t.schema.remove_metadata() == EGRESS_SCHEMA
    assert "no super-packets" in read_metadata(tmp_path / "egress.parquet")["note"]


@pytest.mark.parametrize("text, what", [
    ("not json at all", "not JSON"),
    ('{"ifname": "eth0"}', "has no gso_max_size"),
    ('[{"ifname": "a"}, {"ifname": "b"}]', "array of 2"),
    ('{"gso_max_size": 65536}', "no 'ifname'"),
])
def test_bad_profile_json_one_line_exit_2(tmp_path, text, what):
    bad = tmp_path / "link.json"
    bad.write_text(text)
    r = cli("egress", str(EGRESS_DIR / "v6_gso65536.a0.pcap.xz"), "-o", str(tmp_path / "o"), "--profile", str(bad))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and what in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_bad_option_values_exit_2(tmp_path):
    cap = str(EGRESS_DIR / "v6_gso65536.a0.pcap.xz")
    for args in (["--gso-max-size", "600000"], ["--tso", "maybe"], ["--profile", "no-such-profile"],
                 ["--gso-max-segs", "0"]):
        r = cli("egress", cap, "-o", str(tmp_path), *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_corrupt_capture_exit_3_partial(tmp_path):
    raw = lzma.decompress((EGRESS_DIR / "v6_gso65536.a0.pcap.xz").read_bytes())
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(raw[: len(raw) // 2])
    r = cli("egress", str(cut), "-o", str(tmp_path / "o"), "--json")
    assert r.returncode == 3
    assert "cut.pcap" in r.stderr and "frame" in r.stderr and "byte offset" in r.stderr
    meta = read_metadata(tmp_path / "o" / "egress.parquet")
    assert meta["partial"] is True and pq.read_table(tmp_path / "o" / "egress.parquet").num_rows > 0
    r = cli("egress", str(cut), "-o", str(tmp_path / "o2"))  # the table view: still one stderr line (it was two)
    (line,) = r.stderr.strip().splitlines()
    assert r.returncode == 3 and "byte offset" in line and "egress.parquet, marked partial" in line


def test_profile_file_from_ip_link_show(tmp_path):
    """--profile FILE with the recorded 'ip -d -j link show b1' of a run, IPv4 limit and TSO given as options:
    the CLI's summary equals the API's with the recorded profile, and the metadata records the profile."""
    name = "v4_gso100000"
    doc = json.loads((EGRESS_DIR / f"{name}.json").read_text())["interfaces"]["b1"]
    link = tmp_path / "b1.json"
    link.write_text(json.dumps(doc["ip_d_j_link_show"]))
    cap = EGRESS_DIR / f"{name}.a0.pcap.xz"
    r = cli("egress", str(cap), "-o", str(tmp_path / "o"), "--profile", str(link), "--gso-ipv4-max-size",
            str(doc["rtnetlink_sizes"]["gso_ipv4_max_size"]), "--tso", "on", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    api = bigtcp_pcap.egress(cap, profile=recorded_profile(name)).summary
    assert s["flows"] == api["flows"] and s["inputs_by_action"] == api["inputs_by_action"]
    assert s["profile"]["gso_ipv4_max_size"] == 100000 and s["profile"]["name"] == "b1.json:b1"
    meta = read_metadata(tmp_path / "o" / "egress.parquet")
    assert meta["params"]["egress"]["gso_ipv4_max_size"] == 100000 and meta["source_name"] == cap.name


def test_named_profiles_from_the_cli(tmp_path):
    cap = str(EGRESS_DIR / "v6_gso65536.a0.pcap.xz")
    got = {}
    for prof in ("veth", "ice", "mlx4", "legacy"):
        r = cli("egress", cap, "-o", str(tmp_path / prof), "--profile", prof, "--json")
        assert r.returncode == 0, r.stderr
        got[prof] = json.loads(r.stdout)["inputs_by_action"]["segmented"]
    # the 184306-byte skbs fit mlx4 (524280) only; ice (131072) cuts them, veth/legacy (65536) cut more
    assert got["mlx4"] == 0 < got["ice"] < got["veth"] == got["legacy"]


@pytest.mark.parametrize("name", ["v6_gso65536", "v6_gso100000", "v4_gso65536", "v4_segs24"])
def test_then_gro_equals_gro_on_the_real_b1_capture(tmp_path, name):
    """--then-gro: GRO of the predicted output == GRO (the same engine, the same settings) of b1's real capture.
    Polls are taken out (no idle gap, no budget, no ACK evidence), so only packet contents decide; those must be
    identical."""
    cfg = GroConfig(gro_max_size=185000, gro_ipv4_max_size=185000, poll_gap_us=math.inf, napi_weight=10**9,
                    max_gro_skbs=math.inf, ack_evidence=False)
    res = bigtcp_pcap.egress(EGRESS_DIR / f"{name}.a0.pcap.xz", profile=recorded_profile(name), then_gro=cfg)
    real = bigtcp_pcap.analyze(EGRESS_DIR / f"{name}.b1.pcap.xz", gro=cfg, audit=False).superpackets

    def rows(sp):
        sp = sp[sp.dport == SERVER_PORT]
        return collections.Counter(zip(sp.seq_first.astype(int), sp.payload_len.astype(int),
                                       sp.n_segments.astype(int), sp.frame_len.astype(int)))

    got, want = rows(res.superpackets), rows(real)
    assert sum(want.values()) > 5 and got == want
    assert res.summary["superpackets_after_gro"] == len(res.superpackets)


def test_udp_gso_is_not_a_drop_and_every_frame_is_counted(tmp_path):
    # a UDP datagram above the MTU on a TX tap is a UDP GSO skb (IP fragments before the tap): it was predicted
    # "dropped (mtu)" while the summary, which counted TCP flows only, said "dropped 0"
    import struct

    import craft as C
    from oracle import KERNEL, write_pcap

    from bigtcp_pcap.capture.reader import CaptureReader

    a0 = EGRESS_DIR / "v4_segs24.a0.pcap.xz"  # a kernel BIG TCP sender's skbs, then three UDP GSO skbs
    tcp = [(rb.packet(i), int(rb.wirelen[i])) for rb in CaptureReader(a0) for i in range(len(rb))]
    udp = struct.pack(">HHHH", 4433, 443, 8 + 24000, 0) + bytes(24000)
    cap = write_pcap(tmp_path / "udp_gso.pcap", [*tcp, *[C.eth(0x0800) + C.ipv4(len(udp), proto=17) + udp] * 3])
    res = bigtcp_pcap.egress(cap, outdir=tmp_path / "o")
    t = pq.read_table(tmp_path / "o" / "egress.parquet").to_pydict()
    rows = [(a, r) for a, r, f in zip(t["action"], t["reason"], t["source_frame"], strict=True) if f > len(tcp)]
    assert rows == [("passed", "not_tcp_gso")] * 3
    assert res.summary["inputs_by_action"]["dropped"] == 0 and res.summary["inputs_without_tcp_flow"] >= 3
    assert sum(res.summary["inputs_by_action"].values()) == res.summary["frames_in"] == len(tcp) + 3
    # a kernel VXLAN sender capture: UDP (the tunnel's outer header) and ARP frames are counted by action too
    vx = bigtcp_pcap.egress(KERNEL / "linktypes" / "vxlan.snd.pcap", outdir=tmp_path / "v")
    assert sum(vx.summary["inputs_by_action"].values()) == vx.summary["frames_in"] > 600
    assert vx.summary["inputs_without_tcp_flow"] > 0


def test_then_gro_on_a_pcapng_of_two_link_types_one_receiver_per_interface(tmp_path):
    """A pcapng whose interfaces have different link types (mergecap of a kernel Ethernet sender capture and a
    kernel SLL2 capture): --then-gro, and analyze --no-split-receivers, model one receiver per capture interface
    (the engines' default receiver) and name each. Both ended in a traceback (a receiver index past the one
    "capture interface" label). Each interface's rows equal those of its part analysed alone."""
    import shutil

    from oracle import KERNEL

    if shutil.which("mergecap") is None:
        pytest.skip("mergecap (Wireshark) is not installed (the README's test command installs it)")
    eth = tmp_path / "eth.pcap"
    eth.write_bytes(lzma.decompress((EGRESS_DIR / "v6_gso65536.a0.pcap.xz").read_bytes()))
    sll2 = KERNEL / "linktypes" / "sll2_v6_185000.rcv.pcap"
    both = tmp_path / "both.pcapng"
    subprocess.run(["mergecap", "-F", "pcapng", "-w", str(both), str(eth), str(sll2)], check=True,
                   capture_output=True)

    def rows(sp):
        return collections.Counter(zip(sp.sport.astype(int), sp.dport.astype(int), sp.seq_first.astype(int),
                                       sp.payload_len.astype(int), sp.n_segments.astype(int)))

    for cmd in (["egress", "--then-gro"], ["analyze", "--no-split-receivers", "--no-audit"]):
        out = {}
        for name, cap in (("both", both), ("eth", eth), ("sll2", sll2)):
            r = cli(*cmd[:1], str(cap), "-o", str(tmp_path / f"{cmd[0]}_{name}"), *cmd[1:])
            assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
            out[name] = pq.read_table(tmp_path / f"{cmd[0]}_{name}" / "superpackets.parquet").to_pandas()
        got = out["both"]
        assert set(got.receiver.astype(str)) == {"capture interface", "capture interface 1"}, cmd
        # mergecap numbers the interfaces in the order of its inputs
        for label, part in (("capture interface", "eth"), ("capture interface 1", "sll2")):
            want = rows(out[part])
            assert sum(want.values()) > 5 and rows(got[got.receiver.astype(str) == label]) == want, (cmd, label)
