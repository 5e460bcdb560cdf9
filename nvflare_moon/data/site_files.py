"""A site's own images: find the folder, list its files and labels, and refuse what would train on the wrong thing.

Two layouts, both read on the site (nothing here runs on the submitter's machine):

- ``"image_folder"``: ``<root>/train/<class>/<image>`` and, optionally, a held-out split ``<root>/test/<class>/...``
  (or the first of ``val/``, ``valid/``, ``validation/`` where there is no ``test/``): torchvision's ``ImageFolder``
  layout and extensions. As ImageFolder does, the images of a class are found in its folder's subfolders too
  (``train/pneumonia/patient_001/img.png``, as PACS exports by patient; symbolic links followed, each folder read
  once, so a link back up the tree cannot loop). Nothing a hospital may expect to be read is left out silently:
  files with other extensions (DICOM's ``.dcm``, say) and folders beside ``train/`` that are not read are named in
  the listing's notes (the data check's report and the training log); images directly in a split's folder (no
  class), a class folder that is a link to nowhere (a share not mounted) and a folder that cannot be read are
  refused, and so is an image listed twice (by a link or a repeated manifest row), in either layout.
- ``"datalist"``: a manifest of ``(image, label)`` rows, paths relative to the manifest's folder:
  JSON ``{"training": [{"image": "a.png", "label": "pneumonia"}, ...], "validation": [...]}`` (NVFlare's medical
  examples; ``"train"``/``"test"`` are accepted too), or CSV with the columns ``image,label`` and an optional
  ``split`` column (``train``/``training`` or ``test``/``validation``; rows without it are training rows).
  ``<root>`` is the manifest file, or a folder holding ``datalist.json`` or ``datalist.csv``.

Labels are positions in the job's ``class_names``, the same on every site: a site that lacks a class trains with the
same numbers, and a class folder or manifest label outside ``class_names`` is refused by name. A manifest label may
also be the class's index.

Where ``<root>`` comes from (:func:`resolve_site_root`): the job's ``site_path`` when it sets one (NVFlare resolves
``{SITE_NAME}``, ``{WORKSPACE}`` and ``{$VAR}`` in it on the site); else the site's ``$NVFLARE_MOON_SITE_DATA``; else
``site_path`` in the site's ``<workspace>/local/nvflare_moon_data.json`` (its older key ``data_root`` is read too).
"""

from __future__ import annotations

import csv
import json
import os
import stat
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

from ..core.validation import reject_unknown, take_renamed

SITE_DATASETS = ("image_folder", "datalist")
SITE_DATA_ENV = "NVFLARE_MOON_SITE_DATA"
SITE_DATA_FILE = "nvflare_moon_data.json"  # in the site's <workspace>/local/
SITE_PATH_KEY = "site_path"  # the key of SITE_DATA_FILE
OLD_SITE_PATH_KEY = "data_root"  # its key before site_path had its own name, still read
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
HELD_OUT_FOLDERS = ("test", "val", "valid", "validation")  # an image folder's held-out split: the first present
OS_FILES = ("thumbs.db", "desktop.ini")  # the files Windows writes into folders: never images, not worth a note
IGNORED_BESIDE = ("lost+found", "__MACOSX")  # folders a file system or an archive leaves beside train/: no note
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
    test_split: str = ""  # the held-out split's folder or manifest section ("test", "val", "validation"), if any
    notes: tuple = ()  # what the listing left out that a user may expect to be read, in words
    file_stats: dict = field(default_factory=dict, compare=False, repr=False)  # path -> (size, mtime_ns), read once

    @property
    def folder(self) -> str:
        """The folder the files are named relative to: ``root``, or the manifest's folder."""
        return self.root if os.path.isdir(self.root) else os.path.dirname(self.root)


def check_class_names(class_names: Sequence[str]) -> tuple:
    """``class_names`` as a tuple: at least two distinct, non-empty strings."""
    if isinstance(class_names, str) or not isinstance(class_names, (list, tuple)):
        raise ValueError(f"class_names must be a list of class names (the label order), got {class_names!r}")
    names = tuple(class_names)
    if len(names) < 2 or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"class_names must be at least two distinct non-empty strings, got {class_names!r}")
    return names


