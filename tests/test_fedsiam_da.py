"""FedSiam-DA: the predictor, the three-branch objective and its gradients, dual aggregation, and the whole job."""

import copy
import json
import logging
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from nvflare.apis.fl_constant import ReturnCode
from nvflare.app_common.abstract.fl_model import FLModel

from nvflare_moon.core.aggregation import weighted_average
from nvflare_moon.core.dual_aggregation import dual_aggregate, float_vector, vector_keys
from nvflare_moon.core.fedsiam_da import FedSiamDASettings
from nvflare_moon.core.losses import simsiam_distance
from nvflare_moon.core.objectives import FedSiamDAObjective
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.core.training import frozen_copy, sgd, train_local
from nvflare_moon.executors import FedSiamDAExecutor
from nvflare_moon.models import Network, ProjectionModel
from nvflare_moon.recipes import FedSiamDARecipe
from nvflare_moon.server import DualAggregator

from .conftest import REPO, TINY_TRAINING, export_and_run
from .executor_harness import run_task, site_context, started, tiny_dataset

SITES = ["site-1", "site-2", "site-3"]
RUN_SITES = SITES[:2]  # the sites of the simulator runs
ROUNDS = 2


def n_params(model):
    return sum(p.numel() for p in model.parameters())


# ---- the predictor -----------------------------------------------------------------------------------------------


def test_predictor_is_simsiams_mlp_and_is_part_of_the_aggregated_state():
    net = Network(predictor_hidden_dim=64)
    linear_in, bn, relu, linear_out = net.predictor
    assert (linear_in.in_features, linear_in.out_features) == (256, 64)
    assert isinstance(bn, nn.BatchNorm1d) and bn.num_features == 64 and isinstance(relu, nn.ReLU)
    assert (linear_out.in_features, linear_out.out_features) == (64, 256)
    assert n_params(net) == 92_626 + (256 * 64 + 64) + 2 * 64 + (64 * 256 + 256)
    predictor_entries = {"predictor.1.running_mean", "predictor.1.num_batches_tracked", "predictor.3.weight"}
    assert predictor_entries <= set(net.state_dict())
    plain = Network()
    assert plain.predictor is None and n_params(plain) == 92_626
    for name, value in plain.state_dict().items():  # the predictor does not shift the other layers' initial weights
        torch.testing.assert_close(net.state_dict()[name], value)


# ---- D and the objective -----------------------------------------------------------------------------------------


def test_simsiam_distance_by_hand_and_only_p_learns():
    p = torch.tensor([[1.0, 0.0], [1.0, 1.0]], requires_grad=True)
    z = torch.tensor([[0.0, 2.0], [2.0, 2.0]], requires_grad=True)
    d = simsiam_distance(p, z)
    assert d.item() == pytest.approx(-(0.0 + 1.0) / 2)
    d.backward()
    assert p.grad is not None and z.grad is None


def tiny_net(seed=0):
    torch.manual_seed(seed)
    return ProjectionModel(
        nn.Sequential(nn.Flatten(), nn.Linear(12, 6)), feat_dim=6, num_classes=3, out_dim=4, predictor_hidden_dim=3
    )


