"""A site's own images: listing, refusals by name, decoding into the memory-mapped copy, the held-out split."""

import dataclasses
import json
import os
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from nvflare.apis.fl_constant import ReturnCode
from nvflare.app_common.app_constant import AlgorithmConstants
from PIL import Image

from nvflare_moon import executors
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.core.weights import state_dict_to_numpy
from nvflare_moon.data import TensorBatchLoader, image_cache
from nvflare_moon.data.site_data import SiteDataSettings, list_and_decode, load_site_data, stratified_holdout
from nvflare_moon.data.site_files import SITE_DATA_ENV, SiteDataError, list_site_files, resolve_site_root
from nvflare_moon.data.site_report import site_report
from nvflare_moon.models import Network

from .executor_harness import run_task, site_context, started
from .site_images import class_image, write_datalist, write_image_folder, write_split

CLASSES = ("normal", "pneumonia", "covid")


def settings(**overrides):
    return SiteDataSettings(**{"dataset": "image_folder", "class_names": CLASSES, "image_size": 16, **overrides})


# ---- listing and refusals -------------------------------------------------------------------------------------------


def test_labels_follow_class_names_not_folder_order_and_a_missing_class_is_allowed(tmp_path):
    write_image_folder(tmp_path, CLASSES, {"pneumonia": 3, "covid": 2})  # sorted folders: covid, pneumonia
    files = list_site_files("image_folder", str(tmp_path), CLASSES, "site-1")
    assert [os.path.basename(os.path.dirname(p)) for p in files.train_paths] == ["covid"] * 2 + ["pneumonia"] * 3
    assert files.train_labels == (2, 2, 1, 1, 1)
    assert files.test_paths == ()


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda root: write_image_folder(root, ("normal", "other"), {"other": 2}), "class folder .*other is not in"),
        (lambda root: (root / "train" / "normal").mkdir(parents=True), "normal holds no images"),
        (lambda root: root.mkdir(exist_ok=True), "has no train/ folder"),
        (lambda root: None, "does not exist"),
    ],
    ids=["class not in class_names", "empty class folder", "no train folder", "missing folder"],
)
def test_bad_folders_are_refused_by_name(tmp_path, make, expected):
    root = tmp_path / "site"
    make(root)
    with pytest.raises(SiteDataError, match=expected) as refused:
        list_site_files("image_folder", str(root), CLASSES, "hospital-2")
    assert str(refused.value).startswith("hospital-2: ")


def test_datalist_json_rows_are_relative_to_the_manifest(tmp_path):
    write_datalist(tmp_path, CLASSES, {"normal": 2, "covid": 1}, {"pneumonia": 2})
    files = list_site_files("datalist", str(tmp_path), CLASSES, "site-1")  # the folder holding datalist.json
    assert files.train_labels == (0, 0, 2) and files.test_labels == (1, 1)
    assert all(os.path.isfile(p) for p in files.train_paths + files.test_paths)


def test_datalist_csv_with_a_split_column_and_index_labels(tmp_path):
    write_image_folder(tmp_path, CLASSES, {"normal": 2, "covid": 1})
    manifest = tmp_path / "rows.csv"
    manifest.write_text(
        "image,label,split\ntrain/normal/0000.png,normal,train\ntrain/covid/0000.png,2,test\ntrain/normal/0001.png,0,\n"
    )
    files = list_site_files("datalist", str(manifest), CLASSES, "site-1")
    assert files.train_labels == (0, 0) and files.test_labels == (2,)


@pytest.mark.parametrize(
    "row, expected",
    [
        ({"image": "images/missing.png", "label": "normal"}, r"training\[1\] points to .*missing.png, which does not"),
        ({"image": "images/training/normal/0000.png", "label": "flu"}, r"training\[1\]: label 'flu' is not in"),
        ({"image": "images/training/normal/0000.png", "label": 3}, r"label 3 is not in"),
    ],
)
def test_datalist_rows_that_point_nowhere_or_name_an_unknown_class_are_refused(tmp_path, row, expected):
    write_datalist(tmp_path, CLASSES, {"normal": 1})
    manifest = json.loads((tmp_path / "datalist.json").read_text())
    manifest["training"].append(row)
    (tmp_path / "datalist.json").write_text(json.dumps(manifest))
    with pytest.raises(SiteDataError, match=expected):
        list_site_files("datalist", str(tmp_path), CLASSES, "site-1")


