"""Where the compiled loops come from: the ahead-of-time module when it is built, numba's JIT otherwise.

The kernel modules (``KERNEL_MODULES``) decorate their loops with ``njit`` from here instead of numba's. The
loops that Python calls are marked ``entry=True``. ``python -m bigtcp_pcap.build_kernels`` (run by
``scripts/setup``) compiles those entry points with ``numba.pycc`` into ``bigtcp_pcap/_kernels*.so`` and records,
next to it, the argument types it compiled each for and a digest of the sources the kernels are made of (the
kernel modules and every package module they import, transitively).

At import, when that module exists and its digest matches the sources on disk, each entry point becomes the
ahead-of-time code behind a type guard, and numba (with LLVM) is never imported: start-up drops by ~0.5 s and
peak RSS by ~180 MiB. The guard matters because compiled code trusts its argument types (an int32 array passed
where int64 was compiled reads garbage); a call whose types the build did not see runs on numba's JIT instead,
from a private copy of the kernel module, so it is slower to start but never wrong. Without the module, or with
``BIGTCP_PCAP_JIT=1``, ``njit`` is ``numba.njit`` (compiled on first use, cached on disk) as before.

Both paths compile without numba's reference-counting runtime (NRT, ``_nrt=False`` / ``CC.use_nrt = False``).
The kernels never allocate, return or keep an array (the Python side owns every buffer and keeps it alive for
the call), so NRT has nothing to manage, yet with it every array bound to a name inside a loop costs an atomic
increment and decrement that LLVM's pruning cannot always remove. In the GRO loop those atomics were half the
time (60 -> 28.5 ns per packet without them). A kernel that allocated would now fail to compile, loudly.

Entry points release the GIL while they run (``RELEASE_GIL``: numba's ``nogil`` on the JIT, the same flag for
the ahead-of-time wrappers). They touch no Python object, and the Python side does not change a buffer while a
kernel has it. What it buys: the Parquet writer thread (output/parquet.py) needs the GIL for a moment at the end
of each row group it writes, and while the pipeline's thread held it through every kernel call that thread
waited there, 3-4 ms a row group on a BIG TCP receiver capture, until the pipeline in turn waited for it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

PKG = Path(__file__).resolve().parent
KERNEL_MODULES = ("bigtcp_pcap.capture.walk", "bigtcp_pcap.decode.kernel", "bigtcp_pcap.flows.table",
                  "bigtcp_pcap.gro.compiled", "bigtcp_pcap.gro.evidence", "bigtcp_pcap.gro.receivers",
                  "bigtcp_pcap.audit.bpfvm", "bigtcp_pcap.audit.normalize", "bigtcp_pcap.audit.judge",
                  "bigtcp_pcap.keyed")
SPEC_FILE = PKG / "_kernels.json"
RELEASE_GIL = True  # (a change here changes the source digest: the ahead-of-time module is rebuilt)
ENV_FORCE_JIT = "BIGTCP_PCAP_JIT"


def source_digest(files: list[str]) -> str:
    """SHA-256 over package source files (relative paths and bytes); a missing file gives a digest of its own."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0")
        try:
            h.update((PKG / rel).read_bytes())
        except OSError:
            h.update(b"\xff missing")
    return h.hexdigest()


def _load_aot() -> tuple[Any, dict, str]:
    """(module, export table, mode description)."""
    if os.environ.get(ENV_FORCE_JIT):
        return None, {}, f"jit ({ENV_FORCE_JIT} is set)"
    try:
        spec = json.loads(SPEC_FILE.read_text())
    except (OSError, ValueError):
        return None, {}, "jit (ahead-of-time kernels not built: python -m bigtcp_pcap.build_kernels)"
    if spec.get("source_sha256") != source_digest(spec.get("sources", [])):
        return None, {}, "jit (ahead-of-time kernels are stale: python -m bigtcp_pcap.build_kernels)"
    if str(spec.get("numpy", "")).split(".")[:2] != np.__version__.split(".")[:2]:
        return None, {}, (f"jit (ahead-of-time kernels were built with numpy {spec.get('numpy')}, this is "
                          f"{np.__version__}: python -m bigtcp_pcap.build_kernels)")
    try:
        from . import _kernels  # type: ignore[attr-defined]
    except ImportError as e:
        return None, {}, f"jit (ahead-of-time kernels failed to load: {e})"
    return _kernels, spec["exports"], "aot"


