"""Two hospitals train MOON on their own image folders in the real simulator, each at its own path, with different
class mixes (hospital-2 has no "covid" images and no test split): with ``-t == -n`` and ``-t < -n``; a site whose
folder is missing ends the job at once, naming the folder; a CT site trains through the job's intensity window."""

import json

import pytest

from nvflare_moon.recipes import MoonRecipe

from .conftest import run_simulator
from .site_images import set_site_paths, write_image_folder

pytestmark = pytest.mark.e2e
CLASSES = ["normal", "pneumonia", "covid"]
HOSPITALS = ["hospital-1", "hospital-2"]
SITE_DATA = {"class_names": CLASSES, "image_size": 16, "channels": 1, "val_fraction": 0.2}


def hospital_recipe(site_data=SITE_DATA, **kwargs) -> MoonRecipe:
    return MoonRecipe(
        name="hospital_moon",
        dataset="image_folder",
        site_data=site_data,
        min_clients=2,
        num_rounds=2,
        local_epochs=2,
        batch_size=8,
        lr=0.05,
        num_threads=1,
        **kwargs,
    )


def write_hospitals(root):
    """hospital-1: 16-bit grayscale PNGs, all three classes, a test split; hospital-2: 8-bit, no covid, no test."""
    train, test = {"normal": 24, "pneumonia": 24, "covid": 16}, {"normal": 6, "pneumonia": 6, "covid": 6}
    one = write_image_folder(root / "radiology" / "export", CLASSES, train, test, mode="I;16")
    two = write_image_folder(root / "pacs" / "xray", CLASSES, {"normal": 30, "pneumonia": 20}, mode="L", seed=5)
    return {"hospital-1": one, "hospital-2": two}


@pytest.mark.parametrize("threads", [2, 1], ids=["t2", "t1"])
def test_each_hospital_trains_on_its_own_folder_and_reports_its_accuracy(tmp_path, threads):
    folders = write_hospitals(tmp_path / "data")
    recipe = hospital_recipe(byoc=True)
    set_site_paths(recipe, folders)
    jobs = tmp_path / "jobs"
    recipe.export(str(jobs))
    client_config = json.loads(
        (jobs / "hospital_moon" / "app_hospital-2" / "config" / "config_fed_client.json").read_text()
    )
    data = client_config["executors"][0]["executor"]["args"]["data"]["args"]
    assert data["site_path"] == str(folders["hospital-2"])

    run = run_simulator(jobs / "hospital_moon", tmp_path / "ws", n=2, t=threads, clients=HOSPITALS, timeout=300)
    assert run.returncode == 0, run.output[-3000:]
    assert "hospital-1: 64 training samples (its own images at" in run.output
    assert "24 normal, 24 pneumonia, 16 covid; held out: its test split (18 images)" in run.output
    # hospital-2 holds out round(0.2 · n) of each class: 6 of 30 normal, 4 of 20 pneumonia
    assert "hospital-2: 40 training samples" in run.output and "24 normal, 16 pneumonia, 0 covid" in run.output
    rounds = run.global_metrics()
    assert [r["round"] for r in rounds] == [0, 1] and "test_accuracy" not in rounds[-1]  # the server holds no images
    sites = rounds[-1]["site_metrics"]
    assert set(sites) == set(HOSPITALS) and all(0 <= sites[s]["accuracy"] <= 1 for s in HOSPITALS)
    weights = rounds[-1]["site_weights"]
    weighted = sum(weights[s] * sites[s]["accuracy"] for s in HOSPITALS) / sum(weights.values())
    assert rounds[-1]["spread"]["accuracy"]["mean"] == pytest.approx(weighted)
    for site, folder in folders.items():  # decoded once beside each site's images, and mapped by later processes
        assert len(list((folder / ".nvflare_moon_decoded").iterdir())) == 1


def test_a_ct_site_in_hounsfield_units_trains_through_the_jobs_intensity_window(tmp_path):
    train = {"normal": 24, "pneumonia": 24, "covid": 16}
    folders = {  # signed TIFFs at hospital-1 (class 0 below 0 HU, which the 16-bit range would clip to black)
        "hospital-1": write_image_folder(tmp_path / "ct", CLASSES, train, mode="I", ext="tif"),
        "hospital-2": write_image_folder(tmp_path / "xray", CLASSES, train, mode="L", seed=5),
    }
    recipe = hospital_recipe(byoc=True, site_data={**SITE_DATA, "intensity_window": [-1000, 1000]})
    set_site_paths(recipe, folders)
    recipe.export(str(tmp_path / "jobs"))
    config = tmp_path / "jobs" / "hospital_moon" / "app_hospital-1" / "config" / "config_fed_client.json"
    data = json.loads(config.read_text())["executors"][0]["executor"]["args"]["data"]["args"]
    assert data["site_data"]["intensity_window"] == [-1000, 1000]  # in the job's config, the same for every site
    run = run_simulator(tmp_path / "jobs" / "hospital_moon", tmp_path / "ws", n=2, t=2, clients=HOSPITALS)
    assert run.returncode == 0, run.output[-3000:]
    assert "hospital-1: 51 training samples" in run.output  # 64 less round(0.2 · n) of each class: 5, 5 and 3
    assert "hold negative values" not in run.output
    assert set(run.global_metrics()[-1]["site_metrics"]) == set(HOSPITALS)


def test_a_site_whose_folder_is_missing_ends_the_job_naming_it(tmp_path):
    folders = write_hospitals(tmp_path / "data")
    (tmp_path / "data" / "by_site").mkdir()
    (tmp_path / "data" / "by_site" / "hospital-1").symlink_to(folders["hospital-1"])
    # one path for every site, made the site's own by NVFlare's {SITE_NAME}: hospital-3 has no folder there
    recipe = hospital_recipe(site_path=str(tmp_path / "data" / "by_site" / "{SITE_NAME}"))
    recipe.export(str(tmp_path / "jobs"))
    run = run_simulator(
        tmp_path / "jobs" / "hospital_moon", tmp_path / "ws", n=2, t=2, clients=["hospital-1", "hospital-3"]
    )
    assert run.returncode != 0
    assert f"hospital-3: image folder {tmp_path}/data/by_site/hospital-3 does not exist" in run.output
    assert run.global_metrics() == []
