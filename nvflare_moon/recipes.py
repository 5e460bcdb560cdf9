"""Recipes in NVFlare 2.9's style: one object describes a whole job, which runs in an ``ExecEnv`` or is exported.

    recipe = MoonRecipe(min_clients=10, num_rounds=100, data_root="/data")
    recipe.execute(SimEnv(num_clients=10, num_threads=4))      # or: recipe.export("jobs/moon_cifar10")

Every recipe builds the same server (NVFlare's ``FedAvg`` controller with our weighted aggregator, a
``PTFileModelPersistor`` and the once-per-round :class:`GlobalModelEvaluator`) and differs only in the client executor.
The committed folders in ``jobs/`` are exported from these recipes (``python -m nvflare_moon.export_jobs``).
"""

import os
import shutil
import tempfile
from typing import Any, Dict, Optional

from nvflare.apis.executor import Executor
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.workflows.fedavg import FedAvg
from nvflare.app_opt.pt.job_config.model import PTModel
from nvflare.job_config.api import FedJob
from nvflare.recipe.spec import Recipe

from .data import NUM_CLASSES
from .executors import FedAvgExecutor, MoonExecutor
from .models import Network
from .server import GlobalModelEvaluator, WeightedFedAvgAggregator
from .validation import check_number

_BYOC_README = os.path.join(os.path.dirname(__file__), "job_custom", "README.md")


def _byoc_marker() -> str:
    """A copy of the BYOC README outside every ``sys.path`` entry, so that the exporter puts it at ``custom/``'s
    top instead of under a package-like path."""
    folder = tempfile.mkdtemp(prefix="nvflare_moon_byoc_")
    shutil.copy(_BYOC_README, os.path.join(folder, "README.md"))
    return os.path.join(folder, "README.md")


class FedAvgBaselineRecipe(Recipe):
    """FedAvg on the MOON network (the papers' baseline); other recipes change only the executor.

    Args:
        name: job name.
        min_clients: sites trained per round (all of them unless ``num_sites`` is larger).
        num_rounds: communication rounds.
        num_sites: sites the data is split over; defaults to ``min_clients``. Run the simulator with ``-n num_sites``.
        dataset, data_root, download, partition, beta, seed, local_epochs, batch_size, lr, momentum, weight_decay,
        device, num_threads: passed to the executor (see :class:`FedAvgExecutor`).
        arch: ``"simple_cnn"`` or ``"resnet50"``.
        out_dim: size of the projection z.
        byoc: add an (empty of code) ``custom/`` folder so that the job passes NVFlare's default class allow-list;
            set False for sites that allow-list ``nvflare_moon.``.
    """

    def __init__(
        self,
        *,
        name: str = "fedavg_cifar10",
        min_clients: int = 10,
        num_rounds: int = 100,
        num_sites: Optional[int] = None,
        dataset: str = "cifar10",
        data_root: Optional[str] = None,
        download: bool = True,
        arch: str = "simple_cnn",
        out_dim: int = 256,
        partition: str = "dirichlet",
        beta: float = 0.5,
        seed: int = 0,
        local_epochs: int = 10,
        batch_size: int = 64,
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 1e-5,
        device: str = "auto",
        num_threads: Optional[int] = None,
        byoc: bool = True,
    ):
        check_number("min_clients", min_clients, low=1, integer=True)
        check_number("num_rounds", num_rounds, low=1, integer=True)
        num_sites = min_clients if num_sites is None else num_sites
        check_number("num_sites", num_sites, low=min_clients, integer=True)
        if dataset not in NUM_CLASSES:
            raise ValueError(f"dataset must be one of {sorted(NUM_CLASSES)}, got {dataset!r}")
        self.min_clients = min_clients
        self.num_rounds = num_rounds
        self.num_sites = num_sites
        self.dataset = dataset
        self.byoc = byoc

        def network() -> Network:
            return Network(arch=arch, num_classes=NUM_CLASSES[dataset], out_dim=out_dim, seed=seed)

        data_args = dict(dataset=dataset, data_root=data_root, download=download)
        executor = self.make_executor(
            dict(
                model=network(), **data_args, num_sites=num_sites, partition=partition, beta=beta, seed=seed,
                local_epochs=local_epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                weight_decay=weight_decay, device=device, num_threads=num_threads,
            )
        )  # fmt: skip

        job = FedJob(name=name, min_clients=min_clients)
        job.set_app_packages(["nvflare_moon"])
        job.to_server(PTModel(model=network()), id="persistor")
        job.to_server(
            FedAvg(num_clients=min_clients, num_rounds=num_rounds, aggregator=self.make_aggregator()), id="controller"
        )
        job.to_server(GlobalModelEvaluator(model=network(), **data_args, device=device), id="global_evaluator")
        job.to_clients(executor, tasks=["train"])
        if byoc:
            marker = _byoc_marker()
            job.to_server(marker)
            job.to_clients(marker)
        super().__init__(job)

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        return FedAvgExecutor(**common_args)

    def make_aggregator(self) -> ModelAggregator:
        return WeightedFedAvgAggregator()


class MoonRecipe(FedAvgBaselineRecipe):
    """MOON (Li, He and Song, CVPR 2021) with the paper's CIFAR-10 defaults.

    Args:
        mu: weight of the model-contrastive term (paper: 5 for CIFAR-10, 1 for CIFAR-100/Tiny-ImageNet, 10 at 50+ sites).
        temperature: τ (paper: 0.5).
        num_previous_models: how many previous local models serve as negatives (paper: 1).
        **kwargs: every :class:`FedAvgBaselineRecipe` argument.
    """

    def __init__(
        self, *, name: str = "moon_cifar10", mu: float = 5.0, temperature: float = 0.5, num_previous_models: int = 1,
        **kwargs,
    ):  # fmt: skip
        self.mu = mu
        self.temperature = temperature
        self.num_previous_models = num_previous_models
        super().__init__(name=name, **kwargs)

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        return MoonExecutor(
            **common_args, mu=self.mu, temperature=self.temperature, num_previous_models=self.num_previous_models
        )
