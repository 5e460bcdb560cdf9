"""FedProx and SCAFFOLD against hand computation on tiny models, through NVFlare's PTFedProxLoss / PTScaffoldHelper."""

import logging
import os

import numpy as np
import pytest
import torch
import torch.nn as nn
from nvflare.apis.fl_constant import ReturnCode
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.app_constant import AlgorithmConstants

from nvflare_moon.core.objectives import CrossEntropyObjective, FedProxObjective
from nvflare_moon.core.scaffold import ScaffoldRound, apply_control_deltas
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.core.state import SiteStateStore
from nvflare_moon.core.training import frozen_copy
from nvflare_moon.executors import FedProxExecutor, ScaffoldExecutor
from nvflare_moon.models import Network, ProjectionModel
from nvflare_moon.server import ScaffoldAggregator

from .executor_harness import global_weights, run_task, site_context, started, tiny_dataset
from .executor_harness import tiny_net as harness_net

C_GLOBAL, C_DIFF = AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL, AlgorithmConstants.SCAFFOLD_CTRL_DIFF


def tiny_net():
    torch.manual_seed(0)
    return ProjectionModel(nn.Sequential(nn.Flatten(), nn.Linear(12, 6)), feat_dim=6, num_classes=3, out_dim=4)


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 3, 2, 2, generator=g), torch.randint(0, 3, (8,), generator=g)


# ---- FedProx ---------------------------------------------------------------------------------------------------------


def test_fedprox_objective_adds_half_mu_times_squared_distance_and_its_gradient():
    net = tiny_net()
    global_model = frozen_copy(net)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1)  # every entry 0.1 away from the global model
    num_params = sum(p.numel() for p in net.parameters())
    mu = 0.5
    x, y = batch()
    loss, terms = FedProxObjective(net, global_model, mu)(net(x), x, y)
    assert terms["proximal"].item() == pytest.approx(mu / 2 * num_params * 0.1**2, rel=1e-5)
    assert loss.item() == pytest.approx(terms["ce"].item() + terms["proximal"].item(), rel=1e-6)

    loss.backward()
    prox_grad = {n: p.grad.clone() for n, p in net.named_parameters()}
    net.zero_grad()
    CrossEntropyObjective()(net(x), x, y)[0].backward()
    for name, p in net.named_parameters():  # d/dw (μ/2)‖w − w_g‖² = μ (w − w_g) = 0.05 everywhere
        torch.testing.assert_close(prox_grad[name] - p.grad, torch.full_like(p, mu * 0.1), rtol=1e-4, atol=1e-6)
    assert all(p.grad is None for p in global_model.parameters())


def test_fedprox_objective_at_the_global_model_is_plain_cross_entropy():
    net = tiny_net()
    x, y = batch()
    loss, terms = FedProxObjective(net, frozen_copy(net), mu=0.01)(net(x), x, y)
    assert terms["proximal"].item() == 0.0 and loss.item() == pytest.approx(terms["ce"].item())


def test_fedprox_executor_takes_mu_from_the_servers_metadata():
    executor = FedProxExecutor(model=Network())
    executor._net = executor.model
    objective = executor.make_objective(0, None, meta={AlgorithmConstants.FEDPROX_MU: 0.01})
    assert objective.proximal.mu == 0.01
    with pytest.raises(ValueError, match="fedprox_mu.*FedProxRecipe"):
        executor.make_objective(0, None, meta={})


# ---- SCAFFOLD, client ------------------------------------------------------------------------------------------------


class Vector(nn.Module):
    """w ∈ R², with the loss ½‖w‖², whose gradient is w itself."""

    def __init__(self, w):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w))


def scaffold_steps(round_, model, steps, lr):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)  # plain SGD: a step is w ← w − lr·w
    for _ in range(steps):
        optimizer.zero_grad()
        (0.5 * (model.w**2).sum()).backward()
        optimizer.step()
        round_.after_step()


