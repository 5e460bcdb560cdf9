"""The worked example in docs/custom_model.md: MOON with a user's own network and image folders, run for real."""

import importlib
import sys

import numpy as np
import pytest
from PIL import Image

from .conftest import REPO, run_simulator

EXAMPLE = REPO / "docs" / "examples" / "drop_in"


def write_image_folder(root, per_class, rng):
    for label, colour in enumerate([(200, 30, 30), (30, 30, 200)]):
        folder = root / f"class_{label}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(np.array(colour) + rng.normal(0, 40, (24, 24, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.png")


@pytest.mark.e2e
def test_drop_in_example_trains_with_the_users_network_and_data(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    write_image_folder(tmp_path / "train", 40, rng)
    write_image_folder(tmp_path / "test", 20, rng)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    job_module = importlib.import_module("job")
    try:
        job_module.build_job(str(tmp_path / "train"), str(tmp_path / "test"), num_sites=2, num_rounds=2).export_job(
            str(tmp_path / "jobs")
        )
    finally:
        sys.modules.pop("job", None), sys.modules.pop("hospital_net", None)
    job_dir = tmp_path / "jobs" / "hospital_moon"
    assert (job_dir / "app" / "custom" / "hospital_net.py").exists()  # the user's code travels with the job

    run = run_simulator(job_dir, tmp_path / "ws", n=2, t=1)  # one worker: client processes restart every task
    assert run.returncode == 0, run.output[-3000:]
    metrics = run.global_metrics()
    assert [m["round"] for m in metrics] == [0, 1]
    assert metrics[-1]["test_loss"] < metrics[0]["test_loss"]
    for site in ("site-1", "site-2"):
        assert metrics[0]["site_weights"][site] == pytest.approx(0.5)  # 80 images each
        assert metrics[1]["site_metrics"][site]["train_contrastive"] > 0  # the previous model survived the restart
