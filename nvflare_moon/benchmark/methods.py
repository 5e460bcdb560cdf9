"""The methods the benchmark can run, by name: one entry each.

A :class:`SimulatorMethod` exports its recipe with the run's settings and runs it in NVFlare's simulator; a
:class:`CommandMethod` runs a plain command (SOLO has no federation, so it is a script). Both only describe how to
start a run and where its results are (:class:`Launch`); :mod:`.runner` starts it, watches it and records it.

A method registered in :mod:`nvflare_moon.methods` is here with its variants; add it to a protocol in
:mod:`.protocols` to run it.
"""

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Union

from nvflare.app_common.filters import ExcludeVars, PercentilePrivacy, SVTPrivacy

from ..core.dp import DPSettings
from ..core.fedsiam_da import FedSiamDASettings
from ..core.fedssc import FedSSCSettings
from ..core.moon import MoonSettings
from ..core.specs import DataSpec, TrainingSpec
from ..methods import REGISTRY
from ..ops.resume_point import SIMULATOR_MODULE, ResumePoint, make_simulator_continuation
from ..sim.fixes import without_simulator_fixes
from .collect import read_simulator_results, read_solo_report
from .protocols import RunSpec, Variant, format_value

ROUND_LINE = re.compile(r"round (?P<unit>\d+): global test accuracy (?P<accuracy>[\d.]+)")  # GlobalModelEvaluator
SOLO_SITE_LINE = re.compile(r"(?P<unit>site-\d+): test accuracy (?P<accuracy>[\d.]+)")  # nvflare_moon.solo


@dataclass
class Launch:
    """How to start one run and read its results.

    ``command`` is run in a new session; every line of its output matching ``progress`` marks one more finished
    ``unit_name`` (of ``units``), with the global test accuracy in the group ``accuracy``. After a clean exit
    ``collect(started)`` (``started``: the command's start, seconds since the epoch) returns the run's results,
    at least ``final_accuracy``, or raises ValueError if they are incomplete.
    """

    command: List[str]
    progress: "re.Pattern[str]"
    units: int
    unit_name: str
    collect: Callable[[float], Dict[str, Any]]


@dataclass(frozen=True)
class SimulatorMethod:
    """A method run as a real NVFlare simulator job, exported from ``recipe`` with the run's settings.

    Args:
        label: the name in tables and plots.
        recipe: the recipe class; it gets every setting, the seed and β, then ``defaults``, then the variant's args.
        defaults: method arguments that differ from the recipe's own defaults or from the protocol's settings
            (SCAFFOLD with momentum 0, NIID-Bench's default, against the protocol's 0.9).
    """

    label: str
    recipe: Callable[..., Any]
    defaults: Dict[str, Any] = field(default_factory=dict)
    resumable = True

    def launch(
        self, spec: RunSpec, run_dir: str, data_root: Optional[str], point: Optional[ResumePoint] = None
    ) -> Launch:
        """The run from round 0, or, given a resume point of the same job, its continuation after the point."""
        s = spec.settings
        job, earlier = self.export(spec, os.path.join(run_dir, "job"), data_root), []
        if point is not None:
            if _job_configs(point.job_dir) != _job_configs(job):
                raise ValueError(
                    f"the resume point {point.path} is of another job than this run's (its configs differ from "
                    f"{job}): delete it to run from round 0, or continue it with the code that started it"
                )
            job = make_simulator_continuation(point, os.path.join(run_dir, "continuation"))
            earlier = point.metrics()
        workspace = os.path.join(run_dir, "workspace")
        command = [
            sys.executable,
            "-m",
            SIMULATOR_MODULE,
            job,
            "-w",
            workspace,
            "-n",
            str(s.num_sites),
            "-t",
            str(s.simulator_threads),
        ]
        return Launch(
            command,
            ROUND_LINE,
            s.rounds - len(earlier),
            "round",
            lambda started: read_simulator_results(workspace, s.rounds, started, earlier),
        )

    def export(self, spec: RunSpec, dest: str, data_root: Optional[str]) -> str:
        """Export the run's job into the (emptied) folder ``dest``; returns the job's folder."""
        s = spec.settings
        job_name = re.sub(r"[^A-Za-z0-9_-]", "_", spec.run_id)
        settings = dict(
            name=job_name,
            min_clients=s.num_sites,
            num_rounds=s.rounds,
            dataset=s.dataset,
            arch=s.arch,
            beta=spec.beta,
            seed=spec.seed,
            local_epochs=s.local_epochs,
            batch_size=s.batch_size,
            lr=s.lr,
            momentum=s.momentum,
            weight_decay=s.weight_decay,
            device=s.device,
            data_root=data_root,
        )
        recipe = self.recipe(**{**settings, **self.defaults, **dict(spec.variant.args)})
        shutil.rmtree(dest, ignore_errors=True)
        recipe.export(dest)
        return os.path.join(dest, job_name)

    def job_digest(self, spec: RunSpec) -> str:
        """A digest of the job this code exports for ``spec``, the data folder aside: it changes with the recipes'
        defaults, which the spec's fingerprint does not hold."""
        with tempfile.TemporaryDirectory() as folder:
            configs = _job_configs(self.export(spec, folder, None))
        return hashlib.sha256(json.dumps(configs, sort_keys=True).encode()).hexdigest()


