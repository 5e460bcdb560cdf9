"""A site's images decoded once into one uint8 file, then memory-mapped by every later process.

A hospital folder may hold 100k images of 256-512 px: decoded float tensors of it do not fit in memory, and decoding
it at every client start (the simulator with ``-t < -n`` starts one per task) would cost minutes. The first process
decodes the files in a thread pool and writes the pixels, in file order, straight to
``<folder>/.nvflare_moon_decoded/<key>/images.u8`` (``[N, C, S, S]`` uint8, never all in memory: the decoders run
at most a few images ahead of the writer, however slow the disk), with
``meta.json`` holding the settings, the shape and what was seen: each file's size and channels, the files that could
not be decoded (skipped, so row i of the file is the i-th *readable* image) and, of the files deeper than 8 bits,
how many do not fit the 16-bit range and the medians of their values. Later processes map the file: batches are read
from the page cache, shared by every process on the machine.

The key is a digest of the settings and of every file's path, size and modification time, so a changed folder is
decoded again, never read stale. The older copies of the same listing and settings are then never mapped again
(unless the folder is put back as it was): a new copy removes all but the :data:`KEPT_COPIES` last used
(:func:`remove_older_copies`), so a folder that a PACS export grows every day does not fill the disk with a full
copy a day. Where ``<folder>`` cannot be written (a read-only mount), the copy goes to the fallback folder (the
site's workspace) instead.

Pixels: ``channels=1`` converts to grayscale, ``3`` to RGB (a grayscale image replicated); every image is resized to
``S x S`` (bilinear, the aspect ratio is not kept). Grayscale files deeper than 8 bits (16- and 32-bit integers,
floating point; PIL reads 16-bit colour files at 8 bits itself) are mapped to 8 bits through an intensity window
``(low, high)``: ``clip(rint((v - low) · 255 / (high - low)), 0, 255)``, so ``low`` is black and ``high`` white.
Without one the window is the 16-bit range ``(0, 65535)`` (``v / 257``), and the files it cannot show are counted:
those holding negative values (CT in Hounsfield units), values above 65535 or floating point (``unscaled``, which a
site refuses) and those whose values all stay below 4096 (12-bit data, left nearly black: ``twelve_bit``, a
warning). Values that are not numbers (NaN) are shown black.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter, deque
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, NamedTuple, Optional, Sequence

import numpy as np
import torch

from .decoded_cache import CACHE_FOLDER

_LOG = logging.getLogger(__name__)
FORMAT = 3  # bump when the file layout, the pixel conversion or meta.json changes (3: the window and what it saw)
WIDE_MODES = ("I", "I;16", "I;16B", "I;16L", "F")  # deeper than 8 bits: mapped through the intensity window
GRAYSCALE_MODES = ("1", "L", "LA", *WIDE_MODES)
SIXTEEN_BIT_WINDOW = (0.0, 65535.0)  # the window of a site that sets none
TWELVE_BIT_LIMIT = 4096  # a file deeper than 8 bits whose values all stay below it holds 12-bit data
TWELVE_BIT, UNSCALED = "12-bit", "unscaled"  # how a file's values fit the 16-bit range, where it has no window
MAX_EXAMPLES = 5  # unscaled files named in the decoded copy's meta
KEPT_COPIES = 2  # of each listing and settings: the new copy and the one used before it
STAGING_AGE_S = 24 * 3600  # a staging folder this old was left by a decoding that was killed


@dataclass(frozen=True)
class DecodedImages:
    """The readable images, ``images`` uint8 ``[N_kept, C, S, S]`` (memory-mapped), and what the decoding saw."""

    images: torch.Tensor
    kept: np.ndarray  # positions, in the listed files, of the rows of ``images``
    unreadable: list  # [relative path, reason] of every file that could not be decoded
    source_channels: dict  # {"1": count, "3": count}: grayscale and colour files among the readable ones
    sizes: dict  # {"WxH": count} of the readable files, before resizing
    folder: str  # where the decoded copy is
    twelve_bit: int = 0  # files whose values all stay below 4096 (12-bit data), without a window: nearly black
    unscaled: int = 0  # files the 16-bit range cannot show, without a window (negative, above 65535, floating point)
    unscaled_examples: tuple = ()  # ([relative path, lowest value, highest value], ...) of the first few of them
    stored_values: tuple = ()  # (files, median lowest, median highest) of the grayscale files deeper than 8 bits


class DecodedFile(NamedTuple):
    pixels: np.ndarray  # uint8 [C, S, S]
    size: tuple  # (width, height) before resizing
    source_channels: int  # 1 (grayscale) or 3 (colour)
    depth: str  # TWELVE_BIT or UNSCALED where the file has no window and fits the 16-bit range badly, else ""
    value_range: tuple  # (lowest, highest) stored value of a file deeper than 8 bits (NaN ignored), else ()


def cache_key(
    paths: Sequence[str], base: str, image_size: int, channels: int, window: Optional[tuple], file_stats: Mapping
) -> str:
    """A digest of the settings and of every file's path (relative to ``base``), size and modification time
    (``file_stats[path]``: ``(size, mtime_ns)``, as the listing read them)."""
    digest = hashlib.blake2b(f"{FORMAT}/{image_size}/{channels}/{window}".encode(), digest_size=12)
    for path in paths:
        size, mtime_ns = file_stats[path]
        digest.update(f"/{os.path.relpath(path, base)}:{size}:{mtime_ns}".encode())
    return f"images-{image_size}px-{channels}ch-{digest.hexdigest()}"  # _stale_copies reads "images-"


def decode_image(path: str, image_size: int, channels: int, window: Optional[tuple] = None) -> DecodedFile:
    """One file, resized, converted to ``channels`` and, if deeper than 8 bits, mapped through ``window`` (None: the
    16-bit range, and its depth judged); raises on a bad file."""
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        size, mode, depth, value_range = im.size, im.mode, "", ()
        if mode in WIDE_MODES:
            wide = np.asarray(im, dtype=np.float64)
            values = wide[~np.isnan(wide)] if mode == "F" else wide  # only floating point holds NaN
            value_range = (float(values.min()), float(values.max())) if values.size else (np.nan, np.nan)
            depth = "" if window else _fit_of_16_bit_range(mode, *value_range)
            low, high = window or SIXTEEN_BIT_WINDOW
            scaled = np.nan_to_num(np.rint((wide - low) * 255.0 / (high - low)), nan=0.0)
            im = Image.fromarray(np.clip(scaled, 0, 255).astype(np.uint8), "L")
        im = im.convert("L" if channels == 1 else "RGB")
        if im.size != (image_size, image_size):
            im = im.resize((image_size, image_size), Image.BILINEAR)
        pixels = np.asarray(im, dtype=np.uint8)
    pixels = pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)
    return DecodedFile(np.ascontiguousarray(pixels), size, 1 if mode in GRAYSCALE_MODES else 3, depth, value_range)


def _fit_of_16_bit_range(mode: str, lowest: float, highest: float) -> str:
    """UNSCALED for values the 16-bit range cannot show (floating point, negative, above 65535), TWELVE_BIT for 12-bit
    data (not blank), else ""."""
    if mode == "F" or lowest < 0 or highest > SIXTEEN_BIT_WINDOW[1]:
        return UNSCALED
    return TWELVE_BIT if 0 < highest < TWELVE_BIT_LIMIT else ""


def load_or_decode_images(
    paths: Sequence[str],
    base: str,
    *,
    image_size: int,
    channels: int,
    window: Optional[tuple],
    listing: str,
    file_stats: Mapping,
    fallback_folder: Optional[str],
) -> DecodedImages:
    """The decoded images of ``paths``: mapped from their copy under ``base`` (or ``fallback_folder``) when there is
    one, else decoded into a new copy there, which then removes the older copies of the same ``listing`` (the site's
    folder or manifest) and settings (:func:`remove_older_copies`); ``file_stats`` as for :func:`cache_key`."""
    key = cache_key(paths, base, image_size, channels, window, file_stats)
    folders = [os.path.join(base, CACHE_FOLDER, key)]
    if fallback_folder:
        folders.append(os.path.join(fallback_folder, CACHE_FOLDER, key))
    for folder in folders:
        found = _open(folder)
        if found is not None:
            return found
    settings = {"image_size": image_size, "channels": channels, "window": list(window) if window else None}
    settings["listing"] = listing  # all as JSON reads them back from meta.json
    for folder in folders:
        if _decode_into(folder, paths, base, settings):
            remove_older_copies(os.path.dirname(folder), settings)
            found = _open(folder)
            if found is not None:  # else removed at once by another process: try the next folder
                return found
    raise OSError(f"cannot write the decoded copy of {len(paths)} images into any of {folders}")


def _open(folder: str) -> Optional[DecodedImages]:
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        shape = tuple(meta["shape"])
        path = os.path.join(folder, "images.u8")
        images = np.memmap(path, dtype=np.uint8, mode="c", shape=shape) if shape[0] else np.zeros(shape, np.uint8)
        decoded = DecodedImages(
            torch.from_numpy(images),
            np.asarray(meta["kept"], dtype=np.int64),
            meta["unreadable"],
            meta["source_channels"],
            meta["sizes"],
            folder,
            meta["twelve_bit"],
            meta["unscaled"],
            tuple(meta["unscaled_examples"]),
            tuple(meta["stored_values"]),
        )
    except (OSError, ValueError, KeyError):  # no copy yet, or a damaged one
        return None
    _touch(os.path.join(folder, "meta.json"))  # last used now: remove_older_copies keeps the copies in use
    return decoded


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:  # a read-only mount
        pass


def _decode_into(folder: str, paths: Sequence[str], base: str, settings: dict) -> bool:
    """Decode every file with ``settings`` (``image_size``, ``channels``, ``window``) into a staging folder, then
    rename it to ``folder``; False if it cannot be written."""
    image_size, channels, window = settings["image_size"], settings["channels"], settings["window"]
    parent = os.path.dirname(folder)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(dir=parent, prefix=".writing-")
    except OSError:
        return False

    def decode(path):
        try:
            return decode_image(path, image_size, channels, window)
        except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError, ...
            return f"{type(e).__name__}: {e}"

    kept, unreadable, source_channels, sizes, depths, unscaled_examples = [], [], Counter(), Counter(), Counter(), []
    value_ranges = []  # (lowest, highest) of each file deeper than 8 bits
    report_every = max(1000, len(paths) // 10)  # a large folder takes minutes: say how far it is
    _LOG.info(f"decoding {len(paths)} images into {folder} (once: later starts map the copy)")
    try:
        workers = _workers()
        with open(os.path.join(staging, "images.u8"), "wb") as out, ThreadPoolExecutor(workers) as pool:
            for i, result in enumerate(map_ahead(pool, decode, paths, window=4 * workers)):
                if (i + 1) % report_every == 0:
                    _LOG.info(f"decoded {i + 1} of {len(paths)} images")
                if isinstance(result, str):
                    unreadable.append([os.path.relpath(paths[i], base), result])
                    continue
                out.write(result.pixels.tobytes())
                kept.append(i)
                depths[result.depth] += 1
                if result.value_range:
                    value_ranges.append(result.value_range)
                if result.depth == UNSCALED and len(unscaled_examples) < MAX_EXAMPLES:
                    unscaled_examples.append([os.path.relpath(paths[i], base), *result.value_range])
                source_channels[str(result.source_channels)] += 1
                sizes["{}x{}".format(*result.size)] += 1
        meta = dict(
            format=FORMAT,
            settings=settings,
            shape=[len(kept), channels, image_size, image_size],
            kept=kept,
            unreadable=unreadable,
            source_channels=dict(source_channels),
            sizes=dict(sizes),
            twelve_bit=depths[TWELVE_BIT],
            unscaled=depths[UNSCALED],
            unscaled_examples=unscaled_examples,
            stored_values=_medians(value_ranges),
        )
        with open(os.path.join(staging, "meta.json"), "w") as f:
            json.dump(meta, f)
        shutil.rmtree(folder, ignore_errors=True)  # a damaged copy
        os.rename(staging, folder)
    except OSError:  # another process renamed its copy first, or the disk is full
        shutil.rmtree(staging, ignore_errors=True)
        return _open(folder) is not None
    return True


def _medians(value_ranges: list) -> list:
    """``[files, median lowest, median highest]`` over the files with values (not NaN only); [] for none."""
    ranges = np.asarray(value_ranges, dtype=np.float64).reshape(-1, 2)
    ranges = ranges[np.isfinite(ranges).all(axis=1)]
    if not len(ranges):
        return []
    lowest, highest = np.median(ranges, axis=0)
    return [len(ranges), float(lowest), float(highest)]


def remove_older_copies(parent: str, settings: dict) -> None:
    """Remove, under ``parent``, the copies of an older format, all but the :data:`KEPT_COPIES` last used of
    ``settings`` (the same listing, image size, channels and window), and staging folders a killed decoding left.
    Folders without our ``meta.json`` are left alone, and so is a copy whose file cannot be removed (mapped by a
    process on Windows; on POSIX a process mapping a removed copy keeps reading it). Never raises: the job has its
    copy."""
    try:
        stale = _stale_copies(parent, settings)
    except OSError as e:
        _LOG.warning(f"cannot look for older decoded copies in {parent}: {e}")
        return
    freed = removed = 0
    for path in stale:
        images = os.path.join(path, "images.u8")
        try:
            size = os.path.getsize(images)
            os.remove(images)  # first: a copy whose file is in use stays whole, and is tried again later
        except FileNotFoundError:  # a staging folder, or a copy half removed
            size = 0
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        freed, removed = freed + size, removed + 1
    if removed:
        _LOG.info(f"removed {removed} older decoded cop(ies) from {parent} ({freed / 2**20:.0f} MiB)")


def _stale_copies(parent: str, settings: dict) -> list[str]:
    in_use, stale = [], []
    for entry in os.scandir(parent):
        meta_path = os.path.join(entry.path, "meta.json")
        try:
            if entry.name.startswith(".writing-"):
                if time.time() - entry.stat().st_mtime > STAGING_AGE_S:
                    stale.append(entry.path)
                continue
            if not entry.name.startswith("images-"):  # another kind of copy (decoded_cache's)
                continue
            with open(meta_path) as f:
                meta = json.load(f)
            last_used = os.stat(meta_path).st_mtime_ns
        except (OSError, ValueError):  # not a copy, or one being removed
            continue
        form = meta.get("format") if isinstance(meta, dict) else None
        if not isinstance(form, int):  # not a meta.json of ours
            continue
        if form < FORMAT:
            stale.append(entry.path)
        elif meta.get("settings") == settings:
            in_use.append((last_used, entry.path))
    return stale + [path for _, path in sorted(in_use, reverse=True)[KEPT_COPIES:]]


def map_ahead(pool: Executor, fn: Callable, items: Iterable, window: int) -> Iterator:
    """``pool.map(fn, items)``, in order, with at most ``window`` items submitted ahead of the consumer.

    ``Executor.map`` submits every item at once: where the consumer falls behind the workers, the finished results
    pile up in memory (writing the decoded copy of 20 000 images of 256 px, its writer fell 2 500 images, 480 MB,
    behind on a 2-core machine); here the workers wait instead.
    """
    pending = deque()
    for item in items:
        if len(pending) >= window:
            yield pending.popleft().result()
        pending.append(pool.submit(fn, item))
    while pending:
        yield pending.popleft().result()


def _workers() -> int:
    """PIL releases the GIL while decoding: a few threads per core keep the cores busy while files are read."""
    return max(2, min(16, 2 * (os.cpu_count() or 1)))
