"""What the POC scripts share: where NVFlare's POC workspace is, what it holds, whether it runs, and running
NVFlare's own CLI (``nvflare poc ...``, ``nvflare job ...``) on it with the interpreter that runs these scripts."""

import argparse
import os
import subprocess
import sys
import time
from typing import Dict, List, NoReturn, Optional

import yaml

NVFLARE_DEFAULT_WORKSPACE = "/tmp/nvflare/poc"  # NVFlare's own default
NVFLARE_DEFAULT_PORT = 8002
PID_FILES = ("daemon_pid.fl", "pid.fl")  # the restart loop and the FL process of every started participant


def add_workspace_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-w",
        "--workspace",
        default=os.environ.get("NVFLARE_POC_WORKSPACE") or NVFLARE_DEFAULT_WORKSPACE,
        help="POC workspace folder (default: $NVFLARE_POC_WORKSPACE or %(default)s)",
    )


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


class PocWorkspace:
    """A folder prepared by ``nvflare poc prepare``: ``project.yml`` and ``<project>/prod_00/<participant>/``."""

    def __init__(self, root: str):
        self.root = os.path.abspath(os.path.expanduser(root))
        self.project_file = os.path.join(self.root, "project.yml")

    def project(self) -> Optional[dict]:
        if not os.path.isfile(self.project_file):
            return None
        with open(self.project_file) as f:
            return yaml.safe_load(f)

    def _participants(self, kind: str) -> List[dict]:
        return [p for p in (self.project() or {}).get("participants", []) if p.get("type") == kind]

    def sites(self) -> List[str]:
        return [p["name"] for p in self._participants("client")]

    def services(self) -> List[str]:
        """The server and the sites: what ``nvflare poc start`` starts (admin consoles are started by hand)."""
        return [p["name"] for p in self._participants("server")] + self.sites()

    def has_he(self) -> bool:
        """Whether the project provisions HE contexts (NVFlare's HEBuilder, ``nvflare poc prepare --he``)."""
        return any(b.get("path", "").endswith(".HEBuilder") for b in (self.project() or {}).get("builders", []))

    def port(self) -> int:
        (server,) = self._participants("server")
        return int(server.get("fed_learn_port", NVFLARE_DEFAULT_PORT))

    def prod_dir(self) -> str:
        return os.path.join(self.root, self.project()["name"], "prod_00")

    def admin_kit(self) -> str:
        """The project admin's startup kit: the user that submits jobs."""
        admin = next(p for p in self._participants("admin") if p.get("role") == "project_admin")
        return os.path.join(self.prod_dir(), admin["name"])

    def live_pids(self) -> Dict[str, List[int]]:
        """Participant -> live processes recorded in its pid files; empty when nothing runs."""
        if self.project() is None or not os.path.isdir(self.prod_dir()):
            return {}
        live = {}
        for name in sorted(os.listdir(self.prod_dir())):
            pids = [pid for pid in (_read_pid(os.path.join(self.prod_dir(), name, f)) for f in PID_FILES) if pid]
            pids = [pid for pid in pids if _alive(pid)]
            if pids:
                live[name] = pids
        return live

    def wait_until_stopped(self, timeout: float) -> Dict[str, List[int]]:
        """Poll until no recorded process is alive (NVFlare's restart loops exit within ~5 s); what is left."""
        deadline = time.monotonic() + timeout
        while (live := self.live_pids()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return live


def _read_pid(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def nvflare(args: List[str], workspace: PocWorkspace, capture: bool = False) -> subprocess.CompletedProcess:
    """Run ``nvflare ARGS`` on this workspace with this interpreter.

    The POC participants run ``python3`` from ``PATH``; putting this interpreter's folder first makes them use the
    environment where nvflare_moon is installed.
    """
    env = dict(os.environ, NVFLARE_POC_WORKSPACE=workspace.root)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return subprocess.run(
        [sys.executable, "-m", "nvflare.cli", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        text=True,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.STDOUT if capture else None,
    )
