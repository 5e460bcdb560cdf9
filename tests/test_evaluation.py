"""Evaluation a federation expects: each site's local test split, the local figures every round, cross-site
evaluation (``validate``/``submit_model``), the spread across sites and the best global model.

The end-to-end runs use NVFlare's real simulator with ``add_cross_site_evaluation``: FedAvg with every client process
kept (-n 2 -t 2), its key metric the sites' mean local accuracy (no server evaluation); MOON with a new process per
task (-n 2 -t 1), so that ``submit_model`` must read the local model from the persisted state.
"""

import json

import numpy as np
import pytest
import torch
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import ReservedKey, ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.utils.fl_model_utils import FLModelUtils
from nvflare.recipe.utils import add_cross_site_evaluation, add_experiment_tracking
from torch.utils.data import TensorDataset

from nvflare_moon.core.site_metrics import site_spread, weighted_metric_means
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.core.training import evaluate
from nvflare_moon.core.weights import load_numpy_state, state_dict_to_numpy
from nvflare_moon.data import (
    TensorBatchLoader,
    load_dataset,
    proportional_test_split,
    site_partition,
    site_test_arrays,
    site_test_partition,
    test_transform,
)
from nvflare_moon.executors import FedAvgExecutor
from nvflare_moon.models import Network
from nvflare_moon.recipes import (
    FedAvgBaselineRecipe,
    FedProxRecipe,
    FedSiamDARecipe,
    FedSSCRecipe,
    MoonRecipe,
    ScaffoldRecipe,
)

from .conftest import TINY_TRAINING, export_and_run

SITES = {2: ["site-1", "site-2"], 1: ["site-1", "site-2"]}  # of the run with -t 2 and -t 1
SERVER_MODELS = ["SRV_FL_global_model.pt", "SRV_best_FL_global_model.pt"]


# ---- the local test split ---------------------------------------------------------------------------------------


def test_test_split_follows_the_training_class_proportions():
    train = [np.array([0, 0, 0, 0, 1]), np.array([0, 0, 0, 0, 1, 1, 1]), np.array([1, 1, 1, 1, 1, 1, 2])]
    # class 0: shares (½, ½, 0) of 10; class 1: (0.1, 0.3, 0.6) of 10; class 2: only site 3; class 3: nobody → even
    test_labels = np.array([0] * 10 + [1] * 10 + [2] * 4 + [3] * 6)
    parts = proportional_test_split(train, test_labels, seed=0)
    counts = [np.bincount(test_labels[p], minlength=4).tolist() for p in parts]
    assert counts == [[5, 1, 0, 2], [5, 3, 0, 2], [0, 6, 4, 2]]
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(test_labels)))  # every image exactly once
    again = proportional_test_split(train, test_labels, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = proportional_test_split(train, test_labels, seed=1)
    assert [np.bincount(test_labels[p], minlength=4).tolist() for p in other] == counts
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))  # the seed draws which images


def test_site_test_split_of_a_dataset_leaves_the_training_shards_alone():
    splits = load_dataset("synthetic")
    before = [p.copy() for p in site_partition(splits, 3, "dirichlet", 0.5, 0)]
    parts = site_test_partition(splits, 3, "dirichlet", 0.5, 0)
    assert all(np.array_equal(a, b) for a, b in zip(before, site_partition(splits, 3, "dirichlet", 0.5, 0)))
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(splits.test)))
    train_labels, test_labels = splits.train.labels.numpy(), splits.test.labels.numpy()
    class_sizes = np.bincount(test_labels, minlength=10)
    train_counts = np.stack([np.bincount(train_labels[p], minlength=10) for p in before])
    for j, part in enumerate(parts):
        expected = train_counts[j] / train_counts.sum(axis=0) * class_sizes
        assert np.all(np.abs(np.bincount(test_labels[part], minlength=10) - expected) < 1 + 1e-9)
    assert torch.equal(site_test_arrays(splits, "site-2", 3, "dirichlet", 0.5, 0).labels, splits.test.labels[parts[1]])


