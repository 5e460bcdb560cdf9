"""A simulator run killed part-way and continued with ``python -m nvflare_moon.ops.resume_point`` ends exactly where the same run
without the interruption ends: the same accuracy in every round and the same final global model, bit for bit.

Each method runs its 3-round job three times on tiny synthetic data (two sites): once through, once killed (SIGKILL
to the simulator and its workers) as soon as the server's checkpoint holds round 0, and the continuation of that. The
kill comes while round 1 is under way, so a site may already have trained and saved round 1, which the continuation
runs again: the case that a stored round must not be used as its own previous state (MOON's and FedSiam-DA's previous
model, SCAFFOLD's control). SCAFFOLD also needs the server's global control, which the continuation takes from the
checkpoint's meta. Batches are seeded by (seed, site, round), so nothing else depends on the process's history.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from nvflare.app_common.app_constant import AlgorithmConstants

from nvflare_moon.ops.resume_point import SIMULATOR_MODULE, workspace_checkpoint
from nvflare_moon.recipes import FedSiamDARecipe, MoonRecipe, ScaffoldRecipe

from .conftest import TINY_TRAINING, aggregated_round, run_simulator

pytestmark = pytest.mark.e2e
ROUNDS = 3
STOP_AFTER = 0  # the last round aggregated before the kill

METHODS = {
    # -t < -n for SCAFFOLD: every task in a new process, so c_i lives only in the state file
    "moon": (MoonRecipe, 2),
    "scaffold": (ScaffoldRecipe, 1),
    "fedsiam_da": (FedSiamDARecipe, 2),
}


def run_and_kill(job: Path, workspace: Path, n: int, t: int, timeout: float = 900) -> None:
    """Run the simulator and SIGKILL it with every process it started once the checkpoint holds ``STOP_AFTER``."""
    command = [sys.executable, "-m", SIMULATOR_MODULE, str(job), "-w", str(workspace), "-n", str(n), "-t", str(t)]
    simulator = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=workspace.parent)
    try:
        deadline = time.monotonic() + timeout
        while aggregated_round(workspace) != STOP_AFTER:
            assert simulator.poll() is None, "the simulator ended before it could be interrupted"
            assert time.monotonic() < deadline, f"round {STOP_AFTER} was not aggregated within {timeout} s"
            time.sleep(0.1)
    finally:
        processes = [simulator] + psutil.Process(simulator.pid).children(recursive=True)
        for process in processes:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        simulator.wait()
        psutil.wait_procs([p for p in processes if isinstance(p, psutil.Process)], timeout=30)


def global_model(workspace: Path):
    return torch.load(workspace_checkpoint(str(workspace)), map_location="cpu", weights_only=False)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_killed_run_continued_gives_the_uninterrupted_runs_rounds_and_final_model(tmp_path, method):
    recipe_class, threads = METHODS[method]
    recipe_class(name=f"{method}_tiny", min_clients=2, num_rounds=ROUNDS, **TINY_TRAINING).export(
        str(tmp_path / "jobs")
    )
    job = tmp_path / "jobs" / f"{method}_tiny"

    through = run_simulator(job, tmp_path / "through", n=2, t=threads, timeout=900)
    assert through.returncode == 0, through.output[-3000:]

    interrupted = tmp_path / "interrupted"
    run_and_kill(job, interrupted, n=2, t=threads)
    continued = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvflare_moon.ops.resume_point",
            "--workspace",
            str(interrupted),
            "-n",
            "2",
            "-t",
            str(threads),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert continued.returncode == 0, continued.stdout[-3000:]
    assert f"continuing from round {STOP_AFTER + 1}" in continued.stdout

    metrics = [json.loads(line) for line in (interrupted / "server/simulate_job/global_metrics.jsonl").open()]
    assert [r["round"] for r in metrics] == list(range(ROUNDS))
    assert [r["test_accuracy"] for r in metrics] == [r["test_accuracy"] for r in through.global_metrics()]
    assert [r["test_loss"] for r in metrics] == [r["test_loss"] for r in through.global_metrics()]

    want, got = global_model(tmp_path / "through"), global_model(interrupted)
    assert got["meta_props"]["current_round"] == ROUNDS - 1
    assert want["model"].keys() == got["model"].keys()
    for name, value in want["model"].items():
        assert torch.equal(got["model"][name], value), name
    if method == "scaffold":
        want_c = want["meta_props"][AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL]
        got_c = got["meta_props"][AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL]
        assert want_c.keys() == got_c.keys() and all((got_c[k] == want_c[k]).all() for k in want_c)
