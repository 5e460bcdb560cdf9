"""The worked example in docs/custom_model.md: MOON with a user's own network, each site on its own image folder, run
for real."""

import importlib
import sys

import pytest

from .conftest import REPO, run_simulator
from .site_images import write_image_folder

EXAMPLE = REPO / "docs" / "examples" / "drop_in"
CLASSES = ["normal", "pneumonia"]


@pytest.mark.e2e
def test_drop_in_example_trains_the_users_network_on_each_sites_own_images(tmp_path, monkeypatch):
    write_image_folder(tmp_path / "sites" / "site-1", CLASSES, {"normal": 40, "pneumonia": 24})
    write_image_folder(tmp_path / "sites" / "site-2", CLASSES, {"normal": 16, "pneumonia": 48}, seed=1)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    job_module = importlib.import_module("job")
    try:
        job = job_module.build_job(CLASSES, str(tmp_path / "sites" / "{SITE_NAME}"), num_sites=2, num_rounds=2)
        job.export_job(str(tmp_path / "jobs"))
    finally:
        sys.modules.pop("job", None), sys.modules.pop("hospital_net", None)
    job_dir = tmp_path / "jobs" / "hospital_moon"
    assert (job_dir / "app" / "custom" / "hospital_net.py").exists()  # the user's code travels with the job

    run = run_simulator(job_dir, tmp_path / "ws", n=2, t=1)  # one worker: client processes restart every task
    assert run.returncode == 0, run.output[-3000:]
    metrics = run.global_metrics()
    assert [m["round"] for m in metrics] == [0, 1]
    # each site holds out round(0.1 · n_c) of each class: 4 + 2 of site-1's, 2 + 5 of site-2's
    assert metrics[0]["site_weights"] == pytest.approx({"site-1": 58 / 115, "site-2": 57 / 115})
    assert metrics[-1]["train"]["loss"] < metrics[0]["train"]["loss"]  # the sites' loss of the global model
    for site in ("site-1", "site-2"):
        assert metrics[1]["site_metrics"][site]["train_contrastive"] > 0  # the previous model survived the restart