def _job_configs(job_dir: str) -> Dict[str, Any]:
    """Every config file of a job folder, by its path in the folder, in one form whatever the executors' layout
    (:func:`flat_spec_args`) and the modules' names (:func:`earlier_class_paths`); the simulator's fixes aside, which
    change a run's time and nothing it computes (so records and resume points from before they were a job component
    still match)."""
    configs = {}
    for folder, _, files in os.walk(job_dir):
        for name in files:
            if name.endswith(".json") and not name.startswith(".__nvfl"):
                with open(os.path.join(folder, name)) as f:
                    config = earlier_class_paths(flat_spec_args(json.load(f)))
                if name == "config_fed_server.json":
                    config["components"] = without_simulator_fixes(config.get("components", []))
                configs[os.path.relpath(os.path.join(folder, name), job_dir)] = config
    return configs


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# The spec components an executor takes whole, and the prefix that its fields had as the executor's own arguments.
SPEC_PREFIXES = {
    _class_path(DataSpec): "",
    _class_path(TrainingSpec): "",
    _class_path(DPSettings): "dp_",
    _class_path(MoonSettings): "",
    _class_path(FedSSCSettings): "",
    _class_path(FedSiamDASettings): "",
}


def flat_spec_args(config: Any) -> Any:
    """``config`` with every nested spec component (``{"path": <spec class>, "args": {...}}`` in a component's
    ``args``) replaced by its fields, prefixed as they were when executors took them one by one. A job of today and
    the same job exported before the executors took their specs whole then compare equal, so that the committed
    records (their job digests) and resume points made before still match the jobs they were made with."""
    if isinstance(config, list):
        return [flat_spec_args(item) for item in config]
    if not isinstance(config, dict):
        return config
    flat = {key: flat_spec_args(value) for key, value in config.items()}
    if isinstance(flat.get("args"), dict):
        args = {}
        for name, value in flat["args"].items():
            prefix = SPEC_PREFIXES.get(value.get("path")) if isinstance(value, dict) else None
            if prefix is None:
                args[name] = value
            else:
                args.update({prefix + field: field_value for field, field_value in value.get("args", {}).items()})
        flat["args"] = args
    return flat


# Modules whose classes a job's configs name, renamed after records were made (095503b moved the filters): a job is
# compared under the earlier names, which the records' digests were taken with.
EARLIER_MODULES = {
    "nvflare_moon.filters.quantization.": "nvflare_moon.quantization.",
    "nvflare_moon.filters.privacy.": "nvflare_moon.privacy.",
    "nvflare_moon.filters.encryption.": "nvflare_moon.encryption.",
}


def earlier_class_paths(config: Any) -> Any:
    """``config`` with every component's class path under its module's earlier name (:data:`EARLIER_MODULES`)."""
    if isinstance(config, list):
        return [earlier_class_paths(item) for item in config]
    if not isinstance(config, dict):
        return config
    renamed = {key: earlier_class_paths(value) for key, value in config.items()}
    path = renamed.get("path")
    for module, earlier in EARLIER_MODULES.items():
        if isinstance(path, str) and path.startswith(module):
            renamed["path"] = earlier + path[len(module) :]
    return renamed


