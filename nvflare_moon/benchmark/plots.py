"""The benchmark's figures as PNG files (matplotlib, Agg backend: no display needed)."""

from typing import Dict, List, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ..data import load_dataset, site_partition  # noqa: E402
from ..data.label_plot import plot_label_distribution  # noqa: E402
from .tables import BASELINE, Group, curve, final_accuracy, seeds_label, target_analysis  # noqa: E402


def _close(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def accuracy_vs_rounds(groups: Dict[Group, List[Dict]], path: str, title: str) -> str:
    """Global test accuracy against rounds, one panel per β: each method's mean over seeds, ± std shaded; methods
    without rounds (SOLO) as a dashed level; FedAvg's final accuracy (mean over its seeds) dotted."""
    betas = sorted({beta for _, beta in groups})
    fig, axes = plt.subplots(1, len(betas), figsize=(6.5 * len(betas), 4.5), squeeze=False)
    for ax, beta in zip(axes[0], betas):
        for (variant, b), runs in groups.items():
            if b != beta:
                continue
            label = f"{runs[0]['label']} ({seeds_label(runs)})"
            if not runs[0]["rounds"]:
                ax.axhline(100 * np.mean([r["final_accuracy"] for r in runs]), ls="--", lw=1, color="gray", label=label)
                continue
            curves = np.asarray([curve(r) for r in runs]) * 100
            x = np.arange(1, curves.shape[1] + 1)
            (line,) = ax.plot(x, curves.mean(axis=0), label=label)
            if len(runs) > 1:
                mean, std = curves.mean(axis=0), curves.std(axis=0)
                ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.15, lw=0)
        fedavg = groups.get((BASELINE, beta))
        if fedavg:
            label = f"FedAvg's final accuracy ({seeds_label(fedavg)})"
            ax.axhline(100 * final_accuracy(fedavg)[0], ls=":", color="black", lw=1, label=label)
        ax.set(xlabel="round", ylabel="global test accuracy (%)", title=f"{title}, β = {beta:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _close(fig, path)


def accuracy_so_far(curves: Dict[str, Sequence[float]], path: str, title: str) -> str:
    """Global test accuracy against rounds of runs still in progress: one line per run, as far as it got."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for run_id, accuracies in sorted(curves.items()):
        ax.plot(np.arange(1, len(accuracies) + 1), 100 * np.asarray(accuracies), label=f"{run_id} ({len(accuracies)})")
    ax.set(xlabel="round", ylabel="global test accuracy (%)", title=f"{title}, in progress")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _close(fig, path)


def rounds_to_target(groups: Dict[Group, List[Dict]], path: str, title: str) -> str:
    """Bars: rounds each method needs to reach FedAvg's final accuracy at the same seeds (per β), with the speed-up on
    top; a method that never reaches it gets a hatched bar at its total rounds. The bars name their seeds where
    they differ."""
    analysis = target_analysis(groups)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(analysis) + 2), 4.2))
    several_betas = len({b for _, b in analysis}) > 1
    several_seed_sets = len({tuple(t["seeds"]) for t in analysis.values()}) > 1
    names, heights, hatches, notes = [], [], [], []
    for (variant, beta), t in analysis.items():
        runs = groups[(variant, beta)]
        name = runs[0]["label"] + (f"\nβ={beta:g}" if several_betas else "")
        names.append(name + (f"\n{seeds_label(runs)}" if several_seed_sets else ""))
        reached = t["rounds"] is not None
        heights.append(t["rounds"] if reached else t["total_rounds"])
        hatches.append("" if reached else "//")
        notes.append(f"{t['speedup']:.2f}×" if t["speedup"] is not None else ("not reached" if not reached else "—"))
    bars = ax.bar(range(len(names)), heights, color="#4C72B0", edgecolor="black")
    for bar, hatch, note in zip(bars, hatches, notes):
        bar.set_hatch(hatch)
        if hatch:
            bar.set_facecolor("white")
        ax.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set(ylabel="rounds to reach FedAvg's final accuracy", title=title)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(axis="y", alpha=0.3)
    return _close(fig, path)


def partition(dataset: str, num_sites: int, beta: float, seed: int, path: str, data_root: Optional[str] = None) -> str:
    """The Dirichlet partition the runs train on: per site, its samples stacked by class."""
    splits = load_dataset(dataset, data_root)
    labels = splits.train.labels.numpy()
    parts = site_partition(splits, num_sites, "dirichlet", beta, seed)
    counts = np.stack([np.bincount(labels[idx], minlength=splits.num_classes) for idx in parts])  # [sites, classes]
    names: Sequence[str] = splits.class_names or [str(k) for k in range(splits.num_classes)]
    sites = [f"site-{i}" for i in range(1, num_sites + 1)]
    title = f"{dataset}: {num_sites} sites, Dirichlet β = {beta:g}, seed {seed}"
    return plot_label_distribution(counts, sites, names, path, title)
