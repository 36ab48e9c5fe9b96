"""Many captures as one dataset, and one capture over several processes or a Dask cluster.

``analyze_many(paths, outdir)`` writes ``OUTDIR/<table>/capture=<name>/part-0.parquet`` for every table: a
hive-partitioned Parquet dataset that pandas, pyarrow.dataset, DuckDB and Dask read as one table with a
``capture`` column. The unit of work is a task: one capture, or one part of a capture cut at an idle gap
(``split.py``; merged exactly by ``merge.py``). Tasks run in this process (``jobs=1``), in ``jobs`` worker
processes, or on a ``dask.distributed`` cluster (``client=``). A task writes its own files under deterministic
names (a retried task overwrites them) and returns only paths and its summary. A capture that fails is
reported and marked in its partition (a ``capture_partial`` error row in ``findings``); the others finish.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from . import findings as F
from .buffers import tune_malloc
from .errors import make_outdir
from .split import DEFAULT_ACK_DELAY_NS, Part, PartReader, find_parts, idle_gap_ns, part_name, whole

CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".cap", ".ntar", ".gz", ".bz2", ".xz", ".zst")


def expand_paths(args: Iterable[str | os.PathLike]) -> list[str]:
    """Capture paths from arguments that are files, directories (their capture files) or globs."""
    out: list[str] = []
    for a in args:
        s = str(a)
        if os.path.isdir(s):
            out += sorted(str(p) for p in Path(s).iterdir() if p.is_file() and not p.name.startswith(".")
                          and p.name.lower().endswith(CAPTURE_SUFFIXES))
        elif any(c in s for c in "*?[") and not os.path.exists(s):
            out += sorted(glob.glob(s))
        else:
            out.append(s)
    return out


def partition_names(paths: list[str]) -> list[str]:
    """The ``capture=`` value of each path: its file name made path-safe, unique within the run."""
    seen: dict[str, int] = {}
    names = []
    for p in paths:
        n = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(p.rstrip("/"))) or "capture"
        k = seen.get(n, 0)
        seen[n] = k + 1
        names.append(n if k == 0 else f"{n}-{k + 1}")
    return names


def warm() -> str:
    """Load (or JIT-compile) the kernels in this process by analysing the bundled sample; the kernel mode."""
    from . import _native
    from .api import analyze

    with tempfile.TemporaryDirectory(prefix="bigtcp-warm-") as d:
        analyze(None, outdir=d)
    return _native.MODE


def run_task(task: dict) -> dict:
    """One unit of work: analyse a capture or a part into ``task['outdir']``; returns paths and the summary.

    With ``task['dataset']`` (a whole capture of a dataset run) the tables are then moved to their partition
    ``DATASET/<table>/capture=<name>/part-0.parquet``. Never raises for a bad capture: ``error`` says it.
    """
    from .api import analyze
    from .errors import CaptureError, UsageError

    tune_malloc()
    part: Part | None = task.get("part")
    out = Path(task["outdir"])
    src: Any = task["path"] if part is None or part.records < 0 else PartReader(part)
    res: dict[str, Any] = {"name": task["name"], "path": task["path"], "outdir": str(out), "error": None,
                           "partial": False, "summary": None, "files": [], "largest_superpacket": None}
    try:
        a = analyze(src, outdir=out, name=task["path"], **task["kw"])
        res["summary"] = a.summary
        res["partial"] = a.error is not None
        res["error"] = a.error.one_line() if a.error else None
        flows = out / "flows.parquet"
        if flows.exists():
            from .output.parquet import column_max

            res["largest_superpacket"] = column_max(flows, "max_superpacket_len")
    except (CaptureError, UsageError) as e:
        res["error"] = e.one_line() if isinstance(e, CaptureError) else str(e)
    except Exception as e:  # noqa: BLE001 - a bug must not stop the other captures; it is reported with its type
        res["error"] = f"{task['path']}: {type(e).__name__}: {e}"
    if task.get("dataset"):
        res["files"] = place(Path(task["dataset"]), task["name"], out, res)
        shutil.rmtree(out, ignore_errors=True)
    return res


def place(dataset: Path, name: str, src: Path, res: dict) -> list[str]:
    """Move a capture's tables into their partitions (replacing an earlier run's); mark a failed capture."""
    from .output.tables import TABLES

    files = []
    for t in TABLES:
        d = dataset / t / f"capture={name}"
        shutil.rmtree(d, ignore_errors=True)
        f = src / f"{t}.parquet"
        if f.exists():
            d.mkdir(parents=True, exist_ok=True)
            os.replace(f, d / "part-0.parquet")
            files.append(str(d / "part-0.parquet"))
    if res["summary"] is None:  # could not be analysed at all: one error row says so in the dataset
        import pyarrow as pa
        import pyarrow.parquet as pq

        from .output.parquet import FINDINGS_SCHEMA

        d = dataset / "findings" / f"capture={name}"
        d.mkdir(parents=True, exist_ok=True)
        code = F.BY_ID[F.CAPTURE_PARTIAL]
        pq.write_table(pa.table({"frame": [0], "code": [code.code], "severity": [F.ERROR],
                                 "message": [res["error"]]}, schema=FINDINGS_SCHEMA), d / "part-0.parquet")
        files.append(str(d / "part-0.parquet"))
    return files


# threads that survive a fork by design: jemalloc's background purger (pyarrow) re-arms itself in the child
_FORK_SAFE_THREADS = {"jemalloc_bg_thd"}


def _fork_is_safe() -> bool:
    """True when this process has no thread but the main one and threads known to be fork-safe (Linux: read
    from /proc). A thread that could hold a lock at the fork (a writer, pyarrow's pool) rules fork out, and the
    workers come from a fork server instead."""
    if os.environ.get("BIGTCP_PCAP_NO_FORK"):
        return False
    try:
        tasks = os.listdir("/proc/self/task")
        names = []
        for t in tasks:
            if int(t) != os.getpid():
                with open(f"/proc/self/task/{t}/comm") as f:
                    names.append(f.read().strip())
    except (OSError, ValueError):
        return False
    return all(n in _FORK_SAFE_THREADS for n in names)


class _Runner:
    """Runs tasks in this process, in worker processes, or on a Dask client; results in task order."""

    def __init__(self, jobs: int = 1, client: Any = None) -> None:
        self.jobs = max(1, jobs)
        self.client = client
        self._pool: ProcessPoolExecutor | None = None

    @property
    def workers(self) -> int:
        if self.client is not None:
            return max(1, sum(self.client.nthreads().values()))
        return self.jobs

    def __enter__(self) -> Self:
        if self.client is not None:
            self.client.run(warm)  # compile/load the kernels once per worker, before the first real task
        return self

    def _workers(self) -> ProcessPoolExecutor:
        """The process pool, made at the first tasks: forked from this process when that is safe then (the
        workers start with its imports and kernels: ~0.4 s less each), else from a fork server."""
        if self._pool is None:
            import multiprocessing as mp

            if _fork_is_safe():
                ctx = mp.get_context("fork")
            else:
                ctx = mp.get_context("forkserver")
                ctx.set_forkserver_preload(["bigtcp_pcap.api", "bigtcp_pcap.many"])
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=ctx)
        return self._pool

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def map(self, tasks: list[dict], meanwhile: Any = None) -> list[dict]:
        """The results of ``tasks`` in order; ``meanwhile()`` runs here while worker processes work."""
        if not tasks:
            return []
        if self.client is not None:
            import hashlib

            keys = ["bigtcp-" + hashlib.sha1(repr((t["path"], t["outdir"], t.get("part"))).encode()).hexdigest()
                    for t in tasks]
            futs = self.client.map(run_task, tasks, key=keys, pure=False, retries=1)
            if meanwhile is not None:
                meanwhile()
            return self.client.gather(futs)
        if self.jobs > 1:
            pool = self._workers()
            futs = [pool.submit(run_task, t) for t in tasks]  # the workers are forked here, before...
            if meanwhile is not None:
                meanwhile()  # ...this process does anything else (it may start threads)
            return [f.result() for f in futs]
        return [run_task(t) for t in tasks]


def _split_tasks(path: str, name: str, work: Path, nparts: int, kw: dict) -> tuple[list[Part], list[dict]]:
    part_packets = kw.pop("part_packets", False)
    gro = kw.get("gro")
    gap = idle_gap_ns(gro.poll_gap_us, gro.gro_flush_timeout_ns, kw.pop("ack_delay_ns", None) or DEFAULT_ACK_DELAY_NS)
    parts = find_parts(path, nparts, gap)
    if len(parts) < 2:
        return parts, []
    # the parts write what the merge needs of every packet (flow_state: merge_rows.parquet, flow_state.parquet),
    # not their packets tables unless those are asked for (part_packets, or packets=True for the merged table)
    pkw = dict(kw, wireshark_sidecar=False, packets=kw.get("packets", False) or part_packets, flow_state=True)
    # what a serial run reads off its first batch, the whole capture's in every part: the default audit's port,
    # and the fallback MTU where it is not given
    port, mtu = _first_batch_facts(path)
    if kw.get("filters") is None:
        pkw["default_audit_port"] = port
    if gro is None or gro.fallback_mtu is None:
        pkw["capture_mtu"] = mtu
    return parts, [{"path": path, "name": name, "part": p, "outdir": str(work / part_name(p)), "kw": pkw}
                   for p in parts]


def _load_merge() -> None:
    """Import the merge (pandas, ~0.4 s) while the parts run, not after."""
    from . import merge  # noqa: F401


def _first_batch_facts(path: str) -> tuple[int | None, int | None]:
    """What a serial run of ``path`` reads off its first batch: the default audit's ``tcp port P`` (the busiest
    port; -1: none) and the fallback MTU (``gro.stage.capture_mtu``; 0: none)."""
    from .api import iter_batches
    from .audit.stage import busiest_port
    from .errors import CaptureError
    from .gro.stage import capture_mtu

    try:
        for pb, _ in iter_batches(path):
            port = busiest_port(pb)
            return (-1 if port is None else port), capture_mtu(pb)
    except CaptureError:  # damaged at its start: each part chooses, and differing parts mean a serial run
        return None, None
    return -1, 0


def _finish_split(path: str, name: str, parts: list[Part], tasks: list[dict], results: list[dict], out: Path,
                  kw: dict, runner: _Runner) -> dict:
    """Merge a split capture's parts into ``out``; a serial run instead if a part could not be merged exactly."""
    from .flows.table import CLOSE_TIMEOUT_NS, IDLE_TIMEOUT_NS
    from .merge import NeedPackets, NotExact, merge_parts

    ok = all(r["summary"] is not None and r["error"] is None for r in results) and \
        len({tuple(r["summary"]["filter_audit"]["audited"]) for r in results}) == 1
    if not ok:  # a damaged part or parts that audited different default filters: the serial run decides
        return dict(run_task({"path": path, "name": name, "part": None, "outdir": str(out), "kw": kw}),
                    serial_because="a part failed or the parts audited different default filters")
    def merged(results: list[dict]) -> dict:
        return merge_parts(parts, [Path(r["outdir"]) for r in results], [r["summary"] for r in results], out,
                           packets=kw.get("packets", False), explicit=kw.get("filters") is not None,
                           gro=kw.get("gro"), gro_engine=kw.get("gro_engine", "compiled"),
                           flow_timeouts_s=(kw.get("flow_idle_timeout_s", IDLE_TIMEOUT_NS / 1e9),
                                            kw.get("flow_close_timeout_s", CLOSE_TIMEOUT_NS / 1e9)))

    try:
        try:
            summary = merged(results)
        except NeedPackets:  # a flow crosses a cut: once more with the parts' packets (its rows are recomputed)
            results = runner.map([dict(t, kw=dict(t["kw"], packets=True)) for t in tasks])
            summary = merged(results)
    except NotExact as e:  # the parts' facts do not decide some rows across a cut: the serial run does
        for r in results:
            shutil.rmtree(r["outdir"], ignore_errors=True)
        return dict(run_task({"path": path, "name": name, "part": None, "outdir": str(out), "kw": kw}),
                    serial_because=str(e))
    for r in results:
        shutil.rmtree(r["outdir"], ignore_errors=True)
    from .output.parquet import column_max

    big = column_max(out / "flows.parquet", "max_superpacket_len")
    return {"name": name, "path": path, "outdir": str(out), "error": None, "partial": False, "summary": summary,
            "files": [], "largest_superpacket": big}


