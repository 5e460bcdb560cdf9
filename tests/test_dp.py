"""DP-SGD (docs/differential_privacy.md): the clipping and the noise against hand computations, the accounting against
Opacus's accountant, the refusals, the executors' and the Client API helper's rounds, and a MOON job in the simulator
whose sites report the ε they spent, the same with client processes kept (-t 2) and restarted for every task (-t 1)."""

import copy
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
from nvflare.apis.fl_constant import ReturnCode
from nvflare.app_common.app_constant import AlgorithmConstants
from opacus.accountants import RDPAccountant

from nvflare_moon.benchmark.methods import METHODS
from nvflare_moon.benchmark.protocols import PROTOCOLS
from nvflare_moon.client import PTDPHelper
from nvflare_moon.core.dp import (
    DPSettings,
    calibrated_noise_multiplier,
    clip_factors,
    epsilon_spent,
    noisy_sum,
    per_sample_norms,
    with_steps,
)
from nvflare_moon.core.dp_training import DPSGD
from nvflare_moon.core.objectives import FedProxObjective, MoonObjective
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.core.training import float32_step, frozen_copy
from nvflare_moon.executors import FedProxExecutor, FedSiamDAExecutor, FedSSCExecutor, MoonExecutor, ScaffoldExecutor
from nvflare_moon.models import Network
from nvflare_moon.recipes import FedAvgBaselineRecipe, MoonRecipe

from .conftest import TINY_TRAINING, export_and_run
from .executor_harness import global_weights, run_task, site_context, started, tiny_dataset, tiny_net

SIGMA, RATE, DELTA = 1.1, 0.02, 1e-5


# ---- one step -----------------------------------------------------------------------------------------------------


def test_each_samples_gradient_is_clipped_to_c_and_the_sum_is_the_hand_computed_one():
    # two parameters, three samples; sample norms over both: 5, 0.5 and 13
    weight = torch.tensor([[[3.0, 0.0]], [[0.3, 0.0]], [[5.0, 0.0]]])  # [B, 1, 2]
    bias = torch.tensor([[4.0], [0.4], [12.0]])  # [B, 1]
    assert per_sample_norms([weight, bias]).tolist() == pytest.approx([5.0, 0.5, 13.0])
    factors = clip_factors(per_sample_norms([weight, bias]), max_grad_norm=1.0)
    clipped_norms = per_sample_norms([weight * factors[:, None, None], bias * factors[:, None]])
    assert (clipped_norms <= 1.0).all() and clipped_norms[1] == pytest.approx(0.5)  # under C: unchanged
    summed = noisy_sum([weight, bias], max_grad_norm=1.0, noise_multiplier=0.0)
    # by hand: 3/5 + 0.3 + 5/13 and 4/5 + 0.4 + 12/13
    assert summed[0].flatten().tolist() == pytest.approx([3 / 5 + 0.3 + 5 / 13, 0.0], rel=1e-5)
    assert summed[1].tolist() == pytest.approx([4 / 5 + 0.4 + 12 / 13], rel=1e-5)


def test_a_dp_sgd_step_on_a_linear_model_clips_every_samples_own_gradient():
    torch.manual_seed(0)
    model = nn.Linear(2, 1, bias=False)
    x, y = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.1, 0.1]]), torch.tensor([4.0, -2.0, 0.0])
    w = model.weight.detach().clone().numpy()[0]
    # ℓ_i = (w·x_i − y_i)²/2, so g_i = (w·x_i − y_i)·x_i
    grads = [(w @ xi - yi) * xi for xi, yi in zip(x.numpy(), y.numpy())]
    expected = w - 0.1 * np.mean([g * min(1.0, 0.5 / (np.linalg.norm(g) + 1e-6)) for g in grads], axis=0)

    def squared_error(out, x, y):
        loss = ((out.squeeze(1) - y) ** 2).mean() / 2
        return loss, {}

    step = DPSGD(model, noise_multiplier=0.0, max_grad_norm=0.5)
    step(model, squared_error, torch.optim.SGD(model.parameters(), lr=0.1), x, y)
    step.close()
    np.testing.assert_allclose(model.weight.detach().numpy()[0], expected, rtol=1e-5)


