"""scenarios.py: the table and its arithmetic, checked against what the kernel reported in the committed runs."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from oracle import KERNEL, tshark_fields

from tools.kernel_lab.scenarios import (
    DEFAULT_BYTES,
    GENEVE_MTU,
    KERNEL_DEFAULT_SIZE,
    MIN_SNAPLEN,
    SCENARIOS,
    VXLAN_MTU,
    Scenario,
)

# every JSON a scenario run of this tool wrote (the derived NULL/LOOP records have no "scenario"; other tools'
# records, e.g. scripts/make_egress_captures.py's, name their own generator)
GENERATORS = ("scripts/make_kernel_captures.py", "tools/kernel_lab")
RUNS = [p for p in sorted(KERNEL.glob("**/*.json"))
        if "scenario" in (j := json.loads(p.read_text())) and j.get("generated_by") in GENERATORS]


def test_committed_runs_are_there():
    assert len(RUNS) >= 8 + 6 + 8  # the GRO pairs, the linktype runs, the traced pairs


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_name_states_the_limits(name):
    """v6_185000 = IPv6 185000 both ends; v4_sndA_rcvB; mixed_N = both families; 65536 = the default (None)."""
    sc = SCENARIOS[name]
    m = re.search(r"(v6|v4|mixed)_(?:snd(\d+)_rcv(\d+)|(\d+))$", name)
    if m is None:
        assert sc.group == "linktype" and sc.topology != "veth"
        return
    fam, snd, rcv, both = m.groups()
    snd, rcv = (int(snd), int(rcv)) if both is None else (int(both), int(both))
    snd, rcv = (None if snd == KERNEL_DEFAULT_SIZE else snd), (None if rcv == KERNEL_DEFAULT_SIZE else rcv)
    fams = {"v6": (6,), "v4": (4,), "mixed": (6, 4)}[fam]
    assert sc.families == fams
    assert (sc.snd_v6, sc.rcv_v6) == ((snd, rcv) if 6 in fams else (None, None))
    assert (sc.snd_v4, sc.rcv_v4) == ((snd, rcv) if 4 in fams else (None, None))


@pytest.mark.parametrize("path", RUNS, ids=[str(p.relative_to(KERNEL)) for p in RUNS])
def test_recorded_run_matches_the_table(path):
    """The scenario recorded in each committed JSON is the table's, the kernel read back the expected limits,
    and each iperf3 flow carried the byte budget's share."""
    info = json.loads(path.read_text())
    sc = SCENARIOS[info["scenario"]["name"]]
    table = json.loads(json.dumps(dataclasses.asdict(sc)))
    # the oldest runs predate the later fields (topology, captures, ...): those must still be the defaults
    defaults = {f.name: f.default for f in dataclasses.fields(Scenario) if f.default is not dataclasses.MISSING}
    assert {k: table[k] for k in info["scenario"]} == info["scenario"]
    missing = set(table) - set(info["scenario"])
    assert {k: table[k] for k in missing} == json.loads(json.dumps({k: defaults[k] for k in missing}))
    for dev in ("va", "vb"):
        got = info["limits_read_back"][dev]  # what RTM_GETLINK returned on that run
        assert {k: got[k] for k in sc.expected_limits(dev)} == sc.expected_limits(dev)
    argv = info["argv"]
    nbytes = int(argv[argv.index("--bytes") + 1]) if "--bytes" in argv else (sc.nbytes or DEFAULT_BYTES)
    for fam in sc.families:
        assert info["iperf3"][f"ipv{fam}"]["bytes"] == sc.bytes_per_flow(nbytes)


def test_expected_limits_ipv6_at_or_below_default_lowers_ipv4():
    low = Scenario("x", (6,), 60000, None, None, None).expected_limits("va")
    assert low == {"gso_max_size": 60000, "gro_max_size": 60000, "gso_ipv4_max_size": 60000,
                   "gro_ipv4_max_size": 60000}
    high = Scenario("x", (6,), 80000, None, None, None)
    assert high.expected_limits("va")["gso_ipv4_max_size"] == 65536
    assert high.expected_limits("vb") == dict.fromkeys(low, 65536)  # the receiver keeps every default
    both = Scenario("x", (6, 4), 80000, 90000, 100000, 110000)
    assert both.sizes("va") == (80000, 100000) and both.sizes("vb") == (90000, 110000)
    assert both.expected_limits("vb") == {"gso_max_size": 90000, "gro_max_size": 90000,
                                          "gso_ipv4_max_size": 110000, "gro_ipv4_max_size": 110000}


def test_bytes_per_flow_splits_between_families():
    assert SCENARIOS["mixed_185000"].bytes_per_flow(3_000_001) == 1_500_000
    assert SCENARIOS["v6_80000"].bytes_per_flow(1_000_000) == 1_000_000


@pytest.mark.parametrize("name, mtu", [("vxlan", VXLAN_MTU), ("geneve", GENEVE_MTU)])
def test_overlay_mtu_is_what_the_syn_mss_shows(name, mtu):
    """The kernel's SYN MSS over the overlay = overlay MTU - IP header - TCP header (tshark reads the SYNs)."""
    side = "snd" if (KERNEL / "linktypes" / f"{name}.snd.pcap").exists() else "rcv"
    rows = tshark_fields(KERNEL / "linktypes" / f"{name}.{side}.pcap", ["tcp.options.mss_val"],
                         "tcp.flags.syn == 1 && tcp.flags.ack == 0")
    assert {int(r["tcp.options.mss_val"]) for r in rows} == {mtu - 40 - 20, mtu - 20 - 20}


def test_min_snaplen_holds_the_headers_of_a_jumbo_segment():
    """Ethernet + IPv6 + the 8-byte HBH jumbo option header + TCP with timestamps, as tshark measures them."""
    rows = tshark_fields(KERNEL / "v6_185000.rcv.pcap", ["ipv6.hopopts.len_oct", "tcp.hdr_len"], "ipv6.opt.jumbo")
    assert rows
    assert {14 + 40 + int(r["ipv6.hopopts.len_oct"]) + int(r["tcp.hdr_len"]) for r in rows} == {MIN_SNAPLEN}
