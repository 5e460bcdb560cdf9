"""A data check before training: what each site's images look like, as counts only, and the federation's table.

A site's report (:func:`site_report`) counts the images that decode (the ones training would use):

- ``train``, ``test``: images per class (``{class name: count}``, in ``class_names`` order) of the training split
  and of the site's own test split; ``test`` is None where the site has none (training then holds out
  ``val_fraction`` of its training images);
- ``classes_absent``: the classes with no training image;
- ``unreadable``: files that do not decode;
- ``channels``: ``{"grayscale": count, "colour": count}`` of the source files;
- ``converted``: the source files converted to the job's ``channels`` (colour ones for 1, grayscale ones for 3);
- ``sizes``: ``{"WxH": count}`` of the source files before resizing: the :data:`MAX_SIZES` most frequent sizes that at
  least ``min_count`` images have, the rest together as ``"other"``;
- ``problems``: what would stop training on this data (undecodable files above ``max_unreadable``, files deeper
  than 8 bits that need an ``intensity_window``, grayscale mixed with colour under ``strict_channels``, no training
  image), in words without file names;
- ``stored_values``: for grayscale files deeper than 8 bits (16-bit, 32-bit, floating point), ``{"files": count,
  "median_lowest": v, "median_highest": v}``, the medians over those files of their lowest and highest stored value
  before the intensity window (None when the count is suppressed); None where the site has none. Sites that export
  in different units (CT in Hounsfield units at one, with a +1024 offset at another) show it here, while one
  ``intensity_window`` serves the whole job;
- ``notes``: what the listing did not read that a user may expect it to (a ``val/`` beside ``test/``), paths
  replaced by placeholders, and 12-bit data;
- ``min_count``: the suppression threshold below.

Every count ``n`` with ``0 < n < min_count`` leaves the site as the string ``"<k"`` (``k = min_count``), zeros and
larger counts as numbers; no file name, path or pixel leaves it (``stored_values`` holds medians over at least
``min_count`` files of each file's lowest and highest value). This is small-cell suppression only, not secondary
suppression: where one cell is hidden and the others, with a total the other tables give (e.g. the channel counts,
over both splits), are exact, the hidden one can be worked out. Raise ``min_count`` or merge rare classes where that
matters.

A site whose data cannot be listed reports ``{"error": message}`` instead, with its paths replaced by placeholders
(:func:`redact_paths`).

:func:`summarize` puts the reports into one table and measures how far each site's label distribution is from the
federation's (its non-IID degree; see :func:`label_distribution`).
"""

from __future__ import annotations

import re
from typing import Dict, Mapping, Optional, Union

import numpy as np

from .image_cache import DecodedImages
from .site_data import SiteDataSettings, channel_conversions, decoding_notes, unscaled_problem
from .site_files import SiteFiles

DATA_CHECK_TASK = "data_check"  # the task the server sends and the sites answer
REPORT_KEY = "data_report"  # where a site's report is in the data of its reply (an APP_DEFINED DXO)
MAX_SIZES = 20  # image sizes listed one by one in a report; the others are counted together as "other"
ROUND = 4  # decimals of the shares and distances in the summary
SPAN_RATIO = 4  # sites whose stored values span more than this many times another's are noted
LOW_SHIFT = 0.1  # ... or whose median lowest values lie further apart than this share of the median span
Count = Union[int, str]  # a count, or "<k" for one below the suppression threshold k
_NAME = r"[^/\s'\"(),;]+"  # one name of a path inside a message
_ABSOLUTE_PATH = re.compile(r"(?<![\w<>./~-])/[^\s'\"(),;]+")  # a POSIX absolute path inside a message


def suppress(n: int, min_count: int) -> Count:
    """``n``, or the string ``"<min_count"`` when ``0 < n < min_count``."""
    return f"<{min_count}" if 0 < n < min_count else int(n)


def exact(count: Count) -> int:
    """A reported count as a number: a suppressed one (``"<k"``) as 0."""
    return count if isinstance(count, int) else 0