def batches(n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 3, 2, 2, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def make_sgd(model):
    return sgd(model, 0.1, 0.9, 0.0)


def round_after_some_local_training(mu=0.7, history="epoch"):
    """An objective whose local model has moved away from the received global model, as during a round."""
    net = tiny_net()
    objective = FedSiamDAObjective(net, frozen_copy(tiny_net(seed=9)), mu, make_sgd, history=history)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return net, objective


def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_objective_value_matches_a_hand_computation_from_the_three_branches():
    net, objective = round_after_some_local_training(mu=0.7)
    x, y = batches(1)[0]
    out = net(x)
    loss, terms = objective(out, x, y)
    with torch.no_grad():  # every branch's outputs, on the same batch (BN in train mode, as in the objective)
        z_l, p_l = out.projection.tolist(), net.predictor(out.projection).tolist()
        z_g_t = objective.working_global(x).projection
        z_g, p_g = z_g_t.tolist(), objective.working_global.predictor(z_g_t).tolist()
        z_h = objective.history_model(x).projection.tolist()
        ce = F.cross_entropy(out.logits, y).item()
    n = len(y)
    siamese = sum(0.5 * -cos(p_g[i], z_l[i]) + 0.5 * -cos(p_l[i], z_g[i]) for i in range(n)) / n
    history = sum(cos(z_l[i], z_h[i]) for i in range(n)) / n
    assert terms["siamese"].item() == pytest.approx(siamese, rel=1e-5)
    assert terms["history"].item() == pytest.approx(history, rel=1e-5)
    assert loss.item() == pytest.approx(ce + 0.7 * (siamese + history), rel=1e-5)


def test_history_on_the_predictor_matches_a_hand_computation_and_reaches_the_predictor():
    """history_branch="predictor" reads cos(p_l, sg z_h); "projection" (the default) cos(z_l, sg z_h), which gives the
    predictor no gradient."""
    net, objective = round_after_some_local_training(mu=0.7)
    x, y = batches(1)[0]
    with torch.no_grad():
        z_l_t = net(x).projection
        z_l, p_l = z_l_t.tolist(), net.predictor(z_l_t).tolist()
        z_h = objective.history_model(x).projection.tolist()
    n = len(y)
    by_hand = {
        "projection": sum(cos(z_l[i], z_h[i]) for i in range(n)) / n,
        "predictor": sum(cos(p_l[i], z_h[i]) for i in range(n)) / n,
    }
    assert abs(by_hand["projection"] - by_hand["predictor"]) > 1e-3  # the two readings differ on this batch
    assert objective.history_branch == "projection"
    for branch in ("projection", "predictor"):
        objective.history_branch = branch
        net.zero_grad()
        _, terms = objective(net(x), x, y)
        assert terms["history"].item() == pytest.approx(by_hand[branch], rel=1e-5), branch
        terms["history"].backward()
        reached = [p.grad is not None and p.grad.abs().sum() > 0 for p in net.predictor.parameters()]
        assert any(reached) == (branch == "predictor"), branch
        assert net.l1.weight.grad.abs().sum() > 0  # either way it pushes the encoder
    with pytest.raises(ValueError, match="history_branch"):
        FedSiamDAObjective(net, None, 1.0, make_sgd, history_branch="logits")


def grads(loss, params):
    return torch.autograd.grad(loss, params, allow_unused=True)


def test_gradients_follow_the_stop_gradients():
    net, objective = round_after_some_local_training(mu=0.7)
    working, history = objective.working_global, objective.history_model
    x, y = batches(1)[0]
    loss, _ = objective(net(x), x, y)
    loss.backward()
    assert all(p.grad is None for p in history.parameters())  # frozen
    assert working.l3.weight.grad is None and working.l3.bias.grad is None  # no CE on the working copy

    # The working copy learns only through D(p_g, z_l): recompute that term alone on fresh copies.
    local_only, working_only = copy.deepcopy(net), copy.deepcopy(working)
    z_l = local_only(x).projection
    z_g = working_only(x).projection
    only_pg = 0.7 * 0.5 * simsiam_distance(working_only.predictor(z_g), z_l)
    expected = grads(only_pg, list(working_only.parameters()))
    for (name, p), e in zip(working.named_parameters(), expected):
        if e is None:
            assert p.grad is None, name
        else:
            torch.testing.assert_close(p.grad, e, msg=name)

    # The local model gets CE + D(p_l, z_g) + the history term, and nothing from D(p_g, z_l) (its stop-gradient side).
    out = local_only(x)
    p_l = local_only.predictor(out.projection)
    with torch.no_grad():
        z_g = working_only(x).projection
        z_h = history(x).projection
    local_terms = F.cross_entropy(out.logits, y) + 0.7 * (
        0.5 * simsiam_distance(p_l, z_g) - simsiam_distance(out.projection, z_h)
    )
    expected = grads(local_terms, list(local_only.parameters()))
    for (name, p), e in zip(net.named_parameters(), expected):
        torch.testing.assert_close(p.grad, e, msg=name)


def test_history_epoch_uses_the_previous_upload_first_then_the_last_epochs_model():
    net = tiny_net()
    previous = frozen_copy(tiny_net(seed=9))
    objective = FedSiamDAObjective(net, previous, 1.0, make_sgd, history="epoch")
    objective.start_epoch(0)
    assert objective.history_model is previous
    with torch.no_grad():
        net.l1.weight.add_(1.0)
    objective.start_epoch(1)
    snapshot = objective.history_model
    assert snapshot is not previous and not snapshot.training
    assert all(not p.requires_grad for p in snapshot.parameters())
    torch.testing.assert_close(snapshot.l1.weight, net.l1.weight)
    with torch.no_grad():
        net.l1.weight.add_(1.0)
    assert not torch.equal(snapshot.l1.weight, net.l1.weight)  # a copy, not the live model


def test_history_round_keeps_the_previous_upload_all_round():
    previous = frozen_copy(tiny_net(seed=9))
    objective = FedSiamDAObjective(tiny_net(), previous, 1.0, make_sgd, history="round")
    for epoch in range(3):
        objective.start_epoch(epoch)
        assert objective.history_model is previous


def test_without_any_history_the_term_is_dropped():
    net = tiny_net()
    objective = FedSiamDAObjective(net, None, 2.0, make_sgd, history="round")
    x, y = batches(1)[0]
    loss, terms = objective(net(x), x, y)
    assert "history" not in terms
    assert loss.item() == pytest.approx(terms["ce"].item() + 2.0 * terms["siamese"].item(), rel=1e-6)


def test_the_working_global_copy_trains_in_the_same_steps_and_leaves_the_global_weights_alone():
    net = tiny_net()
    received = copy.deepcopy(net.state_dict())
    objective = FedSiamDAObjective(net, None, 1.0, make_sgd)
    result = train_local(
        net,
        batches(),
        objective,
        make_sgd(net),
        2,
        torch.device("cpu"),
        after_step=objective.step_working_global,
        before_epoch=objective.start_epoch,
    )
    assert result.steps == 8 and set(result.mean_terms) == {"ce", "siamese", "history", "loss"}
    working = objective.working_global
    assert working is not net and working.training
    momentum = objective.working_optimizer.state[working.l1.weight]["momentum_buffer"]
    assert momentum is not None and all(p.grad is None for p in working.parameters())
    assert not torch.equal(working.l1.weight, received["l1.weight"])  # it learned
    torch.testing.assert_close(working.l3.weight, received["l3.weight"])  # ... but never from CE
    assert not torch.equal(working.l1.weight, net.l1.weight)


@pytest.mark.parametrize(
    "arguments, name",
    [
        (lambda: {"settings": FedSiamDASettings(history="step")}, "history"),
        (lambda: {"settings": FedSiamDASettings(mu=-1.0)}, "mu"),
        (lambda: {"training": TrainingSpec(batch_size=1)}, "batch_size"),
    ],
    ids=["history", "mu", "batch_size"],
)
def test_bad_executor_arguments_are_refused_by_name(arguments, name):
    with pytest.raises(ValueError, match=name):  # by the settings, or by the executor (batch_size)
        FedSiamDAExecutor(model=Network(predictor_hidden_dim=64), **arguments())


def test_a_model_without_predictor_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="predictor_hidden_dim=64"):
        FedSiamDAExecutor(model=Network())
    with pytest.raises(ValueError, match="predictor_hidden_dim=64"):
        FedSiamDAObjective(Network(), None, 1.0, make_sgd)


