"""Helpers for the end-to-end tests, which run NVFlare's real simulator as a subprocess (as NVFlare's own tests do)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


class SimulatorRun:
    def __init__(self, workspace: Path, completed: subprocess.CompletedProcess):
        self.workspace = workspace
        self.returncode = completed.returncode
        self.output = completed.stdout

    def server_dir(self) -> Path:
        return self.workspace / "server" / "simulate_job"

    def site_dir(self, site: str) -> Path:
        return self.workspace / site / "simulate_job"

    def global_metrics(self) -> list:
        path = self.server_dir() / "global_metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def last_upload(self, site: str, state_name: str):
        """``(round, state dict)`` of the last upload that ``site`` stored in its state file ``state_name``."""
        record = torch.load(self.site_dir(site) / "nvflare_moon" / f"{state_name}.pt", weights_only=True)
        return record["round"], record["payload"]["previous_models"][-1]


def run_simulator(job_dir, workspace, n: int, t: int, timeout: float = 300, clients=None) -> SimulatorRun:
    """Run the simulator (``-c clients`` instead of ``-n`` when given). Its workers share its process group, which is
    killed when the run is over or past ``timeout``, so that no worker outlives the test."""
    sites = ["-c", ",".join(clients)] if clients else ["-n", str(n)]
    cmd = [sys.executable, "-m", "nvflare.private.fed.app.simulator.simulator", str(job_dir),
           "-w", str(workspace), *sites, "-t", str(t)]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=workspace.parent,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the simulator ran past {timeout} s; its output ends:\n{output[-3000:]}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return SimulatorRun(Path(workspace), subprocess.CompletedProcess(cmd, process.returncode, output))


# training settings of the end-to-end tests' tiny jobs: a second or so of training per site and round
TINY_TRAINING = dict(dataset="synthetic", local_epochs=2, batch_size=32, lr=0.05)


def export_and_run(recipe, root: Path, n: int, t: int, tag: str = "", timeout: float = 300) -> SimulatorRun:
    """Export ``recipe`` to ``root/jobs<tag>`` and run its job in the simulator in ``root/ws<tag>``."""
    jobs = root / f"jobs{tag}"
    recipe.export(str(jobs))
    (job_dir,) = [p for p in jobs.iterdir() if p.is_dir()]
    return run_simulator(job_dir, root / f"ws{tag}", n, t, timeout)


@pytest.fixture
def simulate(tmp_path):
    """Export a recipe and run it in the simulator: ``simulate(recipe, n=3, t=2)``."""

    def _simulate(recipe, n: int, t: int, tag: str = "", timeout: float = 300) -> SimulatorRun:
        return export_and_run(recipe, tmp_path, n, t, tag, timeout)

    return _simulate