def site_report(files: SiteFiles, decoded: DecodedImages, settings: SiteDataSettings, min_count: int = 5) -> dict:
    """The site's report (see the module's docstring): counts of ``decoded``'s readable images of ``files``, read
    with ``settings``."""
    names = files.class_names
    labels = np.asarray(files.train_labels + files.test_labels, dtype=np.int64)[decoded.kept]
    is_train = decoded.kept < len(files.train_paths)
    train = np.bincount(labels[is_train], minlength=len(names))
    test = np.bincount(labels[~is_train], minlength=len(names))
    unreadable = len(decoded.unreadable)
    channels = {"grayscale": decoded.source_channels.get("1", 0), "colour": decoded.source_channels.get("3", 0)}
    problems = []
    if unreadable > settings.max_unreadable:
        problems.append(
            f"{suppress(unreadable, min_count)} image file(s) cannot be decoded, more than "
            f"max_unreadable={settings.max_unreadable} (the site's log names them)"
        )
    unscaled = unscaled_problem(decoded, count=lambda n: suppress(n, min_count))
    if unscaled:
        problems.append(unscaled)
    if channels["grayscale"] and channels["colour"] and settings.strict_channels:
        problems.append("the images mix grayscale and colour files, which strict_channels=True refuses")
    if not train.any():
        problems.append("no training image can be decoded")
    return {
        "min_count": min_count,
        "train": {name: suppress(n, min_count) for name, n in zip(names, train)},
        "test": {name: suppress(n, min_count) for name, n in zip(names, test)} if files.test_paths else None,
        "classes_absent": [name for name, n in zip(names, train) if n == 0],
        "unreadable": suppress(unreadable, min_count),
        "channels": {kind: suppress(n, min_count) for kind, n in channels.items()},
        "converted": suppress(channel_conversions(decoded, settings.channels), min_count),
        "sizes": size_counts(decoded.sizes, min_count),
        "stored_values": stored_values(decoded, min_count),
        "problems": problems,
        "notes": [redact_paths(note, {files.root: "<site_path>"}) for note in files.notes]
        + decoding_notes(decoded, count=lambda n: suppress(n, min_count)),
    }


def stored_values(decoded: DecodedImages, min_count: int) -> Optional[dict]:
    """The report's ``stored_values`` (see the module's docstring)."""
    if not decoded.stored_values:
        return None
    files, lowest, highest = decoded.stored_values
    shown = files >= min_count
    return {
        "files": suppress(files, min_count),
        "median_lowest": round(lowest, ROUND) if shown else None,
        "median_highest": round(highest, ROUND) if shown else None,
    }


def size_counts(sizes: Mapping[str, int], min_count: int) -> Dict[str, Count]:
    """The :data:`MAX_SIZES` most frequent sizes held by at least ``min_count`` images (ties by name), and the rest
    summed as ``"other"`` (suppressed like any count; left out when there is none)."""
    ranked = sorted(sizes.items(), key=lambda item: (-item[1], item[0]))
    listed = {size: n for size, n in ranked[:MAX_SIZES] if n >= min_count}
    other = sum(sizes.values()) - sum(listed.values())
    return {**listed, **({"other": suppress(other, min_count)} if other else {})}


def redact_paths(message: str, paths: Mapping[Optional[str], str]) -> str:
    """``message`` with each of ``paths`` (path -> placeholder, e.g. the site's data location -> ``"<site_path>"``; None
    and empty paths skipped) replaced where it stands whole (``/data/h1`` in ``/data/h1/train``, not in
    ``/data/h1-old``), longest first, and any other absolute path replaced by ``"<path>"``. Under a placeholder at
    most two names are kept, the split and the class (``<site_path>/train/covid/…``): deeper names, a patient's
    folder or a file's, may identify a person."""
    for path in sorted((p for p in paths if p), key=len, reverse=True):
        whole = re.compile(rf"(?<![\w./~-]){re.escape(path.rstrip('/') or path)}(?![\w.~-])")  # not part of a name
        message = whole.sub(lambda _: paths[path], message)
    for placeholder in set(paths.values()):
        message = re.sub(rf"({re.escape(placeholder)}/{_NAME}/{_NAME})(?:/{_NAME})+", r"\1/…", message)
    return _ABSOLUTE_PATH.sub("<path>", message)


def label_distribution(counts: Mapping[str, Mapping[str, Count]]) -> dict:
    """Each site's share of each class, the pooled shares, and each site's distance to the pooled ones.

    With ``n_s(c)`` site s's training images of class c (a suppressed count taken as 0, so the figure uses only the
    cells that left the site as numbers; the error in a share is below ``k / N_s``), ``N_s = Σ_c n_s(c)``:

    - site s's share ``p_s(c) = n_s(c) / N_s``; the pooled share ``q(c) = Σ_s n_s(c) / Σ_s N_s`` (the federation's
      label distribution, as if all images were in one place);
    - site s's non-IID degree: the total-variation distance ``TV_s = ½ Σ_c |p_s(c) − q(c)|``, the share of the site's
      images that would have to change class for its mix to match the pooled one: 0 for a site with the pooled mix,
      ``1 − q(c)`` for a site holding only class c, never above 1;
    - the federation's: ``mean_total_variation``, the unweighted mean of ``TV_s`` over the sites (each site's own
      distribution matters to MOON's local drift, whatever its size).

    A site with no counted image (``N_s = 0``) has share None and no distance, and does not count in the mean.

    Args:
        counts: site -> {class name: count}, every site with the same classes in the same order.

    Returns:
        ``{"pooled": {class: q}, "sites": {site: {class: p} or None}, "total_variation": {site: TV_s},
        "mean_total_variation": mean or None, "suppressed_cells": number of counts taken as 0}``, rounded to
        :data:`ROUND` decimals.
    """
    sites = list(counts)
    class_names = list(counts[sites[0]]) if sites else []
    matrix = np.asarray([[exact(counts[s][c]) for c in class_names] for s in sites], dtype=np.float64)
    matrix = matrix.reshape(len(sites), len(class_names))
    totals = matrix.sum(axis=1)
    pooled = matrix.sum(axis=0) / totals.sum() if totals.sum() else np.zeros(len(class_names))
    shares, distances = {}, {}
    for site, row, total in zip(sites, matrix, totals):
        share = row / total if total else None
        shares[site] = None if share is None else {c: round(float(p), ROUND) for c, p in zip(class_names, share)}
        if share is not None:
            distances[site] = float(0.5 * np.abs(share - pooled).sum())
    return {
        "pooled": {c: round(float(q), ROUND) for c, q in zip(class_names, pooled)},
        "sites": shares,
        "total_variation": {site: round(tv, ROUND) for site, tv in distances.items()},
        "mean_total_variation": round(float(np.mean(list(distances.values()))), ROUND) if distances else None,
        "suppressed_cells": sum(1 for s in sites for c in class_names if not isinstance(counts[s][c], int)),
    }


