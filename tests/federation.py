"""Helpers for the deployment tests, which run real NVFlare federations (POC and provisioned) on loopback.

Every process a test starts is stopped by its PID (or by the process group it was started in) in a ``finally`` block;
every wait is bounded.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional, TypeVar

import torch

from nvflare_moon.recipes import MoonRecipe
from nvflare_moon.submit import open_session

from .conftest import REPO

T = TypeVar("T")
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
        [sys.executable, str(REPO / script), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=timeout,
    )  # fmt: skip


def export_tiny_moon(jobs: Path, name: str, num_rounds: int, min_clients: int = 2, **kwargs) -> Path:
    """A MOON job on the tiny synthetic dataset: a few seconds per round on CPU."""
    recipe = MoonRecipe(
        name=name, min_clients=min_clients, num_rounds=num_rounds, dataset="synthetic", local_epochs=1,
        batch_size=32, lr=0.05, num_threads=1, **kwargs,
    )  # fmt: skip
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
