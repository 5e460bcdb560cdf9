"""Continue a job that failed part-way: a new job that starts at the round after the last one the server aggregated,
from that round's global model, with every site's state.

NVFlare 2.9 fails the whole job when one site's job process dies ("Failing job … due to reported failure from
site-1", status ``FINISHED:EXECUTION_EXCEPTION``) and never restarts it. What the failed job leaves is enough to go on:

- its result on the server holds the last global model, ``workspace/app_server/FL_global_model.pt``, with the round
  that produced it in its ``meta_props``;
- every site keeps its state for the job (MOON's previous models, ...) in its run folder ``<site>/<job_id>/``, which
  NVFlare does not delete.

:func:`make_continuation_job` turns the downloaded result of the failed job into a job folder that runs like any other:

- the server's ``FedAvg`` gets ``start_round`` = k + 1 and ``num_rounds`` = the rounds left, and its persistor starts
  from round k's global model, shipped in the app's ``custom/`` folder;
- every site's executor gets ``resume_from_job_id``, so it takes the state it saved in the failed job
  (:meth:`~nvflare_moon.executors.FedAvgExecutor.load_state`). A site that saved round k + 1 before the failure does
  not use that upload as its previous model when round k + 1 runs again.

Batches and site sampling are seeded by round, so the continued rounds are the ones the failed job would have run.
FedSSC's first continued round trains without shared prototypes, as round 0 does. SCAFFOLD is refused (see
:data:`NOT_RESUMABLE`). ``python -m nvflare_moon.submit --resume JOB_ID`` does it all through the FLARE API.
"""

import importlib
import inspect
import json
import os
import shutil
from typing import Dict, Tuple

import numpy as np
import torch

CHECKPOINT_NAME = "resume_global_model.pt"
PERSISTOR_CHECKPOINT_ARG = "source_ckpt_file_full_name"  # PTFileModelPersistor's; a relative name is read from custom/

# Server components whose state is not in the global model, so a continuation would silently differ from the job.
_SCAFFOLD = (
    "SCAFFOLD keeps its global control variate on the server, not in the checkpoint: a continuation would restart it "
    "at 0. Submit the job again from round 0"
)
NOT_RESUMABLE = {
    "nvflare_moon.server.scaffold.ScaffoldAggregator": _SCAFFOLD,
    "nvflare.app_common.workflows.scaffold.Scaffold": _SCAFFOLD,
}

_numpy = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1
# What the aggregators put in the checkpoint's meta (FedSSC's prototypes, FedSiam-DA's weights): plain numpy arrays.
_NUMPY_GLOBALS = [np.dtype, np.ndarray, _numpy.multiarray.scalar, _numpy.multiarray._reconstruct] + [
    getattr(np.dtypes, name) for name in dir(np.dtypes) if name.endswith("DType")
]


def last_global_model(result_dir: str) -> Tuple[Dict[str, torch.Tensor], int]:
    """The failed job's last global model (a state dict) and the round the server aggregated into it.

    Raises:
        ValueError: there is no checkpoint (the job failed before its first aggregation) or it is not one of NVFlare's
            PyTorch checkpoints.
    """
    path = os.path.join(result_dir, "workspace", "app_server", "FL_global_model.pt")
    if not os.path.exists(path):
        raise ValueError(
            f"{path} does not exist: the job failed before the server aggregated its first round. Submit it again"
        )
    with torch.serialization.safe_globals(_NUMPY_GLOBALS):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    checkpoint = checkpoint if isinstance(checkpoint, dict) else {}
    meta = checkpoint.get("meta_props") or {}
    if not isinstance(checkpoint.get("model"), dict) or not isinstance(meta.get("current_round"), int):
        raise ValueError(f"{path} is not a checkpoint of NVFlare's PTFileModelPersistor with the round in its meta")
    return checkpoint["model"], meta["current_round"]


def make_continuation_job(result_dir: str, failed_job_id: str, dest: str) -> str:
    """Write the continuation of the failed job whose downloaded result is ``result_dir`` (``<download>/<job_id>``,
    holding ``job/<job name>/`` and ``workspace/``) into ``dest``; returns the job folder.

    Raises:
        ValueError: the job cannot be continued; the message says why and what to do.
    """
    model, last_round = last_global_model(result_dir)
    job_dir = os.path.join(os.path.abspath(dest), f"{failed_job_id}-continued")
    shutil.rmtree(job_dir, ignore_errors=True)
    # NVFlare's signature of the submitted folder no longer fits once it is changed; the new submission signs anew
    shutil.copytree(_submitted_job(result_dir), job_dir, ignore=shutil.ignore_patterns(".__nvfl_*"))
    meta_path = os.path.join(job_dir, "meta.json")
    meta = _read_json(meta_path)
    apps = sorted(meta.get("deploy_map", {}))
    servers = [a for a in apps if os.path.exists(_config(job_dir, a, "server"))]
    if len(servers) != 1:
        raise ValueError(f"{job_dir}: expected one app with a server config, found {servers}")
    _continue_server(job_dir, servers[0], last_round)
    for app in apps:
        if os.path.exists(_config(job_dir, app, "client")):
            _continue_clients(job_dir, app, failed_job_id)
    custom = os.path.join(job_dir, servers[0], "custom")
    os.makedirs(custom, exist_ok=True)
    torch.save({"model": model, "meta_props": {"current_round": last_round}}, os.path.join(custom, CHECKPOINT_NAME))
    meta["name"] = f"{meta.get('name', 'job')}-continued-from-round{last_round + 1}"
    _write_json(meta_path, meta)
    return job_dir


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
    workflows = config.get("workflows", [])
    controllers = [w for w in workflows if w.get("id") == "controller"] or workflows
    persistors = [c for c in config.get("components", []) if c.get("id") == "persistor"]
    if len(controllers) != 1 or len(persistors) != 1:
        raise ValueError(f"{path}: expected one FedAvg controller and one component 'persistor'")
    args = controllers[0].setdefault("args", {})
    defaults = _init_defaults(controllers[0]["path"])
    start_round = args.get("start_round", defaults.get("start_round", 0))
    total = start_round + args.get("num_rounds", defaults.get("num_rounds"))
    if last_round + 1 >= total:
        raise ValueError(f"round {last_round} was the job's last ({total} rounds): there is nothing to continue")
    args.update(start_round=last_round + 1, num_rounds=total - last_round - 1)
    persistors[0].setdefault("args", {})[PERSISTOR_CHECKPOINT_ARG] = CHECKPOINT_NAME
    _write_json(path, config)


def _continue_clients(job_dir: str, app: str, failed_job_id: str) -> None:
    path = _config(job_dir, app, "client")
    config = _read_json(path)
    executors = [e["executor"] for e in config.get("executors", [])]
    if not executors or any(not e.get("path", "").startswith("nvflare_moon.") for e in executors):
        raise ValueError(f"{path}: only jobs of nvflare_moon executors can be continued (their state is ours)")
    for executor in executors:
        executor.setdefault("args", {})["resume_from_job_id"] = failed_job_id
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