def test_the_noise_has_std_sigma_times_c():
    zero = torch.zeros(4, 200_000)
    generator = torch.Generator().manual_seed(0)
    (noisy,) = noisy_sum([zero], max_grad_norm=0.8, noise_multiplier=1.5, generator=generator)
    assert noisy.std().item() == pytest.approx(1.2, rel=0.01)
    assert abs(noisy.mean().item()) < 0.01


@pytest.mark.parametrize("method", ["moon", "fedprox"])
def test_without_noise_or_clipping_a_dp_step_is_the_plain_step(method):
    """Every sample's own gradient (MOON's term included) adds up to the batch's, and FedProx's proximal gradient,
    which reads no sample, is added after: with σ = 0 and a C no gradient reaches, DP-SGD is SGD."""
    plain, private = tiny_net(), tiny_net()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, 2, 2, generator=g), torch.randint(0, 3, (8,), generator=g)

    def objective(net):
        if method == "fedprox":
            return FedProxObjective(net, frozen_copy(tiny_net(seed=5)), mu=0.5)
        return MoonObjective(frozen_copy(tiny_net(seed=5)), [frozen_copy(tiny_net(seed=6))], mu=5.0, temperature=0.5)

    float32_step(plain, objective(plain), torch.optim.SGD(plain.parameters(), lr=0.1), x, y)
    step = DPSGD(private, noise_multiplier=0.0, max_grad_norm=1e6)
    step(private, objective(private), torch.optim.SGD(private.parameters(), lr=0.1), x, y)
    step.close()
    for a, b in zip(plain.parameters(), private.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_hooks_come_off_the_network_and_the_frozen_models_never_get_any():
    net, frozen = tiny_net(), frozen_copy(tiny_net(seed=1))
    step = DPSGD(net, noise_multiplier=1.0, max_grad_norm=1.0)
    x, y = torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 2, 0])
    step(net, MoonObjective(frozen, [frozen], mu=1.0, temperature=0.5), torch.optim.SGD(net.parameters(), 0.1), x, y)
    assert not any(m._forward_hooks for m in frozen.modules())
    step.close()
    assert not any(m._forward_hooks or m._backward_hooks for m in net.modules())
    assert not any(hasattr(p, "grad_sample") for p in net.parameters())
    assert list(copy.deepcopy(net).state_dict()) == list(tiny_net().state_dict())


# ---- accounting ---------------------------------------------------------------------------------------------------


def opacus_epsilon(steps):
    accountant = RDPAccountant()
    accountant.history = [(SIGMA, RATE, steps)]
    return accountant.get_epsilon(DELTA)


def test_epsilon_grows_with_the_steps_and_is_opacus_accountants():
    epsilons = [epsilon_spent([(SIGMA, RATE, steps)], DELTA) for steps in (100, 200, 400)]
    assert epsilons[0] < epsilons[1] < epsilons[2]
    assert epsilons == pytest.approx([opacus_epsilon(steps) for steps in (100, 200, 400)], rel=1e-12)
    assert epsilon_spent([], DELTA) == 0.0


def test_rounds_of_the_same_setting_add_up_to_one_entry_of_the_same_epsilon():
    history = with_steps(with_steps([], SIGMA, RATE, 100), SIGMA, RATE, 100)
    assert history == [(SIGMA, RATE, 200)]
    assert with_steps(history, 2.0, RATE, 5) == [(SIGMA, RATE, 200), (2.0, RATE, 5)]
    assert epsilon_spent(history, DELTA) == pytest.approx(opacus_epsilon(200), rel=1e-12)