def test_the_site_root_comes_from_the_job_then_the_variable_then_the_local_file(tmp_path, monkeypatch):
    monkeypatch.delenv(SITE_DATA_ENV, raising=False)
    with pytest.raises(SiteDataError, match="no data location.*nvflare_moon_data.json"):
        resolve_site_root(None, "site-1", str(tmp_path))
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "nvflare_moon_data.json").write_text(json.dumps({"site_path": "/data/from_file"}))
    assert resolve_site_root(None, "site-1", str(tmp_path)) == "/data/from_file"
    # the key of files written before site_path had its own name
    (tmp_path / "local" / "nvflare_moon_data.json").write_text(json.dumps({"data_root": "/data/older_file"}))
    assert resolve_site_root(None, "site-1", str(tmp_path)) == "/data/older_file"
    (tmp_path / "local" / "nvflare_moon_data.json").write_text(json.dumps({"site_path": "", "data_root": "/data/old"}))
    assert resolve_site_root(None, "site-1", str(tmp_path)) == "/data/old"
    monkeypatch.setenv(SITE_DATA_ENV, "/data/from_env")
    assert resolve_site_root(None, "site-1", str(tmp_path)) == "/data/from_env"
    assert resolve_site_root("/data/from_job", "site-1", str(tmp_path)) == "/data/from_job"
    monkeypatch.delenv(SITE_DATA_ENV)
    (tmp_path / "local" / "nvflare_moon_data.json").write_text(json.dumps({"root": "/x"}))
    with pytest.raises(SiteDataError, match=r'must hold \{"site_path": "/path/to/images"\}, got site_path=None'):
        resolve_site_root(None, "site-1", str(tmp_path))
    (tmp_path / "local" / "nvflare_moon_data.json").write_text("{not json")
    with pytest.raises(SiteDataError, match="cannot read .*nvflare_moon_data.json .JSONDecodeError"):
        resolve_site_root(None, "site-1", str(tmp_path))


def test_settings_name_the_bad_argument():
    with pytest.raises(ValueError, match="channels must be one of"):
        settings(channels=2)
    with pytest.raises(ValueError, match="class_names must be at least two distinct"):
        settings(class_names=("a", "a"))
    with pytest.raises(ValueError, match="mean must be None or 1 numbers"):
        settings(channels=1, mean=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="val_fraction must be below 1"):
        settings(val_fraction=1.0)


# ---- decoding -------------------------------------------------------------------------------------------------------


def test_pixels_are_resized_converted_and_16_bit_scaled(tmp_path):
    Image.new("RGB", (20, 24), (10, 200, 30)).save(tmp_path / "rgb.png")
    Image.fromarray(np.full((24, 20), 100 * 257, dtype=np.uint16)).save(tmp_path / "deep.png")
    pixels, size, source, depth, value_range = image_cache.decode_image(str(tmp_path / "rgb.png"), 16, 3)
    assert pixels.shape == (3, 16, 16) and size == (20, 24) and source == 3 and depth == "" and value_range == ()
    assert pixels[:, 5, 5].tolist() == [10, 200, 30]  # a uniform image stays uniform through the resize
    pixels, _, source, depth, value_range = image_cache.decode_image(str(tmp_path / "deep.png"), 16, 1)
    assert source == 1 and pixels.shape == (1, 16, 16) and int(pixels.min()) == int(pixels.max()) == 100
    assert depth == "" and value_range == (25700, 25700)  # 100 * 257 uses the 16-bit range
    replicated = image_cache.decode_image(str(tmp_path / "deep.png"), 16, 3).pixels
    assert replicated.shape == (3, 16, 16) and (replicated == 100).all()


def test_twelve_bit_data_in_16_bit_files_is_counted_and_named_in_the_log_and_the_data_check(tmp_path, caplog):
    write_image_folder(tmp_path, CLASSES, {"normal": 2, "covid": 6})
    for i in range(6):  # a scanner's 12-bit values (up to 4095) in 16-bit PNGs: 4095 / 257 is 16 of 255
        level = np.full((24, 20), 4095 - i, dtype=np.uint16)
        Image.fromarray(level).save(tmp_path / "train" / "covid" / f"{i:04d}.png")
    Image.fromarray(np.zeros((24, 20), dtype=np.uint16)).save(tmp_path / "train" / "covid" / "blank.png")  # not 12-bit
    with caplog.at_level("WARNING"):
        data = load_site_data(settings(channels=1), str(tmp_path), "site-1", str(tmp_path / "ws"))
    assert int(data.images.images[data.images.labels == 2].max()) == 16  # nearly black, as the warning says
    assert "site-1: 6 image file(s) deeper than 8 bits hold values below 4096 only (12-bit data?)" in caplog.text
    files, decoded = list_and_decode(settings(channels=1), str(tmp_path), "site-1", str(tmp_path / "ws"))
    assert decoded.twelve_bit == 6  # read back from the decoded copy
    report = site_report(files, decoded, settings(channels=1))
    assert report["notes"][-1].startswith("6 image file(s) deeper than 8 bits hold values below 4096")
    few = site_report(files, decoded, settings(channels=1), min_count=10)
    assert few["notes"][-1].startswith(
        "<10 image file(s) deeper than 8 bits"
    )  # a small count is suppressed, as every count


