"""Data for nvflare-moon: datasets as uint8 tensors, the MOON reference partitions, batched augmentation and an
in-memory batch loader. Framework-free (no NVFlare imports).

Typical client use::

    splits = load_dataset("cifar10", data_root)
    shard = site_train_arrays(splits, site_name, num_sites, "dirichlet", beta=0.5, seed=0)
    local_test = site_test_arrays(splits, site_name, num_sites, "dirichlet", beta=0.5, seed=0)
    loader = TensorBatchLoader(shard, 64, train_transform("cifar10"), shuffle=True, drop_last=True, seed=...)
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from .datasets import (
    DATASETS,
    NUM_CLASSES,
    DatasetNotFoundError,
    DatasetSplits,
    ImageArrays,
    clear_dataset_cache,
    load_dataset,
    load_image_folder,
    make_synthetic,
    resolve_data_root,
)
from .loader import TensorBatchLoader
from .partition import (
    PARTITION_METHODS,
    check_site_shards,
    dirichlet_partition,
    iid_partition,
    partition_indices,
    proportional_test_split,
    site_index,
)
from .transforms import NORMALIZATION, BatchTransform, test_transform, train_transform

__all__ = [
    "DATASETS",
    "NUM_CLASSES",
    "PARTITION_METHODS",
    "NORMALIZATION",
    "ImageArrays",
    "DatasetSplits",
    "DatasetNotFoundError",
    "load_dataset",
    "load_image_folder",
    "clear_dataset_cache",
    "make_synthetic",
    "resolve_data_root",
    "dirichlet_partition",
    "iid_partition",
    "partition_indices",
    "proportional_test_split",
    "site_index",
    "check_site_shards",
    "BatchTransform",
    "train_transform",
    "test_transform",
    "TensorBatchLoader",
    "site_partition",
    "site_test_partition",
    "site_train_arrays",
    "site_test_arrays",
]

_PARTITIONS: dict = {}
_PARTITIONS_LOCK = threading.Lock()


def site_partition(
    splits: DatasetSplits, num_sites: int, partition: str = "dirichlet", beta: float = 0.5, seed: int = 0
) -> list[np.ndarray]:
    """Every site's train indices, via :func:`partition_indices` on ``splits.train.labels``; memoised in-process per
    (dataset name, num_sites, partition, beta, seed) and a digest of the labels (so two datasets with the same name
    but different labels never share an entry)."""
    labels = splits.train.labels.cpu().numpy()
    digest = hashlib.blake2b(np.ascontiguousarray(labels).tobytes(), digest_size=16).hexdigest()
    key = (splits.name, num_sites, partition, float(beta), seed, digest)
    with _PARTITIONS_LOCK:
        parts = _PARTITIONS.get(key)
    if parts is None:
        parts = partition_indices(labels, num_sites, partition, beta, seed)
        with _PARTITIONS_LOCK:
            parts = _PARTITIONS.setdefault(key, parts)
    return parts


def site_train_arrays(
    splits: DatasetSplits,
    site_name: str,
    num_sites: int,
    partition: str = "dirichlet",
    beta: float = 0.5,
    seed: int = 0,
) -> ImageArrays:
    """The training shard of ``site_name`` (``site-1`` -> the partition's shard 0, ...) under the given partition."""
    idx = site_partition(splits, num_sites, partition, beta, seed)[site_index(site_name, num_sites)]
    return splits.train.subset(idx)


def site_test_partition(
    splits: DatasetSplits, num_sites: int, partition: str = "dirichlet", beta: float = 0.5, seed: int = 0
) -> list[np.ndarray]:
    """Every site's local test indices: the test split shared out with the class proportions of the training shards
    of :func:`site_partition` (:func:`proportional_test_split`, seeded with ``seed``)."""
    train_labels = splits.train.labels.cpu().numpy()
    shards = site_partition(splits, num_sites, partition, beta, seed)
    return proportional_test_split([train_labels[idx] for idx in shards], splits.test.labels.cpu().numpy(), seed)


def site_test_arrays(
    splits: DatasetSplits,
    site_name: str,
    num_sites: int,
    partition: str = "dirichlet",
    beta: float = 0.5,
    seed: int = 0,
) -> ImageArrays:
    """The local test data of ``site_name``: its class-proportional share of the test split (may be empty)."""
    idx = site_test_partition(splits, num_sites, partition, beta, seed)[site_index(site_name, num_sites)]
    return splits.test.subset(idx)