@pytest.mark.parametrize("target", [1.0, 3.0, 8.0])
def test_the_calibrated_noise_meets_the_target_epsilon(target):
    sigma = calibrated_noise_multiplier(target, DELTA, sample_rate=64 / 5000, steps=3900)
    reached = epsilon_spent([(sigma, 64 / 5000, 3900)], DELTA)
    assert target - 0.02 <= reached <= target
    assert epsilon_spent([(0.95 * sigma, 64 / 5000, 3900)], DELTA) > target  # and the noise is not much more


# ---- settings and refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, named",
    [
        (dict(noise_multiplier=1.0, target_epsilon=3.0), "exactly one of dp_noise_multiplier"),
        (dict(noise_multiplier=0.0), "dp_noise_multiplier must be > 0"),
        (dict(target_epsilon=-1.0), "dp_target_epsilon must be > 0"),
        (dict(target_epsilon=3.0, delta=0.0), "dp_delta must be > 0"),
        (dict(target_epsilon=3.0, delta=1.0), "dp_delta must be < 1"),
        (dict(target_epsilon=3.0, max_grad_norm=0.0), "dp_max_grad_norm must be > 0"),
    ],
)
def test_invalid_settings_name_the_argument(arguments, named):
    with pytest.raises(ValueError, match=named):
        DPSettings(**arguments)


def test_delta_or_c_without_dp_is_refused_and_no_dp_argument_is_off():
    assert DPSettings.from_arguments(None, None, DPSettings.delta, DPSettings.max_grad_norm) is None
    with pytest.raises(ValueError, match="dp_max_grad_norm=2.0 sets DP-SGD, which is off"):
        DPSettings.from_arguments(None, None, DPSettings.delta, 2.0)


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_a_batchnorm_network_is_refused_with_the_fix(arch):
    with pytest.raises(ValueError, match=r"BatchNorm .* Use arch='simple_cnn'.*GroupNorm"):
        MoonRecipe(min_clients=2, num_rounds=2, arch=arch, dp_target_epsilon=3.0, **TINY_TRAINING)


def test_methods_and_options_that_do_not_fit_dp_sgd_are_refused_with_why():
    data = DataSpec(dataset=tiny_dataset([0, 1, 2] * 4))
    with pytest.raises(ValueError, match="amp=True cannot be used with DP-SGD.*set amp=False"):
        MoonExecutor(tiny_net(), data=data, training=TrainingSpec(amp=True), dp=DPSettings(noise_multiplier=1.0))
    with pytest.raises(ValueError, match="FedSSCExecutor cannot train with DP-SGD .*class means"):
        FedSSCExecutor(tiny_net(), data=data, dp=DPSettings(noise_multiplier=1.0))
    predictor_net = Network(num_classes=10, predictor_hidden_dim=8, seed=0)
    with pytest.raises(ValueError, match="FedSiamDAExecutor cannot train with DP-SGD .*working copy"):
        FedSiamDAExecutor(predictor_net, data=data, dp=DPSettings(noise_multiplier=1.0))


def test_dp_arguments_left_at_their_defaults_are_not_in_the_exported_job(tmp_path):
    FedAvgBaselineRecipe(name="plain", min_clients=2, num_rounds=2, **TINY_TRAINING).export(str(tmp_path / "plain"))
    MoonRecipe(name="dp", min_clients=2, num_rounds=2, dp_noise_multiplier=1.2, **TINY_TRAINING).export(
        str(tmp_path / "dp")
    )
    plain = (tmp_path / "plain/plain/app/config/config_fed_client.json").read_text()
    assert "dp_" not in plain and "DPSettings" not in plain
    assert "dp" not in json.loads(plain)["executors"][0]["executor"]["args"]
    dp = json.loads((tmp_path / "dp/dp/app/config/config_fed_client.json").read_text())
    assert dp["executors"][0]["executor"]["args"]["dp"] == {
        "path": "nvflare_moon.core.dp.DPSettings",
        "args": {"noise_multiplier": 1.2},
    }


# ---- a site's rounds ----------------------------------------------------------------------------------------------


