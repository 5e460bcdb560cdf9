"""A site's data inside an executor: the source it opens at the job's start and its local evaluation.

The sources themselves (a named dataset's shard, the site's own images, a ``Dataset`` the job brings) are in
:mod:`nvflare_moon.data.sources`; this module picks one from the executor's :class:`~nvflare_moon.core.specs.DataSpec`
on the site, where the site's own paths resolve, and evaluates a model on the site's local test data.
"""

import zlib
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from torch.utils.data import Dataset

from ..core.specs import DataSpec
from ..core.training import clinical_evaluation, evaluate
from ..data.site_data import SiteDataSettings
from ..data.site_files import resolve_site_root
from ..data.sources import PartitionedSource, SiteImagesSource, TorchDatasetSource, dataset_batches


def open_site_source(
    spec: DataSpec,
    own_images: Optional[SiteDataSettings],
    val_dataset: Optional[Dataset],
    site: str,
    workspace_root: Optional[str],
    device: torch.device,
):
    """The site's data source as ``spec`` says: the job's ``Dataset``, the site's own images (``own_images``, their
    checked settings; the folder resolved on the site, in ``workspace_root``) or its shard of a named dataset (kept on the GPU when it
    trains there)."""
    if not isinstance(spec.dataset, str):
        return TorchDatasetSource(spec.dataset, val_dataset)
    if spec.own_images:
        root = resolve_site_root(spec.site_path, site, workspace_root)
        return SiteImagesSource(own_images, root, site, workspace_root)
    return PartitionedSource(
        spec.dataset,
        spec.data_root,
        spec.download,
        site,
        spec.num_sites,
        spec.partition,
        spec.beta,
        spec.seed,
        device=device if device.type == "cuda" else None,
    )


def check_one_batch(site: str, num_samples: int, batch_size: int, spec: DataSpec) -> None:
    """Raise ValueError, naming the settings to change, when the site has fewer samples than one batch."""
    if num_samples >= batch_size:
        return
    fix = (
        "or add images (val_fraction holds out a share of them where the site has no test split)"
        if spec.own_images
        else "or split the data over fewer sites (num_sites)"
    )
    raise ValueError(
        f"site {site} has {num_samples} training samples, fewer than batch_size={batch_size}; lower batch_size, {fix}"
    )


def round_batches(source, batch_size: int, seed: int, site: str, round_number: int):
    """The round's training batches. Their order is a function of (seed, site, round) alone, so a client process
    that is restarted between rounds (the simulator with ``-t < -n``) trains exactly as one that lives on."""
    return source.train_batches(batch_size, zlib.crc32(f"{seed}/{site}/{round_number}".encode()))


class LocalEvaluation:
    """A model's figures on the site's local test data: ``val_dataset`` where the job gives one, else the source's.

    The batches are built on first use; :attr:`missing` then says why the site has none (its figures are then empty).
    """

    def __init__(self, source, val_dataset: Optional[Dataset], device: torch.device, clinical_metrics: bool):
        self.source = source
        self.val_dataset = val_dataset
        self.device = device
        self.clinical_metrics = clinical_metrics
        self.missing: Optional[str] = None
        self._batches = None
        self._ready = False

    def batches(self):
        """The local test batches, or None (with :attr:`missing` set)."""
        if not self._ready:
            if self.val_dataset is not None:
                self._batches, why = dataset_batches(self.val_dataset), "its val_dataset is empty"
            else:
                self._batches, why = self.source.test_batches(), self.source.no_test_reason
            self.missing = None if self._batches is not None else why
            self._ready = True
        return self._batches

    def evaluate(self, model: nn.Module) -> Tuple[Dict[str, float], Optional[List[List[int]]]]:
        """``accuracy`` and ``loss`` of ``model``, with the clinical figures where asked for, and the confusion
        matrix (None without clinical metrics); ``({}, None)`` when the site has no test data."""
        batches = self.batches()
        if batches is None:
            return {}, None
        if not self.clinical_metrics:
            return evaluate(model, batches, self.device), None
        figures, clinical = clinical_evaluation(model, batches, self.device)
        return figures, clinical.confusion