def test_scaffold_correction_and_control_update_match_hand_computation():
    model, lr = Vector([1.0, 2.0]), 0.1
    c, c_i = {"w": np.array([0.5, -0.5], np.float32)}, {"w": torch.tensor([0.1, 0.1])}
    round_ = ScaffoldRound(model, lr, global_control=c, local_control=c_i)

    scaffold_steps(round_, model, 1, lr)
    # w ← 0.9·w, then w ← w − lr·(c − c_i) = [0.9, 1.8] − 0.1·[0.4, −0.6]
    torch.testing.assert_close(model.w.detach(), torch.tensor([0.86, 1.86]))
    scaffold_steps(round_, model, 1, lr)
    torch.testing.assert_close(model.w.detach(), torch.tensor([0.734, 1.734]))

    delta = round_.finish()
    # c_i⁺ = c_i − c + (w_glob − w)/(steps·lr) = [0.1 − 0.5, 0.1 + 0.5] + ([1, 2] − [0.734, 1.734]) / 0.2
    expected_local = np.array([-0.4 + 1.33, 0.6 + 1.33])
    np.testing.assert_allclose(round_.local_control["w"].numpy(), expected_local, rtol=1e-5)
    np.testing.assert_allclose(delta["w"], expected_local - np.array([0.1, 0.1]), rtol=1e-5)
    assert isinstance(delta["w"], np.ndarray) and round_.steps == 2


def test_scaffold_without_controls_starts_from_zero_and_is_plain_sgd():
    model, lr = Vector([1.0, 2.0]), 0.1
    round_ = ScaffoldRound(model, lr)
    scaffold_steps(round_, model, 2, lr)
    torch.testing.assert_close(model.w.detach(), torch.tensor([0.81, 1.62]))
    delta = round_.finish()  # c_i⁺ = (w_glob − w)/(2·lr)
    np.testing.assert_allclose(delta["w"], [0.19 / 0.2, 0.38 / 0.2], rtol=1e-5)


def test_scaffold_refuses_controls_that_do_not_fit_the_model():
    with pytest.raises(ValueError, match="site's SCAFFOLD control"):
        ScaffoldRound(Vector([1.0, 2.0]), 0.1, local_control={"w": torch.zeros(3)})
    with pytest.raises(ValueError, match="server's SCAFFOLD control"):
        ScaffoldRound(Vector([1.0, 2.0]), 0.1, global_control={"w": np.zeros(3, np.float32)})


def test_scaffold_executor_refuses_a_later_round_without_the_global_control(tmp_path):
    executor = ScaffoldExecutor(model=Network())
    executor._net = executor.model
    with pytest.raises(ValueError, match="no SCAFFOLD global control.*ScaffoldRecipe"):
        executor.make_objective(1, site_context(tmp_path), meta={})


def test_scaffold_control_saved_for_another_network_is_set_aside_byte_for_byte(tmp_path, caplog):
    ctx = site_context(tmp_path)
    other = ScaffoldExecutor(model=tiny_net())
    other.state_store(other.STATE_NAME, ctx).save(0, {"rounds": [0], "local_controls": [{"w": torch.zeros(3)}]})
    state = tmp_path / "job-1" / "nvflare_moon" / "scaffold_state.pt"
    original = state.read_bytes()
    executor = ScaffoldExecutor(model=tiny_net())
    executor._net = executor.model
    with caplog.at_level(logging.WARNING):
        executor.make_objective(0, ctx, meta={})  # the stored controls are checked before the round filter
    assert executor._round._history == []
    (kept,) = state.parent.iterdir()
    assert kept.name.startswith("scaffold_state.pt.unusable-other-network-") and kept.read_bytes() == original
    assert f"site-1: state file {state} cannot be used" in caplog.text and "restarts from 0" in caplog.text


def scaffold_site(run_dir):
    executor = ScaffoldExecutor(
        model=harness_net(),
        data=DataSpec(dataset=tiny_dataset([0, 1, 2] * 4)),
        training=TrainingSpec(local_epochs=1, batch_size=4, lr=0.1, device="cpu"),
    )
    ctx = site_context(run_dir)
    return started(executor, ctx), ctx


def scaffold_state(run_dir):
    return SiteStateStore(str(run_dir / "job-1" / "nvflare_moon"), "scaffold_state", "site-1", "job-1")


def write_corrupt(run_dir):
    path = scaffold_state(run_dir).path
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"truncated")