# ---- the spread across sites -------------------------------------------------------------------------------------


def test_site_spread_and_means_over_the_reporting_sites():
    spread = site_spread({"a": 0.5, "b": 0.8, "c": 0.2}, {"a": 1.0, "b": 1.0, "c": 2.0, "d": 5.0})
    assert spread.mean == pytest.approx((0.5 + 0.8 + 2 * 0.2) / 4)
    assert (spread.worst, spread.worst_site, spread.best, spread.best_site) == (0.2, "c", 0.8, "b")
    assert spread.std == pytest.approx(np.sqrt((0.0 + 0.09 + 0.09) / 3))
    assert site_spread({}, {"a": 1.0}) is None
    # a site without local test data reports no accuracy: it neither counts nor pulls the mean to 0
    means = weighted_metric_means({"a": {"loss": 1.0, "accuracy": 0.6}, "b": {"loss": 3.0}}, {"a": 0.25, "b": 0.75})
    assert means == pytest.approx({"loss": 2.5, "accuracy": 0.6})


# ---- the executor's bad input --------------------------------------------------------------------------------------


def site_context(site: str) -> FLContext:
    fl_ctx = FLContext()
    fl_ctx.set_prop(ReservedKey.IDENTITY_NAME, site, private=False, sticky=True)
    return fl_ctx


def test_validate_refuses_a_model_that_does_not_fit_and_an_empty_site_reports_nothing(caplog):
    net = Network(num_classes=10, out_dim=32, seed=0)
    data = DataSpec(dataset="synthetic", num_sites=3)
    training = TrainingSpec(batch_size=16, device="cpu", num_threads=1)
    executor = FedAvgExecutor(model=net, data=data, training=training)
    fl_ctx = site_context("site-1")
    executor.handle_event(EventType.START_RUN, fl_ctx)
    params = state_dict_to_numpy(Network(num_classes=10, out_dim=16, seed=0))  # another projection size
    del params["l3.bias"]
    reply = executor.execute("validate", FLModelUtils.to_shareable(FLModel(params=params)), fl_ctx, Signal())
    assert reply.get_return_code() == ReturnCode.BAD_TASK_DATA
    assert "missing ['l3.bias']" in caplog.text
    del params["l1.weight"], params["l1.bias"]
    params.update({k: v for k, v in state_dict_to_numpy(net).items() if k.startswith("l3.")})
    params.update({k: v for k, v in state_dict_to_numpy(net).items() if k.startswith("l1.")})
    reply = executor.execute("validate", FLModelUtils.to_shareable(FLModel(params=params)), fl_ctx, Signal())
    assert reply.get_return_code() == ReturnCode.BAD_TASK_DATA
    assert "l2.weight (16, 84) vs (32, 84)" in caplog.text

    good = FLModelUtils.to_shareable(FLModel(params=state_dict_to_numpy(net)))
    reply = FLModelUtils.from_shareable(executor.execute("validate", good, fl_ctx, Signal()))
    batches = TensorBatchLoader(
        site_test_arrays(load_dataset("synthetic"), "site-1", 3), 500, test_transform("synthetic"), False, False
    )
    assert reply.metrics == evaluate(net, batches, torch.device("cpu"))

    empty = FedAvgExecutor(
        model=net,
        data=data,
        training=training,
        val_dataset=TensorDataset(torch.zeros(0, 3, 32, 32), torch.zeros(0).long()),
    )
    empty.handle_event(EventType.START_RUN, fl_ctx)
    assert empty.evaluate_locally(net, fl_ctx) == {}
    assert "site-1 has no local test data" in caplog.text
    assert empty.execute("validate", good, fl_ctx, Signal()).get_return_code() == ReturnCode.EMPTY_RESULT