def import_closure(modules: tuple[str, ...] = KERNEL_MODULES) -> list[str]:
    """Package-relative paths of ``modules`` and the bigtcp_pcap modules they import at module level, transitively.

    These are the files whose code or constants the compiled kernels can contain (gro/rules.py is inlined into
    gro/compiled.py, for example)."""
    import ast

    def path_of(mod: str) -> Path | None:
        rel = mod.split(".", 1)[1].replace(".", "/") if "." in mod else ""
        for p in (PKG / (rel + ".py"), PKG / rel / "__init__.py"):
            if rel and p.exists():
                return p
        return None

    seen: set[str] = set()
    todo = list(modules)
    while todo:
        mod = todo.pop()
        path = path_of(mod)
        if path is None or path.relative_to(PKG).as_posix() in seen:
            continue
        seen.add(path.relative_to(PKG).as_posix())
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                if target.split(".")[0] == "bigtcp_pcap":
                    todo.append(target)
                    todo.extend(f"{target}.{a.name}" for a in node.names)  # from . import reasons
            elif isinstance(node, ast.Import):
                todo.extend(a.name for a in node.names if a.name.split(".")[0] == "bigtcp_pcap")
    return sorted(seen)


_cache_dir_set = False


def prefetch(a, i) -> None:
    """Ask the CPU to bring element ``i`` of array ``a`` into its caches (LLVM ``llvm.prefetch``: a read, kept
    in every cache level) without waiting for it; in plain Python it does nothing. A hash probe whose slot is
    known a few rows ahead overlaps its cache miss with the rows in between instead of stalling on it."""


_prefetch_registered = False


def _register_prefetch(numba) -> None:
    global _prefetch_registered
    if _prefetch_registered:
        return
    _prefetch_registered = True
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic, overload

    @intrinsic
    def _llvm_prefetch(typingctx, arr, idx):
        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                                "llvm.prefetch.p0")
            builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
            return context.get_dummy_value()
        return types.void(arr, idx), codegen

    @overload(prefetch, inline="always")
    def _prefetch_impl(a, i):
        def impl(a, i):
            _llvm_prefetch(a, i)
        return impl


def _numba():
    """numba, with its on-disk cache in a directory named by the digest of the kernels' import closure.

    numba keys a cached function by the timestamp of the file that defines it and nothing else, so a change in
    a module it inlines from (gro/rules.py into gro/compiled.py) would silently reuse stale machine code. A
    cache directory per source digest cannot: any change to those files starts a fresh cache. A user's own
    NUMBA_CACHE_DIR wins."""
    global _cache_dir_set
    import numba

    _register_prefetch(numba)
    if not _cache_dir_set:
        _cache_dir_set = True
        if not os.environ.get("NUMBA_CACHE_DIR"):
            here = PKG / "__pycache__" / f"numba-{source_digest(import_closure())[:16]}"
            numba.config.CACHE_DIR = str(here)
            for old in here.parent.glob("numba-*"):  # caches of earlier sources are never read again
                if old != here:
                    shutil.rmtree(old, ignore_errors=True)
    return numba


_AOT, _EXPORTS, MODE = _load_aot()
_force_jit = False  # set while a private JIT copy of a kernel module is executing
_force_python = False  # set while a private plain-Python copy of a module is executing (``python_twin``)
compiled_only: dict[Any, str] = {}  # code object -> name of each loop the AOT module holds only inlined
fallbacks: dict[str, int] = {}  # entry point -> calls that ran on the JIT (argument types the build did not see)


