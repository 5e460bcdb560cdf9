"""Every federated method, registered in one place: the module that holds it in this package.

Each module here defines ``METHOD``, a :class:`Method` naming the method's parts (its executor, Client API helper,
recipes and settings) and where it appears: the committed job folders (``jobs/``, written by
``python -m nvflare_moon.ops.export_jobs``) and the reproduction benchmark's methods
(``python -m nvflare_moon.benchmark --list``). Both read :data:`REGISTRY`, so a method added as one new module here
appears in them without another edit. A small method lives in its module whole (:mod:`.fedbn`); the older ones keep
their parts in the layers (``core/``, ``executors/``, ``client/``, ``recipes/``) and their module here registers them.

Another package registers a method of its own with an entry point in the group ``nvflare_moon.methods`` whose value
is its :class:`Method` (``my_package.my_method:METHOD``, in its ``pyproject.toml`` under
``[project.entry-points."nvflare_moon.methods"]``).
"""

import importlib
import pkgutil
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Callable, Dict, Mapping, Optional, Tuple


@dataclass(frozen=True)
class Method:
    """One federated method and every place it appears.

    Args:
        name: the registry key (``"moon"``).
        label: the name in tables, plots and logs (``"MOON"``).
        paper: the reference, as a short citation.
        recipe: the executor recipe (``MoonRecipe``), keyword-only on :class:`~nvflare_moon.recipes.FedAvgBaselineRecipe`.
        executor: the NVFlare executor class the recipe's sites run.
        helper: the Client API helper for a user's own training script, if any.
        script_recipe: the recipe of a Client API job using ``helper``, if the method needs its own.
        settings: the method's settings dataclass, if it has settings (the docs' option tables).
        jobs: job folder name → a factory of the recipe at the papers' settings, exported into ``jobs/``.
        benchmark: benchmark method name → ``(label, recipe arguments)``: the method and its named variants.
    """

    name: str
    label: str
    paper: str
    recipe: type
    executor: type
    helper: Optional[type] = None
    script_recipe: Optional[type] = None
    settings: Optional[type] = None
    jobs: Mapping[str, Callable[[], Any]] = field(default_factory=dict)
    benchmark: Mapping[str, Tuple[str, Mapping[str, Any]]] = field(default_factory=dict)


def _discover() -> Dict[str, Method]:
    """Each module of this package's ``METHOD``, then the entry points' methods, by name; a module without one, or a
    name registered twice, is an error that names the module."""
    found: Dict[str, Method] = {}
    candidates = [
        (
            f"{__name__}.{info.name}",
            lambda name=info.name: getattr(importlib.import_module(f"{__name__}.{name}"), "METHOD", None),
        )
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)
    ]
    candidates += [(entry.value, entry.load) for entry in entry_points(group=ENTRY_POINT_GROUP)]
    for where, load in candidates:
        method = load()
        if not isinstance(method, Method):
            raise TypeError(f"{where} is not a nvflare_moon.methods.Method: every method registers one")
        if method.name in found:
            raise ValueError(f"method {method.name!r} is registered twice (again by {where})")
        found[method.name] = method
    return found


ENTRY_POINT_GROUP = "nvflare_moon.methods"
REGISTRY: Dict[str, Method] = _discover()


def paper_jobs() -> Dict[str, Callable[[], Any]]:
    """Every registered method's job folders: name → recipe factory (what ``jobs/`` holds)."""
    jobs: Dict[str, Callable[[], Any]] = {}
    for method in REGISTRY.values():
        clash = set(jobs) & set(method.jobs)
        if clash:
            raise ValueError(f"job folder(s) {sorted(clash)} of method {method.name!r} are registered twice")
        jobs.update(method.jobs)
    return jobs
