"""SCAFFOLD with partial participation through NVFlare's real simulator, with client processes kept (-t == -n) and
restarted for every task (-t < -n).

Three sites, two sampled per round (seed 4 draws {2,3}, {1,3}, {1,2}: site-1 joins late, site-2 sits out round 1 and
comes back, site-3 sits out the last round), three rounds on tiny synthetic data: about 30 s with -t 3 and 50 s with
-t 2 on 2 CPU cores.
"""

import numpy as np
import pytest
import torch
from nvflare.app_common.app_constant import AlgorithmConstants

from nvflare_moon.core.sampling import sample_sites
from nvflare_moon.data import load_dataset, site_train_arrays
from nvflare_moon.recipes import ScaffoldRecipe

from .conftest import run_simulator

pytestmark = pytest.mark.e2e
SITES = ["site-1", "site-2", "site-3"]
ROUNDS, SEED, FRACTION = 3, 4, 2 / 3
SCHEDULE = [["site-2", "site-3"], ["site-1", "site-3"], ["site-1", "site-2"]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("scaffold_e2e")
    ScaffoldRecipe(
        name="scaffold_tiny",
        min_clients=3,
        num_rounds=ROUNDS,
        dataset="synthetic",
        local_epochs=1,
        batch_size=32,
        lr=0.05,
        seed=SEED,
        sample_fraction=FRACTION,
    ).export(str(root / "jobs"))
    return {t: run_simulator(root / "jobs" / "scaffold_tiny", root / f"ws_t{t}", n=3, t=t) for t in (3, 2)}


def site_control(run, site):
    record = torch.load(run.site_dir(site) / "nvflare_moon" / "scaffold_state.pt", weights_only=True)
    return record["round"], {k: v.numpy() for k, v in record["payload"]["local_controls"][-1].items()}


def server_control(run):
    saved = torch.load(run.server_dir() / "app_server" / "FL_global_model.pt", weights_only=False)
    return saved["meta_props"][AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL]


def test_the_schedule_is_the_seeded_draw():
    assert [sample_sites(SITES, FRACTION, SEED, r) for r in range(ROUNDS)] == SCHEDULE


@pytest.mark.parametrize("t", [3, 2])
def test_each_round_trains_the_sampled_sites_with_weights_normalised_over_them(runs, t):
    run = runs[t]
    assert run.returncode == 0, run.output[-3000:]
    splits = load_dataset("synthetic", None)
    sizes = {s: len(site_train_arrays(splits, s, 3, seed=SEED)) for s in SITES}
    metrics = run.global_metrics()
    assert [m["round"] for m in metrics] == list(range(ROUNDS))
    for record, sampled in zip(metrics, SCHEDULE):
        total = sum(sizes[s] for s in sampled)
        assert record["site_weights"] == pytest.approx({s: sizes[s] / total for s in sampled})


@pytest.mark.parametrize("t", [3, 2])
def test_site_controls_persist_across_rounds_and_the_server_control_is_their_mean(runs, t):
    run = runs[t]
    # a site starts from c_i = 0 once, at its first participation, even when its process is restarted every task
    assert run.output.count("c_i starts at 0") == len(SITES)
    last_trained = {"site-1": 2, "site-2": 2, "site-3": 1}
    controls = {}
    for site in SITES:
        saved_round, controls[site] = site_control(run, site)
        assert saved_round == last_trained[site]
    # c starts at 0 and gains Σ Δc_i / N each round, so c = Σ_i c_i / N over all sites, sampled or not
    c = server_control(run)
    assert set(c) == set(controls["site-1"])
    for name in c:
        mean = sum(controls[s][name] for s in SITES) / len(SITES)
        np.testing.assert_allclose(c[name], mean, rtol=1e-5, atol=1e-7)
    assert max(np.abs(v).max() for v in c.values()) > 1e-3, "the controls are not trivially zero"


def test_restarting_client_processes_does_not_change_the_controls_or_the_model(runs):
    for site in SITES:
        kept, restarted = site_control(runs[3], site)[1], site_control(runs[2], site)[1]
        for name in kept:
            np.testing.assert_allclose(restarted[name], kept[name], rtol=1e-5, atol=1e-6)
    kept = torch.load(runs[3].server_dir() / "app_server" / "FL_global_model.pt", weights_only=False)["model"]
    restarted = torch.load(runs[2].server_dir() / "app_server" / "FL_global_model.pt", weights_only=False)["model"]
    for name in kept:
        np.testing.assert_allclose(restarted[name].numpy(), kept[name].numpy(), rtol=1e-5, atol=1e-6)