@dataclass(frozen=True)
class CommandMethod:
    """A method run as a plain command that writes a JSON report.

    Args:
        label: the name in tables and plots.
        command: ``(spec, report_path, data_root) -> argv``.
        read_report: ``(report_path, spec) -> results`` (at least ``final_accuracy``).
        progress: the output line that marks a finished unit (group ``accuracy``).
        units: ``spec -> number of units``.
        unit_name: what a unit is, for the progress line.
    """

    label: str
    command: Callable[[RunSpec, str, Optional[str]], List[str]]
    read_report: Callable[[str, RunSpec], Dict[str, Any]]
    progress: "re.Pattern[str]"
    units: Callable[[RunSpec], int]
    unit_name: str
    resumable = False

    def job_digest(self, spec: RunSpec) -> None:
        """A command has no job: its arguments are all in the spec's fingerprint."""
        return None

    def launch(self, spec: RunSpec, run_dir: str, data_root: Optional[str], point=None) -> Launch:
        """A run from the start (a command has no resume point)."""
        report = os.path.join(run_dir, "report.json")
        return Launch(
            self.command(spec, report, data_root),
            self.progress,
            self.units(spec),
            self.unit_name,
            lambda started: self.read_report(report, spec),
        )


def solo_command(spec: RunSpec, report: str, data_root: Optional[str]) -> List[str]:
    """SOLO (:mod:`nvflare_moon.solo`): every site trains alone for ``settings.solo_epochs_per_site`` epochs."""
    s = spec.settings
    command = [
        sys.executable,
        "-m",
        "nvflare_moon.solo",
        "--dataset",
        s.dataset,
        "--num-sites",
        str(s.num_sites),
        "--epochs",
        str(s.solo_epochs_per_site),
        "--arch",
        s.arch,
        "--beta",
        repr(spec.beta),
        "--seed",
        str(spec.seed),
        "--batch-size",
        str(s.batch_size),
        "--lr",
        repr(s.lr),
        "--momentum",
        repr(s.momentum),
        "--weight-decay",
        repr(s.weight_decay),
        "--device",
        s.device,
        "--output",
        report,
    ]
    return command + (["--data-root", data_root] if data_root else [])


def _privacy_variants() -> Dict[str, SimulatorMethod]:
    """MOON under NVFlare's privacy filters on the sites' updates (docs/deployment.md "Privacy and bandwidth")."""
    moon = REGISTRY["moon"].recipe
    return {
        "moon_percentile_privacy": SimulatorMethod(
            "MOON, PercentilePrivacy", moon, {"privacy_filters": [PercentilePrivacy(percentile=10, gamma=0.01)]}
        ),
        "moon_svt_privacy": SimulatorMethod("MOON, SVTPrivacy", moon, {"privacy_filters": [SVTPrivacy()]}),
        "moon_exclude_vars": SimulatorMethod(
            "MOON, ExcludeVars", moon, {"privacy_filters": [ExcludeVars(["l2.weight", "l2.bias"])]}
        ),
    }


# every registered method and its named variants (nvflare_moon.methods), SOLO, and MOON under the privacy filters
METHODS: Dict[str, Union[SimulatorMethod, CommandMethod]] = {
    **{
        name: SimulatorMethod(label, method.recipe, dict(defaults))
        for method in REGISTRY.values()
        for name, (label, defaults) in method.benchmark.items()
    },
    "solo": CommandMethod(
        "SOLO", solo_command, read_solo_report, SOLO_SITE_LINE, lambda spec: spec.settings.num_sites, "site"
    ),
    **_privacy_variants(),
}


def variant_label(variant: Variant) -> str:
    """``MOON``, ``ℓ2 penalty (μ=0.1)``: the method's label and the variant's arguments."""
    label = METHODS[variant.method].label
    if not variant.args:
        return label
    names = {
        "mu": "μ",
        "mu_off_rounds": "K",
        "mu_ramp_rounds": "R",
        "feature_noise_std": "σ",
        "history_branch": "history on",
        "cosine_vector": "ξ from",
        "dp_target_epsilon": "DP-SGD, ε",
    }
    return f"{label} (" + ", ".join(f"{names.get(k, k)}={format_value(v)}" for k, v in variant.args) + ")"