# ---- the recipes -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "recipe_class", [FedAvgBaselineRecipe, MoonRecipe, FedProxRecipe, ScaffoldRecipe, FedSSCRecipe, FedSiamDARecipe]
)
def test_every_recipe_takes_nvflares_cross_site_evaluation_and_early_stopping(recipe_class, tmp_path):
    recipe = recipe_class(min_clients=2, num_rounds=3, stop_cond="test_accuracy >= 0.9", patience=2, **TINY_TRAINING)
    add_cross_site_evaluation(recipe)
    recipe.export(str(tmp_path))
    (job_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    server = json.loads((job_dir / "app" / "config" / "config_fed_server.json").read_text())
    client = json.loads((job_dir / "app" / "config" / "config_fed_client.json").read_text())
    workflows = {w["path"].rsplit(".", 1)[-1]: w["args"] for w in server["workflows"]}
    assert "CrossSiteModelEval" in workflows
    (training,) = [args for name, args in workflows.items() if name != "CrossSiteModelEval"]
    assert (training["stop_cond"], training["patience"]) == ("test_accuracy >= 0.9", 2)
    assert client["executors"][0]["tasks"] == ["train", "validate", "submit_model"]


def test_bad_early_stopping_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="stop_cond must read"):
        MoonRecipe(min_clients=2, num_rounds=2, dataset="synthetic", stop_cond="accuracy is high")
    with pytest.raises(ValueError, match="patience"):
        MoonRecipe(min_clients=2, num_rounds=2, dataset="synthetic", patience=3)
    with pytest.raises(ValueError, match="patience"):
        MoonRecipe(min_clients=2, num_rounds=2, dataset="synthetic", stop_cond="accuracy >= 0.5", patience=0)


# ---- end to end ------------------------------------------------------------------------------------------------------


def local_test_batches(site: str, num_sites: int):
    return TensorBatchLoader(
        site_test_arrays(load_dataset("synthetic"), site, num_sites), 500, test_transform("synthetic"), False, False
    )


def local_accuracy(state: dict, site: str, num_sites: int) -> float:
    net = Network(num_classes=10, out_dim=256, seed=0)
    load_numpy_state(net, state)
    return evaluate(net, local_test_batches(site, num_sites), torch.device("cpu"))["accuracy"]


def saved_global(run, name: str) -> dict:
    return torch.load(run.server_dir() / "app_server" / name, weights_only=False)["model"]


def cross_val_results(run) -> dict:
    return json.loads((run.server_dir() / "cross_site_val" / "cross_val_results.json").read_text())


@pytest.fixture(scope="module")
def run_t2(tmp_path_factory):
    """FedAvg, every process kept, no server evaluation, with NVFlare's TensorBoard tracking."""
    recipe = FedAvgBaselineRecipe(
        name="fedavg_eval", min_clients=2, num_rounds=3, server_evaluation=False, **TINY_TRAINING
    )
    add_cross_site_evaluation(recipe)
    add_experiment_tracking(recipe, "tensorboard")
    return export_and_run(recipe, tmp_path_factory.mktemp("evaluation_t2"), n=2, t=2, timeout=900)


@pytest.fixture(scope="module")
def run_t1(tmp_path_factory):
    """MOON, a new client process for every task (14 of them)."""
    recipe = MoonRecipe(name="moon_eval", min_clients=2, num_rounds=2, **TINY_TRAINING)
    add_cross_site_evaluation(recipe)
    return export_and_run(recipe, tmp_path_factory.mktemp("evaluation_t1"), n=2, t=1, timeout=1800)


@pytest.fixture
def runs(request):
    """``runs[t]``: only the runs a test asks for are made."""

    class Runs:
        def __getitem__(self, t):
            return request.getfixturevalue(f"run_t{t}")

    return Runs()


def last_local_model(run, site: str, t: int) -> dict:
    if t == 2:  # FedAvg keeps it in its own record
        record = torch.load(run.site_dir(site) / "nvflare_moon" / "local_model.pt", weights_only=True)
        return record["payload"]["model"]
    return run.last_upload(site, "moon_state")[1]  # MOON's upload FIFO already holds it