@pytest.mark.parametrize(
    "spoil, warning",
    [
        (write_corrupt, "cannot be used"),
        (
            lambda run_dir: scaffold_state(run_dir).save(0, {"rounds": [0], "local_controls": [{"w": torch.zeros(5)}]}),
            "do not match this job's network",
        ),
    ],
)
def test_scaffold_site_with_an_unusable_stored_control_warns_and_restarts_it_at_zero(tmp_path, caplog, spoil, warning):
    sent = {C_GLOBAL: {k: v for k, v in global_weights(seed=4).items() if "num_batches" not in k}}
    fresh, fresh_ctx = scaffold_site(tmp_path / "fresh")
    _, from_zero = run_task(fresh, fresh_ctx, global_weights(), round_number=1, meta=sent)
    spoil(tmp_path / "spoiled")
    spoiled, ctx = scaffold_site(tmp_path / "spoiled")
    with caplog.at_level(logging.WARNING):
        code, reply = run_task(spoiled, ctx, global_weights(), round_number=1, meta=sent)
    assert code == ReturnCode.OK
    assert warning in caplog.text and "control restarts from 0" in caplog.text
    for name, delta in from_zero.meta[C_DIFF].items():  # the same round as a site that never stored a control
        np.testing.assert_array_equal(reply.meta[C_DIFF][name], delta)
    assert scaffold_state(tmp_path / "spoiled").load()["round"] == 1  # and its new control replaces the bad one


# ---- SCAFFOLD, server ------------------------------------------------------------------------------------------------


def test_server_control_adds_the_deltas_sum_over_all_sites():
    c = {"w": np.array([1.0, 1.0], np.float32)}
    deltas = [{"w": np.array([0.3, -0.6])}, {"w": np.array([0.9, 0.0])}]
    updated = apply_control_deltas(c, deltas, num_sites=4)
    np.testing.assert_allclose(updated["w"], [1.0 + 1.2 / 4, 1.0 - 0.6 / 4], rtol=1e-6)
    assert updated["w"].dtype == np.float32
    np.testing.assert_allclose(apply_control_deltas({}, deltas, 2)["w"], [0.6, -0.3])
    with pytest.raises(ValueError, match="num_sites"):
        apply_control_deltas(c, deltas, num_sites=1)


def scaffold_update(site, n, w, delta):
    meta = {"client_name": site, "num_samples": n}
    if delta is not None:
        meta[C_DIFF] = {"w": np.array(delta, np.float32)}
    return FLModel(params={"w": np.array(w, np.float32)}, meta=meta)


def test_scaffold_aggregator_averages_weights_and_updates_the_control_it_sends_next(caplog):
    agg = ScaffoldAggregator(num_sites=3)
    assert agg.accept_model(scaffold_update("site-1", 100, [1.0, 2.0], [0.3, 0.0]))
    assert agg.accept_model(scaffold_update("site-2", 300, [3.0, 6.0], [0.6, 0.9]))
    with caplog.at_level(logging.WARNING):
        assert not agg.accept_model(scaffold_update("site-3", 100, [0.0, 0.0], None))  # no Δc: not a SCAFFOLD client
    assert "rejected the update of site-3" in caplog.text and C_DIFF in caplog.text
    first = agg.aggregate_model()
    np.testing.assert_allclose(first.params["w"], [2.5, 5.0])  # weighted by samples over the accepted sites
    np.testing.assert_allclose(first.meta[C_GLOBAL]["w"], [0.9 / 3, 0.9 / 3], rtol=1e-6)

    agg.accept_model(scaffold_update("site-3", 100, [0.0, 0.0], [0.3, -0.3]))
    second = agg.aggregate_model()
    np.testing.assert_allclose(second.meta[C_GLOBAL]["w"], [1.2 / 3, 0.6 / 3], rtol=1e-6)
    assert second.meta["site_weights"] == {"site-3": 1.0}


@pytest.mark.parametrize(
    "delta, reason",
    [({"v": np.zeros(2)}, "does not match"), ({"w": np.zeros(3)}, "does not match"), ({"w": [np.nan, 0.0]}, "NaN")],
)
def test_scaffold_aggregator_rejects_bad_control_deltas(delta, reason, caplog):
    agg = ScaffoldAggregator(num_sites=2)
    update = scaffold_update("site-1", 10, [1.0, 2.0], None)
    update.meta[C_DIFF] = delta
    with caplog.at_level(logging.WARNING):
        assert not agg.accept_model(update)
    assert reason in caplog.text
