"""The data check's parts without the simulator: a site's report of counts (small ones hidden), the federation's
table and non-IID degree (hand-computed), the paths kept out of error messages, the executor, the recipe."""

import json

import numpy as np
import pytest
import torch
from nvflare.apis.dxo import from_shareable
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable
from nvflare.apis.signal import Signal
from nvflare.recipe.utils import set_per_site_config

from nvflare_moon.data import image_cache
from nvflare_moon.data.image_cache import DecodedImages
from nvflare_moon.data.label_plot import plot_label_distribution
from nvflare_moon.data.site_data import SiteDataSettings, list_and_decode
from nvflare_moon.data.site_files import SiteFiles
from nvflare_moon.data.site_report import (
    REPORT_KEY,
    format_table,
    label_distribution,
    redact_paths,
    site_report,
    size_counts,
    summarize,
    suppress,
)
from nvflare_moon.executors import DataCheckExecutor
from nvflare_moon.recipes import DataCheckRecipe

from .executor_harness import site_context
from .site_images import write_image_folder

CLASSES = ("a", "b", "c")
SITE_DATA = {"class_names": list(CLASSES), "image_size": 16, "channels": 1}
READ = SiteDataSettings("image_folder", CLASSES, channels=1)  # how the reports' files were read


def decoded(kept, unreadable=(), channels=None, sizes=None, stored_values=()) -> DecodedImages:
    return DecodedImages(
        torch.zeros(len(kept), 1, 2, 2, dtype=torch.uint8),
        np.asarray(kept, dtype=np.int64),
        [[path, "OSError: bad"] for path in unreadable],
        channels if channels is not None else {"1": len(kept)},
        sizes if sizes is not None else {"20x24": len(kept)},
        "/nowhere",
        stored_values=stored_values,
    )


def site_files() -> SiteFiles:
    """10 training files (7 a, 3 b) and 7 test files (2 a, 5 b)."""
    train_labels, test_labels = (0,) * 7 + (1,) * 3, (0,) * 2 + (1,) * 5
    train = tuple(f"/site/train/{i}.png" for i in range(10))
    test = tuple(f"/site/test/{i}.png" for i in range(7))
    return SiteFiles("/site", CLASSES, train, train_labels, test, test_labels)


# ---- a site's report ------------------------------------------------------------------------------------------------


def test_suppress_hides_counts_between_zero_and_the_threshold():
    assert [suppress(n, 5) for n in (0, 1, 4, 5, 60)] == [0, "<5", "<5", 5, 60]
    assert suppress(9, 10) == "<10"


def test_a_report_counts_the_readable_images_per_class_and_split_and_hides_small_cells():
    # training file 2 (an "a") does not decode: 6 a and 3 b train, 2 a and 5 b test; sizes of the 16 readable files
    images = decoded([0, 1, *range(3, 17)], unreadable=["train/a/2.png"], sizes={"20x24": 10, "512x512": 4, "9x9": 2})
    report = site_report(site_files(), images, READ, min_count=5)
    assert report == {
        "min_count": 5,
        "train": {"a": 6, "b": "<5", "c": 0},
        "test": {"a": "<5", "b": 5, "c": 0},
        "classes_absent": ["c"],
        "unreadable": "<5",
        "channels": {"grayscale": 16, "colour": 0},
        "converted": 0,
        "sizes": {"20x24": 10, "other": 6},  # 512x512 (4) and 9x9 (2) are each held by fewer than 5
        "stored_values": None,  # no file deeper than 8 bits
        "problems": ["<5 image file(s) cannot be decoded, more than max_unreadable=0 (the site's log names them)"],
        "notes": [],
    }
    tolerant = SiteDataSettings("image_folder", CLASSES, channels=1, max_unreadable=1)
    assert site_report(site_files(), images, tolerant, min_count=5)["problems"] == []
    json.dumps(report)  # plain values only


def test_a_site_without_a_test_split_reports_none_and_mixed_channels_are_converted_and_counted():
    files = SiteFiles("/site", CLASSES, tuple(f"/s/{i}.png" for i in range(7)), (2,) * 7)
    mixed = decoded(range(7), channels={"1": 6, "3": 1})
    report = site_report(files, mixed, READ, min_count=1)
    assert report["test"] is None and report["train"] == {"a": 0, "b": 0, "c": 7}
    assert report["classes_absent"] == ["a", "b"] and report["channels"] == {"grayscale": 6, "colour": 1}
    assert report["converted"] == 1 and report["problems"] == []  # the colour file, to channels=1
    as_rgb = site_report(files, mixed, SiteDataSettings("image_folder", CLASSES, channels=3), min_count=1)
    assert as_rgb["converted"] == 6  # the grayscale ones, replicated
    assert site_report(files, mixed, READ, min_count=5)["converted"] == "<5"  # suppressed like every count
    strict = SiteDataSettings("image_folder", CLASSES, channels=1, strict_channels=True)
    assert site_report(files, mixed, strict, min_count=1)["problems"] == [
        "the images mix grayscale and colour files, which strict_channels=True refuses"
    ]
    tolerant = SiteDataSettings("image_folder", CLASSES, max_unreadable=5)
    nothing = site_report(files, decoded([], unreadable=["0.png", "1.png"]), tolerant, min_count=1)
    assert nothing["problems"] == ["no training image can be decoded"] and nothing["sizes"] == {}


