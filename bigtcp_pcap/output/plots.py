"""PNG plots from an analysis directory: super-packet sizes, segments per super-packet, size and throughput over time,
flush reasons over time.

Reads only the Parquet tables (``superpackets``, ``flows``) and their metadata, so it works on any output
directory, including one written by an earlier run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import OutputError, UsageError
from .parquet import read_metadata

TOP_FLOWS = 4
KIB64 = 65536


def _limits(meta: dict) -> list[tuple[float, str]]:
    gro = (meta.get("params") or {}).get("gro") or {}
    lines = [(KIB64, "64 KiB (legacy GRO/GSO limit)")]
    v6, v4 = gro.get("gro_max_size"), gro.get("effective_gro_ipv4_max_size")
    if v6 and v6 != KIB64:
        lines.append((v6, f"gro_max_size {v6}"))
    if v4 and v4 != KIB64 and v4 != v6:
        lines.append((v4, f"gro_ipv4_max_size {v4}"))
    return lines


def _flow_label(row) -> str:
    from .summary import flow_name

    return flow_name(row)


def plot_dir(outdir: str | Path, dest: str | Path | None = None) -> list[Path]:
    """Write the PNGs for the analysis in ``outdir`` (into ``dest``, default ``outdir/plots``); returns paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    dest = Path(dest) if dest else outdir / "plots"
    sp, flows, meta = read_tables(outdir)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError.from_os(str(dest), e) from None
    limits = _limits(meta)
    title_src = meta.get("source_name", "")
    top = flows.sort_values("payload_bytes", ascending=False).head(TOP_FLOWS)
    top = top[top.payload_bytes > 0]
    written: list[Path] = []
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    # 1. super-packet size: histogram and CDF per flow, with the limits marked (L3 length, as the kernel counts)
    fig, (ax_h, ax_c) = plt.subplots(1, 2, figsize=(13, 5))
    for k, row in enumerate(top.itertuples()):
        s = sp[sp.flow_id == row.flow_id]
        if s.empty:
            continue
        sizes = s.l3_len.to_numpy(dtype=float)
        label = f"{_flow_label(row)} ({len(s)})"
        ax_h.hist(sizes / 1024, bins=60, alpha=0.55, color=colors[k % len(colors)], label=label)
        xs = np.sort(sizes) / 1024
        ax_c.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", color=colors[k % len(colors)], label=label)
    for ax in (ax_h, ax_c):
        for v, name in limits:
            ax.axvline(v / 1024, color="black" if v == KIB64 else "red", ls="--", lw=1)
            ax.text(v / 1024, 0.98, " " + name, rotation=90, va="top", ha="right", fontsize=8,
                    transform=ax.get_xaxis_transform())
        ax.set_xlabel("super-packet IP length (KiB)")
        ax.grid(alpha=0.3)
    ax_h.set_ylabel("super-packets")
    ax_h.set_title("Super-packet size")
    ax_c.set_ylabel("fraction of super-packets <= size")
    ax_c.set_title("Super-packet size CDF")
    if ax_c.get_legend_handles_labels()[0]:  # (an empty capture has nothing to label)
        ax_c.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{title_src}: GRO super-packets per flow (top {len(top)} by bytes)")
    fig.tight_layout()
    written.append(_save(fig, dest / "superpacket_sizes.png", plt))

    # 2. segments per super-packet
    fig, ax = plt.subplots(figsize=(9, 5))
    for k, row in enumerate(top.itertuples()):
        s = sp[sp.flow_id == row.flow_id]
        if s.empty:
            continue
        counts = s.n_segments.value_counts().sort_index()
        ax.bar(counts.index + 0.8 * (k / max(1, len(top)) - 0.4), counts.values, width=0.8 / max(1, len(top)),
               color=colors[k % len(colors)], label=_flow_label(row))
    ax.set_xlabel("segments per super-packet (NAPI_GRO_CB count)")
    ax.set_ylabel("super-packets")
    ax.set_title(f"{title_src}: segments per super-packet")
    ax.grid(alpha=0.3, axis="y")
    if ax.get_legend_handles_labels()[0]:  # (an empty capture has nothing to label)
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(_save(fig, dest / "segments_per_superpacket.png", plt))

    # 3. super-packet size and throughput over time
    fig, ax = plt.subplots(figsize=(12, 5))
    ax2 = ax.twinx()
    t0 = sp.ts_first_ns.min() if not sp.empty else None
    for k, row in enumerate(top.itertuples()):
        s = sp[sp.flow_id == row.flow_id]
        if s.empty:
            continue
        t = (s.ts_last_ns - t0).dt.total_seconds().to_numpy() * 1000
        ax.scatter(t, s.l3_len / 1024, s=6, color=colors[k % len(colors)], label=_flow_label(row))
        span = max(t.max() - t.min(), 1e-3)
        nb = int(min(200, max(10, span / 1.0)))
        bins = np.linspace(t.min(), t.max() + 1e-9, nb + 1)
        bytes_per_bin, _ = np.histogram(t, bins=bins, weights=s.payload_len.to_numpy(dtype=float))
        width_s = (bins[1] - bins[0]) / 1000
        ax2.plot((bins[:-1] + bins[1:]) / 2, bytes_per_bin * 8 / width_s / 1e9, color=colors[k % len(colors)],
                 lw=1, alpha=0.7)
    for v, name in limits:
        ax.axhline(v / 1024, color="black" if v == KIB64 else "red", ls="--", lw=1)
    ax.set_xlabel("time since first super-packet (ms)")
    ax.set_ylabel("super-packet IP length (KiB), dots")
    ax2.set_ylabel("goodput (Gbit/s), lines")
    ax.set_title(f"{title_src}: super-packet size and throughput over time")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # (an empty capture has nothing to label)
        ax.legend(fontsize=8, loc="lower right", markerscale=3)
    fig.tight_layout()
    written.append(_save(fig, dest / "superpackets_over_time.png", plt))

    # 4. flush reasons over time: super-packets per time bin, stacked by reason (all flows)
    fig, ax = plt.subplots(figsize=(12, 4.5))
    if not sp.empty:
        t = (sp.ts_last_ns - t0).dt.total_seconds().to_numpy() * 1000
        reasons = sp.flush_reason.astype(str).to_numpy()
        names = [r for r in pd.Series(reasons).value_counts().index]
        bins = np.linspace(t.min(), t.max() + 1e-9, int(min(100, max(10, len(t) // 20))) + 1)
        bottom = np.zeros(bins.size - 1)
        for k, name in enumerate(names):
            h, _ = np.histogram(t[reasons == name], bins=bins)
            ax.bar(bins[:-1], h, width=np.diff(bins), bottom=bottom, align="edge", label=name,
                   color=colors[k % len(colors)])
            bottom += h
        if ax.get_legend_handles_labels()[0]:  # (an empty capture has nothing to label)
            ax.legend(fontsize=8, ncol=4)
    ax.set_xlabel("time since first super-packet (ms)")
    ax.set_ylabel("super-packets per bin")
    ax.set_title(f"{title_src}: flush reasons over time")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    written.append(_save(fig, dest / "flush_reasons_over_time.png", plt))
    return written


def read_tables(outdir: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """superpackets, flows and the super-packets' metadata; a missing or damaged table is a UsageError naming it."""
    name = "superpackets.parquet"
    try:
        sp = pd.read_parquet(outdir / name)
        meta = read_metadata(outdir / name)
        name = "flows.parquet"
        flows = pd.read_parquet(outdir / name)
    except Exception as e:  # noqa: BLE001 - pyarrow's errors for a damaged file are many (ArrowInvalid, OSError)
        why = getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise UsageError(f"{outdir}: cannot read {name}: {why} (re-run 'bigtcp-pcap analyze CAPTURE -o "
                         f"{outdir}')") from None
    return sp, flows, meta


def _save(fig, path: Path, plt) -> Path:
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise OutputError.from_os(str(path), e) from None
    finally:
        plt.close(fig)
    return path
