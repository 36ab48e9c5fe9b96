"""Faults on either side lose nothing (issue 14): damaged compressed input keeps its decodable prefix, a
decompression bomb is refused after the first bytes, output faults are exit 4 with one line and no half-written
table, interrupts finish every table marked partial, a usage error leaves the earlier run's tables alone."""

from __future__ import annotations

import bz2
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from oracle import KERNEL, need_tshark, read_pcap_records

from bigtcp_pcap.output.parquet import read_metadata

SND = KERNEL / "v6_185000.snd.pcap"
CLI = [sys.executable, "-m", "bigtcp_pcap.cli"]
TABLES = ("findings", "flows", "superpackets")
COMPRESSORS = {"gz": ["gzip", "-c"], "xz": ["xz", "-c", "--block-size=16KiB"], "bz2": ["bzip2", "-c", "-1"],
               "zst": ["zstd", "-q", "-c"]}
DECOMPRESSORS = {"gz": ["gzip", "-dc"], "xz": ["xz", "-dc"], "bz2": ["bzip2", "-dc"], "zst": ["zstd", "-q", "-dc"]}


def cli(*args, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, **kw)


def error_lines(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.strip()]


def no_temp_files(d: Path) -> bool:
    return not any(p.name.endswith(".tmp") for p in d.iterdir())


@pytest.mark.parametrize("kind", sorted(COMPRESSORS))
def test_truncated_compressed_capture_keeps_its_decompressible_prefix(tmp_path, kind):
    """Oracle: the system decompressor's output of the cut file, read by tshark (frames wholly present)."""
    if shutil.which(COMPRESSORS[kind][0]) is None:
        pytest.skip(f"{COMPRESSORS[kind][0]} not installed")
    big = tmp_path / "big.pcap"
    recs = read_pcap_records(SND)
    big.write_bytes(SND.read_bytes()[:24] + b"".join(
        struct.pack("<IIII", 1, i, len(d), w) + d for i, (d, w) in enumerate(recs * 8)))  # ~2 MB, several blocks
    packed = subprocess.run([*COMPRESSORS[kind], str(big)], capture_output=True, check=True).stdout
    for frac in (0.3, 0.77):
        cut = int(len(packed) * frac)
        bad = tmp_path / f"cut.pcap.{kind}"
        bad.write_bytes(packed[:cut])
        prefix = tmp_path / "prefix.pcap"
        if kind == "bz2":  # bzip2(1) drops its last (up to 5000-byte) output buffer at the error: libbz2 itself
            dec = bz2.BZ2Decompressor()
            prefix.write_bytes(b"".join(dec.decompress(packed[i:min(i + 4096, cut)]) for i in range(0, cut, 4096)))
        else:
            prefix.write_bytes(subprocess.run([*DECOMPRESSORS[kind], str(bad)], check=False,
                                              capture_output=True).stdout)
        want = _tshark_frames(prefix)
        out = tmp_path / f"out{frac}"
        res = cli("analyze", bad, "-o", out, "--no-audit", "--no-progress", "--packets")
        assert res.returncode == 3, res.stderr
        assert pq.read_table(out / "packets.parquet").num_rows == want > 0
        (line,) = error_lines(res)
        assert str(bad) in line and "frame" in line and "byte offset" in line and "marked partial" in line
        assert read_metadata(out / "flows.parquet")["partial"] is True


def _tshark_frames(path: Path) -> int:
    """Frames tshark reads from a capture cut short (it exits 2 at the cut, after printing the whole ones)."""
    r = subprocess.run([need_tshark(), "-r", str(path), "-T", "fields", "-e", "frame.number"], check=False,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 2), r.stderr
    return len(r.stdout.split())


def _peak_rss_mib(code: str) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of a child Python running ``code``."""
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return time.perf_counter() - t, float(res.stdout.split()[-1])


BOMB_CHILD = """
import io, resource, sys, zstandard, gzip
from bigtcp_pcap.capture.reader import CaptureReader
from bigtcp_pcap.errors import CaptureError
kind = sys.argv[1] if len(sys.argv) > 1 else "{kind}"
if "{kind}" == "zst":
    data = zstandard.ZstdCompressor().compress(bytes(128 << 20)) * 32  # 4 GiB of zeros in ~130 KB
elif "{kind}" == "gz":
    data = gzip.compress(bytes(64 << 20), 9) * 64
else:
    data = open("{small}", "rb").read()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    for _ in CaptureReader(io.BytesIO(data)):
        pass
    ok = True
except CaptureError as e:
    ok = "not a pcap" in str(e)