def write_wide(path, value, dtype, air_rows=0):
    """A 20 x 24 TIFF of ``value``, its first ``air_rows`` rows -1000 (CT's air around the body; signed 16-bit data
    opens as 32-bit integers, as PIL reads CT's)."""
    pixels = np.full((24, 20), value, dtype=dtype)
    pixels[:air_rows] = -1000
    Image.fromarray(pixels).save(path)


def test_signed_or_floating_point_files_are_refused_until_an_intensity_window_maps_them(tmp_path):
    write_image_folder(tmp_path, CLASSES, {"normal": 2, "covid": 3})
    for i, hounsfield in enumerate((-160, 0, 240)):  # CT: clipping at 0 would leave soft tissue black (40 / 257)
        write_wide(tmp_path / "train" / "covid" / f"ct{i}.tif", hounsfield, np.int32, air_rows=4)
    with pytest.raises(SiteDataError, match=r"site-1: 3 image file\(s\) hold negative values") as refused:
        load_site_data(settings(channels=1), str(tmp_path), "site-1", str(tmp_path / "ws"))
    assert "set site_data's intensity_window to [low, high]" in str(refused.value)
    assert "train/covid/ct1.tif holds -1000 to 0" in str(refused.value)  # the site's own log names examples
    files, decoded = list_and_decode(settings(channels=1), str(tmp_path), "site-1", str(tmp_path / "ws"))
    assert decoded.unscaled == 3  # read back from the decoded copy
    assert decoded.stored_values == (3, -1000.0, 0.0)  # the median of each file's lowest (air) and highest
    assert site_report(files, decoded, settings(channels=1), min_count=5)["problems"][0].startswith(
        "<5 image file(s) hold negative values"  # suppressed, and no file name leaves the site
    )

    windowed = settings(channels=1, intensity_window=[-160, 240])  # a soft-tissue window: -160 black, 240 white
    data = load_site_data(windowed, str(tmp_path), "site-1", str(tmp_path / "ws"))  # decoded again: a new key
    covid = data.images.images[data.images.labels == 2]
    assert [int(image.max()) for image in covid[-3:]] == [0, 102, 255]  # ct0-2: rint((v + 160) * 255 / 400); 0 -> 102
    eight_bit = sorted((tmp_path / "train" / "normal").iterdir())
    unwindowed = [image_cache.decode_image(str(path), 16, 1).pixels for path in eight_bit]
    assert torch.equal(data.images.images[data.images.labels == 0], torch.from_numpy(np.stack(unwindowed)))


def test_floating_point_files_need_a_window_and_twelve_bit_data_is_shown_whole_through_one(tmp_path):
    write_wide(tmp_path / "float.tif", 0.25, np.float32)
    assert image_cache.decode_image(str(tmp_path / "float.tif"), 16, 1).depth == image_cache.UNSCALED
    assert int(image_cache.decode_image(str(tmp_path / "float.tif"), 16, 1, (0.0, 1.0)).pixels.max()) == 64  # 63.75
    # NaN where a mask left no value: shown black
    Image.fromarray(np.where(np.arange(20) < 10, np.float32(0.5), np.float32(np.nan))[None].repeat(24, 0)).save(
        tmp_path / "holes.tif"
    )
    holes = image_cache.decode_image(str(tmp_path / "holes.tif"), 20, 1, (0.0, 1.0))
    assert holes.value_range == (0.5, 0.5) and holes.pixels[0, 12, :10].tolist() == [128] * 10
    assert holes.pixels[0, 12, 10:].tolist() == [0] * 10
    Image.fromarray(np.full((24, 20), 4095, dtype=np.uint16)).save(tmp_path / "twelve.png")
    assert image_cache.decode_image(str(tmp_path / "twelve.png"), 16, 1).depth == image_cache.TWELVE_BIT
    shown = image_cache.decode_image(str(tmp_path / "twelve.png"), 16, 1, (0.0, 4095.0))
    assert shown.depth == "" and int(shown.pixels.max()) == 255  # not 16 of 255
    assert settings(intensity_window=[0, 4095]).intensity_window == (0.0, 4095.0)
    for bad in ((1, 1), ("0", 1), (0, float("nan")), (0,)):
        with pytest.raises(ValueError, match="intensity_window must be None or \\[low, high\\]"):
            settings(intensity_window=bad)


