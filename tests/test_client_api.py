"""The Client API helpers without NVFlare's runtime: job_id, site and the state folder are given, the server is a few
lines of the same core math. The simulator runs are in ``test_client_api_e2e.py``."""

import json
import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from nvflare.app_common.app_constant import AlgorithmConstants

from nvflare_moon.client import (
    PTFedSiamDAHelper,
    PTFedSSCHelper,
    PTMoonHelper,
    PTPersistentScaffoldHelper,
    StateFolderNotFound,
    state_folder,
)
from nvflare_moon.client import meta as keys
from nvflare_moon.client.state import find_run_folder
from nvflare_moon.core.aggregation import normalized_weights, weighted_average
from nvflare_moon.core.objectives import MoonObjective
from nvflare_moon.core.previous_uploads import PreviousUploads
from nvflare_moon.core.prototypes import select_prototypes, usable_class_means
from nvflare_moon.core.training import frozen_copy, sgd, train_local
from nvflare_moon.core.weights import load_numpy_state, state_dict_to_numpy
from nvflare_moon.models import Network
from nvflare_moon.recipes import (
    FedSiamDAScriptRecipe,
    FedSSCScriptRecipe,
    MoonScriptRecipe,
    ScaffoldScriptRecipe,
)

MOON_META = {keys.MOON_MU: 5.0, keys.MOON_TEMPERATURE: 0.5, keys.MOON_NUM_PREVIOUS_MODELS: 1}
FEDSSC_META = {
    **MOON_META,
    keys.FEDSSC_MU_GLOB: 1.0,
    keys.FEDSSC_MIN_CLASS_COUNT: 1,
    keys.FEDSSC_PROTOTYPE_CLIP_NORM: None,
    keys.FEDSSC_PROTOTYPE_NOISE_STD: 0.0,
}


def received(model: nn.Module, round_number: int, meta: dict):
    """What ``flare.receive()`` gives: an FLModel-like object with the global weights."""
    return SimpleNamespace(params=state_dict_to_numpy(model), current_round=round_number, meta=dict(meta))


