"""The committed job folders, and how bad settings are refused."""

import filecmp
import json

import pytest
from nvflare.recipe.utils import set_per_site_config

from nvflare_moon.core.moon import MoonSettings
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.executors import FedAvgExecutor, MoonExecutor
from nvflare_moon.models import Network
from nvflare_moon.ops.export_jobs import JOBS, export_all
from nvflare_moon.recipes import MoonRecipe

from .conftest import REPO, run_simulator


def tree_differences(a, b):
    cmp = filecmp.dircmp(a, b)
    diffs = [f"{a}/{name}" for name in cmp.left_only + cmp.right_only + cmp.diff_files + cmp.funny_files]
    for sub in cmp.common_dirs:
        diffs += tree_differences(f"{a}/{sub}", f"{b}/{sub}")
    return diffs


def test_committed_job_folders_are_exactly_what_the_recipes_export(tmp_path):
    export_all(str(tmp_path))
    for name in JOBS:
        assert not tree_differences(str(REPO / "jobs" / name), str(tmp_path / name)), (
            f"jobs/{name} differs from its recipe: run python -m nvflare_moon.ops.export_jobs"
        )


def test_main_job_has_the_papers_defaults():
    client = json.loads((REPO / "jobs/moon_cifar10/app/config/config_fed_client.json").read_text())
    args = client["executors"][0]["executor"]["args"]
    expected = dict(
        settings=dict(mu=5.0, temperature=0.5, num_previous_models=1),
        data=dict(dataset="cifar10", num_sites=10, beta=0.5, seed=0),
        training=dict(local_epochs=10, batch_size=64, lr=0.01, momentum=0.9, weight_decay=1e-5),
    )
    assert {spec: {k: args[spec]["args"][k] for k in fields} for spec, fields in expected.items()} == expected
    assert args["model"]["args"]["arch"] == "simple_cnn"
    server = json.loads((REPO / "jobs/moon_cifar10/app/config/config_fed_server.json").read_text())
    assert server["workflows"][0]["args"]["num_rounds"] == 100
    meta = json.loads((REPO / "jobs/moon_cifar10/meta.json").read_text())
    assert meta["min_clients"] == 10
    # a custom/ folder makes the job BYOC, so it passes NVFlare's default class allow-list
    assert (REPO / "jobs/moon_cifar10/app/custom").is_dir()


@pytest.mark.parametrize(
    "spec, kwargs, name",
    [
        (MoonSettings, {"mu": -1.0}, "mu"),
        (MoonSettings, {"temperature": 0.0}, "temperature"),
        (MoonSettings, {"num_previous_models": 0}, "num_previous_models"),
        (DataSpec, {"dataset": "mnist"}, "dataset"),
        (DataSpec, {"beta": 0}, "beta"),
        (TrainingSpec, {"lr": float("nan")}, "lr"),
        (DataSpec, {"partition": "shards"}, "partition"),
        (DataSpec, {"dataset": "image_folder"}, "needs site_data="),
        (
            DataSpec,
            {"dataset": "image_folder", "site_data": {"class_names": ["a", "b"], "image_size": 0}},
            "image_size",
        ),
        (
            DataSpec,
            {"dataset": "datalist", "site_data": {"class_names": ["a", "b"], "colour": True}},
            "site_data: .*colour",
        ),
        (DataSpec, {"site_data": {"class_names": ["a", "b"]}}, "site_data is for dataset='image_folder'"),
    ],
)
def test_bad_executor_arguments_are_refused_by_name(spec, kwargs, name):
    argument = {MoonSettings: "settings", DataSpec: "data", TrainingSpec: "training"}[spec]
    with pytest.raises(ValueError, match=name):  # by the spec, or by the executor that takes it
        MoonExecutor(model=Network(), **{argument: spec(**kwargs)})


def test_a_data_path_is_the_sites_and_is_not_checked_where_the_job_is_built():
    MoonExecutor(model=Network(), data=DataSpec(data_root="/data/{SITE_NAME}/cifar", download=False))
    MoonExecutor(
        model=Network(num_classes=2), data=DataSpec(dataset="image_folder", site_data={"class_names": ["a", "b"]})
    )


def test_per_site_settings_are_refused_unless_a_site_may_set_them():
    recipe = MoonRecipe(min_clients=2, dataset="image_folder", site_data={"class_names": ["a", "b"]})
    with pytest.raises(ValueError, match=r"\['lr'\] for site 'site-2' cannot differ between sites in MoonRecipe"):
        set_per_site_config(recipe, {"site-1": {"site_path": "/a"}, "site-2": {"lr": 0.1}})
    with pytest.raises(ValueError, match="names 1 site\\(s\\) but min_clients=2"):
        set_per_site_config(recipe, {"site-1": {"site_path": "/a"}})
    with pytest.raises(ValueError, match="server_evaluation=True needs a test split on the server"):
        MoonRecipe(dataset="datalist", site_data={"class_names": ["a", "b"]}, server_evaluation=True)


def test_executor_needs_a_module():
    with pytest.raises(ValueError, match="model"):
        FedAvgExecutor(model="simple_cnn")


def test_bad_recipe_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="num_sites"):
        MoonRecipe(min_clients=10, num_sites=5)
    with pytest.raises(ValueError, match="arch"):
        MoonRecipe(arch="vgg")


@pytest.mark.e2e
def test_missing_dataset_stops_the_run_saying_where_it_looked(tmp_path):
    empty = tmp_path / "empty_data"
    empty.mkdir()
    MoonRecipe(name="nodata", min_clients=2, num_rounds=2, data_root=str(empty), download=False).export(
        str(tmp_path / "jobs")
    )
    run = run_simulator(tmp_path / "jobs" / "nodata", tmp_path / "ws", n=2, t=2, timeout=120)
    assert run.returncode != 0
    assert "dataset 'cifar10' not found" in run.output and str(empty / "cifar-10-batches-py") in run.output
    assert "download=True" in run.output
    assert "trained" not in run.output
