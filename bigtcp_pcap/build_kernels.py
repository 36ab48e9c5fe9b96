"""Compile the entry-point loops ahead of time: ``python -m bigtcp_pcap.build_kernels [--check | --discover]``.

1. Each entry point declares the argument types it is compiled for, next to its definition
   (``@njit(entry=True, sig="u8[::1], i64, ...")``, the notation of ``_native.parse_sig``). The build exports each
   (entry point, declared signature) with ``numba.pycc`` into ``bigtcp_pcap/_kernels*.so`` and writes
   ``_kernels.json``: the symbol and argument types of each export and a digest of the package sources, which
   ``_native`` checks before it trusts the module.
2. ``--check`` (also run after a build): in a fresh interpreter, run a workload that goes through every entry point
   the way the pipeline calls it (the bundled sample as pcap, micro- and nanosecond, both byte orders, and pcapng,
   analysed with the packets table and the filter audit; the GRO engine with recorded poll starts and several RX
   queues; the flow table's growth and expiry; the audit's interpreter on writable and read-only buffers) on the
   compiled module, and fail unless every call was served by it (the types matched a declaration) and numba was
   never imported.
3. ``--discover``: the same workload on the JIT, printing any call whose argument types no declaration has (what
   to add to a ``sig=`` after changing how the pipeline calls a kernel).

Takes about a minute and needs numba; afterwards the toolkit runs without importing numba at all.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _records(pcap: bytes) -> list[tuple[int, int, bytes, int]]:
    """(sec, usec, data, wirelen) of a little-endian pcap."""
    div = 1000 if struct.unpack("<I", pcap[:4])[0] == 0xA1B23C4D else 1
    out, p = [], 24
    while p + 16 <= len(pcap):
        sec, frac, incl, orig = struct.unpack("<IIII", pcap[p:p + 16])
        out.append((sec, frac // div, pcap[p + 16:p + 16 + incl], orig))
        p += 16 + incl
    return out


def _variants(sample: Path, tmp: Path) -> list[Path]:
    """The sample rewritten as pcap (ns, both byte orders) and pcapng (both byte orders)."""
    raw = sample.read_bytes()
    recs = _records(raw)
    snaplen, lt = struct.unpack("<II", raw[16:24])
    paths = []
    for e, nanos in (("<", False), ("<", True), (">", False), (">", True)):
        magic = 0xA1B23C4D if nanos else 0xA1B2C3D4
        body = [struct.pack(e + "IHHiIII", magic, 2, 4, 0, 0, snaplen, lt)]
        for sec, usec, d, orig in recs:
            body.append(struct.pack(e + "IIII", sec, usec * (1000 if nanos else 1), len(d), orig) + d)
        paths.append(tmp / f"v{len(paths)}.pcap")
        paths[-1].write_bytes(b"".join(body))
    for e in ("<", ">"):
        def block(btype: int, b: bytes, e: str = e) -> bytes:
            b += b"\0" * (-len(b) % 4)
            return struct.pack(e + "II", btype, 12 + len(b)) + b + struct.pack(e + "I", 12 + len(b))
        body = [block(0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1)),
                block(1, struct.pack(e + "HHI", lt, 0, snaplen) + struct.pack(e + "HHB", 9, 1, 9) + b"\0" * 3)]
        for sec, usec, d, orig in recs:
            t = (sec * 1_000_000 + usec) * 1000
            body.append(block(6, struct.pack(e + "IIIII", 0, t >> 32, t & 0xFFFFFFFF, len(d), orig) + d))
        body.append(block(3, struct.pack(e + "I", len(recs[0][2])) + recs[0][2]))  # a simple packet block
        paths.append(tmp / f"v{len(paths)}.pcapng")
        paths[-1].write_bytes(b"".join(body))
    return paths


def workload() -> None:
    """Call every entry point the way the pipeline does (types, not volume, matter here)."""
    import numpy as np

    from bigtcp_pcap.api import analyze, sample_capture
    from bigtcp_pcap.capture.reader import CaptureReader
    from bigtcp_pcap.decode import decode
    from bigtcp_pcap.flows.table import FlowTable
    from bigtcp_pcap.gro import make_engine
    from bigtcp_pcap.gro.config import GroConfig

    sample = sample_capture()
    with tempfile.TemporaryDirectory(prefix="bigtcp-build-") as d:
        tmp = Path(d)
        analyze(sample, outdir=tmp / "a", packets=True)
        for p in _variants(sample, tmp):
            analyze(p, outdir=tmp / (p.name + ".out"), audit=False)
        for cfg in (GroConfig(), GroConfig(rx_queues=4)):
            engine = make_engine("compiled", cfg)
            flows = FlowTable()
            for rb in CaptureReader(sample):
                pb, _ = decode(rb)
                fid = flows.assign(pb)
                marks = np.zeros(len(pb), bool)
                marks[::7] = True
                engine.feed(pb, fid, marks)
                engine.feed(pb, fid)
            engine.flush()
        # enough flows to grow the engine's key table (its rehash)
        from bigtcp_pcap.gro.synth import bulk_stream

        batch, fid = bulk_stream(6000, nflows=1500, interleave="packet")
        engine = make_engine("compiled", GroConfig())
        engine.feed(batch, fid)
        engine.flush()
        batch.l4_off[:] = 54
        flows = FlowTable()
        flows.assign(batch)  # and the flow table's growth
        flows.expire(int(batch.ts_ns.max()) + 10**12, engine.held_flow_ids())  # every flow ends: rows, frees
        engine._recycle_at = 0  # and the GRO engine's key recycling (state rebuilt for the kept keys)
        engine.recycle(flows.in_memory)
        engine.feed(batch, flows.assign(batch))
        engine.flush()
        # a split run's merge: the sequence bookkeeping of the flows seen in several parts
        from bigtcp_pcap.flows.table import MAX_HOLES, NF, seq_kernel

        k = np.zeros(3, np.int64)
        seq_kernel(k, np.array([1, 1449, 1], np.uint32), np.full(3, 1448, np.uint32), np.full(3, 0x10, np.uint16),
                   np.zeros((1, NF), np.int64), np.zeros((1, MAX_HOLES, 2), np.int64))
        # the cBPF interpreter, on a writable and on a read-only buffer (the audit's normalized copies), without
        # needing libpcap at build time: a one-instruction program (ret #65535)
        from bigtcp_pcap.audit import bpfvm

        prog = bpfvm.program_columns([(0x06, 0, 0, 65535)])
        one = np.zeros(1, np.int64)
        for buf in (np.zeros(64, np.uint8), np.frombuffer(bytes(64), np.uint8)):
            bpfvm.match_batch(prog, buf, one, one + 60, one + 60)
        # the audit's normalization, also without libpcap: every frame of the sample (BIG TCP HBH frames)
        from bigtcp_pcap.audit.normalize import normalize_batch

        for rb in CaptureReader(sample):
            pb, _ = decode(rb)
            normalize_batch(pb, rb.buf, rb.off, pb.caplen.astype(np.int64), pb.wirelen.astype(np.int64),
                            np.arange(len(pb)))


def _spec(t) -> dict | None:
    """JSON form of a numba argument type, or None when the guard cannot check it."""
    import numpy as np
    from numba.core import types

    if isinstance(t, types.Array):
        return {"k": "arr", "dt": str(np.dtype(str(t.dtype))), "nd": t.ndim, "lay": t.layout, "rw": t.mutable,
                "aligned": t.aligned}
    if isinstance(t, types.Boolean):
        return {"k": "bool"}
    if isinstance(t, types.Integer):
        return {"k": "int", "dt": str(np.dtype(str(t)))}
    if isinstance(t, types.Float):
        return {"k": "float", "dt": str(np.dtype(str(t)))}
    if isinstance(t, types.BaseTuple):
        items = [_spec(x) for x in t.types]
        return None if any(i is None for i in items) else {"k": "tup", "items": items}
    return None


def _numba_type(s: dict):
    """The numba type of a declared argument spec (the inverse of ``_spec``)."""
    import numpy as np
    from numba.core import types
    from numba.np.numpy_support import from_dtype

    k = s["k"]
    if k == "arr":
        return types.Array(from_dtype(np.dtype(s["dt"])), s["nd"], s["lay"], readonly=not s["rw"],
                           aligned=s["aligned"])
    if k == "bool":
        return types.boolean
    if k in ("int", "float"):
        return from_dtype(np.dtype(s["dt"]))
    items = [_numba_type(x) for x in s["items"]]
    return types.UniTuple(items[0], len(items)) if all(x == items[0] for x in items) else types.Tuple(items)


def discover() -> int:
    """Run the workload on the JIT and compare the argument types the pipeline really passes with the declared
    ones: a call the build would leave to the JIT is printed with its types."""
    from bigtcp_pcap import _native

    workload()
    bad = 0
    for modname in _native.KERNEL_MODULES:
        mod = importlib.import_module(modname)
        for obj in vars(mod).values():
            if getattr(obj, "_bigtcp_entry", False) and obj.py_func.__module__ == modname:
                declared = obj._bigtcp_sigs
                for sig in obj.signatures:
                    got = [_spec(t) for t in sig]
                    if got not in declared:
                        bad += 1
                        print(f"build_kernels --discover: {modname}.{obj.py_func.__qualname__} called with "
                              f"undeclared types {sig}", file=sys.stderr)
    print(f"build_kernels --discover: {'every call matched a declared signature' if not bad else f'{bad} undeclared'}",
          file=sys.stderr)
    return 1 if bad else 0


def build(out_dir: Path) -> dict:
    import numpy
    from numba.pycc import CC

    from bigtcp_pcap import _native

    if _native._AOT is not None:
        raise SystemExit("build_kernels: the JIT must be active for the build (unset nothing; this is a bug)")
    if _native.RELEASE_GIL:  # the exports' Python wrappers release the GIL around the call, as numba's nogil
        import numba.pycc.compiler as pycc_compiler

        class _Flags(pycc_compiler.Flags):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.release_gil = True

        pycc_compiler.Flags = _Flags
    cc = CC("_kernels")
    cc.output_dir = str(out_dir)
    cc.verbose = False
    cc.use_nrt = False  # like the JIT (_native.njit): the kernels never allocate, so no refcount atomics
    exports: dict[str, list[dict]] = {}
    for modname in _native.KERNEL_MODULES:
        mod = importlib.import_module(modname)
        for name, obj in sorted(vars(mod).items()):
            if not getattr(obj, "_bigtcp_entry", False) or obj.py_func.__module__ != modname:
                continue
            key = f"{modname}.{obj.py_func.__qualname__}"
            if not obj._bigtcp_sigs:
                raise SystemExit(f"build_kernels: {key} is an entry point without declared argument types (sig=)")
            for args in obj._bigtcp_sigs:  # declared at the entry point (_native.parse_sig)
                sig = tuple(_numba_type(a) for a in args)
                symbol = f"{modname.rsplit('.', 2)[-2]}_{modname.rsplit('.', 1)[-1]}__{name.lstrip('_')}__" \
                         f"{len(exports.get(key, []))}"
                cc.export(symbol, sig)(obj.py_func)
                exports.setdefault(key, []).append({"symbol": symbol, "args": args})
    t1 = time.perf_counter()
    cc.compile()
    print(f"build_kernels: compiled {sum(map(len, exports.values()))} exports of {len(exports)} entry points "
          f"in {time.perf_counter() - t1:.1f} s", file=sys.stderr)
    sources = _native.import_closure(_native.KERNEL_MODULES)
    spec = {"sources": sources, "source_sha256": _native.source_digest(sources), "numba": __import__("numba").__version__,
            "numpy": numpy.__version__, "exports": exports}
    tmp = out_dir / "_kernels.json.tmp"
    tmp.write_text(json.dumps(spec, indent=1) + "\n")
    tmp.replace(out_dir / "_kernels.json")
    return spec


def check() -> int:
    """In this interpreter (JIT not forced): run the workload and report how every entry point was served."""
    from bigtcp_pcap import _native

    if _native._AOT is None:
        print(f"build_kernels --check: {_native.MODE}", file=sys.stderr)
        return 1
    workload()
    bad = []
    if _native.fallbacks:
        bad.append(f"calls left to the JIT: {_native.fallbacks}")
    if "numba" in sys.modules:
        bad.append("numba was imported")
    for b in bad:
        print(f"build_kernels --check: {b}", file=sys.stderr)
    if not bad:
        print("build_kernels --check: every entry point ran ahead-of-time code; numba not imported",
              file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bigtcp_pcap.build_kernels", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check the built module (no build)")
    ap.add_argument("--if-stale", action="store_true", help="build only when the module is missing or stale")
    ap.add_argument("--discover", action="store_true",
                    help="run the workload on the JIT and print calls whose types no sig= declares (no build)")
    args = ap.parse_args(argv)
    pkg = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if k != "BIGTCP_PCAP_JIT"}
    checker = [sys.executable, "-c", "import sys; from bigtcp_pcap.build_kernels import check; sys.exit(check())"]
    if args.check:
        return subprocess.run(checker, env=env, check=False).returncode
    if args.discover:
        code = "import sys; from bigtcp_pcap.build_kernels import discover; sys.exit(discover())"
        return subprocess.run([sys.executable, "-c", code], env={**env, "BIGTCP_PCAP_JIT": "1"},
                              check=False).returncode
    if args.if_stale:
        probe = subprocess.run([sys.executable, "-c", "from bigtcp_pcap import _native; print(_native.MODE)"],
                               env=env, capture_output=True, text=True, check=False)
        if probe.stdout.strip() == "aot":
            print("build_kernels: ahead-of-time kernels are up to date", file=sys.stderr)
            return 0
    if "bigtcp_pcap._native" in sys.modules:
        raise SystemExit("build_kernels: run it as its own process (python -m bigtcp_pcap.build_kernels)")
    os.environ["BIGTCP_PCAP_JIT"] = "1"  # the build compiles with numba's JIT first
    build(pkg)
    return subprocess.run(checker, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