SIGMA_ONE = DPSettings(noise_multiplier=1.0)


def dp_executor(executor_class=MoonExecutor, **kwargs):
    data = DataSpec(dataset=tiny_dataset([0, 1, 2] * 20))
    training = TrainingSpec(local_epochs=2, batch_size=8, device="cpu")
    return executor_class(tiny_net(), data=data, training=training, **kwargs)


def train_rounds(executor, ctx, rounds, meta=None):
    """The ``dp_epsilon`` each of ``rounds`` reported, each on the weights the last one returned."""
    weights, epsilons = global_weights(), []
    for round_number in rounds:
        code, reply = run_task(executor, ctx, weights, round_number, meta)
        assert code == ReturnCode.OK
        assert not [name for name in reply.metrics if name.startswith("train_")]  # kept in the site's own log
        assert reply.metrics["dp_delta"] == DELTA
        weights, epsilons = reply.params, epsilons + [reply.metrics["dp_epsilon"]]
    return epsilons


def test_a_restarted_executor_reports_the_epsilon_of_every_round_before(tmp_path):
    ctx = site_context(tmp_path)
    lived = train_rounds(started(dp_executor(dp=SIGMA_ONE), ctx), ctx, [0, 1])
    assert 0 < lived[0] < lived[1]
    ctx = site_context(tmp_path, job="job-2")
    restarted = train_rounds(started(dp_executor(dp=SIGMA_ONE), ctx), ctx, [0])
    restarted += train_rounds(started(dp_executor(dp=SIGMA_ONE), ctx), ctx, [1])
    assert restarted == lived


def test_scaffold_and_fedprox_train_with_dp_sgd(tmp_path):
    ctx = site_context(tmp_path)
    assert train_rounds(started(dp_executor(ScaffoldExecutor, dp=SIGMA_ONE), ctx), ctx, [0])[0] > 0
    ctx = site_context(tmp_path, job="job-2")
    meta = {AlgorithmConstants.FEDPROX_MU: 0.01}
    assert train_rounds(started(dp_executor(FedProxExecutor, dp=SIGMA_ONE), ctx), ctx, [0], meta)[0] > 0


def test_an_unreadable_ledger_refuses_every_later_round(tmp_path, caplog):
    ctx = site_context(tmp_path)
    executor = started(dp_executor(dp=SIGMA_ONE), ctx)
    train_rounds(executor, ctx, [0])
    (ledger,) = (tmp_path / "job-1" / "nvflare_moon").glob("dp_ledger.pt")
    ledger.write_bytes(b"not a ledger")
    for round_number in (1, 2):
        code, _ = run_task(executor, ctx, global_weights(), round_number)
        assert code == ReturnCode.EXECUTION_EXCEPTION
    assert "the DP-SGD ledger cannot be read" in caplog.text and "was set aside as unusable" in caplog.text


# ---- the Client API helper ----------------------------------------------------------------------------------------


def helper_round(tmp_path, round_number, model, **kwargs):
    """One round of a script's loop with :class:`PTDPHelper` (job, site and state folder given); its figures."""
    dp = PTDPHelper(model, 24, 8, local_epochs=1, job_id="job", site="site-1", state_dir=str(tmp_path), **kwargs)
    dp.start_round(SimpleNamespace(current_round=round_number, total_rounds=2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(round_number)
    for _ in range(3):
        x, y = torch.randn(8, 3, 2, 2, generator=g), torch.randint(0, 3, (8,), generator=g)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x).logits, y).backward()
        dp.privatize()
        optimizer.step()
    return dp.finish_round()


def test_the_helper_calibrates_to_the_target_and_keeps_the_epsilon_across_restarts(tmp_path):
    model = tiny_net()
    first, second = (helper_round(tmp_path, r, model, dp_target_epsilon=4.0) for r in (0, 1))  # a new helper each
    assert 0 < first["dp_epsilon"] < second["dp_epsilon"] <= 4.0
    assert second["dp_epsilon"] == pytest.approx(4.0, abs=0.02)  # the 2 rounds × 3 steps it was calibrated for
    assert not any(m._forward_hooks for m in model.modules())


