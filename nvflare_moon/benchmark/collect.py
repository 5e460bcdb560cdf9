"""Read what a finished run logged: the simulator's per-round global metrics, or SOLO's report."""

import json
import os
from typing import Any, Dict, List, Sequence

from ..server.evaluator import METRICS_FILENAME
from .protocols import RunSpec


def global_metrics_path(workspace: str) -> str:
    """Where :class:`~nvflare_moon.server.GlobalModelEvaluator` writes in a simulator workspace."""
    return os.path.join(workspace, "server", "simulate_job", METRICS_FILENAME)


def read_simulator_results(
    workspace: str, rounds: int, started: float, earlier: Sequence[Dict[str, Any]] = ()
) -> Dict[str, Any]:
    """The run's rounds, exactly as ``global_metrics.jsonl`` logged them, after the ``earlier`` rounds of the resume
    point the run continues, each with ``round_seconds`` added: the wall time since the previous round's evaluation
    (for the first round of this sitting, since the simulator started, so it includes start-up; NaN for the first
    round of an earlier sitting, whose start is not recorded).

    Raises ValueError unless rounds 0 … ``rounds``−1 are all there, in order.
    """
    path = global_metrics_path(workspace)
    if not os.path.exists(path):
        raise ValueError(f"the simulator exited without writing {path}")
    with open(path) as f:
        records: List[Dict[str, Any]] = [json.loads(line) for line in f if line.strip()]
    records = [dict(r) for r in earlier] + [r for r in records if r.get("round", -1) >= len(earlier)]
    logged = [r.get("round") for r in records]
    if logged != list(range(rounds)):
        raise ValueError(f"{path} holds rounds {logged}, expected 0 … {rounds - 1}")
    previous = float("nan") if earlier else started  # when an earlier sitting started is not known
    for record in records:
        if record["round"] == len(earlier):
            previous = started
        record["round_seconds"] = record["time"] - previous
        previous = record["time"]
    return {"rounds": records, "final_accuracy": records[-1]["test_accuracy"]}


def read_solo_report(report: str, spec: RunSpec) -> Dict[str, Any]:
    """SOLO's result: the mean of the sites' local test accuracies, with their std over sites and every site's."""
    if not os.path.exists(report):
        raise ValueError(f"SOLO exited without writing {report}")
    with open(report) as f:
        solo = json.load(f)
    missing = spec.settings.num_sites - len(solo.get("sites", {}))
    if missing:
        raise ValueError(f"{report} lacks {missing} of {spec.settings.num_sites} sites")
    return {
        "rounds": [],
        "final_accuracy": solo["mean_test_accuracy"],
        "final_accuracy_std_over_sites": solo["std_test_accuracy"],
        "sites": solo["sites"],
    }
