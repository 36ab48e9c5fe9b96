"""Fuzzing the whole pipeline (issue 14): truncation at every offset, random mutations, lying pcapng block
lengths, huge caplens, decompression bombs, the committed corpus, and a sample through the CLI.

A short run by default (CI, ~40 s); ``BIGTCP_FUZZ_LONG=1`` truncates at every offset through the full API and
runs ``BIGTCP_FUZZ_EXAMPLES`` (default 5000) examples per property (README, "Damaged and field captures").
Every input must give one of the documented results (harness.check); the figures are printed at the end.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import STATS, check
from seeds import CORPUS, corpus

from bigtcp_pcap import iter_batches
from bigtcp_pcap.errors import CaptureError

LONG = bool(os.environ.get("BIGTCP_FUZZ_LONG"))
EXAMPLES = int(os.environ.get("BIGTCP_FUZZ_EXAMPLES", "5000")) if LONG else 80
SEEDS = {name: (CORPUS / name).read_bytes() for name in ("seed.pcap", "seed.pcapng", "seed.pcap.gz",
                                                           "seed.pcapng.zst")}
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not LONG,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_corpus_is_what_seeds_py_builds():
    built = corpus()
    assert sorted(built) == sorted(p.name for p in CORPUS.iterdir())
    for name, data in built.items():
        if not name.endswith(".zst"):  # zstd output may differ between library versions
            assert (CORPUS / name).read_bytes() == data, name


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.iterdir()))
def test_corpus(name):
    assert check((CORPUS / name).read_bytes(), name) in ("clean", "findings", "partial")


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_truncation_at_every_offset(seed):
    """Reader + decoder at every offset; the full API (GRO, flows, audit, sinks) at every offset in a long run,
    every len/40th in CI. A cut file keeps every frame before the cut: never fewer than a shorter cut kept."""
    data = SEEDS[seed]
    kept_before = 0
    for cut in range(len(data) + 1):
        frames = 0
        try:
            for pb, _ in iter_batches(io.BytesIO(data[:cut]), name=seed):
                frames += len(pb)
        except CaptureError as e:
            assert e.frame is not None and e.offset is not None and seed in e.one_line()
        assert frames >= kept_before or seed.endswith((".gz", ".zst")), (cut, frames, kept_before)
        kept_before = max(kept_before, frames) if not seed.endswith((".gz", ".zst")) else 0
    stride = 1 if LONG else max(1, len(data) // 40)
    for cut in range(0, len(data) + 1, stride):
        check(data[:cut], seed)


@FUZZ
@given(seed=st.sampled_from(sorted(SEEDS)), edits=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)),
                                                          min_size=1, max_size=8))
def test_random_byte_mutations(seed, edits):
    data = bytearray(SEEDS[seed])
    for pos, val in edits:
        data[pos % len(data)] = val
    check(bytes(data), seed)


def _pcapng_block_offsets(data: bytes) -> list[int]:
    offs, p = [], 0
    while p + 12 <= len(data):
        offs.append(p)
        p += struct.unpack("<I", data[p + 4:p + 8])[0]
    return offs


@FUZZ
@given(block=st.integers(0, 100), where=st.sampled_from(["lead", "trail", "both"]),
       value=st.one_of(st.integers(0, 64), st.integers(0, 1 << 32).map(lambda v: v & 0xFFFFFFFC),
                       st.sampled_from([0, 12, 0xFFFFFFFC, 0x7FFFFFFC, 1 << 28])))
def test_lying_pcapng_block_lengths(block, where, value):
    data = bytearray(SEEDS["seed.pcapng"])
    offs = _pcapng_block_offsets(bytes(data))
    p = offs[block % len(offs)]
    blen = struct.unpack("<I", data[p + 4:p + 8])[0]
    value &= 0xFFFFFFFF
    if where in ("lead", "both"):
        data[p + 4:p + 8] = struct.pack("<I", value)
    if where in ("trail", "both"):
        data[p + blen - 4:p + blen] = struct.pack("<I", value)
    check(bytes(data), "lying.pcapng")


@FUZZ
@given(record=st.integers(0, 7), caplen=st.integers(0, (1 << 32) - 1), wirelen=st.integers(0, (1 << 32) - 1))
def test_huge_caplens(record, caplen, wirelen):
    data = bytearray(SEEDS["seed.pcap"])
    p = 24
    for _ in range(record):
        p += 16 + struct.unpack("<I", data[p + 8:p + 12])[0]
    data[p + 8:p + 16] = struct.pack("<II", caplen, wirelen)
    check(bytes(data), "caplen.pcap")


def _rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_decompression_bombs(kind):
    """A bomb (4 GiB of zeros) is refused as 'not a pcap' after its first bytes, in well under a second."""
    zstandard = pytest.importorskip("zstandard")
    if kind == "zst":
        bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20)) * 64
    else:
        bomb = gzip.compress(bytes(64 << 20), 1) * 64
    before = _rss_mib()
    t = time.perf_counter()
    assert check(bomb, f"bomb.{kind}") == "partial"
    assert time.perf_counter() - t < 1.0
    assert _rss_mib() - before < 128


@pytest.mark.opt_in
@pytest.mark.skipif(not LONG, reason="long run only (BIGTCP_FUZZ_LONG=1): ~5 s")
@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_capture_followed_by_zeros(kind):
    """A real capture and then 32 MiB of zeros is a capture of 2 M zero-length records: read whole, memory flat
    (every table is streamed; the decompressor hands out what the reader asks for)."""
    zstandard = pytest.importorskip("zstandard")
    comp = (lambda b: zstandard.ZstdCompressor().compress(b)) if kind == "zst" else (lambda b: gzip.compress(b, 1))
    data = comp(SEEDS["seed.pcap"]) + comp(bytes(32 << 20))
    before = _rss_mib()
    check(data, f"tail.{kind}")
    assert _rss_mib() - before < 256


def test_cli_sample_of_truncations(tmp_path):
    """The CLI on a few cuts: exit 3 with one stderr line, or 0/1; never a traceback."""
    data = SEEDS["seed.pcapng"]
    for cut in (13, 200, 555, len(data) - 3):
        f = tmp_path / f"cut{cut}.pcapng"
        f.write_bytes(data[:cut])
        res = subprocess.run([sys.executable, "-m", "bigtcp_pcap.cli", "analyze", str(f), "-o", str(tmp_path / "o"),
                              "--no-progress", "--json"], check=False, capture_output=True, text=True, timeout=120)
        assert res.returncode == 3, res.stderr
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and str(f) in lines[0] and "byte offset" in lines[0], res.stderr
        assert "Traceback" not in res.stderr


def test_report_figures(capsys):
    """Not a check: the outcome counts of this run (pytest -s shows them)."""
    with capsys.disabled():
        print(f"\nfuzz outcomes ({'long' if LONG else 'short'} run): {STATS}")