def check_site_path(site_path: Optional[str]) -> None:
    """Raise ValueError, naming ``site_path``, unless it is None or a non-empty path string."""
    if site_path is not None and (not isinstance(site_path, str) or not site_path):
        raise ValueError(f"site_path must be the site's folder or manifest, or None, got {site_path!r}")


def site_path_argument(site_path: Optional[str], old_names: dict, *, owner: str) -> Optional[str]:
    """The checked ``site_path`` of ``owner``'s constructor: the argument, or for one release its old name
    ``data_root`` taken out of ``old_names`` (the constructor's ``**kwargs``), where any other name is refused."""
    site_path = take_renamed(old_names, "data_root", "site_path", site_path, None, owner=owner)
    reject_unknown(owner, old_names)
    check_site_path(site_path)
    return site_path


def resolve_site_root(site_path: Optional[str], site: str, workspace_root: str) -> str:
    """The site's data location: ``site_path`` if set, else ``$NVFLARE_MOON_SITE_DATA``, else the ``site_path`` of
    ``<workspace_root>/local/nvflare_moon_data.json``; user-expanded. Raises SiteDataError naming all three."""
    if site_path:
        return os.path.expanduser(site_path)
    if os.environ.get(SITE_DATA_ENV):
        return os.path.expanduser(os.environ[SITE_DATA_ENV])
    config = os.path.join(workspace_root, "local", SITE_DATA_FILE)
    example = '{"site_path": "/path/to/images"}'
    if os.path.isfile(config):
        try:
            with open(config) as f:
                settings = json.load(f)
        except (OSError, ValueError) as e:
            raise SiteDataError(f"{site}: cannot read {config} ({type(e).__name__}: {e})") from e
        values = [settings.get(key) for key in (SITE_PATH_KEY, OLD_SITE_PATH_KEY)] if isinstance(settings, dict) else []
        value = next((v for v in values if v), None)
        if not isinstance(value, str):
            raise SiteDataError(f"{site}: {config} must hold {example}, got {SITE_PATH_KEY}={value!r}")
        return os.path.expanduser(value)
    raise SiteDataError(
        f"{site} has no data location: the job sets no site_path, ${SITE_DATA_ENV} is not set on this site, and "
        f"{config} does not exist. Write {example} into that file (or set the variable before starting the site)"
    )


def list_site_files(kind: str, root: str, class_names: Sequence[str], site: str) -> SiteFiles:
    """Every image of the site, labelled; ``kind`` is ``"image_folder"`` or ``"datalist"``."""
    names = check_class_names(class_names)
    stats = {}  # path -> os.stat_result: a datalist's rows are stated as they are read (a missing file names its row)
    if kind == "image_folder":
        files = _list_image_folder(root, names, site)
    elif kind == "datalist":
        files = _list_datalist(root, names, site, stats)
    else:
        raise ValueError(f"dataset must be one of {list(SITE_DATASETS)} for a site's own images, got {kind!r}")
    _stat_files(files, site, stats)
    _refuse_listed_twice(files, stats, site)
    return replace(files, file_stats={path: (found.st_size, found.st_mtime_ns) for path, found in stats.items()})


def _stat_files(files: SiteFiles, site: str, stats: dict) -> None:
    """Add to ``stats`` (``{path: os.stat_result}``) every listed file it lacks: the one ``stat`` a file costs at a
    site's start (on a share, each is a round trip); a file that cannot be reached is refused, naming it (or the link
    that points nowhere)."""
    for path in files.train_paths + files.test_paths:
        if path in stats:
            continue
        try:
            stats[path] = os.stat(path)
        except OSError as e:
            _refuse_unreachable_link(path, site)
            raise _unreadable(site, path, e.strerror) from e


def _refuse_listed_twice(files: SiteFiles, stats: dict, site: str) -> None:
    """Refuse an image listed twice, whatever the path that reaches it (a link, a hard link, a repeated manifest row;
    found by device and inode): in two classes it trains on a wrong label, in both splits it inflates the held-out
    figures, in one class it counts twice."""
    first = {}
    held_out = files.test_split or "test"
    for split, paths, labels in (
        ("train", files.train_paths, files.train_labels),
        (held_out, files.test_paths, files.test_labels),
    ):
        for path, label in zip(paths, labels):
            entry = (split, files.class_names[label], path)
            seen = first.setdefault((stats[path].st_dev, stats[path].st_ino), entry)
            if seen is not entry:
                raise SiteDataError(
                    f"{site}: one image is listed twice: {seen[2]} ({seen[0]}, {seen[1]}) and {path} ({split}, "
                    f"{entry[1]}); keep one (a link or a repeated manifest row reaches the same file)"
                )