# ---- dual aggregation --------------------------------------------------------------------------------------------


def test_dual_aggregation_matches_a_hand_computation():
    # float entries a and b together form vec(w); the integer buffer n is left out of it
    w1 = {"a": np.array([1.0], np.float32), "b": np.array([0.0], np.float32), "n": np.array(0, np.int64)}
    w2 = {"a": np.array([1.0], np.float32), "b": np.array([1.0], np.float32), "n": np.array(100, np.int64)}
    result = dual_aggregate([w1, w2], np.array([0.5, 0.5]))
    # w_f0 = (1, 0.5); cos1 = 1/‖w_f0‖, cos2 = 1.5/(√2·‖w_f0‖)
    norm_f0 = math.sqrt(1.25)
    c1, c2 = 1 / norm_f0, 1.5 / (math.sqrt(2) * norm_f0)
    np.testing.assert_allclose(result.cosines, [c1, c2], rtol=1e-12)
    xi1, xi2 = c1 / (c1 + c2), c2 / (c1 + c2)
    np.testing.assert_allclose(result.xi, [xi1, xi2], rtol=1e-12)
    np.testing.assert_allclose(result.params["a"], [1.0], rtol=1e-6)
    np.testing.assert_allclose(result.params["b"], [xi2], rtol=1e-6)
    assert result.params["a"].dtype == np.float32
    assert result.params["n"] == 50 and result.params["n"].dtype == np.int64  # from w_f0, not Σ ξ_k n_k ≈ 51.5
    assert not result.clamped.any()


