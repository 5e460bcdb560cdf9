"""Continue a job that stopped part-way: a new job that starts at the round after the last one the server aggregated,
from that round's global model, with every site's state.

Two cases, one mechanism (:func:`write_continuation`):

- **POC and production.** NVFlare 2.9 fails the whole job when one site's job process dies ("Failing job … due to
  reported failure from site-1", status ``FINISHED:EXECUTION_EXCEPTION``) and never restarts it. Its downloaded result
  holds the last global model, ``workspace/app_server/FL_global_model.pt``, with the round that produced it in its
  ``meta_props``, and every site keeps its state for the job in its run folder ``<site>/<job_id>/``, which NVFlare
  does not delete. :func:`make_continuation_job` turns the result into the continuation;
  ``python -m nvflare_moon.submit --resume JOB_ID`` does it all through the FLARE API.
- **The simulator.** A run that was stopped (a time limit, Ctrl-C, a closed laptop) leaves the same in its workspace,
  but the simulator wipes its workspace when it starts. So the state is first saved into a **resume point**
  (:func:`save_resume_point`), a small folder that can be kept or committed::

      resume_point.json      the last aggregated round, the sites, where it came from
      job/                   the job as first run
      global_model.pt        the server's checkpoint of that round, as NVFlare wrote it
      global_metrics.jsonl   the per-round global metrics so far
      sites/<site>/<name>.pt each site's state (MOON's previous models, SCAFFOLD's control, ...)

  and :func:`make_simulator_continuation` builds the continuation from it. ``python -m nvflare_moon.resume --workspace
  WS`` does both and runs it (see :func:`main`); the benchmark continues its runs in the same way.

The continuation job is the job as it was, except that the server's ``FedAvg`` gets ``start_round`` = k + 1 and
``num_rounds`` = the rounds left, its persistor starts from round k's checkpoint (shipped in the server app's
``custom/``, meta included: SCAFFOLD's global control, FedSSC's prototypes, so the continued rounds get what they would
have got), and every site's executor gets ``resume_from_job_id`` (and, for the simulator, ``resume_state_dir``), so it
takes the state it saved in the stopped job (:meth:`~nvflare_moon.executors.FedAvgExecutor.load_state`). A site that
trained round k + 1 before the stop does not use that round's state when round k + 1 runs again. Batches and site
sampling are seeded by round, so the continued rounds are the ones the stopped job would have run: the continuation
gives the same models, bit for bit, on the same machine (``tests/test_simulator_resume.py``).
"""

import argparse
import datetime
import importlib
import inspect
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from .core.history import history_before

CHECKPOINT_NAME = "resume_global_model.pt"
PERSISTOR_CHECKPOINT_ARG = "source_ckpt_file_full_name"  # PTFileModelPersistor's; a relative name is read from custom/
# the shipped checkpoint's meta holds numpy arrays (SCAFFOLD's control, FedSSC's prototypes), which torch's
# weights-only loader refuses; the file is the one this module copied from the server's own checkpoint
PERSISTOR_WEIGHTS_ONLY_ARG = "load_weights_only"

# Server components whose state is not in the global model, so a continuation would silently differ from the job.
NOT_RESUMABLE = {
    "nvflare.app_common.workflows.scaffold.Scaffold": (
        "NVFlare's Scaffold controller keeps its global control variate in memory only: a continuation would restart "
        "it at 0. Use ScaffoldRecipe (ScaffoldAggregator, which keeps it in the checkpoint), or run the job again"
    ),
}

_numpy = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1
# What the aggregators put in the checkpoint's meta (FedSSC's prototypes, FedSiam-DA's weights): plain numpy arrays.
_NUMPY_GLOBALS = [np.dtype, np.ndarray, _numpy.multiarray.scalar, _numpy.multiarray._reconstruct] + [
    getattr(np.dtypes, name) for name in dir(np.dtypes) if name.endswith("DType")
]


def read_checkpoint(path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """The model (a state dict) and the meta of a checkpoint of NVFlare's ``PTFileModelPersistor``.

    Raises:
        ValueError: there is no such file (the job stopped before the server aggregated its first round) or it is not
            a checkpoint with the round in its meta.
    """
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist: the job stopped before the server aggregated its first round")
    try:
        with torch.serialization.safe_globals(_NUMPY_GLOBALS):
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} cannot be read ({e})") from e
    checkpoint = checkpoint if isinstance(checkpoint, dict) else {}
    meta = checkpoint.get("meta_props") or {}
    if not isinstance(checkpoint.get("model"), dict) or not isinstance(meta.get("current_round"), int):
        raise ValueError(f"{path} is not a checkpoint of NVFlare's PTFileModelPersistor with the round in its meta")
    return checkpoint["model"], meta


