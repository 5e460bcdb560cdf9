"""The simulator's resume point: a small folder holding a stopped simulator run's last aggregated round, every site's
state and the job, from which :mod:`nvflare_moon.ops.continuation` builds the continuation (see its docstring), and the command
line ``python -m nvflare_moon.ops.resume_point``."""

import argparse
import datetime
import filecmp
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..core.history import history_before
from ..core.state import STATE_FOLDER
from ..sim.fixes import with_simulator_fixes
from .continuation import read_checkpoint, read_json, round_range, server_controller, write_continuation, write_json

SIMULATOR_MODULE = "nvflare.private.fed.app.simulator.simulator"
SIMULATOR_JOB_ID = "simulate_job"  # the simulator's job id, every run
POINT_FILE = "resume_point.json"
POINT_FORMAT = 1
METRICS_FILE = "global_metrics.jsonl"  # GlobalModelEvaluator's


@dataclass(frozen=True)
class ResumePoint:
    """A saved resume point (see the module's docstring): ``path`` and what ``resume_point.json`` says."""

    path: str
    last_round: int
    sites: Tuple[str, ...]
    info: Dict[str, Any]

    @property
    def job_dir(self) -> str:
        return os.path.join(self.path, "job")

    @property
    def checkpoint(self) -> str:
        return os.path.join(self.path, "global_model.pt")

    @property
    def states_dir(self) -> str:
        return os.path.join(self.path, "sites")

    def metrics(self) -> List[Dict[str, Any]]:
        """The per-round global metrics of rounds 0 … ``last_round``, as the evaluator wrote them."""
        return _read_jsonl(os.path.join(self.path, METRICS_FILE))

    def size_bytes(self) -> int:
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(self.path) for f in files)


def load_resume_point(path: str) -> ResumePoint:
    """The resume point saved in ``path``.

    Raises:
        ValueError: ``path`` holds no complete resume point.
    """
    try:
        info = read_json(os.path.join(path, POINT_FILE))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} holds no resume point ({e})") from e
    if info.get("format") != POINT_FORMAT or not isinstance(info.get("last_round"), int):
        raise ValueError(f"{os.path.join(path, POINT_FILE)} is not a format-{POINT_FORMAT} resume point")
    point = ResumePoint(os.path.abspath(path), info["last_round"], tuple(info.get("sites", ())), info)
    for needed in (point.checkpoint, os.path.join(point.job_dir, "meta.json")):
        if not os.path.exists(needed):
            raise ValueError(f"the resume point {path} is incomplete: {needed} is missing")
    return point


def workspace_checkpoint(workspace: str) -> str:
    """Where the simulator's server keeps the last global model."""
    return os.path.join(workspace, "server", SIMULATOR_JOB_ID, "app_server", "FL_global_model.pt")


def save_resume_point(
    workspace: str, dest: str, job_dir: Optional[str] = None, info: Optional[Dict[str, Any]] = None, log=print
) -> ResumePoint:
    """Save the resume point of the simulator run in ``workspace`` (stopped, or still running) into ``dest``.

    If the run is itself a continuation of the resume point in ``dest``, the point is brought forward: the rounds
    before the continuation, and the state of a site that has not trained since, come from it. ``job_dir`` is the job
    as first run; by default the one in ``dest``, else the job rebuilt from the workspace (one app for every site).
    ``info`` is stored in ``resume_point.json`` (the benchmark stores its run's settings).

    If ``dest`` already is this workspace's point at its last round (saved before), it is returned as it is.

    Raises:
        ValueError: the workspace has no aggregated round, its rounds do not follow on from ``dest``, or ``dest``
            holds a later round; the message says what to do.
    """
    model_path = workspace_checkpoint(workspace)
    last_round = read_checkpoint(model_path)[1]["current_round"]
    if _saved_already(workspace, dest, last_round):
        return load_resume_point(dest)
    previous, first_round = _previous_point(workspace, dest, last_round)
    metrics = _metrics_through(workspace, previous, first_round, last_round)
    tmp = f"{os.path.abspath(dest)}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if job_dir is None and previous is not None:
        job_dir = previous.job_dir
    _copy_job(workspace, job_dir, first_round, tmp)
    shutil.copyfile(model_path, os.path.join(tmp, "global_model.pt"))
    with open(os.path.join(tmp, METRICS_FILE), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in metrics)
    sites = _simulator_sites(workspace)
    for site in sites:
        site_states = os.path.join(workspace, site, SIMULATOR_JOB_ID, STATE_FOLDER)
        saved = _save_site_states(site_states, site, last_round, os.path.join(tmp, "sites", site), log)
        if not saved and previous is not None and os.path.isdir(os.path.join(previous.states_dir, site)):
            # the site has not trained since the point it was continued from (partial participation)
            shutil.copytree(os.path.join(previous.states_dir, site), os.path.join(tmp, "sites", site))
    record = {
        "format": POINT_FORMAT,
        "last_round": last_round,
        "sites": sites,
        "saved": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "from_workspace": os.path.abspath(workspace),
        **(info or {}),
    }
    write_json(os.path.join(tmp, POINT_FILE), record)
    _replace_folder(tmp, dest)
    return load_resume_point(dest)


