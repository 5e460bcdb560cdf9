"""A site's own images: find the folder, list its files and labels, and refuse what would train on the wrong thing.

Two layouts, both read on the site (nothing here runs on the submitter's machine):

- ``"image_folder"``: ``<root>/train/<class>/<image>`` and, optionally, ``<root>/test/<class>/<image>``
  (torchvision's ``ImageFolder`` layout and extensions). Files with other extensions are ignored, as ImageFolder does.
- ``"datalist"``: a manifest of ``(image, label)`` rows, paths relative to the manifest's folder:
  JSON ``{"training": [{"image": "a.png", "label": "pneumonia"}, ...], "validation": [...]}`` (NVFlare's medical
  examples; ``"train"``/``"test"`` are accepted too), or CSV with the columns ``image,label`` and an optional
  ``split`` column (``train``/``training`` or ``test``/``validation``; rows without it are training rows).
  ``<root>`` is the manifest file, or a folder holding ``datalist.json`` or ``datalist.csv``.

Labels are positions in the job's ``class_names``, the same on every site: a site that lacks a class trains with the
same numbers, and a class folder or manifest label outside ``class_names`` is refused by name. A manifest label may
also be the class's index.

Where ``<root>`` comes from (:func:`resolve_site_root`): the job's ``data_root`` when it sets one (NVFlare resolves
``{SITE_NAME}``, ``{WORKSPACE}`` and ``{$VAR}`` in it on the site); else the site's ``$NVFLARE_MOON_SITE_DATA``; else
``data_root`` in the site's ``<workspace>/local/nvflare_moon_data.json``.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from typing import Optional, Sequence

SITE_DATASETS = ("image_folder", "datalist")
SITE_DATA_ENV = "NVFLARE_MOON_SITE_DATA"
SITE_DATA_FILE = "nvflare_moon_data.json"  # in the site's <workspace>/local/
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
TRAIN_SECTIONS = ("training", "train")
TEST_SECTIONS = ("validation", "test")


class SiteDataError(ValueError):
    """A site's data cannot be used as the job says; the message names the file or setting and the fix."""


@dataclass(frozen=True)
class SiteFiles:
    """A site's image files, each with its label (a position in ``class_names``); ``test_*`` empty when the site
    has no test split of its own."""

    root: str
    class_names: tuple
    train_paths: tuple
    train_labels: tuple
    test_paths: tuple = ()
    test_labels: tuple = ()


def check_class_names(class_names: Sequence[str]) -> tuple:
    """``class_names`` as a tuple: at least two distinct, non-empty strings."""
    if isinstance(class_names, str) or not isinstance(class_names, (list, tuple)):
        raise ValueError(f"class_names must be a list of class names (the label order), got {class_names!r}")
    names = tuple(class_names)
    if len(names) < 2 or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"class_names must be at least two distinct non-empty strings, got {class_names!r}")
    return names


