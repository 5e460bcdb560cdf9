"""A site's own images, ready to train on: listed and checked (:mod:`.site_files`), decoded once into a memory-mapped
uint8 copy (:mod:`.image_cache`), and split into training and held-out rows.

    settings = SiteDataSettings("image_folder", class_names=("normal", "pneumonia"), image_size=64, channels=1)
    data = load_site_data(settings, "/data/xray", "hospital-1", workspace_root)
    loader = TensorBatchLoader(data.images, 32, settings.train_transform(), shuffle=True, drop_last=True,
                               indices=data.train_index)

The held-out rows are the site's ``test/`` split (else its ``val/``, or the datalist's ``validation`` rows) when it
has one, else a seeded, class-stratified ``val_fraction`` of its training files, drawn so that each file added to
the folder later moves at most one other file between the splits (:func:`stratified_holdout`). Each site uses
all of its own data: there is no partition.

Every file is converted to the job's ``channels`` (a colour file to grayscale with ``channels=1``, a grayscale one
replicated with ``3``); where a site's files mix the two kinds, the conversions are logged and counted in the data
check, or refused with ``strict_channels=True``.

Files deeper than 8 bits are mapped to 8 bits through ``intensity_window`` (:mod:`.image_cache`); without one, the
16-bit range. A site holding files which that range cannot show (negative values, as CT in Hounsfield units, or
floating point) is refused until the job sets a window; 12-bit data (values below 4096), which it leaves nearly black,
is named in a warning.

Bad input is refused with the file or setting named (:class:`SiteDataError`): a class outside ``class_names``, an
empty class folder, a manifest row pointing nowhere, and more than ``max_unreadable`` files that cannot be decoded
(default 0: any unreadable file stops the job; above 0, up to that many are skipped with a warning naming each).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import torch

from ..core.validation import check_choice, check_flag, check_number
from .datasets import ImageArrays
from .image_cache import DecodedImages, load_or_decode_images
from .site_files import SITE_DATASETS, SiteDataError, check_class_names, list_site_files
from .transforms import BatchTransform

# Fixed statistics for images of unknown origin: pixel / 255 has mean 0.5 and std 0.25 after normalisation maps it
# to about [-2, 2]. A job can give a site population's own with ``mean``/``std``.
DEFAULT_MEAN, DEFAULT_STD = 0.5, 0.25
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class SiteDataSettings:
    """What every site of a job does with its own images (the same on every site; only the path is the site's).

    Args:
        dataset: ``"image_folder"`` or ``"datalist"`` (see :mod:`.site_files`).
        class_names: the label order, identical on every site.
        image_size: images are resized to ``image_size x image_size``.
        channels: 1 (grayscale; the network's first layer takes one channel) or 3 (RGB).
        mean, std: per-channel normalisation of ``pixel / 255``; None: 0.5 and 0.25 for every channel.
        val_fraction: share of each class's training files held out where the site has no test split.
        max_unreadable: files that cannot be decoded are skipped, with a warning, up to this many; more stop the job.
        augment: random crop (padding ``image_size // 8``) and horizontal flip in training; False for none (e.g.
            where left and right differ, as on chest X-rays).
        strict_channels: refuse a site whose files mix grayscale and colour, instead of converting the odd ones.
        intensity_window: ``(low, high)``, the stored values shown black and white in grayscale files deeper than 8
            bits (16- and 32-bit integers, floating point; 8-bit and colour files are left as they are): CT in
            Hounsfield units ``(-160, 240)`` (soft tissue) or ``(-1350, 150)`` (lung), 12-bit data ``(0, 4095)``,
            floating point in 0..1 ``(0, 1)``. None: the 16-bit range ``(0, 65535)``.
        seed: seed of the held-out draw.
    """

    dataset: str
    class_names: tuple
    image_size: int = 32
    channels: int = 3
    mean: Optional[tuple] = None
    std: Optional[tuple] = None
    val_fraction: float = 0.1
    max_unreadable: int = 0
    augment: bool = True
    strict_channels: bool = False
    intensity_window: Optional[tuple] = None
    seed: int = 0

    def __post_init__(self):
        check_choice("dataset", self.dataset, SITE_DATASETS)
        object.__setattr__(self, "class_names", check_class_names(self.class_names))
        check_number("image_size", self.image_size, low=8, integer=True)
        check_choice("channels", self.channels, (1, 3))
        for name in ("mean", "std"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (list, tuple)) or len(value) != self.channels):
                raise ValueError(f"{name} must be None or {self.channels} numbers (one per channel), got {value!r}")
        check_number("val_fraction", self.val_fraction, low=0)
        if self.val_fraction >= 1:
            raise ValueError(f"val_fraction must be below 1 (a share of the training files), got {self.val_fraction}")
        check_number("max_unreadable", self.max_unreadable, low=0, integer=True)
        check_flag("augment", self.augment)
        check_flag("strict_channels", self.strict_channels)
        if self.intensity_window is not None:
            object.__setattr__(self, "intensity_window", _checked_window(self.intensity_window))
        check_number("seed", self.seed, low=0, integer=True)

    def normalization(self) -> tuple[tuple, tuple]:
        mean = tuple(self.mean) if self.mean is not None else (DEFAULT_MEAN,) * self.channels
        std = tuple(self.std) if self.std is not None else (DEFAULT_STD,) * self.channels
        return mean, std

    def train_transform(self) -> BatchTransform:
        pad = self.image_size // 8 if self.augment else 0
        return BatchTransform(*self.normalization(), pad=pad, pad_mode="reflect", flip=self.augment)

    def test_transform(self) -> BatchTransform:
        return BatchTransform(*self.normalization())


@dataclass(frozen=True)
class SiteData:
    """A site's readable images and labels (``images``, memory-mapped), the rows to train on and the held-out rows."""

    images: ImageArrays
    train_index: np.ndarray
    test_index: np.ndarray
    class_names: tuple
    held_out: str  # where the held-out rows come from, for the logs
    decoded: DecodedImages

    def class_counts(self, index: np.ndarray) -> list[int]:
        return np.bincount(self.images.labels.numpy()[index], minlength=len(self.class_names)).tolist()


def list_and_decode(settings: SiteDataSettings, root: str, site: str, workspace_root: str):
    """``(files, decoded)``: the site's listed files and their decoded copy (made now if there is none)."""
    files = list_site_files(settings.dataset, root, settings.class_names, site)
    decoded = load_or_decode_images(
        files.train_paths + files.test_paths,
        files.folder,
        image_size=settings.image_size,
        channels=settings.channels,
        window=settings.intensity_window,
        listing=os.path.abspath(files.root),
        file_stats=files.file_stats,
        fallback_folder=workspace_root,
    )
    return files, decoded


def load_site_data(settings: SiteDataSettings, root: str, site: str, workspace_root: str) -> SiteData:
    """The site's data under ``root``, checked, decoded (once per machine) and split; raises SiteDataError."""
    files, decoded = list_and_decode(settings, root, site, workspace_root)
    check_decoded(decoded, settings, site)
    for note in files.notes:
        _LOG.warning(f"{site}: {note}")
    labels = np.asarray(files.train_labels + files.test_labels, dtype=np.int64)[decoded.kept]
    is_train = decoded.kept < len(files.train_paths)
    if files.test_paths:
        train_index, test_index = np.flatnonzero(is_train), np.flatnonzero(~is_train)
        held_out = f"its {files.test_split} split ({len(test_index)} images)"
    else:
        folder = files.folder  # a property that asks the file system: once, not once a file
        names = [os.path.relpath(files.train_paths[i], folder).replace(os.sep, "/") for i in decoded.kept]
        train_index, test_index = stratified_holdout(labels, names, settings.val_fraction, settings.seed)
        held_out = f"val_fraction={settings.val_fraction} of its training images ({len(test_index)})"
    images = ImageArrays(decoded.images, torch.from_numpy(labels))
    return SiteData(images, train_index, test_index, settings.class_names, held_out, decoded)


def channel_conversions(decoded: DecodedImages, channels: int) -> int:
    """How many readable files were converted to ``channels``: the colour ones for 1, the grayscale ones for 3."""
    return decoded.source_channels.get("3" if channels == 1 else "1", 0)


def describe_channels(decoded: DecodedImages) -> str:
    """``"1200 grayscale, 3 colour"``: the source files of each kind."""
    kinds = sorted(decoded.source_channels.items())
    return ", ".join(f"{n} {'grayscale' if c == '1' else 'colour'}" for c, n in kinds)


def decoding_notes(decoded: DecodedImages, count: Callable[[int], Any] = int) -> list[str]:
    """What the decoding saw that a site should hear (the 12-bit data), each count shown by ``count``."""
    if not decoded.twelve_bit:
        return []
    return [
        f"{count(decoded.twelve_bit)} image file(s) deeper than 8 bits hold values below 4096 only (12-bit data?): "
        "scaled over the full 16-bit range (v / 257) they come out nearly black, at most 16 of 255; set site_data's "
        "intensity_window to [0, 4095] (or to the range the data hold), or export them as 8-bit"
    ]


def unscaled_problem(decoded: DecodedImages, count: Callable[[int], Any] = int) -> Optional[str]:
    """Why a site whose files the 16-bit range cannot show is refused, and the fix; None where there are none."""
    if not decoded.unscaled:
        return None
    return (
        f"{count(decoded.unscaled)} image file(s) hold negative values (as CT in Hounsfield units), values above "
        "65535 or floating point, which the default scaling of 0..65535 to 0..255 would clip to black or white; "
        "set site_data's intensity_window to [low, high], the stored values to show black and white (CT soft "
        "tissue [-160, 240], lung [-1350, 150]; floating point in 0..1: [0, 1])"
    )


def value_range_of(example) -> str:
    """``"train/covid/1.tif holds -1024 to 1873"``, of one of ``DecodedImages.unscaled_examples``."""
    path, low, high = example
    return f"{path} holds {low:g} to {high:g}"


def _checked_window(window) -> tuple[float, float]:
    if not (
        isinstance(window, (list, tuple))
        and len(window) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in window)
        and window[0] < window[1]
    ):
        raise ValueError(
            f"intensity_window must be None or [low, high], two numbers with low < high (the stored values shown "
            f"black and white), got {window!r}"
        )
    return float(window[0]), float(window[1])


def check_decoded(decoded: DecodedImages, settings: SiteDataSettings, site: str) -> None:
    """Refuse more than ``max_unreadable`` undecodable files, files that need an intensity window, and
    (``strict_channels``) grayscale mixed with colour; warn for the rest."""
    max_unreadable, bad = settings.max_unreadable, decoded.unreadable
    listed = "; ".join(f"{path} ({why})" for path, why in bad[:5]) + (
        f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
    )
    if len(bad) > max_unreadable:
        raise SiteDataError(
            f"{site}: {len(bad)} image file(s) cannot be decoded, more than max_unreadable={max_unreadable}: "
            f"{listed}. Replace or remove them (or raise max_unreadable to skip them)"
        )
    if bad:
        _LOG.warning(
            f"{site}: skipping {len(bad)} unreadable image file(s) (max_unreadable={max_unreadable}): {listed}"
        )
    unscaled = unscaled_problem(decoded)
    if unscaled:
        examples = "; ".join(map(value_range_of, decoded.unscaled_examples))
        raise SiteDataError(f"{site}: {unscaled} ({examples})")
    for note in decoding_notes(decoded):
        _LOG.warning(f"{site}: {note}")
    if len(decoded.source_channels) < 2:
        return
    if settings.strict_channels:
        raise SiteDataError(
            f"{site}: the images mix grayscale and colour files ({describe_channels(decoded)}) and "
            "strict_channels=True; convert the odd ones, check that they belong to this dataset, or set "
            "strict_channels=False to convert them to the job's channels"
        )
    _LOG.warning(
        f"{site}: the images mix grayscale and colour files ({describe_channels(decoded)}); "
        f"{channel_conversions(decoded, settings.channels)} converted to channels={settings.channels} "
        "(strict_channels=True refuses such a site)"
    )


def stratified_holdout(
    labels: np.ndarray, names: Sequence[str], fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(train rows, held-out rows)``, both sorted: of each class c, the ``round(fraction · n_c)`` rows whose
    ``names`` (the files' paths in the site's folder) come first in the order of a digest of ``seed`` and the name.

    A row's place in that order depends on its own name only, so adding or removing a file moves at most one other
    file between the splits: of n files added to a class, at most ``round(fraction · (n_c + n)) − round(fraction ·
    n_c)``, about ``fraction · n``, files trained on before join the held-out ones (a shuffle of the rows would redraw
    them all, and evaluate mostly on images trained on before)."""
    order = np.array([_digest(seed, name) for name in names], dtype=np.uint64)
    held = []
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        held.append(rows[np.argsort(order[rows], kind="stable")][: int(round(fraction * len(rows)))])
    held_out = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    return np.setdiff1d(np.arange(len(labels)), held_out), held_out


def _digest(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest(), "big")


def site_data_settings(dataset, site_data: Optional[Dict[str, Any]], seed: int) -> Optional[SiteDataSettings]:
    """The checked settings of a site's own images (``dataset`` ``"image_folder"``/``"datalist"``), else None;
    ``site_data`` is refused with any other dataset, and required with these two."""
    if not (isinstance(dataset, str) and dataset in SITE_DATASETS):
        if site_data is not None:
            raise ValueError(f"site_data is for dataset='image_folder' or 'datalist', not dataset={dataset!r}")
        return None
    if not isinstance(site_data, dict) or "class_names" not in site_data:
        raise ValueError(
            f"dataset={dataset!r} needs site_data={{'class_names': [...], ...}}: the label order, the same on every "
            f"site; got site_data={site_data!r}"
        )
    if {"dataset", "seed"} & set(site_data):
        raise ValueError("site_data takes neither 'dataset' nor 'seed': they are the executor's own arguments")
    try:
        return SiteDataSettings(dataset=dataset, seed=seed, **site_data)
    except TypeError as e:  # an unknown key
        raise ValueError(f"site_data: {e}; its keys are the SiteDataSettings fields") from e
