"""What every executor takes beside the method's settings, as two checked dataclasses: where a site's data comes from
(:class:`DataSpec`) and how it trains (:class:`TrainingSpec`).

A recipe builds both once and passes them whole to the executor, as its ``data`` and ``training`` arguments; NVFlare's
job exporter writes each into the job's config as a nested component (``{"path": ..., "args": {...}}``), which the
site builds back, checked, when the job starts. Each spec's ``_always_serialize_args`` names the papers' settings that
an exported job shows even where they equal the defaults. The fields' old flat names (``lr=``, ``beta=``, ...) are
still accepted for one release (:func:`take_flat_fields`).
"""

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple, Type, TypeVar

from ..data import DATASETS, PARTITION_METHODS
from ..data.site_files import SITE_DATASETS, check_site_path
from .dp import DPSettings, require_opacus
from .runtime import resolve_device
from .validation import check_choice, check_flag, check_number, reject_unknown, users_stacklevel


@dataclass(frozen=True)
class DataSpec:
    """Where a site's training data comes from.

    Args:
        dataset: ``"cifar10"``, ``"cifar100"``, ``"tinyimagenet"``, ``"synthetic"`` (split over the sites by their
            names' numbers); ``"image_folder"`` or ``"datalist"``: the site's own images, all of them (see
            :mod:`nvflare_moon.data.site_files`, and ``site_data``); or a map-style ``torch.utils.data.Dataset`` of
            ``(image tensor, label)`` holding this site's own data (used whole).
        data_root: with a dataset name, the folder holding the dataset (its cache); default ``$NVFLARE_MOON_DATA``
            or ``~/.cache/nvflare_moon/data``.
        site_path: with the site's own images, the site's folder (or manifest), checked on the site at the job's
            start; NVFlare resolves ``{SITE_NAME}``, ``{WORKSPACE}`` and ``{$VAR}`` in it there. None: the site's
            ``$NVFLARE_MOON_SITE_DATA``, else ``site_path`` in its ``local/nvflare_moon_data.json``. (Until the next
            release, ``data_root`` given with the site's own images is taken as ``site_path``, with a
            DeprecationWarning.)
        download: fetch a named dataset with torchvision when it is not under ``data_root``.
        site_data: with ``"image_folder"``/``"datalist"``, the :class:`~nvflare_moon.data.site_data.SiteDataSettings`
            fields but ``dataset`` and ``seed``: ``class_names`` (required), ``image_size``, ``channels``, ``mean``,
            ``std``, ``val_fraction``, ``max_unreadable``, ``augment``.
        num_sites: number of sites a named dataset's training set is split over (the simulator's ``-n``).
        partition: ``"dirichlet"`` (label skew with concentration ``beta``) or ``"iid"``.
        beta: Dirichlet concentration β > 0.
        seed: seed of the partition and of the batch order.
    """

    # what an exported job shows even where it equals the default: the papers' settings
    _always_serialize_args = ("dataset", "num_sites", "partition", "beta", "seed")

    dataset: Any = "cifar10"
    data_root: Optional[str] = None
    site_path: Optional[str] = None
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
        self._take_site_path_from_data_root()
        check_site_path(self.site_path)
        if self.site_path is not None and not self.own_images:
            raise ValueError(
                f"site_path is the folder of a site's own images (dataset 'image_folder' or 'datalist'), not of "
                f"dataset {self.dataset!r}: give that dataset's folder as data_root"
            )
        check_flag("download", self.download)
        check_number("num_sites", self.num_sites, low=1, integer=True)
        check_choice("partition", self.partition, PARTITION_METHODS)
        check_number("beta", self.beta, low=0, low_inclusive=False)
        check_number("seed", self.seed, low=0, integer=True)

    def _take_site_path_from_data_root(self) -> None:
        """For one release: ``data_root`` given with the site's own images is its ``site_path``, with a warning."""
        if not self.own_images or self.data_root is None:
            return
        if self.data_root == "":  # unset, as the site's own setting then decides
            object.__setattr__(self, "data_root", None)
            return
        if self.site_path is not None:
            raise ValueError(
                f"data_root and site_path are both set for dataset {self.dataset!r}: a site's own images are found "
                "at site_path alone"
            )
        warnings.warn(
            f"data_root for the site's own images (dataset={self.dataset!r}) is deprecated and will be removed in the "
            "next release: use site_path=... (data_root is a named dataset's folder)",
            DeprecationWarning,
            stacklevel=users_stacklevel(),
        )
        object.__setattr__(self, "site_path", self.data_root)  # frozen: set once, while the spec is being built
        object.__setattr__(self, "data_root", None)

    @property
    def own_images(self) -> bool:
        """Whether every site trains on its own image files (found at each site's ``site_path``)."""
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

    # what an exported job shows even where it equals the default: the papers' settings
    _always_serialize_args = ("local_epochs", "batch_size", "lr", "momentum", "weight_decay")

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


