"""A data check before training, as a recipe: every site lists and decodes its own images, nothing trains, and the
server writes one table of counts and a label distribution plot across sites.

    recipe = DataCheckRecipe(dataset="image_folder", site_data={"class_names": ["normal", "pneumonia"]}, min_clients=2)
    set_per_site_config(recipe, {"hospital-1": {"site_path": "/data/xray"}, "hospital-2": {"site_path": "/pacs"}})
    recipe.execute(SimEnv(clients=["hospital-1", "hospital-2"]))      # or: recipe.export("jobs/data_check")

The server's run folder then holds ``data_summary.json`` (each site's counts, counts below ``min_count`` as
``"<min_count"``; each site's share of each class; each site's total-variation distance to the pooled label
distribution, the federation's non-IID degree: see :func:`nvflare_moon.data.site_report.label_distribution`) and
``label_distribution.png``. The job fails, naming the site and the reason, when a site's data cannot be used. Run it
with the ``site_data`` (``image_size``, ``channels``) of the training job: the decoded copy it leaves beside each
site's images is then the one training maps, so training starts without decoding.
"""

from typing import Any, Dict, Optional

from nvflare.job_config.api import FedJob

from ..core.validation import check_flag, check_number
from ..data.site_files import site_path_argument
from ..data.site_report import DATA_CHECK_TASK
from ..executors.data_check import DataCheckExecutor
from ..server import DataCheckController
from ..sim.fixes import COMPONENT_ID, SimulatorFixes
from .sites import (
    PluginRecipe,
    add_client_apps,
    byoc_marker,
    check_per_site_config,
    site_path_from_data_root,
)

# what set_per_site_config may set for one site in a data check: where its data is (its old name data_root is renamed)
DATA_CHECK_PER_SITE_KEYS = ("site_path",)


class DataCheckRecipe(PluginRecipe):
    """The data check of a federation whose sites train on their own images (no training, no model).

    Args:
        name: job name.
        dataset: ``"image_folder"`` or ``"datalist"``.
        site_data: the training job's image settings (``class_names`` required; see :class:`DataCheckExecutor`).
        min_clients: the sites the job waits for; every connected site is checked.
        site_path: every site's data location (NVFlare resolves ``{SITE_NAME}`` in it on the site); None: each
            site's own (``$NVFLARE_MOON_SITE_DATA`` or its ``local/nvflare_moon_data.json``), or one per site with
            ``set_per_site_config(recipe, {"hospital-1": {"site_path": ...}})`` (keys:
            :data:`DATA_CHECK_PER_SITE_KEYS`). Its old name ``data_root`` is accepted until the next release, with a
            DeprecationWarning.
        min_count: counts below this (and above 0) leave the sites as ``"<min_count"``.
        byoc: add an (empty of code) ``custom/`` folder so that the job passes NVFlare's default class allow-list;
            set False for sites that allow-list ``nvflare_moon.``.
    """

    def __init__(
        self,
        *,
        name: str = "data_check",
        dataset: str,
        site_data: Dict[str, Any],
        min_clients: int,
        site_path: Optional[str] = None,
        min_count: int = 5,
        byoc: bool = True,
        **old_names,
    ):
        site_path = site_path_argument(site_path, old_names, owner=type(self).__name__)
        check_number("min_clients", min_clients, low=1, integer=True)
        check_flag("byoc", byoc)
        self.dataset = dataset
        self.site_data = site_data
        self.min_clients = min_clients
        self.site_path = site_path
        self.min_count = min_count
        self.byoc = byoc
        self._executor_args = dict(dataset=dataset, site_data=site_data, site_path=site_path, min_count=min_count)
        DataCheckExecutor(**self._executor_args)  # every argument checked before anything is built
        self.per_site_config: Optional[Dict[str, Dict[str, Any]]] = None

        job = FedJob(name=name, min_clients=min_clients)
        job.set_app_packages(["nvflare_moon"])
        job.to_server(SimulatorFixes(), id=COMPONENT_ID)
        job.to_server(DataCheckController(task_name=DATA_CHECK_TASK), id="controller")
        if byoc:
            job.to_server(byoc_marker())
        super().__init__(job)

    def _apply_per_site_config(self, config: Dict[str, Dict]) -> None:
        """NVFlare's ``set_per_site_config``: one client app per named site, with its own ``site_path``."""
        self.per_site_config = check_per_site_config(
            site_path_from_data_root(config, type(self).__name__),
            DATA_CHECK_PER_SITE_KEYS,
            self.min_clients,
            type(self).__name__,
            lambda overrides: DataCheckExecutor(**{**self._executor_args, **overrides}),
        )

    def _prepare_client_apps(self) -> None:
        """The clients' apps: one for every site, or one per site named by ``set_per_site_config``."""
        add_client_apps(
            self._job,
            self.per_site_config,
            lambda overrides: [
                (DataCheckExecutor(**{**self._executor_args, **overrides}), dict(tasks=[DATA_CHECK_TASK]))
            ],
            [byoc_marker()] if self.byoc else [],
        )