def analyze_split(path: str | os.PathLike, outdir: str | os.PathLike, *, jobs: int = 2, client: Any = None,
                  parts: int | None = None, ack_delay_ns: int | None = None, part_packets: bool = False,
                  **kw: Any):
    """``analyze(path, outdir=..., **kw)`` with the capture cut at idle gaps into ``parts`` (default: the
    number of workers) and the parts analysed in parallel; the tables equal the serial run's (``merge.py``).
    ``ack_delay_ns``: the longest ACK delay accepted as poll evidence (default 200 ms; ``split.py``).
    ``part_packets=True``: parts also write their packets tables (the merge reads the narrow rows every part
    writes for it, ``merge_rows.parquet``, instead; a merge without either runs the parts again).
    Returns an ``Analysis``."""
    from .api import Analysis, analyze
    from .capture.reader import CaptureInfo
    from .gro.config import GroConfig

    kw = _gro_kw(kw)
    out = Path(outdir)
    path = str(path)
    with _Runner(jobs, client) as runner:
        ps, tasks = _split_tasks(path, Path(path).name, out / "_parts", parts or runner.workers,
                                 dict(kw, ack_delay_ns=ack_delay_ns, part_packets=part_packets))
        if not tasks:
            return analyze(path, outdir=out, **kw)
        res = _finish_split(path, Path(path).name, ps, tasks, runner.map(tasks, meanwhile=_load_merge), out, kw,
                            runner)
    shutil.rmtree(out / "_parts", ignore_errors=True)
    if res["error"] is not None or res["summary"] is None:
        return analyze(path, outdir=out, **kw)
    s = res["summary"]
    if not res.get("serial_because"):  # a serial fallback wrote its own
        from .output.report import write_summary

        write_summary(out / "summary.json", s)
    info = CaptureInfo(name=path, size=s["capture"]["size"], format="pcap", packets=s["capture"]["packets"],
                       first_ts_ns=ps[0].ts_first_ns, last_ts_ns=ps[-1].ts_last_ns)
    gro = kw.get("gro") or GroConfig()
    params = {"gro": gro.to_metadata(), "parts": 1 if res.get("serial_because") else len(ps)}
    if res.get("serial_because"):
        params["serial_because"] = res["serial_because"]
    return Analysis(outdir=out, info=info, params=params, summary=s, error=None)


