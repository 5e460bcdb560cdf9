"""A DataLoader replacement for in-memory uint8 arrays: batches are sliced from one tensor and augmented batched.

No worker processes, no per-image Python objects: each batch is one index_select plus one :class:`BatchTransform`
call. All randomness (shuffling and augmentation) comes from the loader's own ``torch.Generator``, seeded once at
construction, so every epoch differs but a run is reproducible from ``seed``.
"""

from __future__ import annotations

import warnings
from typing import Callable, Iterator

import torch

from ..core.validation import check_number
from .datasets import ImageArrays

__all__ = ["TensorBatchLoader"]


class TensorBatchLoader:
    """Iterate ``(x float32 [B, C, H, W], y int64 [B])`` over ``arrays``.

    - ``shuffle``: each ``__iter__`` draws a fresh permutation from the loader's generator; otherwise dataset order.
    - ``drop_last``: ``len(loader) = N // batch_size``, else ``ceil(N / batch_size)``.
    - ``transform(images_uint8, generator)`` turns a uint8 batch into the model input (see ``transforms.py``); it
      receives the loader's generator.
    - ``seed``: seeds the generator (None: a non-deterministic seed).
    - ``device``: if given, the uint8 data is copied there once and batches are transformed there.
    - ``indices``: iterate over these rows of ``arrays`` only, read batch by batch (a memory-mapped site folder is
      never copied whole); None: every row.
    """

    def __init__(
        self,
        arrays: ImageArrays,
        batch_size: int,
        transform: Callable,
        shuffle: bool,
        drop_last: bool,
        seed: int | None = None,
        device: str | torch.device | None = None,
        indices=None,
    ):
        if not isinstance(arrays, ImageArrays):
            raise ValueError(
                f"arrays must be an ImageArrays (see load_dataset / site_train_arrays), got {type(arrays).__name__}"
            )
        check_number("batch_size", batch_size, low=1, integer=True)
        if not callable(transform):
            raise ValueError(
                f"transform must be callable as transform(images_uint8, generator), e.g. "
                f"train_transform('cifar10'), got {transform!r}"
            )
        if seed is not None:
            check_number("seed", seed, integer=True)
        self.device = torch.device(device) if device is not None else arrays.images.device
        self.images = arrays.images.to(self.device)
        self.labels = arrays.labels.to(self.device)
        self.indices = None if indices is None else torch.as_tensor(indices, dtype=torch.int64, device=self.device)
        self.batch_size = batch_size
        self.transform = transform
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        if self.drop_last and 0 < self.num_samples < batch_size:
            warnings.warn(
                f"TensorBatchLoader: {self.num_samples} samples < batch_size={batch_size} with "
                f"drop_last=True gives 0 batches per epoch"
            )

    @property
    def num_samples(self) -> int:
        return int((self.labels if self.indices is None else self.indices).shape[0])

    def __len__(self) -> int:
        n, b = self.num_samples, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n, b = self.num_samples, self.batch_size
        if self.shuffle:
            order = torch.randperm(n, generator=self.generator).to(self.device)
        else:
            order = None
        if self.indices is not None:
            order = self.indices if order is None else self.indices[order]
        for k in range(len(self)):
            if order is None:
                xb, yb = self.images[k * b : (k + 1) * b], self.labels[k * b : (k + 1) * b]
            else:
                idx = order[k * b : (k + 1) * b]
                xb, yb = self.images.index_select(0, idx), self.labels.index_select(0, idx)
            yield self.transform(xb, self.generator), yb
