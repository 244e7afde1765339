"""Small PNG plots for results (matplotlib, Agg backend, imported only when a plot is drawn)."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np

from huggy_exp.files import atomic_write


def _pyplot():
    if "MPLCONFIGDIR" not in os.environ:  # a read-only HOME: matplotlib would warn in two lines, then use a temporary folder
        try:
            (Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "matplotlib").mkdir(parents=True, exist_ok=True)
        except OSError:
            os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="huggy_exp-matplotlib-")
    import matplotlib

    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)  # "findfont: ... Falling back" warnings: noise
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def error_histogram(path: Path, errors: dict[str, np.ndarray], title: str) -> str:
    """Histogram of log10 |error| per label; exact zeros are counted in the title, not dropped silently."""
    fig, ax = _figure((6, 3.5))
    zeros = []
    for label, err in errors.items():
        err = np.abs(np.asarray(err, np.float64)).ravel()
        nonzero = err[err > 0]
        zeros.append(f"{label}: {np.mean(err == 0):.0%} exact")
        if nonzero.size:
            ax.hist(np.log10(nonzero), bins=40, alpha=0.6, label=label)
    _label(ax, "log10 |error|", "elements", f"{title}\n({'; '.join(zeros)})")  # all exact (or NaN): no legend
    return _save(fig, path)


def bars(path: Path, labels: list[str], values: list[float], limits: list[float] | None, ylabel: str, title: str) -> str:
    fig, ax = _figure((6, 3.5))
    x = np.arange(len(labels))
    ax.bar(x, np.maximum(values, 1e-30), color="tab:blue", label=ylabel)
    if limits is not None:
        ax.step(np.append(x, x[-1] + 1) - 0.5, np.append(limits, limits[-1]), where="post", color="tab:red", label="threshold")
    ax.set_xticks(x, labels, rotation=30, fontsize=8)
    ax.set_yscale("log")
    _label(ax, None, ylabel, title)
    return _save(fig, path)


def lines(path: Path, series: dict[str, np.ndarray], xlabel: str, ylabel: str, title: str,
          threshold: float | None = None, log: bool = False) -> str:
    fig, ax = _figure((7, 3.5))
    for label, y in series.items():
        ax.plot(np.asarray(y), label=label, linewidth=1)
    if threshold is not None:
        ax.axhline(threshold, color="tab:red", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    if log:
        ax.set_yscale("symlog", linthresh=1e-7)
    _label(ax, xlabel, ylabel, title, fontsize=7, ncol=2)
    return _save(fig, path)


def categories(path: Path, series: dict[str, dict[str, float]], order: tuple[str, ...], ylabel: str, title: str,
               limits: dict[str, float] | None = None) -> str:
    """One marker line per label over categorical x (dtypes in `order`: {label: {category: value}}), with each
    category's limit as a red bar; log y, zeros drawn at the bottom."""
    fig, ax = _figure((8, 4.2))
    present = [c for c in order if any(c in values for values in series.values())]
    for label, values in series.items():
        cats = [c for c in present if c in values]
        ax.plot([present.index(c) for c in cats], [max(values[c], 1e-12) for c in cats], marker="o", label=label)
    for i, c in enumerate(present):
        if limits and c in limits:
            ax.hlines(limits[c], i - 0.3, i + 0.3, colors="tab:red", linewidth=2,
                      label="limit" if i == min(j for j, d in enumerate(present) if d in limits) else None)
            ax.annotate(f"limit {limits[c]:g}", (i + 0.32, limits[c]), fontsize=8, color="tab:red", va="center")
    ax.set_xticks(range(len(present)), present)
    ax.set_yscale("log")
    _label(ax, "dtype", ylabel, f"{title} (0 drawn at 1e-12)", title_size=10)
    return _save(fig, path)


def versus_batch(path: Path, curves: dict[str, dict[str, list]], title: str) -> str:
    """Latency per call (`p50_us`, `p99_us` dashed where given) and throughput (`obs_per_s`) against batch size (log2
    axis labelled with the sizes themselves), side by side, one line per label; no throughput panel where no curve
    has a throughput (record, replay)."""
    throughput = any(c.get("obs_per_s") for c in curves.values())
    fig, axes = _figure((12, 4.4) if throughput else (6.5, 4.4), 2 if throughput else 1)
    lat, thr = axes if throughput else (axes, None)
    sizes = sorted({b for c in curves.values() for pts in c.values() for b, _ in pts})
    for label, c in curves.items():
        color = None  # one colour per label in every panel
        for ax, key, style in ((lat, "p50_us", "-"), (lat, "p99_us", "--"), (thr, "obs_per_s", "-")):
            if c.get(key):
                color = ax.plot(*zip(*sorted(c[key])), style, marker="o" if style == "-" else None, color=color,
                                label=f"{label} {key[:3]}" if "p99_us" in c and ax is lat else label)[0].get_color()
    for ax, ylabel in ((lat, "latency per call (µs)"), (thr, "throughput (observations / s)"))[:1 + throughput]:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        _label(ax, "batch size (rows per call)", ylabel, fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def agreement(path: Path, groups: list[str], cells: list[list[tuple[str, int]]]) -> str:
    """One row per group of comparable points; each point a cell coloured by its result class (0 = the first's)."""
    width = max(len(c) for c in cells)
    fig, ax = _figure((min(2 + 1.6 * width, 14), 0.5 + 0.45 * len(groups)))
    grid = np.full((len(groups), width), np.nan)
    for i, row in enumerate(cells):
        for j, (label, cls) in enumerate(row):
            grid[i, j] = cls
            ax.text(j, i, f"{label}\n{'=' if cls == 0 else '≠'}", ha="center", va="center", fontsize=7)
    ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn_r", vmin=0, vmax=max(1, np.nanmax(grid)), aspect="auto")
    ax.set_yticks(range(len(groups)), groups, fontsize=7)
    ax.set_xticks([])
    ax.set_title("bit-identical actions per group (= same bytes as the first point, ≠ different)", fontsize=9)
    return _save(fig, path)


def distributions(path: Path, samples: dict[str, np.ndarray], xlabel: str, title: str) -> str:
    """Empirical CDF of each label's samples (latencies: the whole distribution, not only its percentiles)."""
    fig, ax = _figure((6, 3.5))
    for label, values in samples.items():
        x = np.sort(np.asarray(values, np.float64))
        if x.size:
            ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=f"{label} (n={x.size})")
    ax.set_xscale("log")
    _label(ax, xlabel, "share of calls <= x", title)
    return _save(fig, path)


def _figure(figsize: tuple[float, float], ncols: int = 1):
    return _pyplot().subplots(1, ncols, figsize=figsize)


def _label(ax, xlabel: str | None, ylabel: str, title: str | None = None, title_size: int = 9, **legend) -> None:
    """Axis labels, the title, and a legend where anything drawn has a label (`legend`: its options)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, fontsize=title_size)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**{"fontsize": 8, **legend})


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=90, format=path.suffix.lstrip(".") or "png"))
    finally:
        _pyplot().close(fig)
    return path.name
