"""Helpers for the deployment tests, which run real NVFlare federations (POC and provisioned) on loopback.

Every process a test starts is stopped by its PID (or by the process group it was started in) in a ``finally`` block;
every wait is bounded.
"""

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, TypeVar

import torch

from nvflare_moon.ops.submit import open_session
from nvflare_moon.recipes import MoonRecipe

from .conftest import REPO

T = TypeVar("T")
SITES = ["site-1", "site-2"]
VENV_BIN = os.path.dirname(sys.executable)


def free_port() -> int:
    """A TCP port free on localhost now (NVFlare's POC default 8002 may be a user's running POC)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check: Callable[[], Optional[T]], timeout: float, what: str, interval: float = 0.3) -> T:
    """Poll ``check`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


def pids_of(*needles: str) -> List[int]:
    """PIDs of this user's processes whose command line holds every needle (found by reading /proc, not by pkill)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(needle.encode() in argv for needle in needles):
            found.append(int(entry))
    return found


def kill(pids, sig=signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def nvflare_env(home: Path) -> dict:
    """The environment of NVFlare's processes: this interpreter first on PATH (POC participants run ``python3``),
    and a private HOME, because ``nvflare poc prepare`` registers startup kits in ``~/.nvflare``."""
    home.mkdir(parents=True, exist_ok=True)
    path = VENV_BIN + os.pathsep + os.environ.get("PATH", "")
    return dict(os.environ, HOME=str(home), PATH=path, PYTHONUNBUFFERED="1")


def run_script(script: str, *args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run one of the repository's scripts (``poc/prepare.py``, ...) as the user would."""
    return subprocess.run(
        [sys.executable, str(REPO / script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def export_tiny_moon(
    jobs: Path, name: str, num_rounds: int, min_clients: int = 2, recipe_class: type = MoonRecipe, **kwargs
) -> Path:
    """A MOON job (or ``recipe_class``'s) on the tiny synthetic dataset: a few seconds per round on CPU."""
    recipe = recipe_class(
        name=name,
        min_clients=min_clients,
        num_rounds=num_rounds,
        dataset="synthetic",
        local_epochs=1,
        batch_size=32,
        lr=0.05,
        num_threads=1,
        **kwargs,
    )
    recipe.export(str(jobs))
    return jobs / name


def saved_state(site_workspace: Path, job_id: str) -> Optional[dict]:
    """The MOON state a site saved for a job, or None before its first round."""
    path = site_workspace / job_id / "nvflare_moon" / "moon_state.pt"
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # not written yet (the store replaces the file atomically, so never half written)
        return None


def connect(admin_kit: Path, timeout: float):
    """A FLARE API session, retried while the server starts (or restarts)."""

    def attempt():
        try:
            return open_session(str(admin_kit), timeout=5)
        except Exception:
            return None

    return wait_until(attempt, timeout, f"an admin session to the server with {admin_kit.name}", interval=1)


def _poc_workspace_class():
    """``poc/poc_workspace.py``'s PocWorkspace, loaded from its file: the poc/ scripts are not a package, and putting
    poc/ on ``sys.path`` would change every later import of the test session."""
    spec = importlib.util.spec_from_file_location("poc_workspace", REPO / "poc" / "poc_workspace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PocWorkspace


PocWorkspace = _poc_workspace_class()


class Poc:
    def __init__(self, root: Path, env: dict):
        self.root = root
        self.env = env
        self.ws = PocWorkspace(str(root / "ws"))

    def site(self, name: str) -> Path:
        return Path(self.ws.prod_dir()) / name

    @property
    def admin_kit(self) -> Path:
        return Path(self.ws.admin_kit())


def running_poc(root: Path, he: bool = False) -> Iterator[Poc]:
    """A module fixture's body: a POC of a server and :data:`SITES` on a free port (with NVFlare's HE contexts if
    ``he``), prepared and started with the poc/ scripts, stopped with poc/stop.py and then by PID whatever is left;
    then the scripts are checked to be no-ops when run again."""
    env = nvflare_env(root / "home")
    env["NVFLARE_POC_WORKSPACE"] = str(root / "ws")
    federation = Poc(root, env)
    prepare = ["poc/prepare.py", "-n", str(len(SITES)), "-p", str(free_port()), "-w", str(root / "ws")]
    prepare += ["--he"] if he else []
    prepared = run_script(*prepare, env=env)
    assert prepared.returncode == 0, prepared.stdout
    try:
        started = run_script("poc/start.py", "-w", str(root / "ws"), env=env, timeout=180)
        assert started.returncode == 0, started.stdout
        yield federation
    finally:
        try:
            stopped = run_script("poc/stop.py", "-w", str(root / "ws"), env=env, timeout=180)
            stop_report = (stopped.returncode, stopped.stdout)
        except subprocess.TimeoutExpired:
            stop_report = (None, "poc/stop.py did not finish within 180 s")
        left = federation.ws.live_pids()
        kill(pid for pids in left.values() for pid in pids)  # by PID, should stop.py have failed
        kill(pid for name in ["server", *SITES] for pid in pids_of(str(federation.site(name))))  # their job processes
    assert stop_report[0] == 0 and not left, stop_report[1]
    # once stopped, the scripts are no-ops when run again; the job results stay
    assert "nothing to do" in run_script("poc/stop.py", "-w", str(root / "ws"), env=env).stdout
    assert "already prepared" in run_script(*prepare, env=env).stdout