def test_only_the_most_frequent_sizes_are_listed_one_by_one(monkeypatch):
    from nvflare_moon.data import site_report as module

    monkeypatch.setattr(module, "MAX_SIZES", 2)
    assert size_counts({"1x1": 7, "2x2": 9, "3x3": 7, "4x4": 1}, 5) == {"2x2": 9, "1x1": 7, "other": 8}
    assert size_counts({"1x1": 7, "2x2": 1}, 5) == {"1x1": 7, "other": "<5"}


# ---- the federation's table -----------------------------------------------------------------------------------------


def test_label_distribution_by_hand():
    # pooled: 30 a and 30 b of the counted 60, q = (0.5, 0.5); s1 p = (0.75, 0.25), TV = ½(0.25 + 0.25) = 0.25;
    # s2 holds only b: TV = 1 − q(b) = 0.5; s3's cells are hidden, so it counts nothing; mean (0.25 + 0.5) / 2
    counts = {"s1": {"a": 30, "b": 10}, "s2": {"a": 0, "b": 20}, "s3": {"a": "<5", "b": "<5"}}
    assert label_distribution(counts) == {
        "pooled": {"a": 0.5, "b": 0.5},
        "sites": {"s1": {"a": 0.75, "b": 0.25}, "s2": {"a": 0.0, "b": 1.0}, "s3": None},
        "total_variation": {"s1": 0.25, "s2": 0.5},
        "mean_total_variation": 0.375,
        "suppressed_cells": 2,
    }
    iid = label_distribution({"s1": {"a": 10, "b": 30}, "s2": {"a": 5, "b": 15}})
    assert iid["total_variation"] == {"s1": 0.0, "s2": 0.0} and iid["mean_total_variation"] == 0.0
    assert label_distribution({})["mean_total_variation"] is None


def test_summarize_lists_every_site_and_the_failed_ones():
    ok = site_report(site_files(), decoded(range(17)), READ, min_count=5)
    bad = {**ok, "problems": ["p1", "p2"]}
    summary = summarize({"s2": {"error": "class folder <site_path>/train/x is not in ..."}, "s3": bad, "s1": ok})
    assert list(summary["sites"]) == ["s1", "s2", "s3"] and summary["class_names"] == list(CLASSES)
    assert summary["failed"] == {"s2": "class folder <site_path>/train/x is not in ...", "s3": "p1; p2"}
    assert list(summary["label_distribution"]["sites"]) == ["s1", "s3"]  # the site in error has no counts
    table = format_table(summary)
    assert table.splitlines()[0].split() == ["site", "a", "b", "c", "TV"]
    assert table.splitlines()[1].split() == ["s1", "7", "<5", "0", "0.0000"]
    assert table.splitlines()[2].split() == ["s2", "-", "-", "-", "-"]
    assert "mean TV to the pooled label distribution: 0.0000" in table and "s3 FAILED: p1; p2" in table
    assert summary["notes"] == [] and "NOTE" not in table


def test_sites_whose_deep_images_seem_stored_in_other_units_are_noted():
    def report(files, lowest, highest):
        ct = decoded(range(17), stored_values=(files, lowest, highest))
        return site_report(site_files(), ct, READ, min_count=5)

    hounsfield, offset = report(40, -1024.0, 1800.0), report(30, 0.0, 2900.0)  # air at -1024, and at 0 (+1024)
    assert hounsfield["stored_values"] == {"files": 40, "median_lowest": -1024.0, "median_highest": 1800.0}
    assert report(3, -1024.0, 1800.0)["stored_values"] == {"files": "<5", "median_lowest": None, "median_highest": None}
    # lows 1024 apart, above a tenth of the median span, median(2824, 2900) / 10 = 286.2
    summary = summarize({"h1": hounsfield, "h2": offset, "h3": report(3, 5.0, 9.0)})  # h3's values are hidden
    assert summary["notes"] == [
        "the sites' images deeper than 8 bits may be stored in different units (median lowest and highest values: "
        "h1 -1024 to 1800, h2 0 to 2900), while one intensity_window serves every site: check that each site exports "
        "the same units (e.g. CT in Hounsfield units, not with an offset at some sites)"
    ]
    assert "NOTE: the sites' images deeper than 8 bits" in format_table(summary)
    # lows 24 apart, below median(2824, 3000) / 10 = 291.2, spans within 4x: the same units; a site in error is left out
    same = {"h1": hounsfield, "h2": report(30, -1000.0, 2000.0), "h4": {"error": "no data"}}
    assert summarize(same)["notes"] == []
    # X-rays: the lows agree (0 and 10), but one site's span is 16 times the other's (4085 against 65525)
    xray = summarize({"x1": report(20, 10.0, 4095.0), "x2": report(20, 0.0, 65525.0)})
    assert "(median lowest and highest values: x1 10 to 4095, x2 0 to 65525)" in xray["notes"][0]


