"""Load image datasets as whole uint8 tensors (no per-image Python objects, no PIL at training time).

Every loader returns :class:`DatasetSplits` holding ``ImageArrays`` (uint8 ``[N, C, H, W]`` images, int64 ``[N]``
labels). Augmentation and normalisation happen later, batched, in :mod:`nvflare_moon.data.transforms`.

Supported names (``load_dataset(name, data_root)``):

- ``"cifar10"`` / ``"cifar100"``: the python-pickle layout ``data_root/cifar-10-batches-py/`` or
  ``data_root/cifar-100-python/``. The pickles are read directly, **without torchvision's md5 check** (the offline
  copy has different bytes); torchvision is only used for ``download=True`` when the folder is absent.
- ``"tinyimagenet"``: ``data_root/tiny-imagenet-200/`` with ``train/<wnid>/images/*.JPEG``, ``val/images/*.JPEG`` and
  ``val/val_annotations.txt``. The val set (labelled by the annotations file) is the test set, as in the MOON code.
  Class order is the sorted wnids of ``train/``. Decoded arrays are cached in ``decoded_uint8.pt`` in that folder.
- ``"synthetic"``: a small deterministic, learnable 10-class set generated in memory (``data_root`` is ignored).

``load_dataset`` memoises its result per (name, data_root) in the process. The returned tensors are shared between
callers: treat them as read-only.
"""

from __future__ import annotations

import functools
import os
import pickle
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ..core.files import write_atomic
from ..core.validation import check_number
from .decoded_cache import load_or_decode

__all__ = [
    "ImageArrays",
    "DatasetSplits",
    "DatasetNotFoundError",
    "DATASETS",
    "NUM_CLASSES",
    "load_dataset",
    "load_image_folder",
    "clear_dataset_cache",
    "make_synthetic",
]

DATASETS = ("cifar10", "cifar100", "tinyimagenet", "synthetic")
NUM_CLASSES = {"cifar10": 10, "cifar100": 100, "tinyimagenet": 200, "synthetic": 10}


@dataclass
class ImageArrays:
    """A whole split in memory: ``images`` uint8 ``[N, C, H, W]`` and ``labels`` int64 ``[N]``."""

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self):
        if not isinstance(self.images, torch.Tensor) or self.images.dtype != torch.uint8 or self.images.ndim != 4:
            raise ValueError(
                "images must be a uint8 torch.Tensor of shape [N, C, H, W], got "
                f"{getattr(self.images, 'dtype', type(self.images))} "
                f"{tuple(getattr(self.images, 'shape', ()))}"
            )
        if not isinstance(self.labels, torch.Tensor) or self.labels.dtype != torch.int64 or self.labels.ndim != 1:
            raise ValueError(
                "labels must be an int64 torch.Tensor of shape [N], got "
                f"{getattr(self.labels, 'dtype', type(self.labels))} "
                f"{tuple(getattr(self.labels, 'shape', ()))}"
            )
        if self.images.shape[0] != self.labels.shape[0]:
            raise ValueError(
                f"images and labels must have the same length, got {self.images.shape[0]} images and "
                f"{self.labels.shape[0]} labels"
            )

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices) -> "ImageArrays":
        """The samples at ``indices`` (any int sequence, numpy array or tensor), in that order, as a copy."""
        idx = torch.as_tensor(
            np.asarray(indices, dtype=np.int64) if not isinstance(indices, torch.Tensor) else indices,
            dtype=torch.int64,
            device=self.labels.device,
        )
        if idx.ndim != 1:
            raise ValueError(f"indices must be 1-D, got shape {tuple(idx.shape)}")
        return ImageArrays(self.images[idx], self.labels[idx])


