"""What our recipes share about the sites' apps. ``set_per_site_config``: one client app per named site, differing only in the keys a site may set
(where its data is, what it computes on), every other key refused so that nothing is silently ignored."""

import logging
import os
import shutil
import tempfile
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from nvflare.apis.job_def import ALL_SITES, SERVER_SITE_NAME
from nvflare.job_config.api import FedJob
from nvflare.recipe import SimEnv
from nvflare.recipe.spec import ExecEnv, Recipe

from ..core.validation import users_stacklevel
from ..ops.allow_list import allow_plugin

_LOG = logging.getLogger(__name__)

_BYOC_README = os.path.join(os.path.dirname(__file__), "job_custom", "README.md")

# the components of one site's app, made from that site's overrides: [(component, FedJob.to's keyword arguments)]
ClientComponents = Callable[[Dict[str, Any]], List[Tuple[Any, Dict[str, Any]]]]


def site_path_from_data_root(config: Dict[str, Dict[str, Any]], recipe_name: str) -> Dict[str, Dict[str, Any]]:
    """``config`` with each site's ``data_root``, the old name of ``site_path`` for a site's own images, renamed, with
    a DeprecationWarning (for one release), so that it replaces the recipe's location as ``site_path`` does."""
    renamed = {}
    for site, overrides in config.items():
        if isinstance(overrides, dict) and "data_root" in overrides:
            if "site_path" in overrides:
                raise ValueError(f"set_per_site_config: site {site!r} gives site_path and data_root; give site_path")
            warnings.warn(
                f"set_per_site_config({{{site!r}: {{'data_root': ...}}}}) for a site's own images in {recipe_name} is "
                "deprecated and will be removed in the next release: use 'site_path'",
                DeprecationWarning,
                stacklevel=users_stacklevel(),
            )
            overrides = {("site_path" if key == "data_root" else key): value for key, value in overrides.items()}
        renamed[site] = overrides
    return renamed


def check_per_site_config(
    config: Dict[str, Dict[str, Any]],
    allowed_keys: Sequence[str],
    min_clients: int,
    recipe_name: str,
    check_site: Callable[[Dict[str, Any]], Any],
) -> Dict[str, Dict[str, Any]]:
    """``config`` (site -> overrides) once every site is a site name with only ``allowed_keys``, ``check_site`` has
    accepted each site's overrides (it raises to refuse them: now, not when the job is exported), and at least
    ``min_clients`` sites are named."""
    for site, overrides in config.items():
        if site in (ALL_SITES, SERVER_SITE_NAME):
            raise ValueError(f"set_per_site_config: {site!r} is not a site name")
        unknown = sorted(set(overrides) - set(allowed_keys))
        if unknown:
            raise ValueError(
                f"set_per_site_config: {unknown} for site {site!r} cannot differ between sites in {recipe_name}; "
                f"a site may set only {list(allowed_keys)}"
            )
        check_site(overrides)
    if len(config) < min_clients:
        raise ValueError(
            f"set_per_site_config names {len(config)} site(s) but min_clients={min_clients}: name every site"
        )
    return config


def add_client_apps(
    job: FedJob,
    per_site_config: Optional[Dict[str, Dict[str, Any]]],
    components: ClientComponents,
    files: Iterable[str] = (),
) -> None:
    """The clients' apps: one for every site (``per_site_config`` None), or one per named site, each with
    ``components(its overrides)`` and ``files`` (e.g. the BYOC marker)."""
    files = list(files)
    for site, overrides in (per_site_config or {None: {}}).items():
        for component, kwargs in components(overrides):
            if site is None:
                job.to_clients(component, **kwargs)
            else:
                job.to(component, site, **kwargs)
        for path in files:
            job.to(path, ALL_SITES if site is None else site)


def byoc_marker() -> str:
    """A copy of the BYOC README outside every ``sys.path`` entry, so that the exporter puts it at ``custom/``'s
    top instead of under a package-like path. One fixed folder, so that repeated exports leave nothing behind."""
    folder = os.path.join(tempfile.gettempdir(), f"nvflare_moon_byoc_{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    shutil.copy(_BYOC_README, os.path.join(folder, "README.md"))
    return os.path.join(folder, "README.md")


class PluginRecipe(Recipe):
    """A recipe whose job either carries the plugin in its ``custom/`` folder (``self.byoc`` True) or needs every
    participant to allow-list it (False). Subclasses set ``self.byoc`` before building the job."""

    byoc: bool

    def process_env(self, env: ExecEnv) -> None:
        """A ``byoc=False`` job run in ``SimEnv``: put the plugin on the simulated participants' allow-list (the
        workspace's ``local/resources.json``), as each site's IT does for a real federation. Without it the simulator
        refuses the job (``ComponentNotAuthorized``), exit 2."""
        super().process_env(env)
        if self.byoc or not isinstance(env, SimEnv):
            return
        local = os.path.join(env.workspace_root, self._job.name, "local")
        if allow_plugin(local, server=True):
            _LOG.info(f"byoc=False in SimEnv: {local}/resources.json allow-lists the plugin, as the sites' IT would")

    def export(self, job_dir: str, *args, **kwargs) -> None:
        """NVFlare's export; for a ``byoc=False`` job, a warning of what it needs wherever it runs, since NVFlare's
        refusal does not say."""
        super().export(job_dir, *args, **kwargs)
        if self.byoc:
            return
        _LOG.warning(
            f"{os.path.join(job_dir, self._job.name)} has no custom/ folder (byoc=False): NVFlare refuses its "
            "nvflare_moon classes ('not in allow_list') until every participant allow-lists the plugin. Sites and "
            "server: python -m nvflare_moon.ops.allow_list <startup kit> (docs/deployment.md); nvflare simulator: "
            "python -m nvflare_moon.ops.allow_list --simulator <its -w folder>, once; recipe.execute(SimEnv(...)) "
            "does it itself. Or export with byoc=True"
        )