def batches(site: int, round_number: int, count: int = 3):
    g = torch.Generator().manual_seed(100 * site + round_number)
    return [(torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(count)]


def test_helper_moon_trains_exactly_as_the_executor_path(tmp_path):
    """Two sites, three rounds of FedAvg: the executor's path (train_local on MoonObjective, the previous uploads kept
    by PreviousUploads) and a user loop with PTMoonHelper give the same global model."""
    executor_global, helper_global = Network(seed=1), Network(seed=1)
    executor_previous = {site: PreviousUploads(1) for site in (1, 2)}
    helpers = {}
    for round_number in range(3):
        executor_models, helper_models = [], []
        for site in (1, 2):
            net = Network(seed=9)
            net.load_state_dict(executor_global.state_dict())
            uploads = executor_previous[site]
            objective = MoonObjective(frozen_copy(net), uploads.models(net), mu=5.0, temperature=0.5)
            train_local(net, batches(site, round_number), objective, sgd(net, 0.01, 0.9, 1e-5), 2, torch.device("cpu"))
            uploads.restore({"payload": uploads.payload_after(round_number, net)}, round_number + 1, net)
            executor_models.append(state_dict_to_numpy(net))

            # the user's script: a new model object every round, as a restarted process would have
            model = Network(seed=9)
            if site not in helpers:
                helpers[site] = PTMoonHelper(model, state_dir=tmp_path, job_id="job", site=f"site-{site}")
            helper = helpers[site]
            helper.model = model
            model.load_state_dict(helper_global.state_dict())
            helper.start_round(received(helper_global, round_number, MOON_META))
            optimizer = sgd(model, 0.01, 0.9, 1e-5)
            model.train()
            for _ in range(2):
                for x, y in batches(site, round_number):
                    out = model(x)
                    loss = F.cross_entropy(out.logits, y) + helper.loss(x, out.projection)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            helper.save_local_model()
            helper_models.append(state_dict_to_numpy(model))
            if round_number > 0:
                contrastive = helper.mean_terms()["contrastive"]
                # exactly ln 2 would mean the previous model is the global one
                assert contrastive > 1e-3 and abs(contrastive - math.log(2)) > 1e-5
        weights = normalized_weights([1, 1])
        load_numpy_state(executor_global, weighted_average(executor_models, weights))
        load_numpy_state(helper_global, weighted_average(helper_models, weights))
    for name, value in executor_global.state_dict().items():
        torch.testing.assert_close(helper_global.state_dict()[name], value, rtol=1e-5, atol=1e-6)


def test_previous_model_is_the_one_saved_last_round_even_after_a_restart(tmp_path):
    model = Network(seed=0)
    first = PTMoonHelper(model, state_dir=tmp_path, job_id="job", site="site-1")
    first.start_round(received(model, 0, MOON_META))
    assert first.previous_models == []
    with torch.no_grad():
        model.l3.bias.add_(1.0)  # "training"
    first.save_local_model()
    sent = {k: v.clone() for k, v in model.state_dict().items()}

    restarted = PTMoonHelper(model, state_dir=tmp_path, job_id="job", site="site-1")  # a new process
    global_model = Network(seed=3)
    model.load_state_dict(global_model.state_dict())
    restarted.start_round(received(model, 1, MOON_META))
    (previous,) = restarted.previous_models
    for name, value in previous.state_dict().items():
        assert torch.equal(value, sent[name])


def test_the_helper_follows_the_cold_start_schedule_each_round_even_after_a_restart(tmp_path, caplog):
    schedule = {**MOON_META, keys.MOON_MU_OFF_ROUNDS: 2, keys.MOON_MU_RAMP_ROUNDS: 1}  # μ = 5: 0, 0, 2.5, 5
    model = Network(seed=0)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    mus, terms = [], []
    with caplog.at_level(logging.INFO):
        for round_number in range(4):
            helper = PTMoonHelper(model, state_dir=tmp_path, job_id="job", site="site-1")  # a new process each round
            helper.start_round(received(model, round_number, schedule))
            mus.append(helper.mu)
            terms.append(helper.loss(x, model(x).projection).item())
            helper.save_local_model()
    assert mus == [0.0, 0.0, 2.5, 5.0]
    assert terms[:2] == [0.0, 0.0] and terms[2] > 0 and math.isclose(terms[3], 2 * terms[2], rel_tol=1e-5)
    assert "site-1: round 2: mu = 2.5" in caplog.text
    helper.start_round(received(model, 4, MOON_META))  # a recipe that sends no schedule: the constant μ
    assert helper.mu == 5.0


def test_state_folder_is_found_in_process_and_external_and_never_shared(tmp_path):
    site_root = tmp_path / "site-1"
    for job in ("job-a", "job-b"):
        (site_root / job / "app_site-1").mkdir(parents=True)
    # in-process: the working directory is the site's workspace root
    assert find_run_folder("job-a", str(site_root)) == str(site_root / "job-a")
    # external process: the working directory is the app folder
    assert find_run_folder("job-b", str(site_root / "job-b" / "app_site-1")) == str(site_root / "job-b")
    a = state_folder("job-a", "site-1", cwd=str(site_root))
    b = state_folder("job-b", "site-1", cwd=str(site_root / "job-b" / "app_site-1"))
    assert a == str(site_root / "job-a" / "nvflare_moon") and b == str(site_root / "job-b" / "nvflare_moon")
    # an explicit state_dir wins, one folder per job and site
    mine = state_folder("job-a", "site-1", state_dir=str(tmp_path / "mine"))
    assert mine == str(tmp_path / "mine" / "job-a" / "site-1")


def test_two_concurrent_jobs_on_one_site_keep_separate_state(tmp_path, monkeypatch):
    site_root = tmp_path / "site-1"
    for job in ("job-a", "job-b"):
        (site_root / job).mkdir(parents=True)
    monkeypatch.chdir(site_root)  # in-process layout, both jobs' scripts in the same site workspace
    models = {job: Network(seed=seed) for job, seed in (("job-a", 1), ("job-b", 2))}
    helpers = {job: PTMoonHelper(models[job], job_id=job, site="site-1") for job in models}
    for round_number in range(2):
        for job, helper in helpers.items():  # interleaved, as two running jobs would be
            helper.start_round(received(models[job], round_number, MOON_META))
            if round_number == 1:  # each job's previous model is the one it saved itself
                (previous,) = helper.previous_models
                other = models["job-b" if job == "job-a" else "job-a"]
                assert torch.equal(previous.l3.bias, models[job].l3.bias)
                assert not torch.equal(previous.l3.bias, other.l3.bias)
            with torch.no_grad():
                models[job].l3.bias.add_(1.0)
            helper.save_local_model()
    assert (site_root / "job-a" / "nvflare_moon" / "moon_state.pt").exists()
    assert (site_root / "job-b" / "nvflare_moon" / "moon_state.pt").exists()
    assert not (site_root / "nvflare_moon").exists()


def test_missing_run_folder_fails_with_what_to_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # neither ./job nor an ancestor named job
    model = Network(seed=0)
    helper = PTMoonHelper(model, job_id="job", site="site-1")
    with pytest.raises(StateFolderNotFound, match=r"pass state_dir=.*<state_dir>/job/site-1"):
        helper.start_round(received(model, 0, MOON_META))


def test_unusable_state_is_set_aside_and_the_round_trains_without_the_term(tmp_path, caplog):
    model = Network(seed=0)
    helper = PTMoonHelper(model, state_dir=tmp_path, job_id="job", site="site-1")
    folder = tmp_path / "job" / "site-1"
    folder.mkdir(parents=True)
    (folder / "moon_state.pt").write_bytes(b"not a state file")
    with caplog.at_level(logging.WARNING):
        helper.start_round(received(model, 1, MOON_META))
    assert "cannot be used" in caplog.text and "without the contrastive term" in caplog.text
    assert helper.previous_models == []
    assert list(folder.glob("moon_state.pt.unusable-*"))
    x = torch.randn(4, 3, 32, 32)
    assert helper.loss(x, model(x).projection).item() == 0.0


def test_forgotten_save_is_named_in_the_next_round(tmp_path, caplog):
    model = Network(seed=0)
    helper = PTMoonHelper(model, state_dir=tmp_path, job_id="job", site="site-1")
    helper.start_round(received(model, 0, MOON_META))  # trains, but never calls save_local_model()
    with caplog.at_level(logging.WARNING):
        PTMoonHelper(model, state_dir=tmp_path, job_id="job", site="site-1").start_round(received(model, 1, MOON_META))
    assert "trained round 0 but saved no model" in caplog.text and "PTMoonHelper.save_local_model()" in caplog.text


def test_missing_settings_and_unloaded_weights_are_refused(tmp_path):
    model = Network(seed=0)
    helper = PTMoonHelper(model, state_dir=tmp_path, job_id="job", site="site-1")
    with pytest.raises(ValueError, match="no 'moon_temperature'.*MoonScriptRecipe"):
        helper.start_round(received(model, 0, {keys.MOON_MU: 1.0}))
    with pytest.raises(ValueError, match=r"load_state_dict\(input_model.params\) before"):
        helper.start_round(received(Network(seed=5), 0, MOON_META))


def test_fedssc_prototypes_round_trip_through_the_meta(tmp_path):
    """Sites upload class means in the meta, the server's draw picks prototypes, the next round's helper uses them."""
    uploads = {}
    global_model = Network(seed=0)
    for site in ("site-1", "site-2"):
        model = Network(seed=0)
        helper = PTFedSSCHelper(model, num_classes=10, state_dir=tmp_path, job_id="job", site=site)
        helper.start_round(received(model, 0, FEDSSC_META))
        assert helper.round.objective.prototypes is None
        for x, y in batches(int(site[-1]), 0, count=4):
            helper.loss(x, model(x).projection, y)
        helper.save_local_model()
        sent = helper.upload_meta(num_samples=32)
        assert sent[keys.NUM_SAMPLES] == 32 and sent[keys.CLASS_MEANS].shape == (10, 256)
        means, counts, problems = usable_class_means(sent[keys.CLASS_MEANS], sent[keys.CLASS_COUNTS], 10, 256)
        assert problems == []
        uploads[site] = (means, counts)
    shared = select_prototypes(uploads, 10, 256, 1, np.random.default_rng([0, 0]))
    model = Network(seed=0)
    helper = PTFedSSCHelper(model, num_classes=10, state_dir=tmp_path, job_id="job", site="site-1")
    helper.start_round(received(global_model, 1, {**FEDSSC_META, **shared.meta()}))
    assert torch.equal(helper.round.objective.available, torch.as_tensor(shared.available))
    assert torch.equal(helper.round.objective.prototypes, torch.as_tensor(shared.prototypes))
    x, y = batches(1, 1)[0]
    helper.loss(x, model(x).projection, y)
    assert helper.mean_terms()["prototype_contrastive"] > 0 and "contrastive" in helper.mean_terms()


def test_fedsiam_da_history_survives_a_restart_and_the_working_copy_steps(tmp_path):
    meta = {keys.FEDSIAM_DA_MU: 1.0, keys.FEDSIAM_DA_HISTORY: "epoch", keys.FEDSIAM_DA_HISTORY_BRANCH: "projection"}
    model = Network(seed=0, predictor_hidden_dim=8)
    first = PTFedSiamDAHelper(model, state_dir=tmp_path, job_id="job", site="site-1")
    optimizer = sgd(model, 0.05, 0.9, 0.0)
    first.start_round(received(model, 0, meta), optimizer)
    assert first.history_model is None
    before = {k: v.clone() for k, v in first.objective.working_global.state_dict().items()}
    for x, y in batches(1, 0):
        out = model(x)
        loss = F.cross_entropy(out.logits, y) + first.loss(x, out.projection)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        first.step()
    after = first.objective.working_global.state_dict()
    assert not torch.equal(before["l2.weight"], after["l2.weight"])  # it learned through D(p_g, z_l)
    first.save_local_model()
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    restarted_model = Network(seed=4, predictor_hidden_dim=8)
    restarted = PTFedSiamDAHelper(restarted_model, state_dir=tmp_path, job_id="job", site="site-1")
    restarted.start_round(received(restarted_model, 1, meta), sgd(restarted_model, 0.05, 0.9, 0.0))
    for name, value in restarted.history_model.state_dict().items():
        assert torch.equal(value, saved[name])
    x, _ = batches(1, 1)[0]
    restarted.loss(x, restarted_model(x).projection)
    assert set(restarted.mean_terms()) == {"siamese", "history"}


def test_fedsiam_da_script_recipe_sends_the_history_branch_and_the_helper_uses_it(tmp_path):
    script = tmp_path / "client.py"
    script.write_text("print('the script')\n")
    recipe = FedSiamDAScriptRecipe(
        model=Network(predictor_hidden_dim=8),
        min_clients=2,
        train_script=str(script),
        mu=0.1,
        history_branch="predictor",
        cosine_vector="parameters",
    )
    assert recipe.client_settings() == {
        keys.FEDSIAM_DA_MU: 0.1,
        keys.FEDSIAM_DA_HISTORY: "epoch",
        keys.FEDSIAM_DA_HISTORY_BRANCH: "predictor",
    }
    assert recipe.aggregator.cosine_vector == "parameters"
    for bad in ({"history_branch": "z"}, {"cosine_vector": "weights"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FedSiamDAScriptRecipe(model=Network(predictor_hidden_dim=8), min_clients=2, train_script=str(script), **bad)
    model = Network(seed=0, predictor_hidden_dim=8)
    helper = PTFedSiamDAHelper(model, state_dir=tmp_path, job_id="job", site="site-1")
    helper.start_round(received(model, 0, recipe.client_settings()), sgd(model, 0.05, 0.9, 0.0))
    assert helper.settings.history_branch == "predictor" and helper.objective.history_branch == "predictor"
    without = {k: v for k, v in recipe.client_settings().items() if k != keys.FEDSIAM_DA_HISTORY_BRANCH}
    with pytest.raises(ValueError, match=keys.FEDSIAM_DA_HISTORY_BRANCH):
        helper.start_round(received(model, 1, without), sgd(model, 0.05, 0.9, 0.0))


def test_recipes_send_the_settings_and_keep_fedavg_recipe_arguments(tmp_path):
    script = tmp_path / "client.py"
    script.write_text("print('the script')\n")
    recipe = MoonScriptRecipe(
        model=Network(),
        min_clients=2,
        num_rounds=3,
        train_script=str(script),
        mu=1.5,
        temperature=0.2,
        num_previous_models=2,
        mu_off_rounds=3,
        launch_external_process=True,
        stop_cond="accuracy >= 0.9",
        patience=2,
    )
    recipe.export(str(tmp_path / "jobs"))
    (server,) = (tmp_path / "jobs").glob("*/app/config/config_fed_server.json")
    (client,) = (tmp_path / "jobs").glob("*/app/config/config_fed_client.json")
    (controller,) = json.loads(server.read_text())["workflows"]
    assert controller["path"] == "nvflare_moon.server.settings.SettingsFedAvg"
    assert controller["args"]["client_settings"] == {
        keys.MOON_MU: 1.5,
        keys.MOON_TEMPERATURE: 0.2,
        keys.MOON_NUM_PREVIOUS_MODELS: 2,
        keys.MOON_MU_OFF_ROUNDS: 3,
        keys.MOON_MU_RAMP_ROUNDS: 0,
        keys.MOON_REPRESENTATION_LOSS: "contrastive",
        keys.MOON_FEATURE_NOISE_STD: 0.0,
        keys.MOON_LIGHT_HISTORY: False,
    }
    assert controller["args"]["aggregator"]["path"] == "nvflare_moon.server.aggregators.WeightedFedAvgAggregator"
    assert controller["args"]["num_rounds"] == 3 and controller["args"]["patience"] == 2
    assert controller["args"]["stop_cond"] == "accuracy >= 0.9"
    assert '"execution_mode": "external_process"' in client.read_text()
    with pytest.raises(ValueError, match="brings its own aggregator"):
        MoonScriptRecipe(model=Network(), min_clients=2, train_script=str(script), aggregator=object())
    scaffold = ScaffoldScriptRecipe(model=Network(), min_clients=3, train_script=str(script))
    assert scaffold.aggregator.num_sites == 3
    with pytest.raises(ValueError, match="mu_glob"):
        FedSSCScriptRecipe(
            model=Network(), min_clients=2, train_script=str(script), num_classes=10, prototype_dim=256, mu_glob=-1
        )


def test_scaffold_control_survives_a_restart(tmp_path):
    """NVFlare's PTScaffoldHelper would restart c_i from 0 in a new process; the persistent helper reloads it."""
    model = Network(seed=0)
    first = PTPersistentScaffoldHelper(model, state_dir=tmp_path, job_id="job", site="site-1")
    first.start_round(received(model, 0, {}), lr=0.05)
    optimizer = sgd(model, 0.05, 0.0, 0.0)
    for x, y in batches(1, 0):
        loss = F.cross_entropy(model(x).logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        first.step()
    sent = first.finish()
    delta = sent[AlgorithmConstants.SCAFFOLD_CTRL_DIFF]
    control = {k: v.clone() for k, v in first.round.local_control.items()}
    assert any(np.abs(d).max() > 0 for d in delta.values())

    restarted = PTPersistentScaffoldHelper(model, state_dir=tmp_path, job_id="job", site="site-1")  # a new process
    global_control = {k: np.zeros_like(v) for k, v in delta.items()}
    restarted.start_round(received(model, 1, {AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL: global_control}), lr=0.05)
    for name, value in restarted.round.local_control.items():
        assert torch.equal(value, control[name])
    with pytest.raises(ValueError, match="no SCAFFOLD global control"):
        restarted.start_round(received(model, 2, {}), lr=0.05)


def test_scaffold_helper_runs_a_saved_round_again_from_the_control_it_started_with(tmp_path):
    """A continued job runs the failed job's last round again: it must start from c_i before that round, not after."""
    model = Network(seed=0)
    controls = []  # c_i after rounds 0 and 1
    for round_number in (0, 1):
        helper = PTPersistentScaffoldHelper(model, state_dir=tmp_path, job_id="job", site="site-1")  # a new process
        global_control = {n: np.zeros(tuple(p.shape), np.float32) for n, p in model.named_parameters()}
        helper.start_round(
            received(model, round_number, {AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL: global_control}), 0.05
        )
        optimizer = sgd(model, 0.05, 0.0, 0.0)
        for x, y in batches(1, round_number):
            optimizer.zero_grad()
            F.cross_entropy(model(x).logits, y).backward()
            optimizer.step()
            helper.step()
        helper.finish()
        controls.append({k: v.clone() for k, v in helper.round.local_control.items()})
    assert any(not torch.equal(controls[0][k], controls[1][k]) for k in controls[0])
    again = PTPersistentScaffoldHelper(model, state_dir=tmp_path, job_id="job", site="site-1")
    again.start_round(received(model, 1, {AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL: global_control}), lr=0.05)
    assert all(torch.equal(value, controls[0][name]) for name, value in again.round.local_control.items())
    later = PTPersistentScaffoldHelper(model, state_dir=tmp_path, job_id="job", site="site-1")
    later.start_round(received(model, 2, {AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL: global_control}), lr=0.05)
    assert all(torch.equal(value, controls[1][name]) for name, value in later.round.local_control.items())
