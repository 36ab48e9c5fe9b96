"""The eBPF audit (audit/ebpf.py) on the real kernel, with programs built here from LLVM IR (tests/audit/bpf/*.ll,
``llc -march=bpf``; clang is not needed).

The kernel tests load programs with libbpf and run them with BPF_PROG_TEST_RUN only (nothing is attached, map
pinning disabled); they skip with the reason when not root, when libbpf or llc is missing, or when the kernel
refuses the load (EPERM/EINVAL). The struct layout, the diff logic (a Python stand-in for the kernel) and the
CLI's error paths run everywhere.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from bigtcp_pcap.audit import ebpf, libbpf
from bigtcp_pcap.audit.ebpf import (
    BpfTestRunOpts,
    EbpfAudit,
    EbpfLoadError,
    EbpfPermissionError,
    EbpfUsageError,
    LibbpfMissing,
    ProgramInfo,
    audit_ebpf,
)
from bigtcp_pcap.audit.ebpf_cli import register
from bigtcp_pcap.capture import read_batches
from bigtcp_pcap.decode import decode
from bigtcp_pcap.decode.schema import BIGTCP_V4_TOTLEN0

from .conftest import TSHARK, kernel_capture, tshark_frames, v4_tcp, v6_hbh_tcp, v6_tcp, write_pcap

BPF_DIR = Path(__file__).parent / "bpf"
LLC = shutil.which("llc") or shutil.which("llc-14")
PIN_PATH = "/sys/fs/bpf/bigtcp_pcap_audit_pin"


# --- helpers ------------------------------------------------------------------------------------------------------
def _kernel_ready() -> None:
    if os.geteuid() != 0:
        pytest.skip("not root: loading a BPF program for BPF_PROG_TEST_RUN needs CAP_BPF and CAP_NET_ADMIN")
    try:
        ebpf.load_libbpf()
    except LibbpfMissing as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def bpf_objects(tmp_path_factory):
    """name -> path of the .o built from tests/audit/bpf/<name>.ll."""
    if LLC is None:
        pytest.skip("llc is not installed (apt-get install llvm)")
    out = tmp_path_factory.mktemp("bpf")
    built = {}
    for ll in sorted(BPF_DIR.glob("*.ll")):
        obj = out / f"{ll.stem}.o"
        r = subprocess.run([LLC, "-march=bpf", "-filetype=obj", str(ll), "-o", str(obj)], capture_output=True,
                           text=True, timeout=120, check=False)
        if r.returncode != 0:
            pytest.skip(f"llc could not build {ll.name}: {r.stderr.strip().splitlines()[-1:]}")
        built[ll.stem] = obj
    return built


@pytest.fixture
def kernel(bpf_objects):
    _kernel_ready()
    return bpf_objects


def run_audit(obj: Path, capture, section: str | None = None):
    """audit_ebpf, skipping when the kernel refuses the load for lack of privilege or support."""
    try:
        return audit_ebpf(obj, capture, section)
    except EbpfPermissionError as e:
        pytest.skip(f"the kernel refused: {e}")
    except EbpfLoadError as e:
        if e.errno in (errno.EPERM, errno.EINVAL):
            pytest.skip(f"the kernel refused the load: {e}")
        raise


def decoded(capture: Path):
    (rb,) = list(read_batches(capture))
    return rb, decode(rb)[0]


def jumbo_frames(capture: Path) -> set[int]:
    """Frames with an RFC 2675 Jumbo option: tshark's ``ipv6.opt.jumbo`` when installed, checked against the
    project's decoder; the decoder alone otherwise."""
    _, pb = decoded(capture)
    mine = set(pb.frame[pb.has_jumbo].astype(int).tolist())
    if TSHARK is not None:
        assert tshark_frames(capture, "ipv6.opt.jumbo") == mine
    return mine


@pytest.fixture
def v6_rcv() -> Path:
    return kernel_capture("v6_185000.rcv.pcap")


@pytest.fixture
def app():
    app = typer.Typer()
    register(app)

    @app.callback()
    def main() -> None:  # keeps typer in multi-command mode, as on the real app
        pass

    return app


def cli(app, *args):
    return CliRunner().invoke(app, ["audit-ebpf", *args])


def kernel_cli(app, *args):
    """``cli`` for a command that loads a program: skips when the kernel refuses the load (EPERM/EINVAL)."""
    res = cli(app, *args)
    if res.exit_code == 2 and "the kernel refused" in res.output and ("EPERM" in res.output
                                                                      or "EINVAL" in res.output):
        pytest.skip(res.output.strip())
    return res


