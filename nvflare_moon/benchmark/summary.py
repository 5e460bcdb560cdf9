"""``summary.md``, the per-round CSV and the plots of one protocol, written into one folder that can be copied into
``docs/`` as it is (every link is relative)."""

import csv
import logging
import os
from collections import Counter
from typing import Dict, List, Optional, Sequence

from ..core.files import write_atomic
from ..data import DatasetNotFoundError
from .plots import accuracy_so_far, accuracy_vs_rounds, partition, rounds_to_target
from .protocols import Protocol, RunSpec
from .published import PUBLISHED
from .tables import (
    LOCAL_FIGURE_HEADERS,
    PER_RUN_HEADERS,
    beta_sweep_rows,
    final_accuracy_rows,
    group_runs,
    local_figure_rows,
    markdown_table,
    per_run_rows,
    rounds_to_target_rows,
    unpaired_groups,
)

SUMMARY = "summary.md"
_LOG = logging.getLogger(__name__)
CURVES_CSV = "accuracy_per_round.csv"


def write_curves_csv(records: Sequence[Dict], path: str) -> None:
    """One row per (run, round): run id, round, global test accuracy, wall seconds of the round."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "round", "test_accuracy", "round_seconds"])
        for record in records:
            for r in record["rounds"]:
                writer.writerow([record["run_id"], r["round"], repr(r["test_accuracy"]), repr(r["round_seconds"])])


def write_summary(
    folder: str,
    protocol: Protocol,
    records: Sequence[Dict],
    missing: Sequence[RunSpec],
    command: str,
    environment: Dict,
    data_root: Optional[str] = None,
    in_progress: Optional[Dict[str, List[float]]] = None,
) -> str:
    """Write the protocol's tables, plots and CSV into ``folder``; returns the path of ``summary.md``.
    ``in_progress``: ``{run_id: test accuracy of each round done}`` of interrupted runs that will continue; their
    curves so far are plotted in ``accuracy_so_far.png``."""
    os.makedirs(folder, exist_ok=True)
    s = protocol.settings
    lines = _header(protocol, records, missing, command, environment, in_progress or {})
    if in_progress:
        accuracy_so_far(in_progress, os.path.join(folder, "accuracy_so_far.png"), _title(s))
        lines += ["The interrupted runs so far:", "", "![accuracy so far](accuracy_so_far.png)", ""]
    if s.dataset == "cifar10":
        lines += [
            "Our CIFAR-10 is the offline JPEG-compressed copy (quality 75; labels and order exact), so absolute "
            "accuracies are not the official dataset's. Published numbers are **at the paper's settings**, not ours.",
            "",
        ]
    if records:
        lines += _results(folder, protocol, records, data_root)
    path = os.path.join(folder, SUMMARY)
    write_atomic(path, lambda f: f.write("\n".join(lines)))
    return path


def _header(
    protocol: Protocol,
    records: Sequence[Dict],
    missing: Sequence[RunSpec],
    command: str,
    environment: Dict,
    in_progress: Dict[str, List[float]],
) -> List[str]:
    """The summary's title and its list of how, where and with what the runs were made, and how far they got."""
    s = protocol.settings
    commits = Counter(r["environment"]["commit"] for r in records)
    lines = [
        f"# Benchmark: `{protocol.name}` protocol",
        "",
        protocol.description,
        "",
        f"- Command: `{command}`",
        f"- Summary written {environment['date']}; runs made at commit(s) "
        + (", ".join(f"`{c}` ({n} runs)" for c, n in commits.items()) or "—"),
        f"- Machine: {environment['machine']}",
        f"- Settings: {s.dataset}, {s.num_sites} sites, {s.rounds} rounds × {s.local_epochs} local epochs, "
        f"{s.arch}, batch {s.batch_size}, SGD lr {s.lr:g}, momentum {s.momentum:g}, weight decay {s.weight_decay:g}, "
        f"device {s.device}, simulator `-n {s.num_sites} -t {s.simulator_threads}`; SOLO {s.solo_epochs_per_site} "
        "epochs per site.",
        f"- Runs: {len(records)} finished"
        + (f", {len(missing)} missing: " + ", ".join(m.run_id for m in missing) if missing else "."),
    ]
    for run_id, accuracies in sorted(in_progress.items()):
        lines.append(
            f"- In progress: {run_id}, {len(accuracies)} of {s.rounds} rounds done, test accuracy "
            f"{100 * accuracies[-1]:.2f}% after round {len(accuracies) - 1}."
        )
    return lines + [""]


def _results(folder: str, protocol: Protocol, records: Sequence[Dict], data_root: Optional[str]) -> List[str]:
    """The tables and plots of the finished runs, with the per-round CSV written next to them."""
    groups = group_runs(records)
    lines = _tables(groups, protocol.settings.dataset, records)
    lines += _plots(folder, protocol, groups, data_root)
    write_curves_csv(records, os.path.join(folder, CURVES_CSV))
    return lines + [
        f"Every round of every run: [`{CURVES_CSV}`]({CURVES_CSV}); the full records are the run JSON files.",
        "",
    ]