def last_global_model(result_dir: str) -> Tuple[Dict[str, torch.Tensor], int]:
    """A failed job's last global model (a state dict) and the round the server aggregated into it; see
    :func:`read_checkpoint`."""
    model, meta = read_checkpoint(_result_checkpoint(result_dir))
    return model, meta["current_round"]


def write_continuation(source_job: str, checkpoint: str, job_dir: str, client_args: Dict[str, str]) -> str:
    """Write into ``job_dir`` the continuation of the job folder ``source_job`` after the round of ``checkpoint``;
    every executor gets ``client_args`` (``resume_from_job_id``, ...). Returns ``job_dir``.

    Raises:
        ValueError: the job cannot be continued; the message says why and what to do.
    """
    _, meta_props = read_checkpoint(checkpoint)
    last_round = meta_props["current_round"]
    shutil.rmtree(job_dir, ignore_errors=True)
    # NVFlare's signature of a submitted folder no longer fits once it is changed; the new submission signs anew
    shutil.copytree(source_job, job_dir, ignore=shutil.ignore_patterns(".__nvfl_*"))
    meta_path = os.path.join(job_dir, "meta.json")
    meta = _read_json(meta_path)
    apps = sorted(meta.get("deploy_map", {}))
    servers = [a for a in apps if os.path.exists(_config(job_dir, a, "server"))]
    if len(servers) != 1:
        raise ValueError(f"{job_dir}: expected one app with a server config, found {servers}")
    _continue_server(job_dir, servers[0], last_round)
    for app in apps:
        if os.path.exists(_config(job_dir, app, "client")):
            _continue_clients(job_dir, app, client_args)
    custom = os.path.join(job_dir, servers[0], "custom")
    os.makedirs(custom, exist_ok=True)
    shutil.copyfile(checkpoint, os.path.join(custom, CHECKPOINT_NAME))  # byte for byte: the same job every time
    meta["name"] = f"{meta.get('name', 'job')}-continued-from-round{last_round + 1}"
    _write_json(meta_path, meta)
    return job_dir


def make_continuation_job(result_dir: str, failed_job_id: str, dest: str) -> str:
    """Write the continuation of the failed job whose downloaded result is ``result_dir`` (``<download>/<job_id>``,
    holding ``job/<job name>/`` and ``workspace/``) into ``dest``; returns the job folder. Every site takes its state
    from its run folder of the failed job.

    Raises:
        ValueError: the job cannot be continued; the message says why and what to do.
    """
    checkpoint = _result_checkpoint(result_dir)
    job_dir = os.path.join(os.path.abspath(dest), f"{failed_job_id}-continued")
    return write_continuation(_submitted_job(result_dir), checkpoint, job_dir, {"resume_from_job_id": failed_job_id})


def _result_checkpoint(result_dir: str) -> str:
    return os.path.join(result_dir, "workspace", "app_server", "FL_global_model.pt")


def _submitted_job(result_dir: str) -> str:
    """The job folder as submitted: NVFlare's download holds it as ``job/<job name>/``."""
    jobs = os.path.join(result_dir, "job")
    found = [os.path.join(jobs, n) for n in sorted(os.listdir(jobs))]
    found = [path for path in found if os.path.isfile(os.path.join(path, "meta.json"))]
    if len(found) != 1:
        raise ValueError(f"{jobs} should hold the submitted job folder (with meta.json), found {found}")
    return found[0]


def _continue_server(job_dir: str, app: str, last_round: int) -> None:
    """Start the controller after ``last_round``, and the persistor from the shipped checkpoint."""
    path = _config(job_dir, app, "server")
    config = _read_json(path)
    for component_path in _component_paths(config):
        if component_path in NOT_RESUMABLE:
            raise ValueError(NOT_RESUMABLE[component_path])
    controller, persistor = _controller(config, path), _persistor(config, path)
    args = controller.setdefault("args", {})
    start_round, total = _round_range(controller)
    if last_round + 1 >= total:
        raise ValueError(f"round {last_round} was the job's last ({total} rounds): there is nothing to continue")
    args.update(start_round=last_round + 1, num_rounds=total - last_round - 1)
    persistor.setdefault("args", {}).update(
        {PERSISTOR_CHECKPOINT_ARG: CHECKPOINT_NAME, PERSISTOR_WEIGHTS_ONLY_ARG: False}
    )
    _write_json(path, config)


def _controller(config: dict, path: str) -> dict:
    workflows = config.get("workflows", [])
    controllers = [w for w in workflows if w.get("id") == "controller"] or workflows
    if len(controllers) != 1:
        raise ValueError(f"{path}: expected one FedAvg controller")
    return controllers[0]