# --- struct layout (no kernel needed) -----------------------------------------------------------------------------
def test_test_run_opts_layout_matches_libbpf_1_1():
    """bpf.h of libbpf 1.1: sz first, 80 bytes on LP64, batch_size last (bpf_test_run_opts__last_field)."""
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        pytest.skip("layout checked for LP64")
    offsets = {name: getattr(BpfTestRunOpts, name).offset for name, _ in BpfTestRunOpts._fields_}
    assert offsets == {"sz": 0, "data_in": 8, "data_out": 16, "data_size_in": 24, "data_size_out": 28,
                       "ctx_in": 32, "ctx_out": 40, "ctx_size_in": 48, "ctx_size_out": 52, "retval": 56,
                       "repeat": 60, "duration": 64, "flags": 68, "cpu": 72, "batch_size": 76}
    assert ctypes.sizeof(BpfTestRunOpts) == 80


def test_jumbo_frames_in_the_receiver_capture(v6_rcv):
    assert len(jumbo_frames(v6_rcv)) == 21


# --- the kernel: programs A (naive) and B (aware) -----------------------------------------------------------------
def test_naive_program_flagged_on_every_hbh_jumbo_frame(kernel, v6_rcv):
    jumbo = jumbo_frames(v6_rcv)
    r = run_audit(kernel["naive_tc"], v6_rcv)
    assert (r.program, r.section, r.prog_type, r.l2) == ("tcp_after_ipv6", "tc", "sched_cls", True)
    assert r.frames_run == r.frames_total == 147
    assert r.differing == r.verdict_differs == len(jumbo) == 21
    assert r.output_differs == 0
    assert r.reasons == {"ipv6_hbh_jumbo": 21}
    assert set(r.frame[r.differs].astype(int).tolist()) == jumbo
    assert r.retval_pairs == {"2->0": 21}  # TC_ACT_SHOT on the raw frame, TC_ACT_OK on its normalized copy
    assert r.retval_name(2) == "TC_ACT_SHOT" and r.retval_name(0) == "TC_ACT_OK"
    (flow,) = r.flows
    assert (flow.proto, flow.dport, flow.packets, flow.verdict_differs) == ("tcp", 5201, 21, 21)
    _, pb = decoded(v6_rcv)
    assert flow.wire_bytes == int(pb.wirelen[pb.has_jumbo].astype(np.int64).sum())
    assert any("wire_len" in n and "65536" in n for n in r.notes)
    assert not r.clean


def test_aware_program_flagged_on_none(kernel, v6_rcv):
    naive = run_audit(kernel["naive_tc"], v6_rcv)
    r = run_audit(kernel["aware_tc"], v6_rcv)
    assert r.program == "tcp_after_ipv6_hbh"
    assert r.differing == 0 and r.clean and r.flows == [] and r.reasons == {}
    assert r.compared == naive.compared >= 21  # the same frames ran twice
    # the HBH jumbo frames now pass like every other TCP frame
    jumbo = np.isin(r.frame.astype(int), sorted(jumbo_frames(v6_rcv)))
    assert (r.retval_raw[jumbo] == 0).all() and (r.retval_norm[jumbo] == 0).all()


def test_fixed_offset_rewrite_caught_by_the_output_comparison(kernel, v6_rcv):
    """Program C writes the TCP port at a fixed offset: same verdict, different output on every HBH frame (the
    21 jumbo ones and the 4 MLD reports with a router-alert HBH)."""
    _, pb = decoded(v6_rcv)
    hbh = set(pb.frame[(pb.ip_version == 6) & (pb.ext_len > 0)].astype(int).tolist())
    r = run_audit(kernel["rewrite_tc"], v6_rcv)
    assert r.verdict_differs == 0
    assert r.output_differs == r.differing == len(hbh) == 25
    assert set(r.frame[r.out_differs].astype(int).tolist()) == hbh
    assert r.reasons == {"ipv6_hbh_jumbo": 21, "ipv6_ext_header": 4}


def test_socket_filter_gets_the_packet_from_the_network_header(kernel, v6_rcv):
    r = run_audit(kernel["naive_socket"], v6_rcv)
    assert (r.prog_type, r.l2) == ("socket_filter", False)
    assert r.differing == 21 and r.reasons == {"ipv6_hbh_jumbo": 21}
    assert r.retval_pairs == {"0->65535": 21}
    assert r.output_differs == 0  # the zeroed Ethernet header of the output is the same on both runs
    assert any("network header" in n for n in r.notes)


def test_xdp_program(kernel, v6_rcv):
    r = run_audit(kernel["naive_xdp"], v6_rcv)
    assert (r.prog_type, r.l2) == ("xdp", True)
    assert r.differing == 21 and r.retval_pairs == {"1->2": 21}
    assert r.retval_name(1) == "XDP_DROP"