def test_cosines_of_large_models_agree_with_blas_to_rounding():
    """The server's cosines are summed by numpy, not BLAS (a BLAS call in the forked simulator server can hang); on a
    model-sized vector they must equal the BLAS value to float64 rounding."""
    rng = np.random.default_rng(0)
    models = [{"w": rng.normal(size=300_000).astype(np.float32)} for _ in range(3)]
    result = dual_aggregate(models, np.full(3, 1 / 3))
    mean = weighted_average(models, np.full(3, 1 / 3))["w"].astype(np.float64)  # w_f0
    for model, cosine in zip(models, result.cosines):
        w = model["w"].astype(np.float64)
        assert cosine == pytest.approx(float(w @ mean / (np.linalg.norm(w) * np.linalg.norm(mean))), rel=1e-12)


def test_non_positive_cosines_are_clamped_to_epsilon():
    models = [{"w": np.array(v)} for v in ([1.0, 0.0], [1.0, 1.0], [-1.0, 0.0])]
    result = dual_aggregate(models, np.array([0.4, 0.4, 0.2]), cosine_floor=1e-3)
    # w_f0 = (0.6, 0.4): cosines 0.6/‖w_f0‖, 1/(√2‖w_f0‖), −0.6/‖w_f0‖ → the last is clamped to ε
    norm_f0 = math.sqrt(0.52)
    c = [0.6 / norm_f0, 1.0 / (math.sqrt(2) * norm_f0), -0.6 / norm_f0]
    np.testing.assert_allclose(result.cosines, c, rtol=1e-12)
    numerators = np.array([c[0], c[1], 1e-3])
    np.testing.assert_allclose(result.xi, numerators / numerators.sum(), rtol=1e-12)
    np.testing.assert_array_equal(result.clamped, [False, False, True])
    np.testing.assert_allclose(result.params["w"], sum(x * np.array(m["w"]) for x, m in zip(result.xi, models)))


def test_a_zero_fedavg_model_gives_uniform_weights():
    result = dual_aggregate([{"w": np.array([1.0])}, {"w": np.array([-1.0])}], np.array([0.5, 0.5]))
    assert result.clamped.all()
    np.testing.assert_allclose(result.xi, [0.5, 0.5])


def test_float_vector_is_the_sorted_float_entries():
    params = {"z": np.array([3.0]), "a": np.array([[1.0, 2.0]]), "k": np.array(5, np.int64)}
    np.testing.assert_array_equal(float_vector(params, vector_keys(params)), [1.0, 2.0, 3.0])