def test_the_decoded_copy_is_made_once_then_mapped_and_remade_when_a_file_changes(tmp_path, monkeypatch):
    write_image_folder(tmp_path, CLASSES, {"normal": 4, "covid": 3}, {"normal": 2})
    first = load_site_data(settings(), str(tmp_path), "site-1", str(tmp_path / "ws"))
    assert tuple(first.images.images.shape) == (9, 3, 16, 16)
    assert first.images.labels.tolist() == [2, 2, 2, 0, 0, 0, 0, 0, 0]  # train (covid, normal), then test
    assert first.train_index.tolist() == list(range(7)) and first.test_index.tolist() == [7, 8]
    assert os.path.dirname(first.decoded.folder) == str(tmp_path / ".nvflare_moon_decoded")

    def no_decoding(*args):
        raise AssertionError("decoded again")

    monkeypatch.setattr(image_cache, "decode_image", no_decoding)
    again = load_site_data(settings(), str(tmp_path), "site-1", str(tmp_path / "ws"))
    assert again.decoded.folder == first.decoded.folder
    assert torch.equal(again.images.images, first.images.images)
    monkeypatch.undo()
    Image.new("RGB", (20, 24)).save(tmp_path / "train" / "normal" / "0000.png")  # a replaced image
    changed = load_site_data(settings(), str(tmp_path), "site-1", str(tmp_path / "ws"))
    assert changed.decoded.folder != first.decoded.folder


@pytest.mark.parametrize("layout", ["image_folder", "datalist"])
def test_a_sites_start_stats_each_image_once(tmp_path, monkeypatch, layout):
    (write_image_folder if layout == "image_folder" else write_datalist)(tmp_path, CLASSES, {"normal": 3, "covid": 2})
    files = list_site_files(layout, str(tmp_path), CLASSES, "site-1")
    fresh = {path: (os.stat(path).st_size, os.stat(path).st_mtime_ns) for path in files.train_paths}
    assert files.file_stats == fresh  # what the copy's key took from os.stat before: the same keys, old copies map
    calls = Counter()
    for name in ("stat", "lstat"):  # os.path.islink, exists and isfile call these too

        def counted(path, *args, _real=getattr(os, name), _name=name, **kwargs):
            if str(path).endswith(".png"):
                calls[_name, str(path)] += 1
            return _real(path, *args, **kwargs)

        monkeypatch.setattr(os, name, counted)
    data = load_site_data(settings(dataset=layout), str(tmp_path), "site-1", str(tmp_path / "ws"))
    monkeypatch.undo()
    assert data.images.images.shape[0] == 5  # one stat a file (on a share, a round trip each), no lstat
    assert sorted(calls) == sorted(("stat", path) for path in files.train_paths) and set(calls.values()) == {1}


def test_a_new_copy_removes_older_formats_and_all_but_the_two_last_used_of_its_listing(tmp_path):
    write_image_folder(tmp_path, CLASSES, {"normal": 2, "covid": 2})
    copies = tmp_path / ".nvflare_moon_decoded"
    for name, meta in [("images-0ld", {"format": image_cache.FORMAT - 1}), ("images-odd", ["not", "ours"])]:
        (copies / name).mkdir(parents=True)  # a copy an earlier release wrote; a meta.json of someone else's
        (copies / name / "meta.json").write_text(json.dumps(meta))
    (copies / ".writing-killed").mkdir()  # what a killed decoding left, two days ago
    os.utime(copies / ".writing-killed", (time.time() - 2 * 86400,) * 2)
    (copies / ".writing-running").mkdir()  # a decoding under way in another process

    def start(**overrides):
        folder = load_site_data(settings(**overrides), str(tmp_path), "site-1", str(tmp_path / "ws")).decoded.folder
        return os.path.basename(folder)

    other_size = start(image_size=8)
    first = start()
    os.utime(copies / first / "meta.json", (1, 1))  # long ago
    new = tmp_path / "train" / "normal" / "new.png"
    Image.new("RGB", (20, 24)).save(new)  # the folder grows: a new listing, a new copy
    second = start()
    os.utime(copies / second / "meta.json", (2, 2))
    new.unlink()
    assert start() == first  # the folder as it was: the first copy is mapped, and so used last
    Image.new("RGB", (20, 24)).save(tmp_path / "train" / "normal" / "newer.png")
    third = start()
    assert sorted(os.listdir(copies)) == sorted([".writing-running", "images-odd", other_size, first, third])


def test_copies_of_other_listings_in_the_same_folder_stay(tmp_path):
    write_datalist(tmp_path, CLASSES, {"normal": 4, "covid": 4})
    rows = json.loads((tmp_path / "datalist.json").read_text())["training"]
    folders = []
    for k in range(3):  # three manifests in one folder, each listing other rows: three listings, not three versions
        (tmp_path / f"site{k}.json").write_text(json.dumps({"training": rows[k : k + 4]}))
        data = load_site_data(settings(dataset="datalist"), str(tmp_path / f"site{k}.json"), "s", str(tmp_path))
        folders.append(data.decoded.folder)
    assert len(set(folders)) == 3 and all(os.path.isdir(folder) for folder in folders)