def test_map_pinning_is_disabled_before_the_load(kernel, v6_rcv):
    assert not os.path.exists(PIN_PATH)
    r = run_audit(kernel["pinned_map_tc"], v6_rcv)
    assert r.maps == ["bigtcp_pcap_audit_pin"]
    assert r.pinning_disabled == [{"name": "bigtcp_pcap_audit_pin", "pin_path": PIN_PATH}]
    assert not os.path.exists(PIN_PATH)
    assert r.differing == 21
    assert any("pinning disabled" in n for n in r.notes)


def test_verifier_refusal_is_one_line_and_exit_2(kernel, app, v6_rcv):
    with pytest.raises(EbpfLoadError) as ei:
        try:
            audit_ebpf(kernel["bad_tc"], v6_rcv)
        except EbpfPermissionError as e:
            pytest.skip(f"the kernel refused: {e}")
    assert ei.value.errno == errno.EACCES
    assert "invalid access to packet" in str(ei.value)
    res = kernel_cli(app, str(kernel["bad_tc"]), str(v6_rcv))
    assert res.exit_code == 2
    assert "invalid access to packet" in res.output and "Traceback" not in res.output


def test_program_selection(kernel, v6_rcv):
    with pytest.raises(EbpfUsageError, match="2 programs; choose one with --section: multi_naive"):
        audit_ebpf(kernel["multi_tc"], v6_rcv)
    with pytest.raises(EbpfUsageError, match="no program in section or named 'nope'"):
        audit_ebpf(kernel["multi_tc"], v6_rcv, "nope")
    assert run_audit(kernel["multi_tc"], v6_rcv, "tc").differing == 21
    assert run_audit(kernel["multi_tc"], v6_rcv, "multi_naive").program == "multi_naive"
    r = run_audit(kernel["multi_tc"], v6_rcv, "classifier")
    assert (r.program, r.differing) == ("multi_pass_all", 0)


def test_long_frames_are_cut_to_the_kernel_test_data_limit(kernel, tmp_path):
    cap = write_pcap(tmp_path / "long.pcap", [v6_hbh_tcp(70000, snap=None), v6_tcp(5000), v6_tcp(100),
                                              v6_hbh_tcp(1000, snap=None), v4_tcp(70000, totlen0=True, snap=None)])
    r = run_audit(kernel["naive_tc"], cap)
    assert 1518 < r.data_limit < 5000
    assert r.frames_cut == 3 and r.frames_run == 5
    assert r.differing == 2 and r.reasons == {"ipv6_hbh_jumbo": 2}
    assert any(f"cut to {r.data_limit} bytes" in n for n in r.notes)


def test_non_ethernet_capture_not_supported(kernel, tmp_path, app):
    frame, wire = v6_tcp(100)
    cap = write_pcap(tmp_path / "raw.pcap", [(frame[14:], wire - 14)], linktype=101)
    with pytest.raises(EbpfUsageError, match="Ethernet captures only"):
        run_audit(kernel["naive_tc"], cap)
    res = kernel_cli(app, str(kernel["naive_tc"]), str(cap))
    assert res.exit_code == 2 and "Ethernet captures only" in res.output


# --- the CLI on the kernel ----------------------------------------------------------------------------------------
def test_cli_text_report_exit_1(kernel, app, v6_rcv):
    res = kernel_cli(app, str(kernel["naive_tc"]), str(v6_rcv))
    assert res.exit_code == 1, res.output
    assert "differing 21   verdict 21   output packet 0" in res.output
    assert "raw 2 (TC_ACT_SHOT) -> normalized 0 (TC_ACT_OK)" in res.output
    assert "ipv6_hbh_jumbo" in res.output and "[fd00:b1::2]:5201" in res.output


def test_cli_json_and_exit_0(kernel, app, v6_rcv):
    res = kernel_cli(app, str(kernel["aware_tc"]), str(v6_rcv), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {"program", "section", "prog_type", "frames_total", "differing", "verdict_differs", "output_differs",
            "reasons", "flows", "frames", "notes", "pinning_disabled", "capture"} <= doc.keys()
    assert doc["differing"] == 0 and doc["frames"] == [] and doc["data_starts_at"] == "ethernet"
    res = kernel_cli(app, str(kernel["multi_tc"]), str(v6_rcv), "--json", "--section", "tc")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["differing"] == 21 and {f["reason"] for f in doc["frames"]} == {"ipv6_hbh_jumbo"}


def test_cli_unreadable_capture_exit_3(kernel, app, tmp_path):
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(b"not a capture at all")
    res = kernel_cli(app, str(kernel["naive_tc"]), str(bad))
    assert res.exit_code == 3, res.output


# --- error paths without privileges or libbpf (run everywhere) ----------------------------------------------------
def test_not_root_is_one_line_exit_2(app, monkeypatch, tmp_path):
    monkeypatch.setattr(ebpf.os, "geteuid", lambda: 1000)
    res = cli(app, str(tmp_path / "x.o"), str(tmp_path / "x.pcap"))
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        ("bigtcp-pcap: audit-ebpf must run as root (loading a program for BPF_PROG_TEST_RUN needs CAP_BPF and "
         "CAP_NET_ADMIN); run it with sudo")]