def resolve_site_root(data_root: Optional[str], site: str, workspace_root: str) -> str:
    """The site's data location: ``data_root`` if set, else ``$NVFLARE_MOON_SITE_DATA``, else the ``data_root`` of
    ``<workspace_root>/local/nvflare_moon_data.json``; user-expanded. Raises SiteDataError naming all three."""
    if data_root:
        return os.path.expanduser(data_root)
    if os.environ.get(SITE_DATA_ENV):
        return os.path.expanduser(os.environ[SITE_DATA_ENV])
    config = os.path.join(workspace_root, "local", SITE_DATA_FILE)
    if os.path.isfile(config):
        try:
            with open(config) as f:
                value = json.load(f)["data_root"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SiteDataError(f"{site}: cannot read data_root from {config} ({type(e).__name__}: {e})") from e
        if not isinstance(value, str) or not value:
            raise SiteDataError(f'{site}: {config} must hold {{"data_root": "/path/to/images"}}, got {value!r}')
        return os.path.expanduser(value)
    raise SiteDataError(
        f"{site} has no data location: the job sets no data_root, ${SITE_DATA_ENV} is not set on this site, and "
        f'{config} does not exist. Write {{"data_root": "/path/to/images"}} into that file (or set the '
        f"variable before starting the site)"
    )


def list_site_files(kind: str, root: str, class_names: Sequence[str], site: str) -> SiteFiles:
    """Every image of the site, labelled; ``kind`` is ``"image_folder"`` or ``"datalist"``."""
    names = check_class_names(class_names)
    if kind == "image_folder":
        return _list_image_folder(root, names, site)
    if kind == "datalist":
        return _list_datalist(root, names, site)
    raise ValueError(f"dataset must be one of {list(SITE_DATASETS)} for a site's own images, got {kind!r}")


# ---- image folder ---------------------------------------------------------------------------------------------------


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def _list_split(folder: str, names: tuple, site: str) -> tuple[list, list]:
    index = {name: k for k, name in enumerate(names)}
    paths, labels = [], []
    for entry in sorted(os.listdir(folder)):
        class_dir = os.path.join(folder, entry)
        if entry.startswith(".") or not os.path.isdir(class_dir):
            continue
        if entry not in index:
            raise SiteDataError(
                f"{site}: class folder {class_dir} is not in the job's class_names {list(names)}; rename or remove "
                "the folder, or add the class to class_names (the same list on every site)"
            )
        files = sorted(f for f in os.listdir(class_dir) if _is_image(f))
        if not files:
            raise SiteDataError(
                f"{site}: class folder {class_dir} holds no images (extensions {', '.join(IMAGE_EXTENSIONS)}); "
                "remove the empty folder, or put its images there"
            )
        paths += [os.path.join(class_dir, f) for f in files]
        labels += [index[entry]] * len(files)
    return paths, labels


def _list_image_folder(root: str, names: tuple, site: str) -> SiteFiles:
    train_dir, test_dir = os.path.join(root, "train"), os.path.join(root, "test")
    if not os.path.isdir(train_dir):
        found = "does not exist" if not os.path.exists(root) else "has no train/ folder"
        raise SiteDataError(
            f"{site}: image folder {root} {found}; dataset='image_folder' needs {root}/train/<class>/<image> "
            f"(and optionally {root}/test/<class>/<image>). Set this site's data_root to that folder"
        )
    train = _list_split(train_dir, names, site)
    if not train[0]:
        raise SiteDataError(f"{site}: {train_dir} holds no class folders with images (expected train/<class>/<image>)")
    test = _list_split(test_dir, names, site) if os.path.isdir(test_dir) else ([], [])
    return SiteFiles(root, names, tuple(train[0]), tuple(train[1]), tuple(test[0]), tuple(test[1]))


# ---- datalist -------------------------------------------------------------------------------------------------------


def _manifest_path(root: str, site: str) -> str:
    if os.path.isfile(root):
        return root
    for name in ("datalist.json", "datalist.csv"):
        if os.path.isfile(os.path.join(root, name)):
            return os.path.join(root, name)
    raise SiteDataError(
        f"{site}: no datalist at {root}; dataset='datalist' needs a .json or .csv manifest, or a folder holding "
        "datalist.json or datalist.csv. Set this site's data_root to it"
    )


def _read_manifest(path: str, site: str) -> dict:
    """``{"train": [(image, label, where)], "test": [...]}`` with ``where`` naming the row for error messages."""
    rows = {"train": [], "test": []}
    try:
        with open(path, newline="") as f:
            if path.lower().endswith(".csv"):
                reader = csv.DictReader(f)
                if not reader.fieldnames or not {"image", "label"} <= set(reader.fieldnames):
                    raise SiteDataError(f"{site}: {path} needs the CSV columns image,label, got {reader.fieldnames}")
                for line, row in enumerate(reader, 2):
                    split = (row.get("split") or "train").strip().lower()
                    if split not in TRAIN_SECTIONS + TEST_SECTIONS:
                        raise SiteDataError(f"{site}: {path} line {line}: split {split!r} is not train or test")
                    rows["train" if split in TRAIN_SECTIONS else "test"].append(
                        (row["image"], row["label"], f"{path} line {line}")
                    )
                return rows
            content = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error) as e:
        raise SiteDataError(f"{site}: cannot read the datalist {path} ({type(e).__name__}: {e})") from e
    if not isinstance(content, dict) or not any(s in content for s in TRAIN_SECTIONS):
        raise SiteDataError(f"{site}: {path} needs a 'training' (or 'train') list of {{\"image\", \"label\"}} rows")
    for split, sections in (("train", TRAIN_SECTIONS), ("test", TEST_SECTIONS)):
        for section in sections:
            for i, row in enumerate(content.get(section, [])):
                if not isinstance(row, dict) or "image" not in row or "label" not in row:
                    raise SiteDataError(f'{site}: {path} {section}[{i}] must be {{"image": ..., "label": ...}}')
                rows[split].append((row["image"], row["label"], f"{path} {section}[{i}]"))
    return rows


def _label_of(value, names: tuple, where: str, site: str) -> int:
    if isinstance(value, str) and value in names:
        return names.index(value)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return value
    raise SiteDataError(
        f"{site}: {where}: label {value!r} is not in the job's class_names {list(names)} (nor an index into it)"
    )


def _list_datalist(root: str, names: tuple, site: str) -> SiteFiles:
    manifest = _manifest_path(root, site)
    base = os.path.dirname(os.path.abspath(manifest))
    out = {}
    for split, rows in _read_manifest(manifest, site).items():
        paths, labels = [], []
        for image, label, where in rows:
            path = os.path.normpath(os.path.join(base, str(image)))
            if not os.path.isfile(path):
                raise SiteDataError(f"{site}: {where} points to {path}, which does not exist")
            paths.append(path)
            labels.append(_label_of(label, names, where, site))
        out[split] = (tuple(paths), tuple(labels))
    if not out["train"][0]:
        raise SiteDataError(f"{site}: the datalist {manifest} has no training rows")
    return SiteFiles(manifest, names, *out["train"], *out["test"])
