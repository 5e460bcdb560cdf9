"""A site's images decoded once into one uint8 file, then memory-mapped by every later process.

A hospital folder may hold 100k images of 256-512 px: decoded float tensors of it do not fit in memory, and decoding
it at every client start (the simulator with ``-t < -n`` starts one per task) would cost minutes. The first process
decodes the files in a thread pool and writes the pixels, in file order, straight to
``<folder>/.nvflare_moon_decoded/<key>/images.u8`` (``[N, C, S, S]`` uint8, never all in memory: the decoders run
at most a few images ahead of the writer, however slow the disk), with
``meta.json`` holding the shape and what was seen: each file's size and channels, and the files that could not be
decoded (skipped, so row i of the file is the i-th *readable* image). Later processes map the file: batches are read
from the page cache, shared by every process on the machine.

The key is a digest of the settings and of every file's path, size and modification time, so a changed folder is
decoded again, never read stale. Where ``<folder>`` cannot be written (a read-only mount), the copy goes to the
fallback folder (the site's workspace) instead.

Pixels: ``channels=1`` converts to grayscale, ``3`` to RGB (a grayscale image replicated); 16-bit images are scaled to
8 bits over their full range (``v / 257``, so 65535 -> 255); every image is resized to ``S x S`` (bilinear, the
aspect ratio is not kept).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections import Counter, deque
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch

from .decoded_cache import CACHE_FOLDER

_LOG = logging.getLogger(__name__)
FORMAT = 2  # bump when the file layout or the pixel conversion changes (2: the narrow 16-bit count)
GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")
SIXTEEN_BIT_MODES = ("I", "I;16", "I;16B", "I;16L")
TWELVE_BIT_LIMIT = 4096  # a 16-bit file whose values all stay below it holds 12-bit data


@dataclass(frozen=True)
class DecodedImages:
    """The readable images, ``images`` uint8 ``[N_kept, C, S, S]`` (memory-mapped), and what the decoding saw."""

    images: torch.Tensor
    kept: np.ndarray  # positions, in the listed files, of the rows of ``images``
    unreadable: list  # [relative path, reason] of every file that could not be decoded
    source_channels: dict  # {"1": count, "3": count}: grayscale and colour files among the readable ones
    sizes: dict  # {"WxH": count} of the readable files, before resizing
    folder: str  # where the decoded copy is
    narrow_16bit: int = 0  # 16-bit files whose values all stay below 4096 (12-bit data): nearly black once scaled


def cache_key(paths: Sequence[str], base: str, image_size: int, channels: int) -> str:
    """A digest of the settings and of every file's path (relative to ``base``), size and modification time."""
    digest = hashlib.blake2b(f"{FORMAT}/{image_size}/{channels}".encode(), digest_size=12)
    for path in paths:
        stat = os.stat(path)
        digest.update(f"/{os.path.relpath(path, base)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return f"images-{image_size}px-{channels}ch-{digest.hexdigest()}"


def decode_image(path: str, image_size: int, channels: int) -> tuple[np.ndarray, tuple, int, bool]:
    """``(pixels uint8 [C, S, S], (width, height), source channels 1 or 3, narrow)`` of one file, ``narrow`` for a
    16-bit file whose values (none negative, not all 0) all stay below 4096, which the scaling over the full 16-bit
    range leaves nearly black (12-bit data, as some scanners write); raises on a bad file."""
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        size, mode, narrow = im.size, im.mode, False
        if mode in SIXTEEN_BIT_MODES:
            wide = np.asarray(im, dtype=np.float64)
            narrow = bool(wide.min() >= 0 and 0 < wide.max() < TWELVE_BIT_LIMIT)  # not blank, not signed data
            im = Image.fromarray(np.clip(np.rint(wide / 257.0), 0, 255).astype(np.uint8), "L")
        im = im.convert("L" if channels == 1 else "RGB")
        if im.size != (image_size, image_size):
            im = im.resize((image_size, image_size), Image.BILINEAR)
        pixels = np.asarray(im, dtype=np.uint8)
    pixels = pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)
    return np.ascontiguousarray(pixels), size, 1 if mode in GRAYSCALE_MODES else 3, narrow


def load_or_decode_images(
    paths: Sequence[str], base: str, image_size: int, channels: int, fallback_folder: Optional[str]
) -> DecodedImages:
    """The decoded images of ``paths``: mapped from their copy under ``base`` (or ``fallback_folder``) when there is
    one, else decoded into a new copy there."""
    key = cache_key(paths, base, image_size, channels)
    folders = [os.path.join(base, CACHE_FOLDER, key)]
    if fallback_folder:
        folders.append(os.path.join(fallback_folder, CACHE_FOLDER, key))
    for folder in folders:
        found = _open(folder)
        if found is not None:
            return found
    for folder in folders:
        if _decode_into(folder, paths, base, image_size, channels):
            return _open(folder)
    raise OSError(f"cannot write the decoded copy of {len(paths)} images into any of {folders}")


def _open(folder: str) -> Optional[DecodedImages]:
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        shape = tuple(meta["shape"])
        path = os.path.join(folder, "images.u8")
        images = np.memmap(path, dtype=np.uint8, mode="c", shape=shape) if shape[0] else np.zeros(shape, np.uint8)
    except (OSError, ValueError, KeyError):
        return None
    return DecodedImages(
        torch.from_numpy(images),
        np.asarray(meta["kept"], dtype=np.int64),
        meta["unreadable"],
        meta["source_channels"],
        meta["sizes"],
        folder,
        meta.get("narrow_16bit", 0),
    )


def _decode_into(folder: str, paths: Sequence[str], base: str, image_size: int, channels: int) -> bool:
    """Decode every file into a staging folder, then rename it to ``folder``; False if it cannot be written."""
    parent = os.path.dirname(folder)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(dir=parent, prefix=".writing-")
    except OSError:
        return False

    def decode(path):
        try:
            return decode_image(path, image_size, channels)
        except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError, ...
            return f"{type(e).__name__}: {e}"

    kept, unreadable, source_channels, sizes, narrow_16bit = [], [], Counter(), Counter(), 0
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
                pixels, (width, height), source, narrow = result
                out.write(pixels.tobytes())
                kept.append(i)
                narrow_16bit += narrow
                source_channels[str(source)] += 1
                sizes[f"{width}x{height}"] += 1
        meta = dict(
            format=FORMAT,
            shape=[len(kept), channels, image_size, image_size],
            kept=kept,
            unreadable=unreadable,
            source_channels=dict(source_channels),
            sizes=dict(sizes),
            narrow_16bit=narrow_16bit,
        )
        with open(os.path.join(staging, "meta.json"), "w") as f:
            json.dump(meta, f)
        shutil.rmtree(folder, ignore_errors=True)  # a damaged copy
        os.rename(staging, folder)
    except OSError:  # another process renamed its copy first, or the disk is full
        shutil.rmtree(staging, ignore_errors=True)
        return _open(folder) is not None
    return True


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