def test_libbpf_missing_is_one_line_exit_2(app, monkeypatch, tmp_path):
    monkeypatch.setattr(ebpf.os, "geteuid", lambda: 0)
    monkeypatch.setattr(libbpf, "_lib", None)
    monkeypatch.setattr(libbpf, "_LIB_NAMES", ("libbpf-not-here.so.1",))
    monkeypatch.setattr(libbpf.ctypes.util, "find_library", lambda name: None)
    res = cli(app, str(tmp_path / "x.o"), str(tmp_path / "x.pcap"))
    assert res.exit_code == 2
    assert "libbpf not found" in res.output and "apt-get install libbpf1" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_missing_object_file_exit_2(app, monkeypatch, tmp_path):
    monkeypatch.setattr(ebpf.os, "geteuid", lambda: 0)
    try:
        ebpf.load_libbpf()
    except LibbpfMissing as e:
        pytest.skip(str(e))
    res = cli(app, str(tmp_path / "nope.o"), str(tmp_path / "x.pcap"))
    assert res.exit_code == 2 and "no such BPF object file" in res.output


# --- the diff logic with a Python stand-in for the kernel (runs everywhere) ----------------------------------------
class FakeRunner:
    """``run(data) -> (retval, output)`` like TestRunner, computed in Python by ``fn``."""

    data_limit = None

    def __init__(self, fn):
        self.fn, self.runs = fn, 0

    def cut(self, data: bytes) -> bytes:
        return data

    def run(self, data: bytes):
        self.runs += 1
        return self.fn(data)


TC = ProgramInfo("fake", "tc", 3, "sched_cls")


def fake_audit(capture: Path, fn):
    audit = EbpfAudit(FakeRunner(fn), TC, "fake.o")
    for rb in read_batches(capture):
        audit.feed(rb, decode(rb)[0])
    return audit.result()


def naive(data: bytes):
    return (0 if data[12:14] != b"\x86\xdd" or data[20] == 6 else 2), data


def test_fake_naive_matches_the_kernel_numbers(v6_rcv):
    r = fake_audit(v6_rcv, naive)
    assert r.differing == r.verdict_differs == 21 and r.reasons == {"ipv6_hbh_jumbo": 21}


def test_header_rewrites_at_the_right_place_are_not_flagged(v6_rcv):
    def hop_limit_minus_one(data: bytes):  # IPv6 hop limit (ETH + 7), same layout on both copies
        if data[12:14] != b"\x86\xdd":
            return 0, data
        return 0, data[:21] + bytes([(data[21] - 1) & 0xFF]) + data[22:]

    def strips_hbh(data: bytes):  # removes a HBH header itself, fixing next header and payload length
        if data[12:14] == b"\x86\xdd" and data[20] == 0:
            hlen = 8 + data[55] * 8
            plen = int.from_bytes(data[18:20], "big")
            plen = max(plen - hlen, 0) if plen else 0xFFFF
            return 0, data[:18] + plen.to_bytes(2, "big") + bytes([data[54]]) + data[21:54] + data[54 + hlen:]
        return 0, data

    for fn in (hop_limit_minus_one, strips_hbh):
        r = fake_audit(v6_rcv, fn)
        assert r.differing == 0, (fn.__name__, r.differing_frames()[:3])
        assert r.compared == 25


def test_v4_totlen0_reason():
    cap = kernel_capture("v4_185000.rcv.pcap")
    _, pb = decoded(cap)
    want = set(pb.frame[pb.bigtcp == BIGTCP_V4_TOTLEN0].astype(int).tolist())
    assert want

    def trusts_totlen(data: bytes):  # drops IPv4 frames whose tot_len is below 1000
        if data[12:14] == b"\x08\x00" and int.from_bytes(data[16:18], "big") < 1000:
            return 2, data
        return 0, data

    r = fake_audit(cap, trusts_totlen)
    assert r.reasons == {"v4_totlen0": len(want)}
    assert set(r.frame[r.differs].astype(int).tolist()) == want
    table = r.frames_table()
    assert table.num_rows == r.frames_total
    assert table.column("reason").to_pylist().count("v4_totlen0") == len(want)
