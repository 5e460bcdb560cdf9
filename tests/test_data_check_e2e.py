"""The data check in the real simulator: two hospitals report counts of their own image folders (one lacks a class,
one has a class of 3 images, shown as "<5"; one keeps a class's images in per-patient subfolders, with two colour files
among grayscale ones, converted and counted; one has a val/ beside its test/, named as not read); the server writes
the table and the plot, and the job exits 0. A site with a class folder outside class_names fails the job, named,
with the folder's name and none of its path in the table."""

import json
import re

import pytest

from nvflare_moon.data.site_data import SiteDataSettings, list_and_decode
from nvflare_moon.recipes import DataCheckRecipe

from .conftest import run_simulator
from .site_images import set_site_paths, write_image_folder, write_split

pytestmark = pytest.mark.e2e
CLASSES = ["normal", "pneumonia", "covid"]
HOSPITALS = ["hospital-1", "hospital-2"]
SITE_DATA = {"class_names": CLASSES, "image_size": 16, "channels": 1}


def run_data_check(tmp_path, folders, tag):
    recipe = DataCheckRecipe(dataset="image_folder", site_data=SITE_DATA, min_clients=2)
    set_site_paths(recipe, folders)
    recipe.export(str(tmp_path / f"jobs{tag}"))
    return run_simulator(tmp_path / f"jobs{tag}" / "data_check", tmp_path / f"ws{tag}", n=2, t=2, clients=HOSPITALS)


def hospital_one(root):
    """20x24 8-bit grayscale: 12 normal, 8 pneumonia, 3 covid to train on; 6 normal, 5 pneumonia to test on."""
    train, test = {"normal": 12, "pneumonia": 8, "covid": 3}, {"normal": 6, "pneumonia": 5}
    return write_image_folder(root / "radiology" / "export", CLASSES, train, test, mode="L")


def hospital_two(root):
    """As PACS exports by patient: 10 normal (8 grayscale, 2 colour in a subfolder) and 20 pneumonia in two patients'
    folders; no test split; no covid."""
    write_split(root / "train", {"normal": (0, 8)}, mode="L", seed=5)
    write_split(root / "train" / "normal", {"colour": (0, 2)}, mode="RGB", seed=6)
    for patient in ("patient_000", "patient_001"):
        write_split(root / "train" / "pneumonia" / patient, {"study": (1, 10)}, mode="L", seed=7)
    return root


def test_two_hospitals_report_their_counts_and_the_server_writes_the_table_and_plot(tmp_path):
    folders = {"hospital-1": hospital_one(tmp_path / "data"), "hospital-2": hospital_two(tmp_path / "data" / "pacs")}
    write_split(folders["hospital-1"] / "val", {"normal": (0, 2)}, mode="L")
    run = run_data_check(tmp_path, folders, "")
    assert run.returncode == 0, run.output[-3000:]
    text = (run.server_dir() / "data_summary.json").read_text()
    summary = json.loads(text)
    assert summary["sites"] == {
        "hospital-1": {
            "min_count": 5,
            "train": {"normal": 12, "pneumonia": 8, "covid": "<5"},
            "test": {"normal": 6, "pneumonia": 5, "covid": 0},
            "classes_absent": [],
            "unreadable": 0,
            "channels": {"grayscale": 34, "colour": 0},
            "converted": 0,
            "sizes": {"20x24": 34},
            "stored_values": None,
            "problems": [],
            "notes": [
                "<site_path>/val/ is not read: <site_path>/test/ is the held-out split (merge val/ into train/ or "
                "test/ to use it)"
            ],
        },
        "hospital-2": {
            "min_count": 5,
            "train": {"normal": 10, "pneumonia": 20, "covid": 0},
            "test": None,
            "classes_absent": ["covid"],
            "unreadable": 0,
            "channels": {"grayscale": 28, "colour": "<5"},
            "converted": "<5",
            "sizes": {"20x24": 30},
            "stored_values": None,
            "problems": [],
            "notes": [],
        },
    }
    # counted training images: hospital-1 (12, 8, 0) of 20 (its 3 covid hidden), hospital-2 (10, 20, 0) of 30;
    # pooled (22, 28, 0) / 50 = (0.44, 0.56, 0); TV_1 = ½(0.16 + 0.16) = 0.16, TV_2 = ½(0.10667 + 0.10667)
    assert summary["label_distribution"] == {
        "pooled": {"normal": 0.44, "pneumonia": 0.56, "covid": 0.0},
        "sites": {
            "hospital-1": {"normal": 0.6, "pneumonia": 0.4, "covid": 0.0},
            "hospital-2": {"normal": 0.3333, "pneumonia": 0.6667, "covid": 0.0},
        },
        "total_variation": {"hospital-1": 0.16, "hospital-2": 0.1067},
        "mean_total_variation": 0.1333,
        "suppressed_cells": 1,
    }
    assert summary["class_names"] == CLASSES and summary["failed"] == {}
    assert str(tmp_path) not in text and ".png" not in text and not re.search(r"[\"\s]/\w", text)  # no path at all
    assert (run.server_dir() / "label_distribution.png").stat().st_size > 0
    assert "mean TV to the pooled label distribution: 0.1333" in run.output
    settings = SiteDataSettings(dataset="image_folder", **SITE_DATA)
    for site, folder in folders.items():  # the check decoded each site's images beside them, for training to map
        (copy,) = (folder / ".nvflare_moon_decoded").iterdir()
        assert list_and_decode(settings, str(folder), site, str(tmp_path))[1].folder == str(copy)


def test_a_class_folder_outside_class_names_fails_the_job_naming_the_site_and_the_folder(tmp_path):
    hospital_two = tmp_path / "data" / "pacs"
    write_image_folder(hospital_two, CLASSES + ["fracture"], {"normal": 10, "fracture": 6}, mode="L")
    run = run_data_check(tmp_path, {"hospital-1": hospital_one(tmp_path / "data"), "hospital-2": hospital_two}, "_bad")
    assert run.returncode != 0
    assert (
        "data check failed at 1 site(s): hospital-2: class folder <site_path>/train/fracture is not in the job's "
        "class_names ['normal', 'pneumonia', 'covid']" in run.output
    )
    text = (run.server_dir() / "data_summary.json").read_text()
    summary = json.loads(text)
    assert summary["failed"]["hospital-2"].startswith("class folder <site_path>/train/fracture is not in")
    assert list(summary["failed"]) == ["hospital-2"] and summary["sites"]["hospital-1"]["train"]["normal"] == 12
    assert str(tmp_path) not in text