def test_dual_aggregator_logs_xi_in_meta_and_warns_naming_the_clamped_site(caplog):
    aggregator = DualAggregator(cosine_floor=1e-3)
    for site, w in (("site-1", [1.0, 0.0]), ("site-2", [1.0, 1.0]), ("site-3", [-1.0, 0.0])):
        n = 200 if site == "site-3" else 400
        params = {"w": np.array(w, np.float32), "bn.num_batches_tracked": np.array(7, np.int64)}
        assert aggregator.accept_model(FLModel(params=params, meta={"client_name": site, "num_samples": n}))
    with caplog.at_level(logging.WARNING):
        result = aggregator.aggregate_model()
    assert "site-3" in caplog.text and "clamped" in caplog.text and "site-1" not in caplog.text
    xi = result.meta["site_dual_weights"]
    assert list(xi) == SITES and sum(xi.values()) == pytest.approx(1.0)
    assert all(isinstance(v, float) for v in xi.values())
    expected = dual_aggregate(
        [{"w": np.array(w, np.float32)} for w in ([1.0, 0.0], [1.0, 1.0], [-1.0, 0.0])], np.array([0.4, 0.4, 0.2]), 1e-3
    )
    assert list(xi.values()) == pytest.approx(expected.xi.tolist())
    np.testing.assert_allclose(result.params["w"], expected.params["w"], rtol=1e-6)
    assert result.params["bn.num_batches_tracked"] == 7
    assert result.meta["site_dual_cosines"]["site-3"] < 0


def bn_state_dicts():
    """Two sites' simple-CNN state dicts with the predictor (BatchNorm): weights and running statistics differ."""
    models = []
    for seed in (1, 2):
        net = Network(predictor_hidden_dim=64, seed=0)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=generator))
            net.train()(torch.randn(16, 3, 32, 32, generator=generator))  # BN statistics from the site's batch
        models.append({k: v.numpy().copy() for k, v in net.state_dict().items()})
    return models, dict(Network(predictor_hidden_dim=64).named_parameters())


def torch_cosines(models, weights, keys):
    flat = [torch.cat([torch.as_tensor(m[k], dtype=torch.float64).flatten() for k in keys]) for m in models]
    fedavg = sum(w * f for w, f in zip(weights, flat))
    return [float(F.cosine_similarity(f, fedavg, dim=0)) for f in flat]


def test_dual_aggregation_vector_on_a_real_state_dict_with_batchnorm():
    """The default ("state") vector holds every float entry, BatchNorm running statistics included; "parameters"
    holds exactly the network's parameters."""
    models, parameters = bn_state_dicts()
    weights = [0.3, 0.7]
    statistics = [k for k in models[0] if k.endswith(("running_mean", "running_var"))]
    assert statistics and "predictor.1.running_var" in statistics and "predictor.1.num_batches_tracked" in models[0]
    assert vector_keys(models[0], "parameters") == sorted(parameters)
    floats = sorted(k for k in models[0] if not k.endswith("num_batches_tracked"))
    assert vector_keys(models[0]) == vector_keys(models[0], "state") == floats
    expected = {
        "state": torch_cosines(models, weights, floats),
        "parameters": torch_cosines(models, weights, sorted(parameters)),
    }
    assert abs(expected["state"][0] - expected["parameters"][0]) > 1e-4  # the statistics move the cosine
    for vector in ("state", "parameters"):
        result = dual_aggregate(models, np.array(weights), vector=vector)
        np.testing.assert_allclose(result.cosines, expected[vector], rtol=1e-9, err_msg=vector)
        np.testing.assert_allclose(result.xi, np.array(expected[vector]) / sum(expected[vector]), rtol=1e-9)
        for key in statistics:  # the second aggregation averages the statistics with ξ either way
            np.testing.assert_allclose(
                result.params[key], result.xi[0] * models[0][key] + result.xi[1] * models[1][key], rtol=1e-5
            )
    # the server component's default is the documented vector, BatchNorm statistics included
    aggregator = DualAggregator()
    assert aggregator.cosine_vector == "state"
    for site, model, n in zip(("site-1", "site-2"), models, (300, 700)):
        assert aggregator.accept_model(FLModel(params=model, meta={"client_name": site, "num_samples": n}))
    result = aggregator.aggregate_model()
    assert list(result.meta["site_dual_cosines"].values()) == pytest.approx(expected["state"], rel=1e-9)
    with pytest.raises(ValueError, match="vector"):
        vector_keys(models[0], "weights")


def test_dual_aggregator_refuses_a_bad_floor():
    with pytest.raises(ValueError, match="cosine_floor"):
        DualAggregator(cosine_floor=0.0)


