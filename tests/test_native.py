"""The ahead-of-time kernels (bigtcp_pcap/_native.py, build_kernels.py).

* after ``scripts/setup`` the pipeline runs on them: no numba, no pandas in the process, no JIT fallback;
* every table they produce is identical to numba's JIT (BIGTCP_PCAP_JIT=1) on every kernel capture;
* a call with argument types the build did not compile for runs on the JIT and gives the same answer;
* edited kernel sources make the module stale, so it is not used.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from bigtcp_pcap import _native
from bigtcp_pcap.capture import walk

FIX = Path(__file__).parent / "fixtures" / "kernel"
CAPTURES = sorted(p for p in FIX.rglob("*.pcap*") if p.is_file())
JIT_FORCED = bool(os.environ.get(_native.ENV_FORCE_JIT))

pytestmark = pytest.mark.skipif(JIT_FORCED, reason=f"{_native.ENV_FORCE_JIT} is set: the JIT is under test")


def _env(jit: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != _native.ENV_FORCE_JIT}
    if jit:
        env[_native.ENV_FORCE_JIT] = "1"
    return env


RUN = r"""
import json, sys
from pathlib import Path
from bigtcp_pcap import analyze, _native
from bigtcp_pcap.audit import cbpf
cbpf.FilterAudit.SPILL_ROWS = 5  # (analyze writes the audit rows as it goes; a spill would run too, importing no pandas)
out = Path(sys.argv[1])
for i, cap in enumerate(sys.argv[2:]):
    a = analyze(cap, outdir=out / str(i), packets=True)
    assert a.summary["kernels"] == _native.MODE
print(json.dumps({"mode": _native.MODE, "fallbacks": _native.fallbacks,
                  "modules": [m for m in ("numba", "llvmlite", "pandas", "matplotlib", "pyarrow.compute")
                              if m in sys.modules]}))
"""


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """Every kernel capture analysed on the ahead-of-time kernels and on the JIT (two fresh processes)."""
    out = {}
    for jit in (False, True):
        d = tmp_path_factory.mktemp("jit" if jit else "aot")
        r = subprocess.run([sys.executable, "-c", RUN, str(d), *map(str, CAPTURES)], env=_env(jit), check=False,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        out[jit] = (d, json.loads(r.stdout.strip().splitlines()[-1]))
    return out


def test_pipeline_runs_without_numba_or_pandas(both):
    _, info = both[False]
    assert info["mode"] == "aot", f"the ahead-of-time kernels are not in use: {info['mode']}"
    assert info["fallbacks"] == {}, "calls whose argument types the build did not compile for"
    assert info["modules"] == [], f"imported although the analysis does not need them: {info['modules']}"
    assert both[True][1]["mode"].startswith("jit")


def test_tables_identical_to_the_jit(both):
    (aot, _), (jit, _) = both[False], both[True]
    compared = 0
    for i in range(len(CAPTURES)):
        names = sorted(p.name for p in (aot / str(i)).glob("*.parquet"))
        assert names == sorted(p.name for p in (jit / str(i)).glob("*.parquet"))
        assert "superpackets.parquet" in names and "packets.parquet" in names
        for name in names:
            a, j = pq.read_table(aot / str(i) / name), pq.read_table(jit / str(i) / name)
            assert a.num_rows == j.num_rows, (CAPTURES[i].name, name)
            assert a.equals(j), f"{CAPTURES[i].name}: {name} differs between the AOT and JIT kernels"
            compared += a.num_rows
    assert compared > 10_000


def test_unseen_argument_types_run_on_the_jit():
    data = np.fromfile(FIX / "v6_185000.rcv.pcap", np.uint8)
    cols = [np.empty(64, np.int64), np.empty(64, np.uint32), np.empty(64, np.uint32), np.empty(64, np.int64),
            np.empty(64, np.int64)]
    want = walk.walk_pcap(data, 24, data.shape[0], False, 1000, 262144, *cols)
    assert want[0] == 64 and want[2] == walk.FULL
    first = [c.copy() for c in cols]
    before = dict(_native.fallbacks)
    # a 32-bit offsets array: the compiled code would write 8-byte values into it; the guard sends it to the JIT
    off32 = np.zeros(64, np.int32)
    got = walk.walk_pcap(data, 24, data.shape[0], False, 1000, 262144, off32, *cols[1:])
    assert got == want
    assert np.array_equal(off32, first[0])
    if _native.MODE == "aot":
        key = "bigtcp_pcap.capture.walk.walk_pcap"
        assert _native.fallbacks.get(key, 0) == before.get(key, 0) + 1


@pytest.mark.skipif(_native.MODE != "aot", reason="the ahead-of-time kernels are not built")
def test_edited_sources_or_another_numpy_make_the_module_stale(tmp_path, monkeypatch):
    spec = json.loads(_native.SPEC_FILE.read_text())
    assert {"capture/walk.py", "decode/kernel.py", "flows/table.py", "gro/compiled.py"} <= set(spec["sources"])
    assert spec["source_sha256"] == _native.source_digest(spec["sources"])
    copy = tmp_path / "bigtcp_pcap"
    shutil.copytree(_native.PKG, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    monkeypatch.setattr(_native, "PKG", copy)
    monkeypatch.setattr(_native, "SPEC_FILE", copy / "_kernels.json")
    assert _native._load_aot()[2] == "aot"  # the same sources
    other = dict(spec, numpy="1.26.4")  # built against another numpy: not trusted either
    (copy / "_kernels.json").write_text(json.dumps(other))
    assert "numpy 1.26.4" in _native._load_aot()[2]
    (copy / "_kernels.json").write_text(json.dumps(spec))
    kernel = copy / "gro" / "compiled.py"
    kernel.write_text(kernel.read_text().replace("BIG = 1 << 62", "BIG = 1 << 61"))
    assert "stale" in _native._load_aot()[2]


def test_entry_points_declare_their_argument_types():
    """Every entry point carries its sig=, and the built module holds exactly the declared signatures."""
    import ast

    spec = json.loads(_native.SPEC_FILE.read_text()) if _native.SPEC_FILE.exists() else None
    declared = {}
    for modname in _native.KERNEL_MODULES:
        path = Path(importlib.util.find_spec(modname).origin)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for dec in node.decorator_list:
                kw = {k.arg: k.value for k in getattr(dec, "keywords", [])}
                if "entry" in kw and ast.literal_eval(kw["entry"]):
                    assert "sig" in kw, f"{modname}.{node.name}: entry point without sig="
                    sig = ast.literal_eval(kw["sig"])
                    declared[f"{modname}.{node.name}"] = [_native.parse_sig(s) for s in
                                                          ([sig] if isinstance(sig, str) else sig)]
    assert len(declared) >= 19
    if spec is not None:
        assert {k: [e["args"] for e in v] for k, v in spec["exports"].items()} == declared


def test_signature_notation():
    arr = {"k": "arr", "aligned": True}
    assert _native.parse_sig("u8[::1], i64, bool, ro u16[:, ::1], (u64[::1], u64[:]), f64") == [
        {**arr, "dt": "uint8", "nd": 1, "lay": "C", "rw": True}, {"k": "int", "dt": "int64"}, {"k": "bool"},
        {**arr, "dt": "uint16", "nd": 2, "lay": "C", "rw": False},
        {"k": "tup", "items": [{**arr, "dt": "uint64", "nd": 1, "lay": "C", "rw": True},
                               {**arr, "dt": "uint64", "nd": 1, "lay": "A", "rw": True}]},
        {"k": "float", "dt": "float64"}]


COMPILED_ONLY = r"""
import json, sys, tempfile
from pathlib import Path
from bigtcp_pcap import _native
from bigtcp_pcap import analyze, egress, explode
from bigtcp_pcap.compare import compare
from bigtcp_pcap.many import analyze_split
fix = Path(sys.argv[1])
seen = {}
def hook(frame, event, arg):
    if event == "call" and frame.f_code in _native.compiled_only:
        seen[_native.compiled_only[frame.f_code]] = seen.get(_native.compiled_only[frame.f_code], 0) + 1