def test_the_medians_leave_out_files_of_nan_only():
    nan = float("nan")  # a file of NaN only neither counts towards min_count nor moves a median
    assert image_cache._medians([(nan, nan), (0.0, 10.0), (2.0, 20.0), (4.0, 30.0)]) == [3, 2.0, 20.0]
    assert image_cache._medians([(nan, nan)]) == [] and image_cache._medians([]) == []


def test_reports_of_other_classes_are_refused_by_site():
    ok = site_report(site_files(), decoded(range(17)), READ, min_count=5)
    other = {**ok, "train": {"x": 1, "y": 2, "z": 3}}
    with pytest.raises(ValueError, match=r"s2 reported the classes \['x', 'y', 'z'\]"):
        summarize({"s1": ok, "s2": other})


def test_redact_paths_replaces_the_named_paths_longest_first_and_any_other_absolute_path():
    message = "/data/h1/train/x is odd; see /data/h1-extra/f.png and /ws/local/nvflare_moon_data.json"
    paths = {"/data/h1": "<site_path>", "/ws": "<workspace>", None: "<none>"}
    assert (
        redact_paths(message, paths)
        == "<site_path>/train/x is odd; see <path> and <workspace>/local/nvflare_moon_data.json"
    )
    assert redact_paths("needs <root>/train/<class>/<image>, a train/ folder", {}) == (
        "needs <root>/train/<class>/<image>, a train/ folder"
    )
    deep = "cannot decode /data/h1/train/covid/MRN-0042/scan 3.png; listed twice: /data/h1/train/covid/MRN-0042/a.png"
    assert redact_paths(deep, paths) == (  # the split and the class kept, not a patient's folder or a file's name
        "cannot decode <site_path>/train/covid/… 3.png; listed twice: <site_path>/train/covid/…"
    )


def test_the_label_plot_is_written(tmp_path):
    path = plot_label_distribution(np.array([[3, 1], [0, 4]]), ["h-1", "h-2"], ["a", "b"], str(tmp_path / "p.png"), "t")
    assert (tmp_path / "p.png").stat().st_size > 0 and path == str(tmp_path / "p.png")


# ---- the executor ---------------------------------------------------------------------------------------------------


def answer(executor, ctx, task_name="data_check"):
    reply = executor.execute(task_name, Shareable(), ctx, Signal())
    return reply.get_return_code(ReturnCode.OK), reply


def test_the_executor_reports_counts_and_leaves_the_decoded_copy_that_training_maps(tmp_path):
    folder = write_image_folder(tmp_path / "h1", CLASSES, {"a": 6, "b": 2}, {"a": 5}, mode="L")
    executor = DataCheckExecutor("image_folder", SITE_DATA, site_path=str(folder), min_count=3)
    ctx = site_context(tmp_path / "ws", site="hospital-1")
    code, reply = answer(executor, ctx)
    report = from_shareable(reply).data[REPORT_KEY]
    assert code == ReturnCode.OK and report["train"] == {"a": 6, "b": "<3", "c": 0} and report["test"]["a"] == 5
    assert report["sizes"] == {"20x24": 13} and report["channels"] == {"grayscale": 13, "colour": 0}
    assert str(tmp_path) not in json.dumps(report)
    (copy,) = (folder / ".nvflare_moon_decoded").iterdir()
    settings = SiteDataSettings(dataset="image_folder", **SITE_DATA)
    _, again = list_and_decode(settings, str(folder), "hospital-1", str(tmp_path / "ws"))
    assert again.folder == str(copy)  # training's settings find the check's copy
    assert answer(executor, ctx, "train")[0] == ReturnCode.TASK_UNKNOWN


