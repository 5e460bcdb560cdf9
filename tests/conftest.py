"""Helpers for the end-to-end tests, which run NVFlare's real simulator as a subprocess (as NVFlare's own tests do)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

# Four workers share two cores, so torch's OpenMP threads often wait for a core. Under OpenMP's default (active) wait
# policy a waiting thread spins: a 2-thread training loop took 7 times as long beside two busy processes (55 s against
# 8 s passive, docs/notebook.md). Set before torch is imported, and inherited by every simulator process: it changes
# how idle threads wait, not what they compute.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SIMULATOR_WORKER = "nvflare.private.fed.app.simulator.simulator_worker"
WARM_WORKERS = "nvflare_moon.sim.workers"


class SimulatorRun:
    def __init__(self, workspace: Path, completed: subprocess.CompletedProcess, leftover_workers=()):
        self.workspace = workspace
        self.leftover_workers = list(leftover_workers)  # pids of client workers alive after the simulator exited
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


def end_process_tree(pid: int) -> None:
    """Kill the process ``pid`` started in a session of its own, and everything it started. The simulator starts every
    client worker in a new session (``os.setsid``), so its process group alone would miss them: they are found by
    parentage first; the group then catches what was already orphaned."""
    try:
        root = psutil.Process(pid)
        tree = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for process in tree:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=30)


def aggregated_round(workspace: Path):
    """The last round whose global model the simulator run in ``workspace`` has checkpointed; None before the first."""
    from nvflare_moon.ops.continuation import read_checkpoint
    from nvflare_moon.ops.resume_point import workspace_checkpoint

    try:
        return read_checkpoint(workspace_checkpoint(str(workspace)))[1]["current_round"]
    except ValueError:  # not there yet, or being written: NVFlare's persistor does not write atomically
        return None


def run_command(cmd, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run`` that, on a timeout (or Ctrl-C), ends the command's whole process tree before raising."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        end_process_tree(process.pid)
        e.output, _ = process.communicate(timeout=30)
        raise
    except BaseException:
        end_process_tree(process.pid)
        raise
    return subprocess.CompletedProcess(cmd, process.returncode, output)


def run_simulator(job_dir, workspace, n: int, t: int, timeout: float = 300, clients=None) -> SimulatorRun:
    """Run the simulator (``-c clients`` instead of ``-n`` when given); past ``timeout`` the test fails. No process of
    the run outlives it; the run's ``leftover_workers`` are the client workers still alive after a normal exit."""
    sites = ["-c", ",".join(clients)] if clients else ["-n", str(n)]
    cmd = [
        sys.executable,
        "-m",
        "nvflare.private.fed.app.simulator.simulator",
        str(job_dir),
        "-w",
        str(workspace),
        *sites,
        "-t",
        str(t),
    ]
    try:
        completed = run_command(cmd, workspace.parent, timeout)
    except subprocess.TimeoutExpired as e:
        kill_workers(workspace)
        pytest.fail(f"the simulator ran past {timeout} s; its output ends:\n{(e.output or '')[-3000:]}")
    return SimulatorRun(Path(workspace), completed, leftover_workers=kill_workers(workspace))


def kill_workers(workspace) -> list:
    """Kill the simulator client workers of ``workspace`` that are still alive; return their pids."""
    folder = os.path.abspath(workspace)
    workers = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        # a worker forked from nvflare_moon's zygote has the zygote's command line, which ends with the simulator's
        is_worker = SIMULATOR_WORKER in cmdline or WARM_WORKERS in cmdline
        if is_worker and any(arg.startswith(folder + os.sep) or os.path.abspath(arg) == folder for arg in cmdline):
            workers.append(process)
    for worker in workers:
        try:
            worker.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(workers, timeout=10)
    return [worker.pid for worker in workers]


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


@pytest.fixture(scope="session", autouse=True)
def private_temp_dir(tmp_path_factory):
    """This process's temporary files (the recipes' BYOC marker folder, ...) go to a folder of this test session that
    pytest cleans up, not to the system temp directory, where they would outlive the tests."""
    folder = tmp_path_factory.mktemp("tmp")
    saved = tempfile.tempdir
    tempfile.tempdir = str(folder)
    yield folder
    tempfile.tempdir = saved


# pytest-xdist (``--dist loadscope --no-loadscope-reorder``, pyproject.toml) hands whole modules to its workers in
# collection order: the longest modules go first, so that none of them starts last and runs alone while the other
# workers idle. (Without --no-loadscope-reorder xdist sorts the modules by their number of tests, which put the
# three-test resume module, the longest, last.) The order is by each module's total time in a full run.
LONGEST_MODULES = (
    "test_client_api_e2e.py",
    "test_simulator_resume.py",
    "test_privacy_bandwidth.py",
    "test_simulator_speed.py",
    "test_fail_loud.py",
    "test_deploy_poc.py",
    "test_e2e_moon.py",
    "test_evaluation.py",
    "test_deploy_provisioned.py",
    "test_dp.py",
    "test_benchmark.py",
    "test_methods.py",
    "test_deploy_poc_he.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_MODULES)))  # stable: the rest keep their order


def pytest_addoption(parser):
    parser.addoption(
        "--record-dir",
        default=None,
        help="write the figures that the docs quote from a test's measurement (test_deploy_poc_he.py: the HE transfer "
        "sizes) as JSON records into this folder, e.g. docs/results/he",
    )


@pytest.fixture
def write_record(request):
    """``write_record(name, figures)``: with ``--record-dir``, write ``figures`` to ``<dir>/<name>.json`` beside the
    command (as typed), date, commit and machine; without it, nothing."""
    from nvflare_moon.benchmark.runner import environment
    from nvflare_moon.core.files import write_json_atomic

    def _write(name: str, figures: dict) -> None:
        folder = request.config.getoption("record_dir")
        if folder:
            command = shlex.join(["python", "-m", "pytest", *request.config.invocation_params.args])
            write_json_atomic(os.path.join(folder, f"{name}.json"), {"command": command, **environment(), **figures})

    return _write
