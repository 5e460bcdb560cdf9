"""Continue a job that stopped part-way: a new job that starts at the round after the last one the server aggregated,
from that round's global model, with every site's state.

Two cases, one mechanism (:func:`write_continuation`):

- **POC and production.** NVFlare 2.9 fails the whole job when one site's job process dies ("Failing job … due to
  reported failure from site-1", status ``FINISHED:EXECUTION_EXCEPTION``) and never restarts it. Its downloaded result
  holds the last global model, ``workspace/app_server/FL_global_model.pt``, with the round that produced it in its
  ``meta_props``, and every site keeps its state for the job in its run folder ``<site>/<job_id>/``, which NVFlare
  does not delete. :func:`make_continuation_job` turns the result into the continuation;
  ``python -m nvflare_moon.ops.submit --resume JOB_ID`` does it all through the FLARE API.
- **The simulator.** A run that was stopped (a time limit, Ctrl-C, a closed laptop) leaves the same in its workspace,
  but the simulator wipes its workspace when it starts. So the state is first saved into a **resume point**
  (:func:`~nvflare_moon.ops.resume_point.save_resume_point`), a small folder that can be kept or committed::

      resume_point.json      the last aggregated round, the sites, where it came from
      job/                   the job as first run
      global_model.pt        the server's checkpoint of that round, as NVFlare wrote it
      global_metrics.jsonl   the per-round global metrics so far
      sites/<site>/<name>.pt each site's state (MOON's previous models, SCAFFOLD's control, ...)

  and :func:`~nvflare_moon.ops.resume_point.make_simulator_continuation` builds the continuation from it (both in
  :mod:`nvflare_moon.ops.resume_point`). ``python -m nvflare_moon.ops.resume_point --workspace WS`` does both and runs it (see
  :func:`~nvflare_moon.ops.resume_point.main`); the benchmark continues its runs in the same way.

The continuation job is the job as it was, except that the server's ``FedAvg`` gets ``start_round`` = k + 1 and
``num_rounds`` = the rounds left, its persistor starts from round k's checkpoint (shipped in the server app's
``custom/``, meta included: SCAFFOLD's global control, FedSSC's prototypes, so the continued rounds get what they would
have got), and every site's executor gets ``resume_from_job_id`` (and, for the simulator, ``resume_state_dir``), so it
takes the state it saved in the stopped job (:meth:`~nvflare_moon.executors.FedAvgExecutor.job_state`). A site that
trained round k + 1 before the stop does not use that round's state when round k + 1 runs again. Batches and site
sampling are seeded by round, so the continued rounds are the ones the stopped job would have run: the continuation
gives the same models, bit for bit, on the same machine (``tests/test_simulator_resume.py``).
"""

import importlib
import inspect
import json
import os
import shutil
from typing import Any, Dict, Tuple

import numpy as np
import torch

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
    meta = read_json(meta_path)
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
    write_json(meta_path, meta)
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
    config = read_json(path)
    for component_path in _component_paths(config):
        if component_path in NOT_RESUMABLE:
            raise ValueError(NOT_RESUMABLE[component_path])
    controller, persistor = server_controller(config, path), _persistor(config, path)
    args = controller.setdefault("args", {})
    start_round, total = round_range(controller)
    if last_round + 1 >= total:
        raise ValueError(f"round {last_round} was the job's last ({total} rounds): there is nothing to continue")
    args.update(start_round=last_round + 1, num_rounds=total - last_round - 1)
    persistor.setdefault("args", {}).update(
        {PERSISTOR_CHECKPOINT_ARG: CHECKPOINT_NAME, PERSISTOR_WEIGHTS_ONLY_ARG: False}
    )
    write_json(path, config)


def server_controller(config: dict, path: str) -> dict:
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


def round_range(controller: dict) -> Tuple[int, int]:
    """The controller's first round and its end (the job's total rounds)."""
    args = controller.get("args", {})
    defaults = _init_defaults(controller["path"])
    start_round = args.get("start_round", defaults.get("start_round", 0))
    return start_round, start_round + args.get("num_rounds", defaults.get("num_rounds"))


def _continue_clients(job_dir: str, app: str, client_args: Dict[str, str]) -> None:
    path = _config(job_dir, app, "client")
    config = read_json(path)
    executors = [e["executor"] for e in config.get("executors", [])]
    if not executors or any(not e.get("path", "").startswith("nvflare_moon.") for e in executors):
        raise ValueError(f"{path}: only jobs of nvflare_moon executors can be continued (their state is ours)")
    for executor in executors:
        executor.setdefault("args", {}).update(client_args)
    write_json(path, config)


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


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=4)
