"""The Client API example on each site's own images (docs/client_api_site_data.md): two sites whose folders are at
different paths, given to the script as ``--site_path`` in per-site ``train_args`` (``set_per_site_config``), train
MOON through PTMoonHelper in the real simulator with ``-t == -n``; and without ``--site_path`` a site reads the
folder named after it."""

import importlib
import json
import re
import sys

import pytest
from nvflare.recipe.utils import set_per_site_config

from nvflare_moon.recipes import MoonScriptRecipe

from .conftest import REPO, export_and_run
from .site_images import write_image_folder

pytestmark = pytest.mark.e2e
EXAMPLE = REPO / "docs" / "examples" / "client_api"
CLASSES = ["normal", "pneumonia", "covid"]
COMMON_ARGS = f"--class_names {','.join(CLASSES)} --epochs 1 --batch_size 8 --threads 1"


@pytest.fixture
def example(monkeypatch):
    """The example's folder on the path, as job.py puts it: the exporter then copies net.py into the job."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield importlib.import_module("net"), importlib.import_module("client_moon_site_data")
    for name in ("net", "client_moon_site_data"):
        sys.modules.pop(name, None)


def test_without_site_path_a_site_reads_the_folder_named_after_it(example):
    _, script = example
    assert script.site_folder(None, "hospital-2") == f"{script.DEFAULT_PARENT}/hospital-2"
    assert script.site_folder("/mnt/pacs/xray", "hospital-2") == "/mnt/pacs/xray"


def test_each_site_trains_on_the_folder_its_train_args_name(tmp_path, example):
    net, _ = example
    one = write_image_folder(tmp_path / "radiology" / "export", CLASSES, {"normal": 20, "pneumonia": 20, "covid": 10})
    two = write_image_folder(tmp_path / "pacs" / "xray", CLASSES, {"normal": 30, "pneumonia": 10}, mode="L", seed=3)
    recipe = MoonScriptRecipe(
        name="moon_site_data",
        model=net.Net(num_classes=len(CLASSES)),
        min_clients=2,
        num_rounds=2,
        train_script=str(EXAMPLE / "client_moon_site_data.py"),
        command=f"{sys.executable} -u",
        mu=5.0,
    )
    # a site's train_args replace the recipe's: each site's string holds all of them
    set_per_site_config(
        recipe,
        {
            "site-1": {"train_args": f"{COMMON_ARGS} --site_path {one}"},
            "site-2": {"train_args": f"{COMMON_ARGS} --site-path {two}"},
        },
    )
    run = export_and_run(recipe, tmp_path, n=2, t=2, timeout=600)
    assert run.returncode == 0, run.output[-3000:]

    # val_fraction 0.1 of each class held out: 2 + 2 + 1 of site-1's 50, 3 + 1 of site-2's 40
    assert f"site-1: 45 training images (18 normal, 18 pneumonia, 9 covid) from {one}" in run.output
    assert f"site-2: 36 training images (27 normal, 9 pneumonia, 0 covid) from {two}" in run.output
    for site in ("site-1", "site-2"):
        assert f"{site}: round 1: global accuracy" in run.output and "'contrastive'" in run.output
    for folder in (one, two):  # decoded once beside each site's images
        assert len(list((folder / ".nvflare_moon_decoded").iterdir())) == 1

    # NVFlare's record of the aggregated metrics: each round's accuracy is the sites' weighted by their sample counts
    rounds = [json.loads(line) for line in (run.server_dir() / "metrics" / "round_metrics.jsonl").open()]
    assert [r["round"] for r in rounds] == [0, 1]
    for r in rounds:
        site_accuracy = {
            site: float(re.search(rf"{site}: round {r['round']}: global accuracy ([\d.]+)", run.output).group(1))
            for site in ("site-1", "site-2")
        }
        (metric,) = [m for m in r["aggregated_metrics"] if m["name"] == "accuracy"]
        weighted = (45 * site_accuracy["site-1"] + 36 * site_accuracy["site-2"]) / 81
        assert metric["value"] == pytest.approx(weighted, abs=1e-4), (r, site_accuracy)