# ---- image folder ---------------------------------------------------------------------------------------------------


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def _unreadable(site: str, path: str, reason: str) -> SiteDataError:
    return SiteDataError(f"{site}: cannot read {path} ({reason}); give the account the site runs as read access")


def _refuse_unreachable_link(path: str, site: str) -> None:
    """A link whose target cannot be reached (a share not mounted) would drop what it holds without a word."""
    if os.path.islink(path) and not os.path.exists(path):
        target = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
        raise SiteDataError(
            f"{site}: {path} links to {target}, which cannot be reached (a share not mounted?); mount it, or remove "
            "the link"
        )


def _entries(folder: str, site: str) -> list:
    """The names in ``folder`` that are not hidden, sorted; refused when the folder cannot be listed."""
    try:
        return sorted(entry for entry in os.listdir(folder) if not entry.startswith("."))
    except OSError as e:
        raise _unreadable(site, folder, e.strerror) from e


def _images_under(class_dir: str, site: str) -> tuple[list, Counter]:
    """Every image file in ``class_dir`` and its subfolders, sorted by path relative to it, and the other files'
    count by extension (``""``: none); hidden files and folders and Windows' folder files skipped. A folder reached a
    second time through a symbolic link, or a link to a folder above ``class_dir`` (whose other classes it would read
    as this one), is not read. A folder that cannot be read, and a link that cannot be reached, are refused: what
    they hold would be lost without a word."""

    def refuse(error: OSError):
        raise _unreadable(site, error.filename, error.strerror)

    top = os.path.realpath(class_dir)
    seen, found, others = set(), [], Counter()
    for folder, subfolders, files in os.walk(class_dir, followlinks=True, onerror=refuse):
        real = os.path.realpath(folder)
        if real in seen or (real != top and os.path.commonpath([real, top]) == real):
            subfolders[:] = []
            continue
        seen.add(real)
        subfolders[:] = [d for d in subfolders if not d.startswith(".")]
        for f in files:
            if _is_image(f):  # a dangling link among them is refused by the listing's one stat a file
                found.append(os.path.join(folder, f))
                continue
            _refuse_unreachable_link(os.path.join(folder, f), site)  # os.walk lists a link to a folder gone as a file
            if not f.startswith(".") and f.lower() not in OS_FILES:
                others[os.path.splitext(f)[1].lower()] += 1
    return sorted(found, key=lambda path: os.path.relpath(path, class_dir).split(os.sep)), others


def _described(others: Counter) -> str:
    """``".dcm ×12, no extension ×3"``."""
    return ", ".join(
        f"{ext or 'no extension'} ×{n}" for ext, n in sorted(others.items(), key=lambda kv: (-kv[1], kv[0]))
    )


def _unread_note(folder: str, others: Counter) -> str:
    dicom = " (DICOM: export it as PNG or TIFF first)" if ".dcm" in others else ""
    return (
        f"{folder}: {sum(others.values())} file(s) not read, not of an image extension ({_described(others)}); "
        f"only {', '.join(IMAGE_EXTENSIONS)} are read{dicom}"
    )


def _list_split(folder: str, names: tuple, site: str) -> tuple[list, list, Counter]:
    """The images of one split's folder with their labels, and the count of the files it does not read."""
    index = {name: k for k, name in enumerate(names)}
    paths, labels, others = [], [], Counter()
    entries = _entries(folder, site)
    loose = [entry for entry in entries if _is_image(entry) and not os.path.isdir(os.path.join(folder, entry))]
    if loose:
        raise SiteDataError(
            f"{site}: {len(loose)} image(s) directly in {folder} have no class: move each into {folder}/<class>/"
        )
    for entry in entries:
        class_dir = os.path.join(folder, entry)
        _refuse_unreachable_link(class_dir, site)
        if not os.path.isdir(class_dir):
            continue
        if entry not in index:
            raise SiteDataError(
                f"{site}: class folder {class_dir} is not in the job's class_names {list(names)}; rename or remove "
                "the folder, or add the class to class_names (the same list on every site)"
            )
        files, unread = _images_under(class_dir, site)
        if not files:
            held = f"; it holds {_described(unread)}, not read" if unread else ""
            raise SiteDataError(
                f"{site}: class folder {class_dir} holds no images, nor do its subfolders (extensions "
                f"{', '.join(IMAGE_EXTENSIONS)}){held}; remove the folder, or put its images there as one of these"
            )
        paths += files
        labels += [index[entry]] * len(files)
        others += unread
    return paths, labels, others