@dataclass
class DatasetSplits:
    """A dataset's train and test splits, ``num_classes`` and (when known) the class names in label order."""

    name: str
    train: ImageArrays
    test: ImageArrays
    num_classes: int
    class_names: tuple = ()


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are missing, incomplete, unreadable or corrupt. The message names the dataset, every path
    that was tried and what to do about it."""


# --------------------------------------------------------------------------------------------------------------------
# process-level cache

_CACHE: dict = {}
_CACHE_LOCK = threading.Lock()


def clear_dataset_cache() -> None:
    """Forget every dataset memoised by :func:`load_dataset` in this process."""
    with _CACHE_LOCK:
        _CACHE.clear()


DATA_ROOT_ENV = "NVFLARE_MOON_DATA"
DEFAULT_DATA_ROOT = os.path.join("~", ".cache", "nvflare_moon", "data")


def resolve_data_root(data_root: str | None) -> str:
    """``data_root`` itself, else ``$NVFLARE_MOON_DATA``, else ``~/.cache/nvflare_moon/data`` (user expanded).

    The committed job folders leave ``data_root`` unset, so each site chooses its folder with the variable.
    """
    return os.path.expanduser(data_root or os.environ.get(DATA_ROOT_ENV) or DEFAULT_DATA_ROOT)


def load_dataset(name: str, data_root: str | None = None, download: bool = False) -> DatasetSplits:
    """Load dataset ``name`` (one of :data:`DATASETS`) from ``data_root`` (see :func:`resolve_data_root`); memoised
    per (name, abspath(data_root)).

    ``download=True`` fetches CIFAR-10/100 with torchvision when their folder is absent. Raises
    :class:`DatasetNotFoundError` when the files are missing (and not downloaded) or unreadable, and ValueError for an
    unknown ``name``.
    """
    if name not in DATASETS:
        raise ValueError(f"dataset must be one of {list(DATASETS)}, got {name!r}")
    if name == "synthetic":
        key = (name, None)
    else:
        if data_root is not None and not isinstance(data_root, (str, os.PathLike)):
            raise ValueError(f"data_root must be a folder path for dataset {name!r}, got {data_root!r}")
        key = (name, os.path.abspath(resolve_data_root(data_root and os.fspath(data_root))))
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
    if cached is not None:
        return cached
    if name == "synthetic":
        splits = make_synthetic()
    elif name in ("cifar10", "cifar100"):
        splits = _load_cifar(name, key[1], download)
    else:
        splits = _load_tinyimagenet(key[1], download)
    with _CACHE_LOCK:
        return _CACHE.setdefault(key, splits)


# --------------------------------------------------------------------------------------------------------------------
# CIFAR

_CIFAR = {
    "cifar10": dict(
        folder="cifar-10-batches-py",
        train=[f"data_batch_{i}" for i in range(1, 6)],
        test=["test_batch"],
        meta="batches.meta",
        label_key="labels",
        names_key="label_names",
        tv_class="CIFAR10",
    ),
    "cifar100": dict(
        folder="cifar-100-python",
        train=["train"],
        test=["test"],
        meta="meta",
        label_key="fine_labels",
        names_key="fine_label_names",
        tv_class="CIFAR100",
    ),
}


def _candidates(data_root: str, folder: str) -> list[str]:
    """Where a dataset folder may be: ``data_root/folder``, or ``data_root`` itself if it is named ``folder``."""
    paths = [os.path.join(data_root, folder)]
    if os.path.basename(os.path.normpath(data_root)) == folder:
        paths.append(data_root)
    return paths


def _not_found(name: str, looked_in: list[str], missing: str, how_to_fix: str) -> DatasetNotFoundError:
    where = "\n".join(f"  - {p}" for p in looked_in)
    return DatasetNotFoundError(f"dataset {name!r} not found: {missing}. Looked in:\n{where}\nTo fix: {how_to_fix}")


def _cifar_files(spec: dict) -> list[str]:
    return spec["train"] + spec["test"] + [spec["meta"]]


def _find_complete(paths: list[str], files: list[str]) -> str | None:
    for p in paths:
        if all(os.path.isfile(os.path.join(p, f)) for f in files):
            return p
    return None


def _read_pickle(path: str, name: str) -> dict:
    try:
        with open(path, "rb") as f:
            obj = pickle.load(f, encoding="latin1")
    except Exception as e:  # truncated, not a pickle, permission denied, ...
        raise DatasetNotFoundError(
            f"dataset {name!r}: cannot read {path} ({type(e).__name__}: {e}). The file is "
            f"unreadable or corrupt: delete its folder and rebuild it (download=True, or "
            f"offline: python build_batches.py DEST)"
        ) from e
    if not isinstance(obj, dict):
        raise DatasetNotFoundError(
            f"dataset {name!r}: {path} does not hold a CIFAR batch dict (got "
            f"{type(obj).__name__}); delete its folder and rebuild it"
        )
    return obj


def _decode_cifar_batches(folder: str, files: list[str], spec: dict, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = [], []
    for fname in files:
        path = os.path.join(folder, fname)
        batch = _read_pickle(path, name)
        try:
            data = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
            lab = np.asarray(batch[spec["label_key"]], dtype=np.int64)
            if lab.shape[0] != data.shape[0]:
                raise ValueError(f"{data.shape[0]} images but {lab.shape[0]} labels")
        except (KeyError, ValueError, TypeError) as e:
            raise DatasetNotFoundError(
                f"dataset {name!r}: {path} is not a valid CIFAR batch ({type(e).__name__}: "
                f"{e}); delete its folder and rebuild it"
            ) from e
        images.append(data)
        labels.append(lab)
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(images))), torch.from_numpy(np.concatenate(labels))


def _read_cifar_batches(folder: str, files: list[str], spec: dict, name: str) -> ImageArrays:
    """The split in ``files``: decoded once, then memory-mapped by every later process (see :mod:`.decoded_cache`)."""
    decode = functools.partial(_decode_cifar_batches, folder, files, spec, name)
    return ImageArrays(*load_or_decode(folder, files, f"{name}-{files[0]}", decode))


def _load_cifar(name: str, data_root: str, download: bool) -> DatasetSplits:
    spec = _CIFAR[name]
    files = _cifar_files(spec)
    paths = _candidates(data_root, spec["folder"])
    folder = _find_complete(paths, files)
    if folder is None and download:
        import torchvision.datasets as tvd

        try:
            getattr(tvd, spec["tv_class"])(root=data_root, train=True, download=True)
        except Exception as e:
            raise _not_found(
                name,
                paths,
                f"download with torchvision failed ({type(e).__name__}: {e})",
                f"check network access, or copy {spec['folder']}/ into data_root (offline CIFAR-10: "
                f"python build_batches.py {data_root})",
            ) from e
        folder = _find_complete(paths, files)
    if folder is None:
        raise _not_found(
            name,
            paths,
            f"need {spec['folder']}/ with files {files}",
            f"set download=True to fetch it with torchvision, or point data_root (or $NVFLARE_MOON_DATA) at a folder containing "
            f"{spec['folder']}/ (offline CIFAR-10: python build_batches.py DEST)",
        )
    meta = _read_pickle(os.path.join(folder, spec["meta"]), name)
    train = _read_cifar_batches(folder, spec["train"], spec, name)
    test = _read_cifar_batches(folder, spec["test"], spec, name)
    k = NUM_CLASSES[name]
    for split, arrays in (("train", train), ("test", test)):
        lo, hi = int(arrays.labels.min()), int(arrays.labels.max())
        if lo < 0 or hi >= k:
            raise DatasetNotFoundError(
                f"dataset {name!r}: {split} labels in {folder} span {lo}..{hi}, expected "
                f"0..{k - 1}; the folder holds a different dataset"
            )
    return DatasetSplits(name, train, test, k, tuple(meta.get(spec["names_key"], ())))


# --------------------------------------------------------------------------------------------------------------------
# Tiny-ImageNet

_TINY_FOLDER = "tiny-imagenet-200"
_TINY_CACHE = "decoded_uint8.pt"
_TINY_CACHE_FORMAT = 1
_TINY_SIZE = 64


def _decode_rgb(path: str, size: int) -> np.ndarray:
    """One image file as uint8 ``[size, size, 3]`` RGB (PIL; bilinear resize only if it is not size x size)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            if im.size != (size, size):
                im = im.resize((size, size), Image.BILINEAR)
            return np.asarray(im, dtype=np.uint8)
    except Exception as e:
        raise DatasetNotFoundError(
            f"cannot decode image {path} ({type(e).__name__}: {e}); the file is missing or "
            f"corrupt: replace or remove it"
        ) from e