def _saved_already(workspace: str, dest: str, last_round: int) -> bool:
    """Whether ``dest`` is this workspace's point at ``last_round``, with its very global model (a run redone from
    scratch in the same workspace is not): saved once, it is no longer the point the workspace's run continued from,
    so saving it again must not be checked against that."""
    if not os.path.exists(os.path.join(dest, POINT_FILE)):
        return False
    point = load_resume_point(dest)
    return (
        point.last_round == last_round
        and point.info.get("from_workspace") == os.path.abspath(workspace)
        and filecmp.cmp(workspace_checkpoint(workspace), point.checkpoint, shallow=False)
    )


def _previous_point(workspace: str, dest: str, last_round: int) -> Tuple[Optional[ResumePoint], int]:
    """The resume point already in ``dest`` (None: none) and the first round the workspace's run trained.

    Raises:
        ValueError: ``dest`` holds a later round, or the run continues from a round that ``dest`` does not hold.
    """
    server_config = read_json(
        os.path.join(workspace, "server", SIMULATOR_JOB_ID, "app_server", "config", "config_fed_server.json")
    )
    first_round, _ = round_range(server_controller(server_config, "the workspace's server config"))
    previous = load_resume_point(dest) if os.path.exists(os.path.join(dest, POINT_FILE)) else None
    if previous is not None and previous.last_round > last_round:
        raise ValueError(
            f"{dest} holds round {previous.last_round}, the workspace {workspace} only round "
            f"{last_round}: keeping the resume point; continue from it"
        )
    if first_round > 0 and (previous is None or previous.last_round != first_round - 1):
        raise ValueError(
            f"the run in {workspace} continues from round {first_round - 1}, but {dest} does not hold that resume "
            "point: save it where the continuation was made from"
        )
    return previous, first_round


def _metrics_through(
    workspace: str, previous: Optional[ResumePoint], first_round: int, last_round: int
) -> List[Dict[str, Any]]:
    """The global metrics of rounds 0 … ``last_round``: the previous point's before the run, then the run's.

    Raises:
        ValueError: a round is missing.
    """
    earlier = [r for r in previous.metrics() if r["round"] < first_round] if first_round > 0 else []
    run_metrics = _read_jsonl(os.path.join(workspace, "server", SIMULATOR_JOB_ID, METRICS_FILE))
    metrics = earlier + [r for r in run_metrics if first_round <= r["round"] <= last_round]
    if [r["round"] for r in metrics] != list(range(last_round + 1)):
        raise ValueError(
            f"the global metrics of {workspace} hold rounds {[r['round'] for r in metrics]}, expected 0 … {last_round}"
        )
    return metrics


def _copy_job(workspace: str, job_dir: Optional[str], first_round: int, point_dir: str) -> None:
    """The job as first run, into ``point_dir/job``: ``job_dir``, else rebuilt from a run that started at round 0.

    Raises:
        ValueError: a continuation's job is not given.
    """
    if job_dir is not None:
        shutil.copytree(job_dir, os.path.join(point_dir, "job"), ignore=shutil.ignore_patterns(".__nvfl_*"))
    elif first_round == 0:
        _rebuild_job(workspace, os.path.join(point_dir, "job"))
    else:
        raise ValueError(f"the job of the continuation in {workspace} is unknown: give the job folder")


def _save_site_states(source: str, site: str, last_round: int, dest: str, log) -> bool:
    """Copy a site's state files, each cut to what the round after ``last_round`` reads; False if it has none. A
    file that is not this site's is left out, with a warning."""
    names = sorted(f for f in os.listdir(source) if f.endswith(".pt")) if os.path.isdir(source) else []
    saved = False
    for name in names:
        try:
            record = torch.load(os.path.join(source, name), map_location="cpu", weights_only=True)
        except Exception as e:
            log(f"warning: {site}: {name} cannot be read ({e}); the site continues without it")
            continue
        if not isinstance(record, dict) or record.get("site") != site or record.get("job_id") != SIMULATOR_JOB_ID:
            owner = record.get("site") if isinstance(record, dict) else None
            log(
                f"warning: {site}'s {name} is the state of {owner!r}, not {site!r}: the simulator ran another site's "
                f"training in {site}'s process. {site} continues without this state"
            )
            continue
        payload = history_before(record.get("payload") or {}, last_round + 1)
        rounds = payload.get("rounds")
        record = dict(record, payload=payload, round=max(rounds) if rounds else record["round"])
        os.makedirs(dest, exist_ok=True)
        torch.save(record, os.path.join(dest, name))
        saved = True
    return saved


def _simulator_sites(workspace: str) -> List[str]:
    """The sites of a simulator workspace: its folders with a run folder, the server's aside."""
    found = [n for n in os.listdir(workspace) if os.path.isdir(os.path.join(workspace, n, SIMULATOR_JOB_ID))]
    return sorted((n for n in found if n != "server"), key=lambda n: (len(n), n))