# ---- the whole job -----------------------------------------------------------------------------------------------


def test_committed_job_has_the_defaults():
    client = json.loads((REPO / "jobs/fedsiam_da_cifar10/app/config/config_fed_client.json").read_text())
    args = client["executors"][0]["executor"]["args"]
    settings, data, training = (args[name]["args"] for name in ("settings", "data", "training"))
    assert (settings["mu"], settings["history"], data["dataset"], training["local_epochs"]) == (
        0.01,
        "epoch",
        "cifar10",
        10,
    )
    assert settings["history_branch"] == "projection"
    assert args["model"]["args"]["predictor_hidden_dim"] == 64
    server = json.loads((REPO / "jobs/fedsiam_da_cifar10/app/config/config_fed_server.json").read_text())
    assert server["workflows"][0]["args"]["aggregator"]["path"].endswith("DualAggregator")
    # the server's copies of the network (persistor, evaluator) have the predictor too
    models = [c["args"]["model"] for c in server["components"] if "model" in c["args"]]
    assert [m["args"]["predictor_hidden_dim"] for m in models] == [64, 64]


def test_recipe_refuses_bad_settings_by_name():
    with pytest.raises(ValueError, match="history"):
        FedSiamDARecipe(history="batch")
    with pytest.raises(ValueError, match="cosine_floor"):
        FedSiamDARecipe(cosine_floor=-1.0)
    with pytest.raises(ValueError, match="history_branch"):
        FedSiamDARecipe(history_branch="logits")
    with pytest.raises(ValueError, match="cosine_vector"):
        FedSiamDARecipe(cosine_vector="weights")


def test_recipe_sends_its_options_to_the_executor_and_the_aggregator(tmp_path):
    FedSiamDARecipe(name="options", history_branch="predictor", cosine_vector="parameters").export(str(tmp_path))
    config = tmp_path / "options/app/config"
    client = json.loads((config / "config_fed_client.json").read_text())["executors"][0]["executor"]["args"]
    server = json.loads((config / "config_fed_server.json").read_text())["workflows"][0]["args"]["aggregator"]
    assert (
        client["settings"]["args"]["history_branch"] == "predictor" and server["args"]["cosine_vector"] == "parameters"
    )


def test_executor_builds_the_working_copy_from_the_received_weights_and_steps_it(tmp_path):
    """The executor makes the objective after loading the global weights, and its after_step moves the working
    copy: the copy starts at the received weights and ends elsewhere."""
    executor = FedSiamDAExecutor(
        model=tiny_net(seed=5),
        data=DataSpec(dataset=tiny_dataset([0, 1, 2, 0, 1, 2, 0, 1])),
        training=TrainingSpec(local_epochs=2, batch_size=4, lr=0.05, device="cpu"),
    )
    ctx = site_context(tmp_path)
    started(executor, ctx)
    received = {k: v.numpy().copy() for k, v in tiny_net(seed=0).state_dict().items()}
    built = []
    make_objective = executor.make_objective

    def spy(round_number, fl_ctx, meta=None):
        objective = make_objective(round_number, fl_ctx, meta)
        built.append((objective, {k: v.clone() for k, v in objective.working_global.state_dict().items()}))
        return objective

    executor.make_objective = spy
    code, _ = run_task(executor, ctx, received)
    assert code == ReturnCode.OK
    ((objective, at_start),) = built
    for name, value in received.items():
        np.testing.assert_array_equal(at_start[name].numpy(), value, err_msg=name)
    moved = objective.working_global.state_dict()
    assert not torch.equal(moved["l1.weight"], at_start["l1.weight"])  # stepped during local training
    assert not torch.equal(moved["predictor.0.weight"], at_start["predictor.0.weight"])


@pytest.fixture(scope="module")
def fedsiam_run(tmp_path_factory):
    recipe = FedSiamDARecipe(name="fedsiam_tiny", min_clients=2, num_rounds=ROUNDS, **TINY_TRAINING)
    # -t < -n: the simulator restarts the client processes for every task
    return export_and_run(recipe, tmp_path_factory.mktemp("fedsiam_e2e"), n=2, t=1)