def test_a_copy_whose_file_is_in_use_stays_whole_and_the_cleanup_never_raises(tmp_path, monkeypatch, caplog):
    copy = tmp_path / "images-16px-3ch-0ld"
    copy.mkdir()
    (copy / "images.u8").write_bytes(bytes(10))
    (copy / "meta.json").write_text(json.dumps({"format": image_cache.FORMAT - 1}))

    def in_use(path):  # as on Windows, where a file mapped by a process cannot be removed
        raise PermissionError(13, "in use", path)

    monkeypatch.setattr(os, "remove", in_use)
    image_cache.remove_older_copies(str(tmp_path), [])
    assert sorted(os.listdir(copy)) == ["images.u8", "meta.json"]  # left whole, for a later start to remove
    monkeypatch.undo()
    image_cache.remove_older_copies(str(tmp_path), [])
    assert not copy.exists()
    with caplog.at_level("WARNING"):
        image_cache.remove_older_copies(str(tmp_path / "missing"), [])
    assert "cannot look for older decoded copies" in caplog.text


def test_a_folder_that_cannot_be_written_decodes_into_the_workspace(tmp_path):
    root = write_image_folder(tmp_path / "mount", CLASSES, {"normal": 2, "covid": 2})
    (root / ".nvflare_moon_decoded").write_text("not a folder")  # as on a read-only mount: nothing can be made here
    data = load_site_data(settings(val_fraction=0.5), str(root), "site-1", str(tmp_path / "ws"))
    assert data.decoded.folder.startswith(str(tmp_path / "ws" / ".nvflare_moon_decoded"))
    assert len(data.train_index) == 2 and len(data.test_index) == 2


def test_unreadable_files_stop_the_site_unless_skipping_is_allowed(tmp_path):
    write_image_folder(tmp_path, CLASSES, {"normal": 3, "covid": 2})
    broken = tmp_path / "train" / "covid" / "0001.png"
    broken.write_bytes(broken.read_bytes()[:40])  # truncated
    with pytest.raises(SiteDataError, match=r"1 image file\(s\) cannot be decoded.*covid/0001.png"):
        load_site_data(settings(), str(tmp_path), "site-1", str(tmp_path / "ws"))
    data = load_site_data(settings(max_unreadable=1, val_fraction=0), str(tmp_path), "site-1", str(tmp_path / "ws"))
    assert data.decoded.kept.tolist() == [0, 2, 3, 4] and data.images.labels.tolist() == [2, 0, 0, 0]
    assert data.decoded.unreadable[0][0] == os.path.join("train", "covid", "0001.png")


def test_colour_files_among_grayscale_ones_are_converted_unless_strict(tmp_path, caplog):
    write_image_folder(tmp_path, CLASSES, {"normal": 2}, mode="L")
    write_image_folder(tmp_path, CLASSES, {"covid": 1}, mode="RGB")
    with caplog.at_level("WARNING"):
        data = load_site_data(settings(channels=1, val_fraction=0), str(tmp_path), "site-1", str(tmp_path / "ws"))
    assert data.images.images.shape == (3, 1, 16, 16) and data.images.labels.tolist() == [2, 0, 0]
    assert "mix grayscale and colour files (2 grayscale, 1 colour); 1 converted to channels=1" in caplog.text
    # the colour file's pixels are PIL's luminance of it, resized as every image is
    expected = Image.open(tmp_path / "train" / "covid" / "0000.png").convert("L").resize((16, 16), Image.BILINEAR)
    assert np.array_equal(data.images.images[0, 0].numpy(), np.asarray(expected))
    with pytest.raises(SiteDataError, match=r"mix grayscale and colour files \(2 grayscale, 1 colour\) and strict_ch"):
        load_site_data(settings(channels=1, strict_channels=True), str(tmp_path), "site-1", str(tmp_path / "ws"))


def test_images_in_subfolders_of_a_class_folder_are_read_and_a_link_loop_is_not_followed(tmp_path):
    # as PACS exports by patient: train/<class>/<patient>/<image>, beside images in the class folder itself
    write_image_folder(tmp_path, CLASSES, {"normal": 1})
    for patient, n in (("patient_002", 2), ("patient_001", 1)):
        write_split(tmp_path / "train" / "pneumonia" / patient / "study", {"series": (1, n)})
    write_split(tmp_path / "train" / "pneumonia" / ".thumbnails", {"x": (1, 3)})  # hidden: not an image folder
    os.symlink(tmp_path / "train", tmp_path / "train" / "pneumonia" / "patient_001" / "up")  # a loop back up
    files = list_site_files("image_folder", str(tmp_path), CLASSES, "site-1")
    relative = [os.path.relpath(p, tmp_path / "train") for p in files.train_paths]
    assert relative == [
        "normal/0000.png",
        "pneumonia/patient_001/study/series/0000.png",
        "pneumonia/patient_002/study/series/0000.png",
        "pneumonia/patient_002/study/series/0001.png",
    ]
    assert files.train_labels == (0, 1, 1, 1)
    (tmp_path / "train" / "covid" / "empty" / "deeper").mkdir(parents=True)
    with pytest.raises(SiteDataError, match="covid holds no images, nor do its subfolders"):
        list_site_files("image_folder", str(tmp_path), CLASSES, "site-1")