@pytest.mark.e2e
@pytest.mark.parametrize("t", [2, 1])
def test_cross_site_evaluation_has_every_site_and_the_persisted_models(runs, t):
    run = runs[t]
    assert run.returncode == 0, run.output[-3000:]
    results = cross_val_results(run)
    sites = SITES[t]
    assert sorted(results) == sites
    final_round = run.global_metrics()[-1]
    for validator in sites:
        assert sorted(results[validator]) == sorted(SERVER_MODELS + sites)
        for owner in sites:  # every site's last local model, evaluated again on the validator's local test data
            expected = local_accuracy(last_local_model(run, owner, t), validator, len(sites))
            assert results[validator][owner]["accuracy"] == pytest.approx(expected, abs=1e-12)
        expected = local_accuracy(saved_global(run, "FL_global_model.pt"), validator, len(sites))
        assert results[validator]["SRV_FL_global_model.pt"]["accuracy"] == pytest.approx(expected, abs=1e-12)
        # the personalised figure of the last round is the submitted model on the site's own data
        reported = final_round["site_metrics"][validator]["local_model_accuracy"]
        assert reported == pytest.approx(results[validator][validator]["accuracy"], abs=1e-12)


@pytest.mark.e2e
@pytest.mark.parametrize("t", [2, 1])
def test_rounds_record_the_local_figures_and_their_spread(runs, t):
    records = runs[t].global_metrics()
    for record in records:
        per_site, weights = record["site_metrics"], record["site_weights"]
        assert sorted(per_site) == SITES[t]
        for name in ("accuracy", "local_model_accuracy"):
            values = [per_site[s][name] for s in SITES[t]]
            spread = record["spread"][name]
            assert spread["mean"] == pytest.approx(sum(weights[s] * per_site[s][name] for s in SITES[t]))
            assert (spread["worst"], spread["best"]) == (min(values), max(values))
            assert spread["std"] == pytest.approx(np.std(values))
    assert ("test_accuracy" in records[0]) == (t == 1)  # the FedAvg job runs without server evaluation


@pytest.mark.e2e
def test_best_model_is_the_global_model_the_sites_rated_best(runs):
    """Without server evaluation the key metric is the sites' weighted mean local accuracy of the model they received;
    the best file holds that model, and its accuracy recomputed on each site equals what the site reported."""
    records = runs[2].global_metrics()
    means = [r["spread"]["accuracy"]["mean"] for r in records]
    best = int(np.argmax(means))
    assert records[-1]["best_model"] == {
        "key_metric": "accuracy",
        "value": means[-1],
        "best_value": means[best],
        "round": best - 1,
    }
    best_model = saved_global(runs[2], "best_FL_global_model.pt")
    for site in SITES[2]:
        reported = records[best]["site_metrics"][site]["accuracy"]
        assert local_accuracy(best_model, site, 2) == pytest.approx(reported, abs=1e-12)


@pytest.mark.e2e
def test_site_figures_reach_nvflares_experiment_tracking(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = runs[2].global_metrics()
    for site in SITES[2]:  # written by NVFlare's TBAnalyticsReceiver from the sites' forwarded analytics events
        events = EventAccumulator(str(runs[2].server_dir() / "tb_events" / site))
        events.Reload()
        for name in ("accuracy", "local_model_accuracy"):
            scalars = events.Scalars(name)
            assert [e.step for e in scalars] == [r["round"] for r in records]
            expected = [r["site_metrics"][site][name] for r in records]
            assert [e.value for e in scalars] == pytest.approx(expected, abs=1e-6)  # stored as float32


@pytest.mark.e2e
def test_best_model_by_server_test_accuracy(runs):
    records = runs[1].global_metrics()
    accuracies = [r["test_accuracy"] for r in records]
    best = int(np.argmax(accuracies))
    assert records[-1]["best_model"]["round"] == best
    net = Network(num_classes=10, out_dim=256, seed=0)
    load_numpy_state(net, saved_global(runs[1], "best_FL_global_model.pt"))
    test = load_dataset("synthetic").test
    batches = TensorBatchLoader(test, 500, test_transform("synthetic"), False, False)
    assert evaluate(net, batches, torch.device("cpu"))["accuracy"] == pytest.approx(accuracies[best], abs=1e-12)