def _list_image_folder(root: str, names: tuple, site: str) -> SiteFiles:
    train_dir = os.path.join(root, "train")
    if not os.path.isdir(train_dir):
        found = "does not exist" if not os.path.exists(root) else "has no train/ folder"
        raise SiteDataError(
            f"{site}: image folder {root} {found}; dataset='image_folder' needs {root}/train/<class>/<image> "
            f"(and optionally {root}/test/<class>/<image>). Set this site's site_path to that folder"
        )
    train = _list_split(train_dir, names, site)
    if not train[0]:
        raise SiteDataError(f"{site}: {train_dir} holds no class folders with images (expected train/<class>/<image>)")
    held_out = [split for split in HELD_OUT_FOLDERS if os.path.isdir(os.path.join(root, split))]
    split = held_out[0] if held_out else ""
    test = _list_split(os.path.join(root, split), names, site) if held_out else ([], [], Counter())
    notes = [
        f"{root}/{other}/ is not read: {root}/{split}/ is the held-out split (merge {other}/ into train/ or {split}/ "
        "to use it)"
        for other in held_out[1:]
    ]
    read = [os.path.join(root, name) for name in ("train", *held_out)]
    beside = [
        entry
        for entry in _entries(root, site)
        if os.path.isdir(os.path.join(root, entry))
        and entry not in IGNORED_BESIDE
        and not any(os.path.samefile(os.path.join(root, entry), path) for path in read)  # Train/ where case is folded
    ]
    notes += [
        f"{root}/{entry}/ is not read: an image folder holds train/ and one held-out split, the first of "
        f"{', '.join(f'{name}/' for name in HELD_OUT_FOLDERS)}"
        for entry in beside
    ]
    notes += [
        _unread_note(folder, others)
        for folder, others in ((train_dir, train[2]), (os.path.join(root, split), test[2]))
        if others
    ]
    return SiteFiles(root, names, tuple(train[0]), tuple(train[1]), tuple(test[0]), tuple(test[1]), split, tuple(notes))


# ---- datalist -------------------------------------------------------------------------------------------------------


def _manifest_path(root: str, site: str) -> str:
    if os.path.isfile(root):
        return root
    for name in ("datalist.json", "datalist.csv"):
        if os.path.isfile(os.path.join(root, name)):
            return os.path.join(root, name)
    raise SiteDataError(
        f"{site}: no datalist at {root}; dataset='datalist' needs a .json or .csv manifest, or a folder holding "
        "datalist.json or datalist.csv. Set this site's site_path to it"
    )


def _read_manifest(path: str, site: str) -> dict:
    """``{"train": [(image, label, where)], "test": [...]}`` with ``where`` naming the row for error messages."""
    rows = {"train": [], "test": []}
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # utf-8-sig: a CSV saved by Excel starts with a BOM
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


def _list_datalist(root: str, names: tuple, site: str, stats: dict) -> SiteFiles:
    """The manifest's rows, each file stated into ``stats``; a row whose file is missing (or not a file) is refused,
    naming the row."""
    manifest = _manifest_path(root, site)
    base = os.path.dirname(os.path.abspath(manifest))
    out = {}
    for split, rows in _read_manifest(manifest, site).items():
        paths, labels = [], []
        for image, label, where in rows:
            path = os.path.normpath(os.path.join(base, str(image)))
            try:
                found = os.stat(path)
            except OSError:
                found = None
            if found is None or not stat.S_ISREG(found.st_mode):
                raise SiteDataError(f"{site}: {where} points to {path}, which does not exist")
            stats[path] = found
            paths.append(path)
            labels.append(_label_of(label, names, where, site))
        out[split] = (tuple(paths), tuple(labels))
    if not out["train"][0]:
        raise SiteDataError(f"{site}: the datalist {manifest} has no training rows")
    return SiteFiles(manifest, names, *out["train"], *out["test"], "validation" if out["test"][0] else "")
