"""The derived tables, from finished run records: the math is pure functions, the tables are rows of strings.

- Table 1 style: final top-1 accuracy per method, mean ± std over seeds.
- Table 2 style: rounds needed to reach FedAvg's final accuracy, and the speed-up over FedAvg (as the paper counts it,
  and against the round at which FedAvg itself first reached that accuracy).
- Table 4 style: final accuracy per Dirichlet β.
- The sites' own test data: in the last round, the mean local accuracy of the global model, the worst site, the
  spread across sites and the personalised (local model) accuracy.

Accuracies are percentages with two decimals. Standard deviations are population std (``ddof=0``), as
:mod:`nvflare_moon.solo` reports over sites.
"""

from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .published import published

BASELINE = "fedavg"
Group = Tuple[str, float]  # (variant name, β)


# ---- the math ---------------------------------------------------------------------------------------------------


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and population standard deviation."""
    if not len(values):
        raise ValueError("mean_std needs at least one value")
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std())


def mean_curve(curves: Sequence[Sequence[float]]) -> List[float]:
    """Round-by-round mean of several accuracy curves of the same length."""
    if len({len(c) for c in curves}) != 1:
        raise ValueError(f"curves must have the same number of rounds, got {[len(c) for c in curves]}")
    return [float(v) for v in np.mean(np.asarray(curves, dtype=np.float64), axis=0)]


def rounds_to_target(curve: Sequence[float], target: float) -> Optional[int]:
    """How many rounds until the accuracy first reaches ``target`` (round index + 1); None if it never does."""
    return next((i + 1 for i, accuracy in enumerate(curve) if accuracy >= target), None)


def speedup(baseline_rounds: Optional[int], rounds: Optional[int]) -> Optional[float]:
    """The baseline's rounds to the target divided by the method's; None if either never reached it."""
    if baseline_rounds is None or rounds is None:
        return None
    return baseline_rounds / rounds


# ---- grouping -----------------------------------------------------------------------------------------------------


def group_runs(records: Sequence[Dict]) -> "OrderedDict[Group, List[Dict]]":
    """Records by (variant, β), in first-seen order; each group holds one record per seed."""
    groups: "OrderedDict[Group, List[Dict]]" = OrderedDict()
    for record in records:
        groups.setdefault((record["variant"], record["beta"]), []).append(record)
    return groups


def curve(record: Dict) -> List[float]:
    return [r["test_accuracy"] for r in record["rounds"]]


def final_accuracy(runs: Sequence[Dict]) -> Tuple[float, float]:
    """Mean ± std over the seeds' final accuracies."""
    return mean_std([r["final_accuracy"] for r in runs])


def fedavg_runs_at(groups: "OrderedDict[Group, List[Dict]]", beta: float, seeds: Sequence[int]) -> Optional[List[Dict]]:
    """FedAvg's runs at Dirichlet ``beta`` and exactly ``seeds``, in that order; None if FedAvg lacks one of them.

    Each seed draws its own partition, so a method is compared with FedAvg on the partitions it ran on."""
    by_seed = {r["seed"]: r for r in groups.get((BASELINE, beta), [])}
    return [by_seed[seed] for seed in seeds] if all(seed in by_seed for seed in seeds) else None


def target_analysis(groups: "OrderedDict[Group, List[Dict]]") -> Dict[Group, Dict]:
    """For every group with rounds whose seeds FedAvg also ran at its β (:func:`fedavg_runs_at`): the target (FedAvg's
    mean final accuracy over those seeds), the rounds the group's mean curve needs to reach it, the round at which
    FedAvg's own mean curve over those seeds first reaches it, and two speed-ups over FedAvg.

    ``speedup`` counts as the MOON paper's Table 2 does: FedAvg's total rounds T (100 in the paper) over the method's
    rounds; FedAvg's own is 1 by definition. ``speedup_first_reach`` divides instead FedAvg's first reach, which is
    smaller than T when FedAvg's accuracy has levelled off before its last round: the stricter figure.
    """
    result = {}
    for (variant, beta), runs in groups.items():
        seeds = [r["seed"] for r in runs]
        baseline = fedavg_runs_at(groups, beta, seeds)
        if not runs[0]["rounds"] or baseline is None:
            continue
        target = final_accuracy(baseline)[0]
        baseline_curve = mean_curve([curve(r) for r in baseline])
        first_reach = rounds_to_target(baseline_curve, target)
        rounds = rounds_to_target(mean_curve([curve(r) for r in runs]), target)
        result[(variant, beta)] = {
            "target": target,
            "seeds": seeds,
            "rounds": rounds,
            "fedavg_first_reach": first_reach,
            "speedup": 1.0 if variant == BASELINE else speedup(len(baseline_curve), rounds),
            "speedup_first_reach": speedup(first_reach, rounds),
            "total_rounds": len(runs[0]["rounds"]),
        }
    return result


