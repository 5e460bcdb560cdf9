"""MOON through NVFlare's real simulator, with every client process kept (-t == -n) and restarted per task (-t < -n).

Three sites, three rounds, tiny synthetic data and the simple-CNN: about a minute per run on 2 CPU cores. Those runs
are too short to learn (the simple-CNN sits at chance for its first ~1.5/lr SGD steps on the synthetic set), so one
more run, with enough steps, checks that MOON learns.
"""

import math

import numpy as np
import pytest
import torch

from nvflare_moon.data import load_dataset, site_train_arrays
from nvflare_moon.recipes import MoonRecipe

from .conftest import run_simulator

pytestmark = pytest.mark.e2e
SITES = ["site-1", "site-2", "site-3"]
ROUNDS = 3


def tiny_moon_recipe():
    return MoonRecipe(
        name="moon_tiny", min_clients=3, num_rounds=ROUNDS, dataset="synthetic", local_epochs=2, batch_size=32, lr=0.05
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moon_e2e")
    tiny_moon_recipe().export(str(root / "jobs"))
    return {t: run_simulator(root / "jobs" / "moon_tiny", root / f"ws_t{t}", n=3, t=t) for t in (3, 2)}


def final_global(run):
    saved = torch.load(run.server_dir() / "app_server" / "FL_global_model.pt", weights_only=False)
    return {k: v.numpy() for k, v in saved["model"].items()}


@pytest.mark.parametrize("t", [3, 2])
def test_job_completes_and_reports_global_accuracy_every_round(runs, t):
    run = runs[t]
    assert run.returncode == 0, run.output[-3000:]
    metrics = run.global_metrics()
    assert [m["round"] for m in metrics] == list(range(ROUNDS))
    assert run.output.count("global test accuracy") == ROUNDS  # once per round, not once per client
    assert list((run.server_dir() / "tb_events" / "global").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("t", [3, 2])
def test_rounds_after_the_first_use_the_persisted_previous_model(runs, t):
    run = runs[t]
    metrics = run.global_metrics()
    for site in SITES:
        assert "train_contrastive" not in metrics[0]["site_metrics"][site]  # round 0: no previous model
        for later in metrics[1:]:
            contrastive = later["site_metrics"][site]["train_contrastive"]
            assert contrastive > 0 and abs(contrastive - math.log(2)) > 1e-3, "a real previous model, not z_glob"
        saved_round, _ = run.last_upload(site, "moon_state")
        assert saved_round == ROUNDS - 1
    assert run.output.count("no previous local model yet") == len(SITES)


@pytest.mark.parametrize("t", [3, 2])
def test_global_model_is_the_sample_weighted_average_of_the_uploads(runs, t):
    run = runs[t]
    splits = load_dataset("synthetic", None)
    sizes = np.array([len(site_train_arrays(splits, s, 3)) for s in SITES], dtype=np.float64)
    weights = sizes / sizes.sum()
    uploads = [run.last_upload(s, "moon_state")[1] for s in SITES]
    expected = {k: sum(w * u[k].double().numpy() for w, u in zip(weights, uploads)) for k in uploads[0]}
    got = final_global(run)
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-5, atol=1e-6)
    assert run.global_metrics()[-1]["site_weights"] == pytest.approx(dict(zip(SITES, weights)))


def test_restarting_client_processes_does_not_change_the_algorithm(runs):
    a, b = final_global(runs[3]), final_global(runs[2])
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_moon_learns_the_synthetic_classes(tmp_path):
    """The synthetic set's classes are noisy copies of 10 fixed smooth images, learnt to ~100 % by the simple-CNN
    after ~150 SGD steps at lr 0.02 (its first ~75 steps stay at chance). Two sites with the same class mix, 72 steps
    per round: the global model should be near 100 % after round 2; 50 % is five times chance."""
    recipe = MoonRecipe(
        name="moon_learns",
        min_clients=2,
        num_rounds=3,
        dataset="synthetic",
        partition="iid",
        local_epochs=8,
        batch_size=32,
        lr=0.02,
    )
    recipe.export(str(tmp_path / "jobs"))
    run = run_simulator(tmp_path / "jobs" / "moon_learns", tmp_path / "ws", n=2, t=2)
    assert run.returncode == 0, run.output[-3000:]
    accuracy = [m["test_accuracy"] for m in run.global_metrics()]
    assert len(accuracy) == 3 and accuracy[-1] >= 0.5, accuracy
    assert all("train_contrastive" in m["site_metrics"][s] for m in run.global_metrics()[1:] for s in SITES[:2])