# --- declared argument types of the entry points ------------------------------------------------------------
# ``@njit(entry=True, sig="u8[::1], i64, (u64[::1], u64[:]), ro u8[::1], bool")``: one string per compiled
# signature, the arguments in order. Arrays are ``<dtype>[dims]`` with ``::1`` on the last dimension for
# C-contiguous (``[:, ::1]`` a C 2-D array) or ``:`` only for any layout; ``ro`` marks a read-only array; scalars
# are a dtype (i64 takes Python ints) or ``bool``; ``( ... )`` is a tuple. dtypes: u8 u16 u32 u64 i8 i16 i32 i64
# b1 (bool) f64. build_kernels compiles exactly these; the guard below dispatches on them.
_DTYPES = {"u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64", "i8": "int8", "i16": "int16",
           "i32": "int32", "i64": "int64", "b1": "bool", "f64": "float64"}


def parse_sig(text: str) -> list[dict]:
    """The argument specs (the JSON form _kernels.json records) of one declared signature string."""
    return _parse_list(text.replace(" ", "").replace("\n", ""), 0, "")[0]


def _parse_list(t: str, pos: int, close: str) -> tuple[list[dict], int]:
    out: list[dict] = []
    while pos < len(t) and (not close or t[pos] != close):
        if t[pos] == "(":
            inner, pos = _parse_list(t, pos + 1, ")")
            out.append({"k": "tup", "items": inner})
            pos += 1  # ")"
        else:
            end = pos
            depth = 0
            while end < len(t) and (depth or t[end] not in ",)"):
                depth += t[end] == "["
                depth -= t[end] == "]"
                end += 1
            out.append(_parse_one(t[pos:end]))
            pos = end
        if pos < len(t) and t[pos] == ",":
            pos += 1
    return out, pos


def _parse_one(tok: str) -> dict:
    ro = tok.startswith("ro")
    if ro:
        tok = tok[2:]
    if tok == "bool":
        return {"k": "bool"}
    if "[" not in tok:
        dt = _DTYPES[tok]
        return {"k": "float", "dt": dt} if dt.startswith("float") else {"k": "int", "dt": dt}
    name, dims = tok[:-1].split("[", 1)
    parts = dims.split(",")
    lay = "C" if parts[-1] == "::1" else "A"
    return {"k": "arr", "dt": _DTYPES[name], "nd": len(parts), "lay": lay, "rw": not ro, "aligned": True}


def njit(*args: Any, entry: bool = False, sig: str | list[str] | None = None, **options: Any):
    """``numba.njit(cache=..., inline=...)``, or the ahead-of-time code for an ``entry=True`` loop, whose
    argument types are declared in ``sig`` (see ``parse_sig``)."""
    if args and callable(args[0]):
        return njit(entry=entry, sig=sig, **options)(args[0])

    def deco(f):
        if _force_python:
            return f
        if _AOT is None or _force_jit:
            numba = _numba()
            if entry:
                options.setdefault("nogil", RELEASE_GIL)
            disp = numba.njit(_nrt=False, **options)(f)  # no refcount atomics (module docstring)
            disp._bigtcp_entry = entry  # read by build_kernels
            disp._bigtcp_sigs = [parse_sig(x) for x in ([sig] if isinstance(sig, str) else sig or [])]
            return disp
        key = f"{f.__module__}.{f.__qualname__}"
        if entry and key in _EXPORTS:
            return _Guarded(f, key, _EXPORTS[key])
        compiled_only[f.__code__] = key  # a Python-level call of it is a missing entry=True (tests/test_native.py)
        return f  # only ever called from compiled code, which the module already holds
    return deco


class _Guarded:
    """An ahead-of-time entry point: dispatch on exact argument types, JIT for anything else."""

    def __init__(self, f, key: str, sigs: list[dict]) -> None:
        self.py_func = f
        self.key = key
        self.__doc__ = f.__doc__
        self._impls = []
        for s in sigs:
            check = _make_check(s["args"])
            self._impls.append((check, getattr(_AOT, s["symbol"])))
        self._jit = None

    def __call__(self, *args):
        for check, fn in self._impls:
            if check(*args):
                return fn(*args)
        fallbacks[self.key] = fallbacks.get(self.key, 0) + 1
        if self._jit is None:
            self._jit = _jit_twin(self.py_func.__module__, self.py_func.__qualname__)
        return self._jit(*args)


_twins: dict[str, Any] = {}
_py_twins: dict[str, Any] = {}