def _rebuild_job(workspace: str, dest: str) -> None:
    """The job as the simulator deployed it: its meta and the server's app, which holds both configs."""
    server = os.path.join(workspace, "server", SIMULATOR_JOB_ID)
    meta = read_json(os.path.join(server, "meta.json"))
    apps = list(meta.get("deploy_map", {}))
    if len(apps) != 1:
        raise ValueError(f"the job in {workspace} has apps {apps}: give its job folder")
    app_dir = os.path.join(server, "app_server")
    if not os.path.exists(os.path.join(app_dir, "config", "config_fed_client.json")):
        raise ValueError(f"the server app in {workspace} lacks the client config: give the job folder")
    shutil.copytree(os.path.join(app_dir, "config"), os.path.join(dest, apps[0], "config"))
    if os.path.isdir(os.path.join(app_dir, "custom")):
        shutil.copytree(os.path.join(app_dir, "custom"), os.path.join(dest, apps[0], "custom"))
    kept = ("name", "resource_spec", "min_clients", "deploy_map")
    write_json(os.path.join(dest, "meta.json"), {k: meta[k] for k in kept if k in meta})


def _replace_folder(new: str, dest: str) -> None:
    """Put the complete folder ``new`` in the place of ``dest``; the old one is kept until the new one is there."""
    old = f"{os.path.abspath(dest)}.old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(dest):
        os.rename(dest, old)
    os.rename(new, dest)
    shutil.rmtree(old, ignore_errors=True)


def make_simulator_continuation(point: ResumePoint, job_dir: str) -> str:
    """Write the simulator continuation of ``point`` into ``job_dir``; its sites read their state from the point,
    which must stay where it is while the job runs. Returns ``job_dir``."""
    args = {"resume_from_job_id": SIMULATOR_JOB_ID, "resume_state_dir": point.states_dir}
    job_dir = write_continuation(point.job_dir, point.checkpoint, os.path.abspath(job_dir), args)
    for folder, _, files in os.walk(job_dir):  # a point saved before the fixes were a job component gets them
        if "config_fed_server.json" in files:
            path = os.path.join(folder, "config_fed_server.json")
            config = read_json(path)
            config["components"] = with_simulator_fixes(config.get("components", []))
            write_json(path, config)
    return job_dir


def continued_metrics(point: ResumePoint, workspace: str) -> List[Dict[str, Any]]:
    """Every round's global metrics of a run continued from ``point`` in ``workspace``: the point's, then the run's."""
    run = _read_jsonl(os.path.join(workspace, "server", SIMULATOR_JOB_ID, METRICS_FILE))
    return point.metrics() + [r for r in run if r["round"] > point.last_round]


def _read_jsonl(path: str) -> List[Dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nvflare_moon.ops.resume_point",
        description="Continue a stopped simulator run of an nvflare_moon job from its last aggregated round, with "
        "every site's state. The state is first saved into a resume point (default WORKSPACE_resume), because the "
        "simulator wipes its workspace; the continuation then runs in WORKSPACE, and its global_metrics.jsonl gets "
        "every round.",
    )
    parser.add_argument("--workspace", "-w", required=True, help="the simulator workspace (-w) of the stopped run")
    parser.add_argument("--job", help="the job folder it ran (default: rebuilt from the workspace)")
    parser.add_argument(
        "--point",
        help="the resume point folder (default: WORKSPACE_resume); if the workspace has "
        "no aggregated round, the run continues from this point",
    )
    parser.add_argument("--save-only", action="store_true", help="save the resume point and stop")
    parser.add_argument("-n", type=int, help="the simulator's -n (default: the point's number of sites)")
    parser.add_argument("-t", type=int, help="the simulator's -t (default: -n)")
    args = parser.parse_args(argv)
    workspace = os.path.abspath(args.workspace)
    point_dir = os.path.abspath(args.point or f"{workspace.rstrip(os.sep)}_resume")
    try:
        if os.path.exists(workspace_checkpoint(workspace)):
            point = save_resume_point(workspace, point_dir, args.job)
            print(f"saved the resume point of round {point.last_round} in {point_dir} ({point.size_bytes()} bytes)")
        else:
            point = load_resume_point(point_dir)
            print(f"{workspace} has no aggregated round; continuing from {point_dir} (round {point.last_round})")
        if args.save_only:
            return 0
        job = make_simulator_continuation(point, f"{workspace.rstrip(os.sep)}_continuation")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = args.n or len(point.sites)
    command = [sys.executable, "-m", SIMULATOR_MODULE, job, "-w", workspace, "-n", str(n), "-t", str(args.t or n)]
    print(f"continuing from round {point.last_round + 1}: {' '.join(command)}", flush=True)
    returncode = subprocess.call(command)
    if returncode == 0:
        metrics = continued_metrics(point, workspace)
        with open(os.path.join(workspace, "server", SIMULATOR_JOB_ID, METRICS_FILE), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in metrics)
        print(f"done: rounds 0 … {metrics[-1]['round']} in {workspace}/server/{SIMULATOR_JOB_ID}/{METRICS_FILE}")
    return returncode


if __name__ == "__main__":
    sys.exit(main())