def _tables(groups, dataset: str, records: Sequence[Dict]) -> List[str]:
    lines = [
        "## Final top-1 accuracy (Table 1 style)",
        "",
        markdown_table(
            ["method", "β", "seeds", "top-1 % (mean ± std over seeds)", "published top-1 %, at the paper's settings"],
            final_accuracy_rows(groups, dataset),
        ),
        "",
    ]
    local_rows = local_figure_rows(groups)
    if local_rows:
        lines += [
            "## On the sites' own test data (last round)",
            "",
            "Each site's class-proportional share of the test split (see docs/evaluation.md). The global model's "
            "figures are those of the model the sites received in the last round; means are weighted by training "
            "samples, the std is across sites; every cell is the mean ± std over seeds.",
            "",
            markdown_table(LOCAL_FIGURE_HEADERS, local_rows),
            "",
        ]
    lines += _rounds_to_target(groups, dataset)
    if len({beta for _, beta in groups}) > 1:
        headers, rows = beta_sweep_rows(groups)
        title = "## Heterogeneity: final top-1 % per Dirichlet β (Table 4 style)"
        lines += [title, "", markdown_table(headers, rows), ""]
    lines += ["## Every run: accuracy, time and memory", "", markdown_table(PER_RUN_HEADERS, per_run_rows(records)), ""]
    shown = {(r["method"]) for r in records}
    notes = [p for p in PUBLISHED if p.dataset == dataset and p.method in shown]
    if notes:
        lines += ["Published numbers (quoted, not reproduced):", ""]
        lines += [f"- {p.method} {p.metric} {p.value:g}: {p.source}, {p.where}; settings: {p.settings}." for p in notes]
        lines.append("")
    return lines


def _rounds_to_target(groups, dataset: str) -> List[str]:
    """Table 2: rounds to FedAvg's final accuracy, paired by seed; empty where FedAvg did not run."""
    speed_rows = rounds_to_target_rows(groups, dataset)
    if not speed_rows:
        return []
    lines = [
        "## Rounds to reach FedAvg's final accuracy (Table 2 style)",
        "",
        "The comparison is paired: each method's target is FedAvg's final accuracy at the seeds the method ran "
        "(each seed draws its own partition), mean over those seeds, and its rounds are counted on its mean curve "
        "over them. Speed-up as the paper's Table 2 counts it: FedAvg's total rounds / the method's rounds "
        "(FedAvg: 1× by definition). The stricter speed-up divides instead the round at which FedAvg's own mean "
        "curve over the same seeds first reached the target, which is earlier when its accuracy levelled off.",
        "",
        markdown_table(
            [
                "method",
                "β",
                "seeds",
                "target %",
                "rounds to target / total",
                "FedAvg first reaches it at round",
                "speed-up (paper's count)",
                "speed-up against FedAvg's first reach",
                "published speed-up, at the paper's settings",
            ],
            speed_rows,
        ),
        "",
    ]
    left_out = unpaired_groups(groups)
    if left_out:
        lines += [f"Left out, as FedAvg has not run at all their seeds: {'; '.join(left_out)}.", ""]
    return lines


def _title(settings) -> str:
    return f"{settings.dataset}, {settings.num_sites} sites, E = {settings.local_epochs}"


def _plots(folder: str, protocol: Protocol, groups, data_root: Optional[str]) -> List[str]:
    s = protocol.settings
    title = _title(s)
    lines = ["## Plots", ""]
    accuracy_vs_rounds(groups, os.path.join(folder, "accuracy_vs_rounds.png"), title)
    lines += ["Global test accuracy per round:", "", "![accuracy against rounds](accuracy_vs_rounds.png)", ""]
    if rounds_to_target_rows(groups, s.dataset):
        rounds_to_target(groups, os.path.join(folder, "rounds_to_target.png"), title)
        lines += ["Rounds to reach FedAvg's final accuracy:", "", "![rounds to target](rounds_to_target.png)", ""]
    seed = min(r["seed"] for runs in groups.values() for r in runs)
    for beta in sorted({beta for _, beta in groups}):
        name = f"partition_beta{beta:g}.png"
        try:
            partition(s.dataset, s.num_sites, beta, seed, os.path.join(folder, name), data_root)
        except DatasetNotFoundError as e:  # the records alone make every table; only this plot reads the labels
            _LOG.warning("partition plot at β = %g left out: %s", beta, str(e).splitlines()[0])
            lines += [
                f"(The partition plot at β = {beta:g} is left out: {s.dataset} was not found; give --data-root.)",
                "",
            ]
            continue
        lines += [
            f"What non-IID means here, β = {beta:g} (seed {seed}; other seeds draw other partitions):",
            "",
            f"![partition at β = {beta:g}]({name})",
            "",
        ]
    return lines