def unpaired_groups(groups: "OrderedDict[Group, List[Dict]]") -> List[str]:
    """The groups with rounds that :func:`target_analysis` leaves out (FedAvg lacks one of their seeds), as
    "label (β = b, seeds s1, s2)"."""
    analysed = target_analysis(groups)
    return [
        f"{runs[0]['label']} (β = {beta:g}, {seeds_label(runs)})"
        for (variant, beta), runs in groups.items()
        if runs[0]["rounds"] and (variant, beta) not in analysed
    ]


# ---- formatting ---------------------------------------------------------------------------------------------------


def percent(value: float) -> str:
    return f"{100 * value:.2f}"


def seeds_cell(runs: Sequence[Dict]) -> str:
    return ", ".join(str(r["seed"]) for r in runs)


def seeds_label(runs: Sequence[Dict]) -> str:
    return f"seed {runs[0]['seed']}" if len(runs) == 1 else f"seeds {seeds_cell(runs)}"


def percent_mean_std(values: Sequence[float]) -> str:
    mean, std = mean_std(values)
    return percent(mean) if len(values) == 1 else f"{percent(mean)} ± {percent(std)}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _published_cell(method: str, dataset: str, metric: str, beta: float, unit: str = "") -> str:
    p = published(method, dataset, metric, beta)
    return "—" if p is None else f"{p.value:g}{unit}"


# ---- the tables ---------------------------------------------------------------------------------------------------


def final_accuracy_rows(groups: "OrderedDict[Group, List[Dict]]", dataset: str) -> List[List[str]]:
    """Table 1: method, β, seeds, top-1 % (mean ± std over seeds), published top-1 %.

    SOLO's single-seed cell shows the std over sites, as the paper reports it (marked "over sites")."""
    rows = []
    for (variant, beta), runs in groups.items():
        accuracy = percent_mean_std([r["final_accuracy"] for r in runs])
        if len(runs) == 1 and "final_accuracy_std_over_sites" in runs[0]:
            accuracy += f" ± {percent(runs[0]['final_accuracy_std_over_sites'])} (over sites)"
        seeds = seeds_cell(runs)
        top1 = _published_cell(runs[0]["method"], dataset, "top1", beta)
        rows.append([runs[0]["label"], f"{beta:g}", seeds, accuracy, top1])
    return rows


def rounds_to_target_rows(groups: "OrderedDict[Group, List[Dict]]", dataset: str) -> List[List[str]]:
    """Table 2: method, β, seeds, target (FedAvg's final % at those seeds), rounds to reach it (of the total), the round
    at which FedAvg's own curve first reaches it, the speed-up as the paper counts it, the speed-up against FedAvg's
    first reach (see :func:`target_analysis`), and the published speed-up."""
    rows = []
    for (variant, beta), t in target_analysis(groups).items():
        runs = groups[(variant, beta)]
        rows.append(
            [
                runs[0]["label"],
                f"{beta:g}",
                seeds_cell(runs),
                percent(t["target"]),
                f"{_round_or_not(t['rounds'])} / {t['total_rounds']}",
                _round_or_not(t["fedavg_first_reach"]),
                _times(t["speedup"]),
                _times(t["speedup_first_reach"]),
                _published_cell(runs[0]["method"], dataset, "speedup", beta, "×"),
            ]
        )
    return rows