def summarize(reports: Mapping[str, dict]) -> dict:
    """The federation's table from every site's report (site -> :func:`site_report`'s dict, or ``{"error": ...}``).

    Returns:
        ``{"class_names": [...], "sites": {site: report}, "label_distribution": {...}, "failed": {site: reason},
        "notes": [...]}``, sites sorted by name: ``label_distribution`` is :func:`label_distribution` of the
        training counts of the sites that reported counts; ``failed`` holds every site that reported an error or a
        problem (its problems joined by "; "); ``notes`` what a user should check before training
        (:func:`stored_values_note`).

    Raises:
        ValueError: two sites' reports name different classes (not one job's reports), naming the site.
    """
    ordered = {site: reports[site] for site in sorted(reports)}
    counted = {site: report["train"] for site, report in ordered.items() if "error" not in report}
    class_names = list(next(iter(counted.values()))) if counted else []
    for site, train in counted.items():
        if list(train) != class_names:
            raise ValueError(f"{site} reported the classes {list(train)}, the other sites {class_names}")
    failed = {}
    for site, report in ordered.items():
        if "error" in report or report["problems"]:
            failed[site] = report.get("error") or "; ".join(report["problems"])
    return {
        "class_names": class_names,
        "sites": ordered,
        "label_distribution": label_distribution(counted),
        "failed": failed,
        "notes": [note] if (note := stored_values_note(ordered)) else [],
    }


def stored_values_note(reports: Mapping[str, dict]) -> Optional[str]:
    """A note where the sites' files deeper than 8 bits seem stored in different units: their median lowest values
    lie further apart than :data:`LOW_SHIFT` of the median span (median highest − median lowest), as between CT in
    Hounsfield units (air at −1024) and the same CT with a +1024 offset (air at 0), or one site's span is more than
    :data:`SPAN_RATIO` times another's, as between X-rays in 0..4095 and in 0..65535. None otherwise, or for fewer
    than two such sites."""
    ranges = {
        site: (values["median_lowest"], values["median_highest"])
        for site, report in reports.items()
        if (values := report.get("stored_values"))
        and values["median_lowest"] is not None
        and values["median_highest"] is not None
    }
    if len(ranges) < 2:
        return None
    lows = [low for low, _ in ranges.values()]
    spans = [high - low for low, high in ranges.values()]
    shifted = max(lows) - min(lows) > LOW_SHIFT * float(np.median(spans))
    if not shifted and max(spans) <= SPAN_RATIO * min(spans):
        return None
    listed = ", ".join(f"{site} {low:g} to {high:g}" for site, (low, high) in ranges.items())
    return (
        f"the sites' images deeper than 8 bits may be stored in different units (median lowest and highest values: "
        f"{listed}), while one intensity_window serves every site: check that each site exports the same units "
        "(e.g. CT in Hounsfield units, not with an offset at some sites)"
    )


def format_table(summary: dict) -> str:
    """The summary as text: one row per site with its training images per class and its distance to the pooled
    label distribution (TV), then the mean distance and the failed sites."""
    names = summary["class_names"]
    distribution = summary["label_distribution"]
    rows = [["site", *names, "TV"]]
    for site, report in summary["sites"].items():
        if "error" in report:
            rows.append([site, *(["-"] * len(names)), "-"])
            continue
        tv = distribution["total_variation"].get(site)
        rows.append([site, *(str(report["train"][c]) for c in names), "-" if tv is None else f"{tv:.4f}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows
    ]
    mean = distribution["mean_total_variation"]
    lines.append(f"mean TV to the pooled label distribution: {'-' if mean is None else f'{mean:.4f}'}")
    lines += [f"{site} FAILED: {reason}" for site, reason in summary["failed"].items()]
    lines += [f"NOTE: {note}" for note in summary["notes"]]
    return "\n".join(lines)