sys.setprofile(hook)
with tempfile.TemporaryDirectory() as d:
    d = Path(d)
    analyze(fix / "v6_185000.snd.pcap", outdir=d / "a", packets=True)
    s = analyze_split(fix / "traced" / "v4_65536.snd.pcap", d / "s", jobs=1, parts=4, ack_delay_ns=1_000_000,
                      part_packets=False)
    assert s.params["parts"] >= 2, s.params
    compare(fix / "mixed_185000.snd.pcap", fix / "mixed_185000.rcv.pcap", gro_max_size=185000,
            gro_ipv4_max_size=185000, outdir=d / "c")
    egress(fix / "v6_185000.rcv.pcap", outdir=d / "e", profile="veth", then_gro=None)
    explode(fix / "v6_185000.rcv.pcap", d / "x.pcap")
sys.setprofile(None)
print(json.dumps({"mode": _native.MODE, "python_calls": seen}))
"""


@pytest.mark.skipif(_native.MODE != "aot", reason="the ahead-of-time kernels are not built")
def test_no_compiled_loop_runs_as_python():
    """With the ahead-of-time module, a loop not marked entry=True exists only inlined into the entry points: a
    Python-level call runs it as plain Python, ~100x slower and with no error (the split run's merge once
    spent 12 s of 13 that way). Every user-facing path here must call compiled code only."""
    r = subprocess.run([sys.executable, "-c", COMPILED_ONLY, str(FIX)], env=_env(False), capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["mode"] == "aot"
    assert got["python_calls"] == {}


def test_the_jit_fallback_compiles_loops_that_call_other_modules_helpers(monkeypatch):
    """The JIT twin of an entry point whose loop calls helpers from another module (``evidence_scan`` calls
    ``flows.table._digest`` and ``_fmix``, which the ahead-of-time module holds only inlined) compiles and gives
    the ahead-of-time scan's flags, busy times and moves on a kernel capture. It once failed to type the imported
    helpers, so a call with argument types the build did not see raised instead of running on the JIT."""
    from bigtcp_pcap.capture import CaptureReader
    from bigtcp_pcap.decode import decode
    from bigtcp_pcap.gro import evidence as EV

    pb, _ = decode(next(iter(CaptureReader(FIX / "mixed_185000.snd.pcap", batch_size=1 << 20))))

    def scan():
        ev = EV.AckEvidence()
        (_, _, flags, e), = ev.push(pb) + ev.finish()
        return flags, e.busy, e.move

    want = scan()
    monkeypatch.setattr(EV, "evidence_scan", _native._jit_twin("bigtcp_pcap.gro.evidence", "evidence_scan"))
    got = scan()
    assert want[0].any() and (want[1] > 0).any()
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)