def test_val_is_the_held_out_split_without_test_and_named_as_unread_beside_it(tmp_path, caplog):
    write_image_folder(tmp_path, CLASSES, {"normal": 3, "covid": 3})
    write_split(tmp_path / "val", {"normal": (0, 2)})
    data = load_site_data(settings(), str(tmp_path), "site-1", str(tmp_path / "ws"))
    assert len(data.train_index) == 6 and data.images.labels[data.test_index].tolist() == [0, 0]
    assert data.held_out == "its val split (2 images)"
    write_split(tmp_path / "test", {"covid": (2, 1)})
    with caplog.at_level("WARNING"):
        data = load_site_data(settings(), str(tmp_path), "site-1", str(tmp_path / "ws"))
    assert data.held_out == "its test split (1 images)" and data.images.labels[data.test_index].tolist() == [2]
    assert f"{tmp_path}/val/ is not read: {tmp_path}/test/ is the held-out split" in caplog.text


def test_files_that_are_not_images_are_named_in_a_note_never_dropped_without_a_word(tmp_path, caplog):
    write_image_folder(tmp_path, CLASSES, {"normal": 2, "pneumonia": 2}, {"normal": 1})
    for name in ("a.dcm", "b.dcm", "IM0001", "Thumbs.db", ".DS_Store"):  # DICOM twice, a PACS file, OS files
        (tmp_path / "train" / "pneumonia" / name).write_bytes(b"x")
    (tmp_path / "test" / "normal" / "report.pdf").write_bytes(b"x")
    files = list_site_files("image_folder", str(tmp_path), CLASSES, "site-1")
    assert len(files.train_paths) == 4 and len(files.test_paths) == 1  # the images are read as before
    assert files.notes == (
        f"{tmp_path}/train: 3 file(s) not read, not of an image extension (.dcm ×2, no extension ×1); only "
        ".jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp are read (DICOM: export it as PNG or TIFF first)",
        f"{tmp_path}/test: 1 file(s) not read, not of an image extension (.pdf ×1); only .jpg, .jpeg, .png, .ppm, "
        ".bmp, .pgm, .tif, .tiff, .webp are read",
    )
    with caplog.at_level("WARNING"):
        load_site_data(settings(), str(tmp_path), "site-1", str(tmp_path / "ws"))
    assert "site-1: " + files.notes[0] in caplog.text  # the training log says it too


def dicom_only_class(train):
    (train / "covid").mkdir()
    (train / "covid" / "1.dcm").write_bytes(b"x")


def image_with_no_class(train):
    class_image(0, np.random.default_rng(0)).save(train / "0000.png")


def class_on_a_share_not_mounted(train):
    os.symlink(train.parent / "unmounted", train / "covid")


def patient_on_a_share_not_mounted(train):
    os.symlink("../../unmounted/patient_7", train / "pneumonia" / "patient_7")  # relative, as links often are


def image_on_a_share_not_mounted(train):
    os.symlink("../../unmounted/0009.png", train / "pneumonia" / "0009.png")


def unreadable_patient_folder(train, monkeypatch):
    (train / "pneumonia" / "patient_8").mkdir()
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path).endswith("patient_8"):
            raise PermissionError(13, "Permission denied", os.fspath(path))  # what a non-root site account meets
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)


@pytest.mark.parametrize(
    "make, expected",
    [
        (dicom_only_class, "covid holds no images, .* it holds .dcm ×1, not read"),
        (image_with_no_class, r"1 image\(s\) directly in .*train have no class: move each into .*train/<class>/"),
        (class_on_a_share_not_mounted, "covid links to .*unmounted, which cannot be reached"),
        (patient_on_a_share_not_mounted, f"patient_7 links to {os.sep}.*unmounted/patient_7, which cannot be reached"),
        (image_on_a_share_not_mounted, f"0009.png links to {os.sep}.*unmounted/0009.png, which cannot be reached"),
        (unreadable_patient_folder, r"cannot read .*pneumonia/patient_8 \(Permission denied\); give the account"),
    ],
    ids=[
        "a class of DICOM only",
        "an image with no class",
        "a class on a share not mounted",
        "a patient on a share not mounted",
        "an image on a share not mounted",
        "a folder it may not read",
    ],
)
def test_what_would_lose_a_sites_images_is_refused_naming_it(tmp_path, monkeypatch, make, expected):
    write_image_folder(tmp_path, CLASSES, {"normal": 2, "pneumonia": 2})
    if make is unreadable_patient_folder:
        make(tmp_path / "train", monkeypatch)
    else:
        make(tmp_path / "train")
    with pytest.raises(SiteDataError, match=expected) as refused:
        list_site_files("image_folder", str(tmp_path), CLASSES, "hospital-2")
    assert str(refused.value).startswith("hospital-2: ")