def _gro_kw(kw: dict) -> dict:
    """``gro=`` or GRO keywords -> a ``gro=GroConfig`` entry (tasks carry one picklable config)."""
    from .gro.config import GroConfig

    names = set(GroConfig.__dataclass_fields__)
    gro_params = {k: kw.pop(k) for k in list(kw) if k in names}
    if kw.get("gro") is not None and gro_params:
        raise TypeError("give gro= or GRO keywords, not both")
    if kw.get("gro") is None:
        kw["gro"] = GroConfig(**gro_params)
    return kw


@dataclass
class ManyAnalysis:
    """What ``analyze_many`` produced: the dataset directory and one result per capture."""

    outdir: Path
    captures: list[dict] = field(default_factory=list)

    def table(self, name: str):
        """One table of every capture as a pandas DataFrame (with a ``capture`` column)."""
        import pandas as pd

        return pd.read_parquet(self.outdir / name)

    @property
    def failed(self) -> list[dict]:
        """The captures that could not be analysed, or only partly."""
        return [c for c in self.captures if c["error"] is not None]

    @property
    def summary(self) -> dict:
        """One line per capture and the totals (what ``analyze --json`` prints for several captures)."""
        lines = [capture_line(c) for c in self.captures]
        tot: dict[str, Any] = {"captures": len(lines), "failed": sum(1 for c in lines if c["error"])}
        for k in ("packets", "bigtcp_packets", "flows", "findings", "filter_misses"):
            tot[k] = sum(c[k] or 0 for c in lines)
        tot["bigtcp_share"] = round(tot["bigtcp_packets"] / tot["packets"], 6) if tot["packets"] else 0.0
        sizes = [c["largest_superpacket"] for c in lines if c["largest_superpacket"] is not None]
        tot["largest_superpacket"] = max(sizes) if sizes else None
        return {"dataset": str(self.outdir), "captures": lines, "totals": tot}


