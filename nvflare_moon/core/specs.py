"""What every executor takes beside the method's settings, as two checked dataclasses: where a site's data comes from
(:class:`DataSpec`) and how it trains (:class:`TrainingSpec`).

The executor builds both from its constructor arguments, so each option is named, defaulted and checked in one place;
a recipe passes the arguments on by name and reads the specs back from the executor it builds. The executor keeps taking the fields as plain constructor
arguments, stored under their own names: NVFlare's job exporter writes them into the job's config from there, and the
committed job folders (``jobs/``) and the benchmark's records (their job digests) name them so.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional

from ..data import DATASETS, PARTITION_METHODS
from ..data.site_files import SITE_DATASETS
from .runtime import resolve_device
from .validation import check_choice, check_flag, check_number


@dataclass(frozen=True)
class DataSpec:
    """Where a site's training data comes from.

    Args:
        dataset: ``"cifar10"``, ``"cifar100"``, ``"tinyimagenet"``, ``"synthetic"`` (split over the sites by their
            names' numbers); ``"image_folder"`` or ``"datalist"``: the site's own images, all of them (see
            :mod:`nvflare_moon.data.site_files`, and ``site_data``); or a map-style ``torch.utils.data.Dataset`` of
            ``(image tensor, label)`` holding this site's own data (used whole).
        data_root: with a dataset name, the folder holding the dataset; default ``$NVFLARE_MOON_DATA`` or
            ``~/.cache/nvflare_moon/data``. With the site's own images: the site's folder (or manifest), checked on the
            site at the job's start; NVFlare resolves ``{SITE_NAME}``, ``{WORKSPACE}`` and ``{$VAR}`` in it there.
            None: the site's ``$NVFLARE_MOON_SITE_DATA``, else ``data_root`` in its ``local/nvflare_moon_data.json``.
        download: fetch a named dataset with torchvision when it is not under ``data_root``.
        site_data: with ``"image_folder"``/``"datalist"``, the :class:`~nvflare_moon.data.site_data.SiteDataSettings`
            fields but ``dataset`` and ``seed``: ``class_names`` (required), ``image_size``, ``channels``, ``mean``,
            ``std``, ``val_fraction``, ``max_unreadable``, ``augment``.
        num_sites: number of sites a named dataset's training set is split over (the simulator's ``-n``).
        partition: ``"dirichlet"`` (label skew with concentration ``beta``) or ``"iid"``.
        beta: Dirichlet concentration β > 0.
        seed: seed of the partition and of the batch order.
    """

    dataset: Any = "cifar10"
    data_root: Optional[str] = None
    download: bool = True
    site_data: Optional[Dict[str, Any]] = None
    num_sites: int = 10
    partition: str = "dirichlet"
    beta: float = 0.5
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.dataset, str):
            check_choice("dataset", self.dataset, DATASETS + SITE_DATASETS)
        elif not _is_torch_dataset(self.dataset):
            raise ValueError(f"dataset must be a dataset name or a torch Dataset, got {type(self.dataset).__name__}")
        check_flag("download", self.download)
        check_number("num_sites", self.num_sites, low=1, integer=True)
        check_choice("partition", self.partition, PARTITION_METHODS)
        check_number("beta", self.beta, low=0, low_inclusive=False)
        check_number("seed", self.seed, low=0, integer=True)

    @property
    def own_images(self) -> bool:
        """Whether every site trains on its own image files (``data_root`` is then each site's own path)."""
        return self.dataset in SITE_DATASETS if isinstance(self.dataset, str) else False


@dataclass(frozen=True)
class TrainingSpec:
    """How a site trains and evaluates in every round.

    Args:
        local_epochs: local epochs E per round.
        batch_size: local batch size (the last incomplete batch is dropped).
        lr, momentum, weight_decay: SGD settings (a new optimizer every round).
        device: ``"auto"`` (GPU if visible), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        num_threads: torch CPU threads; None shares the cores among the simulator's parallel workers.
        amp: mixed precision in local training (:class:`~nvflare_moon.core.training.MixedPrecisionStep`): float16
            with a gradient scaler on a GPU; bfloat16 on the CPU, much slower than float32 there without bfloat16
            instructions. The weights stay float32. False (default): float32 throughout.
        clinical_metrics: the local metrics (of the received global model, of the trained one, and in cross-site
            evaluation) also hold AUROC, sensitivity, specificity, balanced accuracy and F1
            (:mod:`nvflare_moon.core.clinical_metrics`); the site logs its confusion matrix every round.
    """

    local_epochs: int = 10
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-5
    device: str = "auto"
    num_threads: Optional[int] = None
    amp: bool = False
    clinical_metrics: bool = False

    def __post_init__(self):
        check_number("local_epochs", self.local_epochs, low=1, integer=True)
        check_number("batch_size", self.batch_size, low=1, integer=True)
        check_number("lr", self.lr, low=0, low_inclusive=False)
        check_number("momentum", self.momentum, low=0)
        check_number("weight_decay", self.weight_decay, low=0)
        resolve_device(self.device)
        if self.num_threads is not None:
            check_number("num_threads", self.num_threads, low=1, integer=True)
        check_flag("amp", self.amp)
        check_flag("clinical_metrics", self.clinical_metrics)


def spec_fields(spec: Any) -> Dict[str, Any]:
    """``{field: value}`` of a spec dataclass, as the executor's constructor arguments of the same names."""
    return {field.name: getattr(spec, field.name) for field in dataclasses.fields(spec)}


def _is_torch_dataset(value: Any) -> bool:
    from torch.utils.data import Dataset

    return isinstance(value, Dataset)


def store_arguments(owner: Any, **arguments: Any) -> None:
    """Keep each constructor argument on ``owner`` under its own name, where NVFlare's job exporter reads it back."""
    for name, value in arguments.items():
        setattr(owner, name, value)