def test_a_datalist_csv_saved_by_excel_with_a_byte_order_mark_is_read(tmp_path):
    write_image_folder(tmp_path, CLASSES, {"normal": 1, "covid": 1})
    (tmp_path / "rows.csv").write_bytes(
        "image,label\ntrain/normal/0000.png,normal\ntrain/covid/0000.png,covid\n".encode("utf-8-sig")
    )
    files = list_site_files("datalist", str(tmp_path / "rows.csv"), CLASSES, "site-1")
    assert files.train_labels == (0, 2)


def a_class_linked_into_another(root):
    os.symlink(root / "train" / "normal" / "0000.png", root / "train" / "pneumonia" / "0009.png")


def a_test_image_linked_from_train(root):
    write_split(root / "test", {"covid": (2, 1)})
    os.remove(root / "test" / "covid" / "0000.png")
    os.symlink(root / "train" / "covid" / "0000.png", root / "test" / "covid" / "0000.png")


def a_repeated_manifest_row(root):
    (root / "rows.csv").write_text("image,label\ntrain/normal/0000.png,normal\ntrain/normal/0000.png,normal\n")


@pytest.mark.parametrize(
    "make, kind, expected",
    [
        (
            a_class_linked_into_another,
            "image_folder",
            r"normal/0000.png \(train, normal\) and .*pneumonia/0009.png \(train, pneumonia\)",
        ),
        (
            a_test_image_linked_from_train,
            "image_folder",
            r"covid/0000.png \(train, covid\) and .*test/covid/0000.png \(test, covid\)",
        ),
        (
            a_repeated_manifest_row,
            "datalist",
            r"normal/0000.png \(train, normal\) and .*normal/0000.png \(train, normal\)",
        ),
    ],
    ids=["in two classes", "in both splits", "a repeated row"],
)
def test_an_image_listed_twice_is_refused_naming_both_entries(tmp_path, make, kind, expected):
    write_image_folder(tmp_path, CLASSES, {"normal": 1, "pneumonia": 1, "covid": 1})
    make(tmp_path)
    root = tmp_path / "rows.csv" if kind == "datalist" else tmp_path
    with pytest.raises(SiteDataError, match="site-1: one image is listed twice: .*" + expected):
        list_site_files(kind, str(root), CLASSES, "site-1")


def test_validation_is_a_held_out_split_and_other_folders_beside_train_are_named_as_unread(tmp_path):
    write_image_folder(tmp_path, CLASSES, {"normal": 3, "covid": 3})
    write_split(tmp_path / "validation", {"normal": (0, 2)})
    write_split(tmp_path / "Test", {"covid": (2, 1)})  # another case: not the held-out split
    (tmp_path / "lost+found").mkdir()  # a file system's own folder: no note
    os.symlink(tmp_path / "train", tmp_path / "train_link")  # the train/ folder by another name: read, so no note
    files = list_site_files("image_folder", str(tmp_path), CLASSES, "site-1")
    assert files.test_split == "validation" and files.test_labels == (0, 0)
    assert files.notes == (
        f"{tmp_path}/Test/ is not read: an image folder holds train/ and one held-out split, the first of test/, val/, "
        "valid/, validation/",
    )
    write_split(tmp_path / "valid", {"covid": (2, 1)})
    files = list_site_files("image_folder", str(tmp_path), CLASSES, "site-1")
    assert files.test_split == "valid" and files.test_labels == (2,)
    assert files.notes[0] == (
        f"{tmp_path}/validation/ is not read: {tmp_path}/valid/ is the held-out split (merge validation/ into train/ "
        "or valid/ to use it)"
    )


# ---- the held-out split and the batches -----------------------------------------------------------------------------


def class_files(counts: dict) -> tuple[np.ndarray, list]:
    """Labels and names of ``counts[c]`` files of each class c, in the listing's order."""
    rows = [(c, f"train/{c}/{i:04d}.png") for c, n in counts.items() for i in range(n)]
    return np.array([c for c, _ in rows]), [name for _, name in rows]


