"""A decoded copy of a dataset split beside its source files, memory-mapped by every later process.

Decoding CIFAR's pickled batches costs a client process about 0.3 s of CPU and 300 MB of private memory, and NVFlare's
simulator with ``-t < -n`` starts a new client process for every task. The first process to decode a split writes
``images.npy`` and ``labels.npy`` into ``<source folder>/.nvflare_moon_decoded/<key>/``; later processes map them
(copy-on-write), so the pages come from the operating system's page cache and are shared by all processes.

The key is a digest of the source files' names, sizes and modification times, so a rebuilt or replaced dataset is
decoded again, never read stale. A folder that cannot be written (a read-only dataset mount) only costs the decoding.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from typing import Callable

import numpy as np
import torch

CACHE_FOLDER = ".nvflare_moon_decoded"
VERSION = "1"  # bump when the decoded layout changes


def cache_key(folder: str, files: list[str], label: str) -> str:
    """``<label>-<digest>`` of the source files' names, sizes and modification times."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(f"{VERSION}/{label}".encode())
    for name in files:
        stat = os.stat(os.path.join(folder, name))
        digest.update(f"/{name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return f"{label}-{digest.hexdigest()}"


def load_or_decode(
    folder: str, files: list[str], label: str, decode: Callable[[], tuple[torch.Tensor, torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels) of the split stored in ``files``: mapped from its decoded copy when there is one, else
    ``decode()``d and saved for the next process. ``label`` names the copy's folder (e.g. ``cifar10-test_batch``)."""
    target = os.path.join(folder, CACHE_FOLDER, cache_key(folder, files, label))
    try:
        images = np.load(os.path.join(target, "images.npy"), mmap_mode="c")
        labels = np.load(os.path.join(target, "labels.npy"))
        return torch.from_numpy(images), torch.from_numpy(labels)
    except (OSError, ValueError):  # no copy yet (or a damaged one, which is replaced below)
        pass
    images, labels = decode()
    _save_atomically(target, images.numpy(), labels.numpy())
    return images, labels


def _save_atomically(target: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Write both arrays into a temporary folder and rename it to ``target``: a reader sees both or neither."""
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(dir=parent, prefix=".writing-")
    except OSError:
        return  # not writable: decode every time
    try:
        np.save(os.path.join(staging, "images.npy"), images)
        np.save(os.path.join(staging, "labels.npy"), labels)
        shutil.rmtree(target, ignore_errors=True)  # a damaged copy
        os.rename(staging, target)
    except OSError:  # another process renamed its copy first, or the disk is full
        shutil.rmtree(staging, ignore_errors=True)
