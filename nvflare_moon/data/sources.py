"""Where a site's training and local test batches come from: one object per kind of data, so that the executors hold
one training loop whatever the data is.

- :class:`PartitionedSource`: a named dataset (CIFAR-10/100, Tiny-ImageNet, synthetic) split over ``num_sites`` by
  the site name's number, the papers' set-up;
- :class:`SiteImagesSource`: the site's own images (``"image_folder"``, ``"datalist"``), all of them, no partition;
- :class:`TorchDatasetSource`: a map-style ``torch.utils.data.Dataset`` the job brings (BYOC).

Each gives ``num_samples``, ``num_classes`` (None when unknown), ``train_batches(batch_size, seed)`` (shuffled, last
incomplete batch dropped, the order a function of ``seed`` alone) and ``test_batches()`` (None when the site has no
test data, with ``no_test_reason``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.utils.data import DataLoader, Dataset

from .datasets import load_dataset
from .loader import TensorBatchLoader
from .site_data import SiteDataSettings, load_site_data
from .transforms import test_transform, train_transform

EVAL_BATCH_SIZE = 500


class PartitionedSource:
    """The site's shard of a named dataset, and its class-proportional share of the test split."""

    def __init__(
        self,
        dataset: str,
        data_root,
        download: bool,
        site: str,
        num_sites: int,
        partition: str,
        beta,
        seed,
        device: Optional[torch.device] = None,
    ):
        from . import site_test_arrays, site_train_arrays  # the package's memoised partitions

        splits = load_dataset(dataset, data_root, download)
        self.dataset = dataset
        self.num_classes = splits.num_classes
        self.train = site_train_arrays(splits, site, num_sites, partition, beta, seed)
        self.test = site_test_arrays(splits, site, num_sites, partition, beta, seed)
        self.device = device  # a GPU: the site's uint8 data is copied there once
        self.num_samples = len(self.train)
        self.no_test_reason = "its share of the test split is empty"
        self.description = f"shard {site} of {dataset} ({num_sites} sites, {partition})"

    def train_batches(self, batch_size: int, seed: int):
        return TensorBatchLoader(
            self.train,
            batch_size,
            train_transform(self.dataset),
            shuffle=True,
            drop_last=True,
            seed=seed,
            device=self.device,
        )

    def test_batches(self):
        if len(self.test) == 0:
            return None
        return TensorBatchLoader(
            self.test,
            EVAL_BATCH_SIZE,
            test_transform(self.dataset),
            shuffle=False,
            drop_last=False,
            seed=0,
            device=self.device,
        )


class SiteImagesSource:
    """All of the site's own images; batches are read from their memory-mapped decoded copy, never copied whole."""

    def __init__(self, settings: SiteDataSettings, root: str, site: str, workspace_root: str):
        self.settings = settings
        self.data = load_site_data(settings, root, site, workspace_root)
        self.num_classes = len(settings.class_names)
        self.num_samples = len(self.data.train_index)
        self.no_test_reason = "it holds no held-out images"
        counts = ", ".join(
            f"{n} {c}" for c, n in zip(settings.class_names, self.data.class_counts(self.data.train_index))
        )
        self.description = f"its own images at {root}: {counts}; held out: {self.data.held_out}"

    def train_batches(self, batch_size: int, seed: int):
        return TensorBatchLoader(
            self.data.images,
            batch_size,
            self.settings.train_transform(),
            shuffle=True,
            drop_last=True,
            seed=seed,
            indices=self.data.train_index,
        )

    def test_batches(self):
        if len(self.data.test_index) == 0:
            return None
        return TensorBatchLoader(
            self.data.images,
            EVAL_BATCH_SIZE,
            self.settings.test_transform(),
            shuffle=False,
            drop_last=False,
            seed=0,
            indices=self.data.test_index,
        )


class TorchDatasetSource:
    """A ``Dataset`` of ``(image tensor, label)`` the job brings, used whole; ``test`` the site's own test data."""

    def __init__(self, train: Dataset, test: Optional[Dataset]):
        self.train = train
        self.test = test
        self.num_classes = None
        self.num_samples = len(train)
        self.no_test_reason = "no val_dataset given" if test is None else "its val_dataset is empty"
        self.description = f"the job's {type(train).__name__}"

    def train_batches(self, batch_size: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        return DataLoader(self.train, batch_size=batch_size, shuffle=True, drop_last=True, generator=generator)

    def test_batches(self):
        return dataset_batches(self.test)


def dataset_batches(dataset: Optional[Dataset]):
    """Evaluation batches of a map-style ``Dataset`` in its order; None when there is none or it is empty."""
    if dataset is None or len(dataset) == 0:
        return None
    return DataLoader(dataset, batch_size=EVAL_BATCH_SIZE, shuffle=False)