def test_the_holdout_takes_the_rounded_fraction_of_each_class_drawn_with_the_seed():
    labels, names = class_files({0: 10, 1: 4, 2: 1})
    train, held = stratified_holdout(labels, names, 0.25, seed=3)
    assert np.bincount(labels[held], minlength=3).tolist() == [2, 1, 0]  # round(2.5), round(1.0), round(0.25)
    assert sorted(train.tolist() + held.tolist()) == list(range(15))
    assert stratified_holdout(labels, names, 0.25, seed=3)[1].tolist() == held.tolist()
    assert stratified_holdout(labels, names, 0.25, seed=4)[1].tolist() != held.tolist()


def test_files_added_later_move_few_files_trained_on_into_the_held_out_ones():
    labels, names = class_files({0: 200, 1: 100})
    before = {names[i] for i in stratified_holdout(labels, names, 0.1, seed=0)[1]}
    labels, names = class_files({0: 250, 1: 100})  # 50 files of class 0 exported since: rows 200-249 are new
    after = {names[i] for i in stratified_holdout(labels, names, 0.1, seed=0)[1]}
    trained_on_before = after - before - set(names[200:250])
    assert len(trained_on_before) <= 5  # at most round(0.1 * 250) - round(0.1 * 200) = 5 of the 25 (a shuffle: ~22)
    assert {n for n in after if "/1/" in n} == {n for n in before if "/1/" in n}  # class 1 is untouched


def test_batches_come_from_the_given_rows_only(tmp_path):
    write_image_folder(tmp_path, CLASSES, {"normal": 6, "pneumonia": 6, "covid": 6})
    data = load_site_data(settings(val_fraction=0.5, augment=False), str(tmp_path), "site-1", str(tmp_path / "ws"))
    loader = TensorBatchLoader(
        data.images, 4, settings().test_transform(), shuffle=True, drop_last=False, seed=0, indices=data.test_index
    )
    seen = torch.cat([y for _, y in loader])
    assert len(loader) == 3 and sorted(seen.tolist()) == sorted(data.images.labels[data.test_index].tolist())
    x, _ = next(iter(loader))
    assert x.shape == (4, 3, 16, 16) and x.dtype == torch.float32


def test_the_network_takes_one_channel_and_larger_images():
    model = Network(num_classes=3, in_channels=1, image_size=64)
    assert model.backbone[0].in_channels == 1 and model.backbone[7].in_features == 16 * 13 * 13
    assert model(torch.zeros(2, 1, 64, 64)).logits.shape == (2, 3)
    assert Network().state_dict().keys() == Network(in_channels=1, image_size=64).state_dict().keys()


# ---- every method's executor on a site's own images -----------------------------------------------------------------


@pytest.mark.parametrize(
    "executor_class, meta",
    [
        (executors.FedAvgExecutor, None),
        (executors.FedProxExecutor, {AlgorithmConstants.FEDPROX_MU: 0.01}),
        (executors.MoonExecutor, None),
        (executors.FedSSCExecutor, None),
        (executors.FedSiamDAExecutor, None),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_every_method_trains_a_round_on_a_sites_own_images(tmp_path, executor_class, meta):
    root = write_image_folder(tmp_path / "images", CLASSES, {"normal": 10, "pneumonia": 10, "covid": 10})
    site_data = {"class_names": list(CLASSES), "image_size": 16, "channels": 1}
    predictor = 16 if executor_class is executors.FedSiamDAExecutor else None
    model = Network(num_classes=3, in_channels=1, image_size=16, out_dim=8, predictor_hidden_dim=predictor)
    executor = executor_class(
        model=model,
        data=DataSpec(dataset="image_folder", site_data=site_data, site_path=str(root)),
        training=TrainingSpec(batch_size=4, local_epochs=1),
    )
    ctx = site_context(tmp_path / "ws")
    started(executor, ctx)
    code, reply = run_task(executor, ctx, state_dict_to_numpy(model), meta=meta)
    assert code == ReturnCode.OK
    assert reply.meta["num_samples"] == 27  # 10 per class, round(0.1 · 10) = 1 of each held out
    assert 0 <= reply.metrics["accuracy"] <= 1 and "local_model_accuracy" in reply.metrics


def test_the_hospital_page_lists_every_site_data_key():
    page = (Path(__file__).resolve().parents[1] / "docs" / "hospital_data.md").read_text()
    section = page[page.index("## The settings of `site_data`") :]
    table = section[: section.index("\n## ", 1)]
    listed = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)? \|", table, re.M))
    keys = {name for pair in listed for name in pair if name}
    own_arguments = {"dataset", "seed"}  # the executor's, refused in site_data
    assert keys == {f.name for f in dataclasses.fields(SiteDataSettings)} - own_arguments