def _round_or_not(rounds: Optional[int]) -> str:
    return "not reached" if rounds is None else str(rounds)


def _times(ratio: Optional[float]) -> str:
    return "—" if ratio is None else f"{ratio:.2f}×"


def beta_sweep_rows(groups: "OrderedDict[Group, List[Dict]]") -> Tuple[List[str], List[List[str]]]:
    """Table 4: one row per method, one column per β (final top-1 %, mean ± std over seeds)."""
    betas = sorted({beta for _, beta in groups})
    variants = list(OrderedDict.fromkeys(variant for variant, _ in groups))
    headers = ["method"] + [f"β = {beta:g}" for beta in betas]
    rows = []
    for variant in variants:
        label = next(runs[0]["label"] for (v, _), runs in groups.items() if v == variant)
        cells = [
            percent_mean_std([r["final_accuracy"] for r in groups[(variant, beta)]])
            if (variant, beta) in groups
            else "—"
            for beta in betas
        ]
        rows.append([label] + cells)
    return headers, rows


def local_figure_rows(groups: "OrderedDict[Group, List[Dict]]") -> List[List[str]]:
    """Method, β, seeds, and from each run's last round (means over seeds): the weighted mean local accuracy of the
    global model the sites received, the worst site's, the std across sites, and the weighted mean personalised
    accuracy. Only groups whose runs recorded the local figures (runs before them did not)."""
    rows = []
    for (variant, beta), runs in groups.items():
        spreads = [r["rounds"][-1].get("spread", {}) for r in runs if r["rounds"]]
        if not spreads or not all("accuracy" in s and "local_model_accuracy" in s for s in spreads):
            continue
        rows.append(
            [
                runs[0]["label"],
                f"{beta:g}",
                seeds_cell(runs),
                percent_mean_std([s["accuracy"]["mean"] for s in spreads]),
                percent_mean_std([s["accuracy"]["worst"] for s in spreads]),
                percent_mean_std([s["accuracy"]["std"] for s in spreads]),
                percent_mean_std([s["local_model_accuracy"]["mean"] for s in spreads]),
            ]
        )
    return rows


LOCAL_FIGURE_HEADERS = [
    "method",
    "β",
    "seeds",
    "local acc. of the global model % (mean over sites)",
    "worst site %",
    "std over sites %",
    "personalised acc. % (mean over sites)",
]


def per_run_rows(records: Sequence[Dict]) -> List[List[str]]:
    """Every run: id, final %, best % (at round), wall time (s; of the last sitting for a continued run), median
    s/round after round 0 (the median, because the first round of each later sitting of a continued run also counts
    the time between sittings), round 0 s (start-up included; unknown when it ran in an earlier sitting), peak RSS of
    the largest client process and of the largest other process (MB)."""
    rows = []
    for r in records:
        rounds = r["rounds"]
        if rounds:
            best = max(rounds, key=lambda x: x["test_accuracy"])
            best_cell = f"{percent(best['test_accuracy'])} (round {best['round']})"
            later = [x["round_seconds"] for x in rounds[1:] if not np.isnan(x["round_seconds"])]
            per_round = f"{np.median(later):.1f}" if later else "—"
            first = "—" if np.isnan(rounds[0]["round_seconds"]) else f"{rounds[0]['round_seconds']:.1f}"
        else:
            best_cell, per_round, first = "—", "—", "—"
        memory = r["peak_rss_mb"]
        client_peak = f"{max(memory['clients'].values()):.0f}" if memory["clients"] else "—"
        rows.append(
            [
                r["run_id"],
                percent(r["final_accuracy"]),
                best_cell,
                f"{r['wall_seconds']:.0f}" + ("" if r.get("continued_after_round") is None else " (last sitting)"),
                per_round,
                first,
                client_peak,
                f"{memory['other']:.0f}",
            ]
        )
    return rows


PER_RUN_HEADERS = [
    "run",
    "final top-1 %",
    "best top-1 % (round)",
    "wall s",
    "s/round, median (rounds ≥ 1)",
    "round 0 s (incl. start-up)",
    "peak RSS per client MB (max)",
    "peak RSS other MB",
]