def _decode_files(paths: list[str], size: int) -> torch.Tensor:
    """Decode image files to uint8 ``[N, 3, size, size]``, in a thread pool (PIL releases the GIL while decoding)."""
    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        for i, img in enumerate(pool.map(lambda p: _decode_rgb(p, size), paths, chunksize=64)):
            out[i] = img
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


def _tiny_from_source(root: str) -> dict:
    train_dir = os.path.join(root, "train")
    classes = sorted(d for d in os.listdir(train_dir) if os.path.isdir(os.path.join(train_dir, d)))
    if not classes:
        raise DatasetNotFoundError(f"dataset 'tinyimagenet': {train_dir} has no class folders")
    class_to_idx = {c: i for i, c in enumerate(classes)}
    train_paths, train_labels = [], []
    for c in classes:
        img_dir = os.path.join(train_dir, c, "images")
        if not os.path.isdir(img_dir):
            raise DatasetNotFoundError(f"dataset 'tinyimagenet': missing {img_dir} (expected train/<wnid>/images/)")
        for f in sorted(os.listdir(img_dir)):
            if f.lower().endswith((".jpeg", ".jpg", ".png")):
                train_paths.append(os.path.join(img_dir, f))
                train_labels.append(class_to_idx[c])
    ann_path = os.path.join(root, "val", "val_annotations.txt")
    test_paths, test_labels = [], []
    with open(ann_path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.split("\t") if "\t" in line else line.split()
            if len(parts) < 2 or parts[1].strip() not in class_to_idx:
                raise DatasetNotFoundError(
                    f"dataset 'tinyimagenet': {ann_path} line {line_no} is malformed or names "
                    f"a class not in train/: {line.strip()!r}"
                )
            test_paths.append(os.path.join(root, "val", "images", parts[0].strip()))
            test_labels.append(class_to_idx[parts[1].strip()])
    return {
        "format": _TINY_CACHE_FORMAT,
        "classes": classes,
        "train_images": _decode_files(train_paths, _TINY_SIZE),
        "train_labels": torch.tensor(train_labels, dtype=torch.int64),
        "test_images": _decode_files(test_paths, _TINY_SIZE),
        "test_labels": torch.tensor(test_labels, dtype=torch.int64),
    }


def _read_tiny_cache(path: str) -> dict | None:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
        if obj.get("format") != _TINY_CACHE_FORMAT:
            raise ValueError(f"cache format {obj.get('format')!r}, expected {_TINY_CACHE_FORMAT}")
        ImageArrays(obj["train_images"], obj["train_labels"])
        ImageArrays(obj["test_images"], obj["test_labels"])
        return obj
    except Exception as e:
        warnings.warn(f"ignoring unreadable Tiny-ImageNet cache {path} ({type(e).__name__}: {e}); decoding again")
        return None


def _write_cache(obj, path: str) -> None:
    try:
        write_atomic(path, lambda f: torch.save(obj, f), binary=True)
    except OSError as e:
        warnings.warn(f"could not write the decoded-image cache {path} ({e}); later loads will decode again")


def _load_tinyimagenet(data_root: str, download: bool) -> DatasetSplits:
    paths = _candidates(data_root, _TINY_FOLDER)
    obj = None
    for root in paths:
        cache = os.path.join(root, _TINY_CACHE)
        if os.path.isfile(cache):
            obj = _read_tiny_cache(cache)
            if obj is not None:
                break
    if obj is None:
        root = next(
            (
                p
                for p in paths
                if os.path.isdir(os.path.join(p, "train"))
                and os.path.isfile(os.path.join(p, "val", "val_annotations.txt"))
            ),
            None,
        )
        if root is None:
            extra = (
                " (download=True is not supported for Tiny-ImageNet: torchvision has no downloader)" if download else ""
            )
            raise _not_found(
                "tinyimagenet",
                paths,
                f"need {_TINY_FOLDER}/ with train/<wnid>/images/ and val/val_annotations.txt{extra}",
                f"download http://cs231n.stanford.edu/tiny-imagenet-200.zip and unzip it into data_root, "
                f"or point data_root (or $NVFLARE_MOON_DATA) at a folder containing {_TINY_FOLDER}/",
            )
        try:
            obj = _tiny_from_source(root)
        except DatasetNotFoundError:
            raise
        except OSError as e:
            raise DatasetNotFoundError(f"dataset 'tinyimagenet': cannot read {root} ({type(e).__name__}: {e})") from e
        _write_cache(obj, os.path.join(root, _TINY_CACHE))
    return DatasetSplits(
        "tinyimagenet",
        ImageArrays(obj["train_images"], obj["train_labels"]),
        ImageArrays(obj["test_images"], obj["test_labels"]),
        len(obj["classes"]),
        tuple(obj["classes"]),
    )


# --------------------------------------------------------------------------------------------------------------------
# a site's own data (ImageFolder layout)


def load_image_folder(root: str, image_size: int = 32) -> tuple[ImageArrays, list[str]]:
    """Read ``root/<class>/<image>`` (torchvision ImageFolder layout and extensions) into uint8 arrays.

    Images are converted to RGB and resized to ``image_size x image_size`` (bilinear). Labels follow the sorted class
    folder names, which are returned too: ``(arrays, class_names)``.
    """
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    check_number("image_size", image_size, low=1, integer=True)
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise DatasetNotFoundError(
            f"image folder not found: {root}. Point root at a folder laid out as root/<class_name>/<image file>"
        )
    try:
        classes, class_to_idx = find_classes(root)
        samples = make_dataset(root, class_to_idx, extensions=IMG_EXTENSIONS)
    except FileNotFoundError as e:
        raise DatasetNotFoundError(
            f"image folder {root} has no usable images ({e}); expected root/<class_name>/"
            f"<image> with extensions {IMG_EXTENSIONS}"
        ) from e
    images = _decode_files([path for path, _ in samples], image_size)
    labels = torch.tensor([label for _, label in samples], dtype=torch.int64)
    return ImageArrays(images, labels), list(classes)


# --------------------------------------------------------------------------------------------------------------------
# synthetic


def make_synthetic(
    num_train: int = 600, num_test: int = 200, num_classes: int = 10, seed: int = 1234, noise_std: float = 48.0
) -> DatasetSplits:
    """A deterministic, learnable image set (3x32x32 uint8) for tests and smoke runs; needs no files.

    Each class c has a smooth random template T_c (a 3x4x4 uniform(40, 215) grid upsampled bilinearly to 32x32).
    A sample of class c is ``clip(T_c + noise_std * N(0, 1), 0, 255)``. Labels are exactly balanced
    (``i % num_classes``, then shuffled), so any Dirichlet split over a few sites gets enough of every class.
    """
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(num_classes, 3, 4, 4, generator=g) * 175 + 40
    templates = torch.nn.functional.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False)

    def split(n: int) -> ImageArrays:
        labels = (torch.arange(n) % num_classes)[torch.randperm(n, generator=g)]
        x = templates[labels] + noise_std * torch.randn(n, 3, 32, 32, generator=g)
        return ImageArrays(x.round_().clamp_(0, 255).to(torch.uint8), labels.to(torch.int64))

    train = split(num_train)
    test = split(num_test)
    return DatasetSplits("synthetic", train, test, num_classes, tuple(f"class_{k}" for k in range(num_classes)))