def capture_line(c: dict) -> dict:
    """The summary line of one capture of a dataset run."""
    s = c["summary"]
    if s is None:
        return {"capture": c["name"], "path": c["path"], "packets": None, "bigtcp_packets": None,
                "bigtcp_share": None, "flows": None, "largest_superpacket": None, "findings": None,
                "filter_misses": None, "error": c["error"], "partial": True}
    pk = s["capture"]["packets"]
    big = sum(s["bigtcp"].values())
    return {"capture": c["name"], "path": c["path"], "packets": pk, "bigtcp_packets": big,
            "bigtcp_share": round(big / pk, 6) if pk else 0.0, "flows": s["flows"],
            "largest_superpacket": c["largest_superpacket"], "findings": sum(s["findings"].values()),
            "filter_misses": sum(r.get("missed", 0) for r in s["filter_audit"]["results"]),
            "error": c["error"], "partial": c["partial"]}


def analyze_many(paths: Iterable[str | os.PathLike], outdir: str | os.PathLike, *, jobs: int = 1,
                 client: Any = None, split: bool | None = None, ack_delay_ns: int | None = None,
                 **kw: Any) -> ManyAnalysis:
    """Analyse many captures into one hive-partitioned dataset ``OUTDIR/<table>/capture=<name>/``.

    ``paths``: files, directories or globs (``expand_paths``). ``jobs``: worker processes; ``client``: a
    ``dask.distributed.Client`` (tasks on its cluster; workers need the package and the paths). ``split``:
    also cut captures at idle gaps into parts (default: when there are fewer captures than workers).
    ``**kw``: the keywords of ``analyze`` (``packets=``, ``gro=`` or GRO keywords, ``filters=`` ...).
    """
    kw = _gro_kw(dict(kw))
    files = expand_paths(paths)
    names = partition_names(files)
    out = make_outdir(outdir)
    work = out / "_work"
    results: list[dict | None] = [None] * len(files)
    with _Runner(jobs, client) as runner:
        do_split = split if split is not None else len(files) < runner.workers
        tasks, splits = [], {}
        for i, (p, n) in enumerate(zip(files, names)):
            ps, st = _split_tasks(p, n, work / n, runner.workers, dict(kw, ack_delay_ns=ack_delay_ns)) \
                if do_split and os.path.isfile(p) else ([whole(p)] if os.path.exists(p) else [], [])
            if st:
                splits[i] = (ps, len(tasks), len(st))
                tasks += st
            else:
                tasks.append({"path": p, "name": n, "part": None, "outdir": str(work / n), "kw": kw,
                              "dataset": str(out), "_i": i})
        done = runner.map(tasks)
        for t, r in zip(tasks, done):
            if "_i" in t:
                results[t["_i"]] = r
        for i, (ps, a, k) in splits.items():
            tmp = work / f"{names[i]}-merged"
            r = _finish_split(files[i], names[i], ps, tasks[a:a + k], done[a:a + k], tmp, kw, runner)
            r["files"] = place(out, names[i], tmp, r)
            shutil.rmtree(tmp, ignore_errors=True)
            results[i] = r
    shutil.rmtree(work, ignore_errors=True)
    _drop_stale_partitions(out, set(names))
    return ManyAnalysis(outdir=out, captures=[r for r in results if r is not None])


def _drop_stale_partitions(out: Path, names: set[str]) -> None:
    """Remove the ``capture=`` partitions an earlier run left in the dataset: a reader of ``OUTDIR/<table>`` would
    count them with this run's captures (the summary would say 2 captures, the tables hold 3)."""
    for table in out.iterdir():
        if not table.is_dir() or table.name.startswith("_"):
            continue
        for part in table.glob("capture=*"):
            if part.is_dir() and part.name[len("capture="):] not in names:
                shutil.rmtree(part, ignore_errors=True)