def _persistor(config: dict, path: str) -> dict:
    persistors = [c for c in config.get("components", []) if c.get("id") == "persistor"]
    if len(persistors) != 1:
        raise ValueError(f"{path}: expected one component 'persistor'")
    return persistors[0]


def _round_range(controller: dict) -> Tuple[int, int]:
    """The controller's first round and its end (the job's total rounds)."""
    args = controller.get("args", {})
    defaults = _init_defaults(controller["path"])
    start_round = args.get("start_round", defaults.get("start_round", 0))
    return start_round, start_round + args.get("num_rounds", defaults.get("num_rounds"))


def _continue_clients(job_dir: str, app: str, client_args: Dict[str, str]) -> None:
    path = _config(job_dir, app, "client")
    config = _read_json(path)
    executors = [e["executor"] for e in config.get("executors", [])]
    if not executors or any(not e.get("path", "").startswith("nvflare_moon.") for e in executors):
        raise ValueError(f"{path}: only jobs of nvflare_moon executors can be continued (their state is ours)")
    for executor in executors:
        executor.setdefault("args", {}).update(client_args)
    _write_json(path, config)


def _init_defaults(class_path: str) -> Dict[str, object]:
    """The constructor defaults of a component class and its bases: the exported config leaves out arguments that
    equal them (FedAvg's ``num_rounds=5``, say)."""
    module, _, name = class_path.rpartition(".")
    defaults: Dict[str, object] = {}
    for klass in reversed(getattr(importlib.import_module(module), name).__mro__):
        for parameter in inspect.signature(klass.__init__).parameters.values():
            if parameter.default is not inspect.Parameter.empty:
                defaults[parameter.name] = parameter.default
    return defaults


def _component_paths(config) -> list:
    """Every class path in a job config, nested arguments included."""
    if isinstance(config, dict):
        own = [config["path"]] if isinstance(config.get("path"), str) else []
        return own + [p for value in config.values() for p in _component_paths(value)]
    if isinstance(config, list):
        return [p for value in config for p in _component_paths(value)]
    return []


def _config(job_dir: str, app: str, side: str) -> str:
    return os.path.join(job_dir, app, "config", f"config_fed_{side}.json")


def _read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=4)


# ---- the simulator ---------------------------------------------------------------------------------------------

SIMULATOR_MODULE = "nvflare.private.fed.app.simulator.simulator"
SIMULATOR_JOB_ID = "simulate_job"  # the simulator's job id, every run
POINT_FILE = "resume_point.json"
POINT_FORMAT = 1
METRICS_FILE = "global_metrics.jsonl"  # GlobalModelEvaluator's
STATE_FOLDER = "nvflare_moon"  # the executors' folder in a site's run folder


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
        info = _read_json(os.path.join(path, POINT_FILE))
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

    Raises:
        ValueError: the workspace has no aggregated round, its rounds do not follow on from ``dest``, or ``dest``
            holds a later round; the message says what to do.
    """
    model_path = workspace_checkpoint(workspace)
    _, meta = read_checkpoint(model_path)
    last_round = meta["current_round"]
    server_config = _read_json(
        os.path.join(workspace, "server", SIMULATOR_JOB_ID, "app_server", "config", "config_fed_server.json")
    )
    first_round, _ = _round_range(_controller(server_config, "the workspace's server config"))
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
    earlier = [r for r in previous.metrics() if r["round"] < first_round] if first_round > 0 else []
    run_metrics = _read_jsonl(os.path.join(workspace, "server", SIMULATOR_JOB_ID, METRICS_FILE))
    metrics = earlier + [r for r in run_metrics if first_round <= r["round"] <= last_round]
    if [r["round"] for r in metrics] != list(range(last_round + 1)):
        raise ValueError(
            f"the global metrics of {workspace} hold rounds {[r['round'] for r in metrics]}, expected 0 … {last_round}"
        )

    tmp = f"{os.path.abspath(dest)}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if job_dir is None:
        job_dir = previous.job_dir if previous is not None else None
    if job_dir is not None:
        shutil.copytree(job_dir, os.path.join(tmp, "job"), ignore=shutil.ignore_patterns(".__nvfl_*"))
    elif first_round == 0:
        _rebuild_job(workspace, os.path.join(tmp, "job"))
    else:
        raise ValueError(f"the job of the continuation in {workspace} is unknown: give the job folder")
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
    _write_json(os.path.join(tmp, POINT_FILE), record)
    _replace_folder(tmp, dest)
    return load_resume_point(dest)


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
    meta = _read_json(os.path.join(server, "meta.json"))
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
    _write_json(os.path.join(dest, "meta.json"), {k: meta[k] for k in kept if k in meta})


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
    return write_continuation(point.job_dir, point.checkpoint, os.path.abspath(job_dir), args)


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
        prog="python -m nvflare_moon.resume",
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