def python_twin(module: str):
    """A private copy of ``module`` in which every ``njit`` function stays plain Python (calls between them too).

    The readable reference engine runs the GRO rules this way: the same source the compiled engine inlines,
    on Python integers, with no compiled code in between (numba's dispatchers would refuse a uint64 digest
    above 2**63 as an int64 argument)."""
    global _force_python
    twin = _py_twins.get(module)
    if twin is None:
        spec = importlib.util.find_spec(module)
        twin = importlib.util.module_from_spec(spec)
        _force_python = True
        try:
            spec.loader.exec_module(twin)
        finally:
            _force_python = False
        _py_twins[module] = twin
    return twin


def _jit_twin(module: str, qualname: str):
    """The numba dispatcher of ``module.qualname``, from a private copy of the module compiled with the JIT.

    The copy's compiled loops call helpers imported from other kernel modules (``flows.table._fmix`` in
    ``gro/evidence.py``): in the loaded modules those are plain functions (the ahead-of-time module holds them
    inlined) or guarded entry points, which numba cannot type, so each is replaced by its JIT twin as well."""
    global _force_jit
    twin = _twins.get(module)
    if twin is None:
        spec = importlib.util.find_spec(module)
        twin = importlib.util.module_from_spec(spec)
        _force_jit = True
        try:
            spec.loader.exec_module(twin)
        finally:
            _force_jit = False
        _twins[module] = twin
        for name, v in list(vars(twin).items()):
            if isinstance(v, _Guarded):
                setattr(twin, name, _jit_twin(v.py_func.__module__, v.py_func.__qualname__))
            elif getattr(v, "__code__", None) in compiled_only and v.__module__ != module:
                setattr(twin, name, _jit_twin(v.__module__, v.__qualname__))
    return getattr(twin, qualname)


def _make_check(specs: list[dict]):
    """A function of the positional arguments: True when each has exactly the compiled type."""
    env: dict[str, Any] = {"ndarray": np.ndarray, "np": np, "bool_": np.bool_}
    conds: list[str] = []

    def cond(expr: str, s: dict) -> None:
        k = s["k"]
        if k == "arr":
            name = f"D{len(env)}"
            env[name] = np.dtype(s["dt"])
            conds.append(f"type({expr}) is ndarray and {expr}.dtype == {name} and {expr}.ndim == {s['nd']}")
            if s["lay"] == "C":
                conds.append(f"{expr}.flags.c_contiguous")
            elif s["lay"] == "F":
                conds.append(f"{expr}.flags.f_contiguous")
            conds.append(f"{expr}.flags.writeable" if s["rw"] else f"not {expr}.flags.writeable")
            if s["aligned"]:
                conds.append(f"{expr}.flags.aligned")
        elif k == "bool":
            conds.append(f"(type({expr}) is bool or type({expr}) is bool_)")
        elif k == "int":
            name = f"D{len(env)}"
            env[name] = np.dtype(s["dt"])
            py = f" or (type({expr}) is int)" if s["dt"] == "int64" else ""
            conds.append(f"((isinstance({expr}, np.integer) and {expr}.dtype == {name}){py})")
        elif k == "float":
            name = f"D{len(env)}"
            env[name] = np.dtype(s["dt"])
            py = f" or (type({expr}) is float)" if s["dt"] == "float64" else ""
            conds.append(f"((isinstance({expr}, np.floating) and {expr}.dtype == {name}){py})")
        elif k == "tup":
            conds.append(f"type({expr}) is tuple and len({expr}) == {len(s['items'])}")
            for j, item in enumerate(s["items"]):
                cond(f"{expr}[{j}]", item)
        else:  # pragma: no cover - the build only writes the kinds above
            raise ValueError(f"unknown argument kind {k!r}")

    names = [f"a{i}" for i in range(len(specs))]
    for n, s in zip(names, specs):
        cond(n, s)
    # a call with another number of arguments must fail the check, not raise TypeError
    body = " and ".join(conds) or "True"
    src = (f"def check(*args):\n    if len(args) != {len(specs)}:\n        return False\n"
           f"    {', '.join(names)}{',' if len(names) == 1 else ''} = args\n    return {body}\n")
    if not names:
        src = "def check(*args):\n    return not args\n"
    exec(src, env)  # noqa: S102 - generated from the build's own type table
    return env["check"]
