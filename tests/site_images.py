"""Small image folders that the tests write, in a hospital's layouts: ``train/<class>/<image>`` (plus ``test/``), or a
datalist. A class's images are learnable: class k has brightness ``40 + 60·k`` (and, in colour, its own tint), plus
noise."""

import json
from pathlib import Path

import numpy as np
from nvflare.recipe.utils import set_per_site_config
from PIL import Image


def class_image(label: int, rng: np.random.Generator, size=(20, 24), mode: str = "RGB") -> Image.Image:
    """One image of class ``label`` in PIL ``mode`` ``"RGB"``, ``"L"``, ``"I;16"`` (16-bit grayscale) or ``"I"`` (CT
    in Hounsfield units, signed: 8 HU a level, level 128 at 0 HU, so class 0 lies below 0)."""
    height, width = size[1], size[0]
    level = 40.0 + 60.0 * label + rng.normal(0.0, 12.0, (height, width))
    if mode == "I":
        return Image.fromarray(np.rint((level - 128.0) * 8.0).astype(np.int32))
    if mode == "I;16":
        return Image.fromarray(np.clip(level * 257.0, 0, 65535).astype(np.uint16))
    if mode == "L":
        return Image.fromarray(np.clip(level, 0, 255).astype(np.uint8), "L")
    tint = np.array([1.0, 0.8 + 0.1 * label, 0.6])
    return Image.fromarray(np.clip(level[..., None] * tint, 0, 255).astype(np.uint8), "RGB")


def write_split(folder: Path, counts: dict, seed: int = 0, mode: str = "RGB", size=(20, 24), ext: str = "png") -> list:
    """``folder/<class>/<i>.<ext>`` for each ``{class name: (label, count)}``; returns ``[(path, class name)]``."""
    rng = np.random.default_rng(seed)
    written = []
    for name, (label, count) in counts.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            path = folder / name / f"{i:04d}.{ext}"
            class_image(label, rng, size, mode).save(path)
            written.append((path, name))
    return written


def write_image_folder(root: Path, class_names, train_counts: dict, test_counts: dict = None, **kwargs) -> Path:
    """A site folder: ``root/train/<class>/…`` with ``train_counts[class]`` images (and ``root/test/`` likewise)."""
    index = {name: k for k, name in enumerate(class_names)}
    write_split(root / "train", {c: (index[c], n) for c, n in train_counts.items()}, **kwargs)
    if test_counts:
        write_split(root / "test", {c: (index[c], n) for c, n in test_counts.items()}, seed=99, **kwargs)
    return root


def write_datalist(root: Path, class_names, train_counts: dict, test_counts: dict = None, **kwargs) -> Path:
    """Images under ``root/images/`` and ``root/datalist.json`` listing them (MONAI's training/validation form)."""
    index = {name: k for k, name in enumerate(class_names)}
    sections = {"training": train_counts, "validation": test_counts or {}}
    manifest = {}
    for seed, (section, counts) in enumerate(sections.items()):
        rows = write_split(root / "images" / section, {c: (index[c], n) for c, n in counts.items()}, seed, **kwargs)
        manifest[section] = [{"image": str(path.relative_to(root)), "label": name} for path, name in rows]
    (root / "datalist.json").write_text(json.dumps(manifest))
    return root


def set_site_paths(recipe, folders: dict) -> None:
    """Each site's own folder, as its IT names it: ``set_per_site_config`` with ``{site: {"site_path": folder}}``."""
    set_per_site_config(recipe, {site: {"site_path": str(folder)} for site, folder in folders.items()})