@pytest.mark.e2e
def test_fedsiam_da_job_runs_with_restarted_clients_and_persisted_history(fedsiam_run):
    run = fedsiam_run
    assert run.returncode == 0, run.output[-3000:]
    metrics = run.global_metrics()
    assert [m["round"] for m in metrics] == list(range(ROUNDS))
    # only round 0 lacks a previous upload: later rounds find it although every task runs in a new process
    assert run.output.count("no previous upload yet") == len(RUN_SITES)
    for site in RUN_SITES:
        assert run.last_upload(site, "fedsiam_da_state")[0] == ROUNDS - 1
        for record in metrics:
            assert {"train_siamese", "train_history"} <= set(record["site_metrics"][site])


@pytest.mark.e2e
def test_xi_reaches_the_metrics_file_and_tensorboard_and_builds_the_global_model(fedsiam_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = fedsiam_run
    metrics = run.global_metrics()
    for record in metrics:
        xi = record["site_dual_weights"]
        assert sorted(xi) == RUN_SITES and sum(xi.values()) == pytest.approx(1.0, abs=1e-9)
        assert all(0 < v < 1 for v in xi.values())
    (events,) = (run.server_dir() / "tb_events" / "global").glob("events.out.tfevents.*")
    tags = EventAccumulator(str(events)).Reload().Tags()["scalars"]
    assert {f"site_dual_weights/{s}" for s in RUN_SITES} <= set(tags)

    # the final global model is Σ ξ_k·w_k of the last uploads; integer buffers are their weighted FedAvg
    saved = torch.load(run.server_dir() / "app_server" / "FL_global_model.pt", weights_only=False)["model"]
    uploads = [run.last_upload(s, "fedsiam_da_state")[1] for s in RUN_SITES]
    xi = [metrics[-1]["site_dual_weights"][s] for s in RUN_SITES]
    fedavg = metrics[-1]["site_weights"]
    assert "predictor.0.weight" in saved
    for name, value in saved.items():
        if value.is_floating_point():
            expected = sum(x * u[name].double() for x, u in zip(xi, uploads))
            torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-6)
        else:
            expected = round(sum(fedavg[s] * float(u[name]) for s, u in zip(RUN_SITES, uploads)))
            assert int(value) == expected


@pytest.fixture(scope="module")
def fedsiam_options_run(tmp_path_factory):
    recipe = FedSiamDARecipe(
        name="fedsiam_options",
        min_clients=2,
        num_rounds=2,
        history="round",
        history_branch="predictor",
        cosine_vector="parameters",
        **TINY_TRAINING,
    )
    return export_and_run(recipe, tmp_path_factory.mktemp("fedsiam_options_e2e"), n=2, t=2)


@pytest.mark.e2e
def test_the_history_round_predictor_and_parameters_options_end_to_end(fedsiam_options_run):
    """history="round": no history term in a site's first round, the previous upload in the next; the server's
    cosines are those of the parameters-only vector of the uploads."""
    run, sites = fedsiam_options_run, RUN_SITES
    assert run.returncode == 0, run.output[-3000:]
    metrics = run.global_metrics()
    assert [m["round"] for m in metrics] == [0, 1]
    assert run.output.count("training without the history term") == len(sites)  # not "... in the first epoch"
    for site in sites:
        assert "train_history" not in metrics[0]["site_metrics"][site]
        assert "train_history" in metrics[1]["site_metrics"][site]
    uploads = [{k: v.numpy() for k, v in run.last_upload(s, "fedsiam_da_state")[1].items()} for s in sites]
    weights = np.array([metrics[-1]["site_weights"][s] for s in sites])
    expected = dual_aggregate(uploads, weights, vector="parameters").cosines
    with_statistics = dual_aggregate(uploads, weights, vector="state").cosines
    assert not np.allclose(expected, with_statistics, rtol=0, atol=1e-9)
    got = [metrics[-1]["site_dual_cosines"][s] for s in sites]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
