"""Batched augmentation + normalisation on uint8 image tensors.

The random distributions are those of the MOON reference code's torchvision transforms, but applied to a whole
``[B, C, H, W]`` uint8 batch at once (one gather for crop+flip, one ``grid_sample`` for rotation) instead of per-image
PIL operations:

- crop: pad by ``p`` (reflect or zeros), then a ``H x W`` window at offsets ``(i, j)`` drawn independently per image,
  uniformly from ``{0, ..., 2p}`` (= ``torchvision.transforms.RandomCrop``);
- flip: each image mirrored left-right with probability 0.5 (= ``RandomHorizontalFlip``);
- rotation: each image rotated about its centre by an angle uniform in ``[-d, d]`` degrees, nearest-neighbour
  sampling, fill 0 (= ``RandomRotation(d)``);
- normalisation: ``x = (pixel / 255 - mean[c]) / std[c]`` (= ``ToTensor`` then ``Normalize``).

Per dataset (``train_transform(name)``; ``test_transform(name)`` only normalises):

- cifar10 / synthetic: reflect-pad 4 + crop 32, flip; mean (125.3, 123.0, 113.9)/255, std (63.0, 62.1, 66.7)/255.
- cifar100: zero-pad 4 + crop 32, flip, rotation 15 deg; mean (0.50708, 0.48655, 0.44092),
  std (0.26733, 0.25644, 0.27615) (the reference code's values).
- tinyimagenet: no augmentation; mean 0.5, std 0.5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core.validation import check_number

__all__ = ["BatchTransform", "train_transform", "test_transform", "NORMALIZATION", "TRANSFORM_DATASETS"]

NORMALIZATION = {
    "cifar10": ((125.3 / 255, 123.0 / 255, 113.9 / 255), (63.0 / 255, 62.1 / 255, 66.7 / 255)),
    "cifar100": (
        (0.5070751592371323, 0.48654887331495095, 0.4409178433670343),
        (0.2673342858792401, 0.2564384629170883, 0.27615047132568404),
    ),
    "tinyimagenet": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}
NORMALIZATION["synthetic"] = NORMALIZATION["cifar10"]
TRANSFORM_DATASETS = tuple(NORMALIZATION)


@dataclass(frozen=True)
class BatchTransform:
    """``transform(images_uint8 [B, C, H, W], generator=None) -> float32 [B, C, H, W]``, normalised.

    ``pad`` > 0 enables the random crop (output size = input size), with ``pad_mode`` "reflect" or "constant" (zeros);
    ``flip`` enables the random horizontal flip; ``rotation`` > 0 the random rotation in ``[-rotation, rotation]``
    degrees. Randomness comes from ``generator`` (the global torch RNG if None); random numbers are drawn on the
    generator's device, so a CPU generator gives the same augmentation whatever device the images are on.
    """

    mean: tuple
    std: tuple
    pad: int = 0
    pad_mode: str = "reflect"
    flip: bool = False
    rotation: float = 0.0

    def __post_init__(self):
        if len(self.mean) != len(self.std) or not self.mean:
            raise ValueError(f"mean and std must have one value per channel, got {self.mean!r} and {self.std!r}")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std values must be > 0, got {self.std!r}")
        check_number("pad", self.pad, low=0, integer=True)
        if self.pad_mode not in ("reflect", "constant"):
            raise ValueError(f"pad_mode must be 'reflect' or 'constant' (zero fill), got {self.pad_mode!r}")
        if not 0 <= self.rotation <= 180:
            raise ValueError(f"rotation must be in [0, 180] degrees, got {self.rotation!r}")

    @property
    def is_random(self) -> bool:
        return self.pad > 0 or self.flip or self.rotation > 0

    # ---- building blocks (public so they can be tested with given random values) -----------------------------------

    def crop_flip(self, images: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
        """For image b, the window at ``offsets[b] = (row, col)`` of the padded image, mirrored left-right where
        ``flips[b]`` is True. Keeps the dtype; one ``torch.gather``, no Python loop over images.

        Reflect padding is never materialised: padded coordinate q maps to source pixel ``reflect(q - pad)``
        (``-i`` below 0, ``2(H-1) - i`` above H-1), folded into the gather indices. Zero padding pads once.
        """
        b, c, h, w = images.shape
        p = self.pad
        dev = images.device
        if p > 0 and self.pad_mode == "reflect":
            if p >= h or p >= w:
                raise ValueError(f"reflect padding {p} needs images larger than {p} pixels, got {h}x{w}")
            source, hs, ws = images, h, w
            row_map = _reflect_table(h, p, dev)  # padded row -> source row
            col_map = _reflect_table(w, p, dev)
        else:
            source = F.pad(images, (p, p, p, p), mode="constant", value=0) if p > 0 else images
            hs, ws = h + 2 * p, w + 2 * p
            row_map = torch.arange(hs, device=dev)
            col_map = torch.arange(ws, device=dev)
        offsets = offsets.to(dev, torch.int64)
        flips = flips.to(dev, torch.bool)
        ar_h = torch.arange(h, device=dev)
        ar_w = torch.arange(w, device=dev)
        rows = row_map[offsets[:, 0:1] + ar_h]  # [B, H]
        cols = col_map[torch.where(flips[:, None], ar_w.flip(0), ar_w) + offsets[:, 1:2]]  # [B, W]
        lin = (rows[:, :, None] * ws + cols[:, None, :]).reshape(b, 1, h * w)  # [B, 1, H*W]
        out = torch.gather(source.reshape(b, c, hs * ws), 2, lin.expand(b, c, h * w))
        return out.reshape(b, c, h, w)

    def rotate(self, images: torch.Tensor, angles_deg: torch.Tensor) -> torch.Tensor:
        """Rotate each float image about its centre by ``angles_deg[b]`` (counter-clockwise on screen), nearest
        sampling, zero fill: one batched ``affine_grid`` + ``grid_sample``."""
        b, _, h, w = images.shape
        a = angles_deg.to(images.device, torch.float32) * (math.pi / 180)
        cos, sin = torch.cos(a), torch.sin(a)
        theta = torch.zeros(b, 2, 3, device=images.device)
        # output pixel -> input pixel (inverse map), in normalised coords, corrected for the aspect ratio
        theta[:, 0, 0] = cos
        theta[:, 0, 1] = -sin * (h / w)
        theta[:, 1, 0] = sin * (w / h)
        theta[:, 1, 1] = cos
        grid = F.affine_grid(theta, list(images.shape), align_corners=False)
        return F.grid_sample(images, grid, mode="nearest", padding_mode="zeros", align_corners=False)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """``(x / 255 - mean) / std`` per channel, as float32 (computed as ``x * a - b`` in one pass)."""
        c = images.shape[1]
        if c != len(self.mean):
            raise ValueError(f"images have {c} channels but this transform normalises {len(self.mean)}")
        mean = torch.tensor(self.mean, dtype=torch.float32, device=images.device).view(1, c, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=images.device).view(1, c, 1, 1)
        return torch.addcmul(-mean / std, images.to(torch.float32), 1.0 / (255.0 * std))

    # ---- the transform ------------------------------------------------------------------------------------------------

    def sample_params(self, batch_size: int, generator: torch.Generator | None = None):
        """Draw the random parameters of one batch, in this order, on the generator's device:
        ``offsets`` int64 [B, 2] uniform in {0..2*pad} (row, col), ``flips`` bool [B] with P(True) = 0.5,
        ``angles`` float32 [B] uniform in [-rotation, rotation]. Disabled parts are zeros and draw nothing."""
        gdev = generator.device if generator is not None else torch.device("cpu")
        b = batch_size
        if self.pad > 0:
            offsets = torch.randint(0, 2 * self.pad + 1, (b, 2), generator=generator, device=gdev)
        else:
            offsets = torch.zeros(b, 2, dtype=torch.int64, device=gdev)
        if self.flip:
            flips = torch.rand(b, generator=generator, device=gdev) < 0.5
        else:
            flips = torch.zeros(b, dtype=torch.bool, device=gdev)
        if self.rotation > 0:
            angles = (torch.rand(b, generator=generator, device=gdev) * 2 - 1) * self.rotation
        else:
            angles = torch.zeros(b, dtype=torch.float32, device=gdev)
        return offsets, flips, angles

    def apply(
        self, images: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, angles: torch.Tensor
    ) -> torch.Tensor:
        """The deterministic part: crop+flip, rotate, normalise with the given parameters."""
        x = images
        if self.pad > 0 or self.flip:
            x = self.crop_flip(x, offsets, flips)
        if self.rotation > 0:
            x = self.rotate(x.to(torch.float32), angles)
        return self.normalize(x)

    def __call__(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.dtype != torch.uint8:
            raise ValueError(
                "images must be a uint8 tensor [B, C, H, W], got "
                f"{getattr(images, 'dtype', type(images))} {tuple(getattr(images, 'shape', ()))}"
            )
        if not self.is_random:
            return self.normalize(images)
        params = self.sample_params(images.shape[0], generator)
        if images.is_cuda and not params[0].is_cuda:
            # through pinned memory, asynchronously: a plain copy would make the CPU wait for the GPU at every batch
            params = tuple(p.pin_memory().to(images.device, non_blocking=True) for p in params)
        return self.apply(images, *params)


def _reflect_table(n: int, p: int, device) -> torch.Tensor:
    """Source index of each of the ``n + 2p`` reflect-padded positions (edge pixel not repeated, like F.pad)."""
    i = torch.arange(-p, n + p, device=device)
    return torch.where(i < 0, -i, torch.where(i > n - 1, 2 * (n - 1) - i, i))


def _check_name(dataset: str) -> str:
    if dataset not in NORMALIZATION:
        raise ValueError(f"dataset must be one of {list(TRANSFORM_DATASETS)}, got {dataset!r}")
    return dataset


def train_transform(dataset: str) -> BatchTransform:
    """The paper's training augmentation for ``dataset`` (see the module docstring)."""
    mean, std = NORMALIZATION[_check_name(dataset)]
    if dataset in ("cifar10", "synthetic"):
        return BatchTransform(mean, std, pad=4, pad_mode="reflect", flip=True)
    if dataset == "cifar100":
        return BatchTransform(mean, std, pad=4, pad_mode="constant", flip=True, rotation=15.0)
    return BatchTransform(mean, std)


def test_transform(dataset: str) -> BatchTransform:
    """Normalisation only, with ``dataset``'s mean and std."""
    mean, std = NORMALIZATION[_check_name(dataset)]
    return BatchTransform(mean, std)


test_transform.__test__ = False  # not a pytest test, even when imported into a test module