Spec = TypeVar("Spec")


def take_flat_fields(
    cls: Type[Spec], spec: Optional[Spec], flat: Dict[str, Any], *, owner: str, argument: str, prefix: str = ""
) -> Optional[Spec]:
    """``spec``; or, for one release, a ``cls`` of the fields given flat under their old names (``prefix + field``),
    taken out of ``flat`` with a DeprecationWarning that shows the new form. None when neither is given.

    Raises:
        TypeError: both ``spec`` and flat fields are given.
    """
    names = {prefix + field.name: field.name for field in dataclasses.fields(cls)}
    given = {names[name]: flat.pop(name) for name in list(flat) if name in names}
    if not given:
        return spec
    old = ", ".join(f"{prefix}{name}=..." for name in given)
    if spec is not None:
        raise TypeError(f"{owner}: give {argument}={cls.__name__}(...) alone, not with {old}")
    new = ", ".join(f"{name}=..." for name in given)
    warnings.warn(
        f"{owner}({old}) is deprecated and will be removed in the next release: use {argument}={cls.__name__}({new})",
        DeprecationWarning,
        stacklevel=users_stacklevel(),
    )
    return cls(**given)


def spec_argument(
    cls: Type[Spec],
    value: Optional[Spec],
    flat: Dict[str, Any],
    *,
    owner: str,
    argument: str,
    prefix: str = "",
    default: bool = True,
) -> Optional[Spec]:
    """The ``argument`` of ``owner``: ``value``, or built from its fields' old flat names in ``flat``
    (:func:`take_flat_fields`); where neither is given, ``cls()`` if ``default``, else None.

    Raises:
        TypeError: both ``value`` and flat fields are given.
        ValueError: ``value`` is not a ``cls`` (the message names ``argument``).
    """
    value = take_flat_fields(cls, value, flat, owner=owner, argument=argument, prefix=prefix)
    if value is None:
        return cls() if default else None
    if not isinstance(value, cls):
        raise ValueError(f"{argument} must be a {cls.__name__}, got {type(value).__name__}")
    return value


def executor_specs(
    owner: str,
    data: Optional[DataSpec],
    training: Optional[TrainingSpec],
    dp: Optional[DPSettings],
    flat_fields: Dict[str, Any],
) -> Tuple[DataSpec, TrainingSpec, Optional[DPSettings]]:
    """An executor's ``data``, ``training`` and ``dp`` (:func:`spec_argument`); ``dp`` stays None where not given.

    Raises:
        TypeError: ``flat_fields`` holds a name no spec has.
        ValueError: an argument is not of its spec's type (the message names it).
    """
    data = spec_argument(DataSpec, data, flat_fields, owner=owner, argument="data")
    training = spec_argument(TrainingSpec, training, flat_fields, owner=owner, argument="training")
    dp = spec_argument(DPSettings, dp, flat_fields, owner=owner, argument="dp", prefix="dp_", default=False)
    reject_unknown(owner, flat_fields)
    if dp is not None:
        require_opacus()
    return data, training, dp


def _is_torch_dataset(value: Any) -> bool:
    from torch.utils.data import Dataset

    return isinstance(value, Dataset)