def test_a_delta_not_below_one_over_n_is_named_at_the_sites_first_round(tmp_path, caplog):
    helper_round(tmp_path, 0, tiny_net(), dp_noise_multiplier=1.0, dp_delta=0.05)  # N = 24: 1/N ≈ 0.042
    helper_round(tmp_path, 1, tiny_net(), dp_noise_multiplier=1.0, dp_delta=0.05)
    assert caplog.text.count("site-1: dp_delta=0.05 is not below 1/N = 0.0417 (N = 24") == 1


def test_the_helper_refuses_a_batch_of_another_size(tmp_path):
    model = tiny_net()
    dp = PTDPHelper(model, 24, 8, job_id="job", site="site-1", state_dir=str(tmp_path), dp_noise_multiplier=1.0)
    dp.start_round(SimpleNamespace(current_round=0, total_rounds=2))
    nn.functional.cross_entropy(model(torch.randn(5, 3, 2, 2)).logits, torch.zeros(5, dtype=torch.long)).backward()
    with pytest.raises(ValueError, match=r"a batch of \[5\] samples.*drop_last=True"):
        dp.privatize()


# ---- the benchmark's protocol ------------------------------------------------------------------------------------


def test_the_dp_protocol_shares_quicks_moon_and_sets_each_target_epsilon(tmp_path):
    quick = {spec.run_id: spec.fingerprint() for spec in PROTOCOLS["quick"].runs(["moon"])}
    targets = {}
    for spec in PROTOCOLS["dp"].runs():
        if not spec.variant.args:
            assert spec.fingerprint() == quick[spec.run_id]  # the run without DP is quick's, done once
            continue
        METHODS[spec.variant.method].launch(spec, str(tmp_path / spec.run_id), None)
        (config,) = (tmp_path / spec.run_id / "job").glob("*/app/config/config_fed_client.json")
        executor_args = json.loads(config.read_text())["executors"][0]["executor"]["args"]
        targets[spec.run_id] = executor_args["dp"]["args"]["target_epsilon"]
    assert targets == {f"moon-dp_target_epsilon{eps:g}-beta0.5-seed0": eps for eps in (1.0, 3.0, 8.0)}


# ---- MOON with DP-SGD in the simulator ----------------------------------------------------------------------------

SITES = ("site-1", "site-2")
TARGET_EPSILON = 8.0


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp_e2e")
    # one epoch: ε is calibrated over all the rounds' steps, however many there are
    tiny = {**TINY_TRAINING, "local_epochs": 1}
    recipe = MoonRecipe(name="moon_dp", min_clients=2, num_rounds=2, dp_target_epsilon=TARGET_EPSILON, **tiny)
    return {t: export_and_run(recipe, root, n=2, t=t, tag=f"_t{t}") for t in (2, 1)}


@pytest.mark.e2e
def test_every_site_reports_the_epsilon_it_spent_every_round_the_same_with_restarted_processes(simulated):
    epsilons = {}
    for t, run in simulated.items():
        assert run.returncode == 0, run.output[-3000:]
        rounds = run.global_metrics()
        assert [r["round"] for r in rounds] == [0, 1]
        epsilons[t] = {site: [r["site_metrics"][site]["dp_epsilon"] for r in rounds] for site in SITES}
        for site in SITES:
            assert 0 < epsilons[t][site][0] < epsilons[t][site][1] <= TARGET_EPSILON
            assert epsilons[t][site][1] == pytest.approx(TARGET_EPSILON, abs=0.05)  # calibrated for both rounds
            assert not [name for name in rounds[1]["site_metrics"][site] if name.startswith("train_")]
        assert run.output.count("DP-SGD round 1: ε = ") == len(SITES)
    assert epsilons[1] == epsilons[2]  # -t 1 restarts every client process per task