assert ok
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
"""


@pytest.mark.parametrize("kind", ["zst", "gz"])
def test_decompression_bomb_is_refused_after_the_first_bytes(kind):
    """A 4 GiB-of-zeros bomb took 15.8 s and 4.2 GB before 'not a pcap': now the magic is sniffed from the first
    decompressed bytes, output is bounded per read."""
    pytest.importorskip("zstandard")
    t = time.perf_counter()
    _, grew = _peak_rss_mib(BOMB_CHILD.format(kind=kind, small=SND))
    assert grew < 64, f"peak RSS grew by {grew:.0f} MiB while refusing the bomb"
    assert time.perf_counter() - t < 30  # start-up included; the read itself is timed below
    code = BOMB_CHILD.format(kind=kind, small=SND).replace("base = resource", "import time; t0 = time.perf_counter()"
                                                          "\nbase = resource").replace(
        "print((resource", "print(time.perf_counter() - t0, (resource")
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert float(res.stdout.split()[0]) < 0.5, res.stdout


# --- output faults ------------------------------------------------------------------------------------------------
def test_output_path_is_a_file_or_below_one(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    for out in (f, f / "sub"):
        res = cli("analyze", SND, "-o", out, "--no-progress")
        assert res.returncode == 4
        (line,) = error_lines(res)
        assert line.startswith(f"bigtcp-pcap: {out}: cannot make the output directory: ")
        assert "File exists" in line or "Not a directory" in line
    assert f.read_text() == "x"


@pytest.fixture
def mount_tmpfs(tmp_path):
    mounted = []

    def mount(name: str, opts: str) -> Path:
        d = tmp_path / name
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(d)], check=False, capture_output=True)
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()}): needs root")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", str(d)], check=False, capture_output=True)


def test_read_only_filesystem(mount_tmpfs):
    ro = mount_tmpfs("ro", "ro,size=1m")
    for out in (ro, ro / "sub"):
        res = cli("analyze", SND, "-o", out, "--no-progress")
        assert res.returncode == 4
        (line,) = error_lines(res)
        assert "Read-only file system" in line and str(out) in line


def test_full_filesystem_keeps_the_other_tables_marked_partial(mount_tmpfs):
    full = mount_tmpfs("full", "size=24k")
    res = cli("analyze", SND, "-o", full, "--packets", "--no-progress")
    assert res.returncode == 4
    (line,) = error_lines(res)
    assert "No space left on device" in line and "marked partial" in line
    assert no_temp_files(full)
    written = sorted(p.stem for p in full.glob("*.parquet"))
    assert written and "packets" not in written  # no half-written table under its name
    for name in written:
        meta = read_metadata(full / f"{name}.parquet")  # readable: footer and metadata present
        assert meta["partial"] is True and "No space left on device" in meta["error"]
    if "findings" in written:
        codes = pq.read_table(full / "findings.parquet").column("code").to_pylist()
        assert "output.write_failed" in codes


def test_no_permission(request):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the CLI as another user")
    base = Path(tempfile.mkdtemp(prefix="bigtcp-noperm-"))  # outside pytest's 0700 tree: the user must reach it
    base.chmod(0o755)
    d = base / "locked"
    d.mkdir()
    d.chmod(0o555)
    cache = base / "numba-cache"  # the JIT (when the ahead-of-time kernels are stale) needs a writable cache
    cache.mkdir()
    cache.chmod(0o777)
    snd = base / "snd.pcap"
    shutil.copy(SND, snd)
    snd.chmod(0o644)
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *CLI, "analyze", str(snd),
                          "-o", str(d), "--no-progress"], check=False, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NUMBA_CACHE_DIR": str(cache)})
    assert res.returncode == 4, res.stderr
    (line,) = error_lines(res)
    assert "Permission denied" in line and str(d) in line
    assert list(d.iterdir()) == []


def test_usage_error_leaves_the_earlier_tables_alone(tmp_path):
    out = tmp_path / "out"
    assert cli("analyze", SND, "-o", out, "--no-progress").returncode in (0, 1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for bad in (["--filter", "tcp and and"], ["--napi-weight", "0"], ["--rx-queues", "x"], ["--bogus"]):
        res = cli("analyze", SND, "-o", out, "--no-progress", *bad)
        assert res.returncode == 2, (bad, res.stderr)
        assert len(error_lines(res)) == 1, res.stderr
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("jobs", [[], ["--jobs", "2"]])
def test_error_run_prints_one_stderr_line(tmp_path, jobs):
    raw = SND.read_bytes()
    bad = tmp_path / "cut.pcap"
    bad.write_bytes(raw[:len(raw) // 2])
    res = cli("analyze", bad, "-o", tmp_path / "out", "--no-progress", *jobs)
    assert res.returncode == 3
    (line,) = error_lines(res)  # --jobs printed "tables written to ..." before the error line
    assert f"tables written to {tmp_path / 'out'}/, marked partial" in line and "byte offset" in line


# --- interrupts ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_finishes_every_table_marked_partial(tmp_path, sig):
    """An endless capture on stdin (``tcpdump -w - | bigtcp-pcap analyze -``), then SIGINT / SIGTERM."""
    recs = read_pcap_records(SND)
    header = SND.read_bytes()[:24]
    chunk = b"".join(struct.pack("<IIII", 1, i, len(d), w) + d for i, (d, w) in enumerate(recs))
    out = tmp_path / "out"
    p = subprocess.Popen([*CLI, "analyze", "-", "-o", str(out), "--packets", "--no-progress"], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def feed() -> None:
        try:
            p.stdin.write(header)
            while True:
                p.stdin.write(chunk)
        except (BrokenPipeError, ValueError, OSError):
            pass

    threading.Thread(target=feed, daemon=True).start()
    deadline = time.time() + 60
    while time.time() < deadline and not (out.exists() and any(out.glob(".packets.parquet.*.tmp"))):
        time.sleep(0.1)
    time.sleep(1.0)  # some batches in
    p.send_signal(sig)
    err = p.stderr.read().decode()
    rc = p.wait(timeout=60)
    assert rc == 128 + sig
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert f"interrupted by {sig.name}" in line and "marked partial" in line
    assert no_temp_files(out)
    n = pq.read_table(out / "packets.parquet").num_rows
    assert n > 0 and f"frames 1-{n}" in line
    for name in ("packets", *TABLES):
        meta = read_metadata(out / f"{name}.parquet")
        assert meta["partial"] is True and sig.name in meta["error"]
    codes = pq.read_table(out / "findings.parquet").column("code").to_pylist()
    assert "capture.interrupted" in codes


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_on_a_quiet_pipe_ends_at_once_with_every_frame(tmp_path, sig):
    """A live capture that goes quiet (``tcpdump -w - |`` on an idle link): the frames that came are analysed
    before more arrive (a pipe is read as the bytes come, not a buffer's worth at a time), and one SIGINT /
    SIGTERM ends the run while it waits. It waited for the writer to send more or close: the run only ended
    when the writer did (the pipe stays open here until the run has ended)."""
    want = len(read_pcap_records(SND))
    out = tmp_path / "out"
    p = subprocess.Popen([*CLI, "analyze", "-", "-o", str(out), "--packets", "--no-progress"], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        p.stdin.write(SND.read_bytes())  # every frame, then nothing (the pipe stays open)
        p.stdin.flush()
        # the frames are analysed while the pipe is open: the flow table writes its rows at the end only, but the
        # packets table's row groups stream (its temporary file grows)
        deadline = time.time() + 60
        while time.time() < deadline and not (out.exists() and any(out.glob(".packets.parquet.*.tmp"))):
            time.sleep(0.1)
        time.sleep(2.0)
        p.send_signal(sig)
        rc = p.wait(timeout=30)  # (before the fix: until the writer closed the pipe)
        err = p.stderr.read().decode()
    finally:
        if p.poll() is None:
            p.kill()
        p.stdin.close()
    assert rc == 128 + sig, err
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert f"interrupted by {sig.name}" in line and f"frames 1-{want}" in line, line
    assert pq.read_table(out / "packets.parquet").num_rows == want
    assert read_metadata(out / "flows.parquet")["partial"] is True
    # every frame came: the flows and super-packets are those of the whole file
    full = tmp_path / "full"
    assert cli("analyze", SND, "-o", full, "--no-progress").returncode in (0, 1)
    for name, cols in (("flows", ["src", "dst", "sport", "dport", "packets", "payload_bytes", "superpackets"]),
                       ("superpackets", ["sport", "dport", "seq_first", "payload_len", "n_segments", "poll_end"])):
        got, ref = (pq.read_table(d / f"{name}.parquet").to_pandas()[cols].astype(str).sort_values(cols)
                    .reset_index(drop=True) for d in (out, full))
        assert len(ref) > 2 and got.equals(ref), name


def test_sidecar_from_stdin_is_a_usage_error_before_any_work(tmp_path):
    # the sidecar is matched to a capture file by name and size: from a stream it raised a ValueError traceback
    # after the tables were written
    with open(SND, "rb") as f:
        res = subprocess.run([*CLI, "analyze", "-", "-o", str(tmp_path / "out"), "--wireshark-sidecar"], stdin=f,
                             capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    (line,) = error_lines(res)
    assert "--wireshark-sidecar needs a capture file" in line and not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad", [["--flow-close-timeout", "inf"], ["--flow-idle-timeout", "1e10"],
                                 ["--flow-idle-timeout", "1e-12"], ["--rx-queues", "9223372036854775807"],
                                 ["--gro-hash-buckets", "9223372036854775807"], ["--dask", "local:x"],
                                 ["--dask", "local:0"]])
def test_out_of_range_options_are_one_usage_line(tmp_path, bad):
    # each was a traceback (OverflowError, ValueError "array is too big", int("x")); ":x" printed as an emoji
    res = cli("analyze", SND, "-o", tmp_path / "out", "--no-progress", *bad)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    (line,) = error_lines(res)
    assert line.startswith("bigtcp-pcap: ") and bad[0] in line and ":x:" not in line.replace("local:x:", "")


def test_dask_scheduler_addresses_are_not_local_clusters():
    # "localhost:8786" started a LocalCluster of 8786 worker processes
    from bigtcp_pcap.errors import UsageError
    from bigtcp_pcap.many_cli import local_workers

    assert [local_workers(a) for a in ("local", "local:3", "localhost:8786", "tcp://10.0.0.1:8786")] == \
        [2, 3, None, None]
    with pytest.raises(UsageError):
        local_workers("local:")