def test_a_listing_error_is_reported_without_the_sites_paths(tmp_path):
    folder = write_image_folder(tmp_path / "h2", CLASSES + ("extra",), {"a": 6, "extra": 2}, mode="L")
    executor = DataCheckExecutor("image_folder", SITE_DATA, site_path=str(folder))
    code, reply = answer(executor, site_context(tmp_path / "ws", site="hospital-2"))
    error = from_shareable(reply).data[REPORT_KEY]["error"]
    assert code == ReturnCode.OK
    assert error.startswith("class folder <site_path>/train/extra is not in the job's class_names ['a', 'b', 'c']")
    missing = DataCheckExecutor("image_folder", SITE_DATA)  # no site_path, no variable, no local file
    _, reply = answer(missing, site_context(tmp_path / "ws", site="hospital-3"))
    error = from_shareable(reply).data[REPORT_KEY]["error"]
    assert error.startswith("hospital-3 has no data location") and "<workspace>/local/nvflare_moon_data.json" in error
    assert str(tmp_path) not in error


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dataset="cifar10"), "dataset must be one of"),
        (dict(site_data={"image_size": 16}), "needs site_data"),
        (dict(site_path=""), "site_path must be"),
        (dict(min_count=0), "min_count must be >= 1"),
        (dict(task_name=""), "task_name must be"),
    ],
)
def test_executor_arguments_are_checked_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DataCheckExecutor(**{"dataset": "image_folder", "site_data": SITE_DATA, **kwargs})


# ---- the recipe -----------------------------------------------------------------------------------------------------


def test_the_recipe_gives_each_named_site_its_own_site_path_and_refuses_other_keys(tmp_path):
    recipe = DataCheckRecipe(dataset="image_folder", site_data=SITE_DATA, min_clients=2, min_count=3)
    set_per_site_config(recipe, {"hospital-1": {"site_path": "/d/1"}, "hospital-2": {"site_path": "/d/2"}})
    recipe.export(str(tmp_path))
    for site in ("hospital-1", "hospital-2"):
        config = json.loads((tmp_path / "data_check" / f"app_{site}" / "config" / "config_fed_client.json").read_text())
        (executor,) = config["executors"]
        assert executor["tasks"] == ["data_check"]
        assert executor["executor"]["args"]["site_path"] == f"/d/{site[-1]}"
        assert executor["executor"]["args"]["min_count"] == 3
    server = json.loads((tmp_path / "data_check" / "app_server" / "config" / "config_fed_server.json").read_text())
    assert [w["path"] for w in server["workflows"]] == ["nvflare_moon.server.data_check.DataCheckController"]

    for config, message in [
        ({"hospital-1": {"device": "cpu"}, "hospital-2": {}}, r"\['device'\] for site 'hospital-1' cannot differ"),
        ({"hospital-1": {"site_path": "/d/1"}}, "names 1 site"),
        ({"hospital-1": {"site_path": ""}, "hospital-2": {}}, "site_path must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            set_per_site_config(DataCheckRecipe(dataset="image_folder", site_data=SITE_DATA, min_clients=2), config)
    with pytest.raises(ValueError, match="min_clients must be"):
        DataCheckRecipe(dataset="image_folder", site_data=SITE_DATA, min_clients=0)


def test_data_root_the_old_name_of_site_path_still_works_for_one_release_with_a_warning(tmp_path):
    with pytest.warns(
        DeprecationWarning, match=r"DataCheckExecutor\(data_root=...\) is deprecated.*use site_path"
    ) as w:
        executor = DataCheckExecutor("image_folder", SITE_DATA, data_root="/d/old")
    assert executor.site_path == "/d/old" and {warning.filename for warning in w} == {__file__}
    recipe = DataCheckRecipe(dataset="image_folder", site_data=SITE_DATA, min_clients=2, site_path="/d/all")
    with pytest.warns(DeprecationWarning, match="use 'site_path'"):
        set_per_site_config(recipe, {"hospital-1": {"data_root": "/d/1"}, "hospital-2": {"site_path": "/d/2"}})
        recipe.export(str(tmp_path))
    config = json.loads((tmp_path / "data_check" / "app_hospital-1" / "config" / "config_fed_client.json").read_text())
    assert config["executors"][0]["executor"]["args"]["site_path"] == "/d/1"
    with pytest.raises(TypeError, match="give site_path alone"):
        DataCheckExecutor("image_folder", SITE_DATA, site_path="/d/new", data_root="/d/old")


@pytest.mark.parametrize("make", [DataCheckExecutor, DataCheckRecipe], ids=["executor", "recipe"])
def test_both_classes_refuse_an_unknown_name_and_an_empty_site_path_when_built(make):
    required = dict(dataset="image_folder", site_data=SITE_DATA)
    if make is DataCheckRecipe:
        required["min_clients"] = 2
    with pytest.raises(TypeError, match=rf"{make.__name__} got unexpected keyword argument\(s\) data_dir, sites"):
        make(**required, data_dir="/d", sites=2)
    with pytest.raises(ValueError, match="site_path must be"):
        make(**required, site_path="")
