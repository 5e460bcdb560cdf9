"""The MOON article's practical options (docs/practical_options.md): the cold start's μ schedule, hand-checked round by
round and applied alike by a restarted client process, and the noise before the projection head (zero scale is plain
MOON, the noise is reproducible and seeded per (seed, site, round, step))."""

import json
import logging
import math
import os
import zlib

import pytest
import torch
from torch.utils.data import TensorDataset

from nvflare_moon.core.feature_noise import FeatureNoise
from nvflare_moon.core.moon import MoonSettings
from nvflare_moon.core.objectives import LightHistoryMoonObjective, MoonObjective, RepresentationL2Objective
from nvflare_moon.core.schedules import describe_mu_schedule, scheduled_mu
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.core.training import frozen_copy, sgd, train_local
from nvflare_moon.executors import FedSSCExecutor, MoonExecutor
from nvflare_moon.executors.local_data import round_batches
from nvflare_moon.models import Network, ProjectionHead
from nvflare_moon.recipes import FedSSCRecipe, MoonRecipe

from .executor_harness import site_context

SYNTHETIC = DataSpec(dataset="synthetic")

# ---- the cold start ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "off, ramp, expected",
    [
        (0, 0, [5, 5, 5, 5]),  # the paper: constant μ
        (3, 0, [0, 0, 0, 5, 5]),  # off in rounds 0-2
        (2, 3, [0, 0, 1.25, 2.5, 3.75, 5, 5]),  # then 5·1/4, 5·2/4, 5·3/4
        (0, 1, [2.5, 5, 5]),
        (1, 1, [0, 2.5, 5, 5]),
    ],
)
def test_schedule_round_by_round(off, ramp, expected):
    assert [scheduled_mu(r, 5.0, off, ramp) for r in range(len(expected))] == expected


def test_schedule_in_words():
    assert describe_mu_schedule(5.0, 0, 0) == ""
    assert describe_mu_schedule(5.0, 3, 0) == "cold start: 0 in rounds 0-2, 5 from round 3"
    assert describe_mu_schedule(1.0, 2, 3) == "cold start: 0 in rounds 0-1, ramped in rounds 2-4, 1 from round 5"


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"mu_off_rounds": -1}, "mu_off_rounds"),
        ({"mu_off_rounds": 1.5}, "mu_off_rounds"),
        ({"mu_ramp_rounds": -2}, "mu_ramp_rounds"),
        ({"feature_noise_std": -0.1}, "feature_noise_std"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MoonExecutor(model=Network(), data=SYNTHETIC, settings=MoonSettings(**kwargs))
    with pytest.raises(ValueError, match=name):
        MoonRecipe(min_clients=2, dataset="synthetic", **kwargs)


def test_noise_needs_the_projection_model():
    class Plain(torch.nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(ValueError, match="feature_noise_std > 0 needs a ProjectionModel"):
        MoonExecutor(model=Plain(), data=SYNTHETIC, settings=MoonSettings(feature_noise_std=0.1))


@pytest.mark.parametrize("executor_class", [MoonExecutor, FedSSCExecutor])
def test_a_new_process_every_round_applies_the_scheduled_mu_and_logs_it(executor_class, tmp_path, caplog):
    """The simulator with -t < -n starts a new client process for every task: μ must come from the round alone."""
    ctx = site_context(tmp_path)
    expected = [0.0, 0.0, 1.0, 2.0, 2.0]
    for round_number, mu in enumerate(expected):
        settings = MoonSettings(mu=2.0, mu_off_rounds=2, mu_ramp_rounds=1)
        executor = executor_class(model=Network(seed=0), data=SYNTHETIC, settings=settings)
        executor._net = executor.model
        caplog.clear()
        with caplog.at_level(logging.INFO):
            objective = executor.make_objective(round_number, ctx)
        moon = objective.moon if executor_class is FedSSCExecutor else objective
        assert moon.mu == mu
        schedule = "cold start: 0 in rounds 0-1, ramped in round 2, 2 from round 3"
        assert f"site-1: round {round_number}: mu = {mu:g} ({schedule})" in caplog.text
        if executor_class is FedSSCExecutor:  # its upload needs one recorded batch
            objective.record_class_means()
            x = torch.randn(2, 3, 32, 32)
            objective(executor._net(x), x, torch.tensor([0, 1]))
        executor.after_training(round_number, ctx)
        if round_number >= 1:  # the uploads of the warm-up rounds are kept, so the term has its negative at once
            assert len(moon.previous_models) == 1


def test_mu_zero_drops_the_term_without_computing_it():
    torch.manual_seed(0)
    net, x, y = Network(seed=0), torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])

    class Exploding(torch.nn.Module):
        def forward(self, x):
            raise AssertionError("a cold-start round must not run the global or previous model")

    out = net(x)
    for objective in (MoonObjective(Exploding(), [Exploding()], 0.0, 0.5), RepresentationL2Objective(Exploding(), 0.0)):
        loss, terms = objective(out, x, y)
        assert list(terms) == ["ce"] and torch.equal(loss, torch.nn.functional.cross_entropy(out.logits, y))


@pytest.mark.parametrize(
    "recipe, expected",
    [
        (MoonRecipe, dict(mu=5.0, mu_off_rounds=3, mu_ramp_rounds=2, feature_noise_std=0.1, light_history=True)),
        (FedSSCRecipe, dict(mu=4.0, mu_off_rounds=3, mu_ramp_rounds=2, feature_noise_std=0.1, light_history=True)),
    ],
)
def test_recipes_write_the_practical_options_into_the_job(recipe, expected, tmp_path):
    recipe(**expected).export(str(tmp_path))
    (config,) = tmp_path.glob("*/app/config/config_fed_client.json")
    settings = json.loads(config.read_text())["executors"][0]["executor"]["args"]["settings"]
    assert settings["path"] == "nvflare_moon.core.moon.MoonSettings"
    assert {k: settings["args"][k] for k in expected} == expected


# ---- noise before the projection head ---------------------------------------------------------------------------


def test_noise_hand_computed():
    h = torch.tensor([[3.0, 4.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], requires_grad=True)
    noise = FeatureNoise(0.5, seed=7, site="site-2", round_number=4)
    noisy = [noise(h), noise(h)]
    for step, out in enumerate(noisy):
        key = zlib.crc32(f"feature_noise/7/site-2/4/{step}".encode())
        eps = torch.randn(2, 4, generator=torch.Generator().manual_seed(key))
        scale = 0.5 * torch.tensor([[5.0], [2.0]]) / math.sqrt(4)  # σ·‖h_b‖/√F
        torch.testing.assert_close(out, h + scale * eps, rtol=0, atol=0)
    assert not torch.equal(noisy[0], noisy[1])  # a new draw every step
    noisy[0].sum().backward()
    assert torch.equal(h.grad, torch.ones_like(h))  # the scale is a constant: the gradient passes unchanged


def test_noise_size_is_relative_to_the_features():
    h = torch.randn(2000, 84) * 7.0
    noise = FeatureNoise(0.2, seed=0, site="site-1", round_number=0)
    ratio = torch.linalg.vector_norm(noise(h) - h, dim=1) / torch.linalg.vector_norm(h, dim=1)
    assert ratio.square().mean().sqrt().item() == pytest.approx(0.2, rel=0.02)


def test_the_model_applies_noise_only_in_training_mode():
    net, x = Network(seed=0), torch.randn(4, 3, 32, 32)
    clean = net.eval()(x)
    net.feature_noise = FeatureNoise(0.5, seed=0, site="site-1", round_number=0)
    assert torch.equal(net.eval()(x).projection, clean.projection)  # global, previous and evaluated models
    noisy = net.train()(x)
    assert torch.equal(noisy.features, clean.features)  # h is reported clean; only the head's input is noisy
    assert not torch.allclose(noisy.projection, net.train()(x).projection)
    assert net.state_dict().keys() == Network(seed=0).state_dict().keys()


SITE_DATA = TensorDataset(torch.randn(96, 3, 32, 32), torch.arange(96) % 10)


def train_rounds(tmp_path, rounds=2, site="site-1", **settings):
    """Rounds 0 … rounds−1 of a site, each by a new executor (a restarted process) from the same initial weights, as
    ``execute`` runs them, with MOON's ``settings``; the last one's executor and mean loss terms. Round 1 on has MOON's
    term."""
    ctx = site_context(tmp_path, site=site)
    for round_number in range(rounds):
        executor = MoonExecutor(
            model=Network(seed=0),
            data=DataSpec(dataset=SITE_DATA),
            training=TrainingSpec(batch_size=32, local_epochs=2, num_threads=1),
            settings=MoonSettings(**settings),
        )
        executor._setup(ctx)
        objective = executor.make_objective(round_number, ctx)
        optimizer = sgd(executor._net, 0.05, 0.9, 0.0)
        batches = round_batches(executor._source, executor.training.batch_size, executor.data.seed, site, round_number)
        result = train_local(executor._net, batches, objective, optimizer, 2, torch.device("cpu"))
        executor.after_training(round_number, ctx)
    return executor, result.mean_terms


def same_weights(a, b):
    a, b = a._net.state_dict(), b._net.state_dict()
    return all(torch.equal(a[k], b[k]) for k in a)


def test_zero_scale_is_plain_moon_exactly(tmp_path):
    plain, plain_terms = train_rounds(tmp_path / "plain")
    zero, zero_terms = train_rounds(tmp_path / "zero", feature_noise_std=0.0)
    assert zero._net.feature_noise is None
    assert same_weights(zero, plain) and zero_terms == plain_terms and plain_terms["contrastive"] > 0
    noisy, _ = train_rounds(tmp_path / "noisy", feature_noise_std=0.1)
    assert not same_weights(noisy, plain)


def test_noise_is_reproducible_and_seeded_per_seed_site_and_round(tmp_path):
    first, first_terms = train_rounds(tmp_path / "a", feature_noise_std=0.5)
    again, again_terms = train_rounds(tmp_path / "b", feature_noise_std=0.5)
    assert same_weights(again, first) and again_terms == first_terms
    noise = first._net.feature_noise
    assert (noise.std, noise.seed, noise.site, noise.round_number, noise.steps) == (0.5, 0, "site-1", 1, 6)  # 3 × 2
    reference = FeatureNoise(0.5, seed=0, site="site-1", round_number=1)
    others = [FeatureNoise(0.5, 1, "site-1", 1), FeatureNoise(0.5, 0, "site-2", 1), FeatureNoise(0.5, 0, "site-1", 2)]
    assert len({reference.step_seed(0), reference.step_seed(1)} | {o.step_seed(0) for o in others}) == 5


# ---- light history: previous projection heads only ---------------------------------------------------------------


def test_light_history_z_prev_is_the_previous_head_on_the_global_features_hand_computed():
    global_net, previous_net = Network(seed=0).eval(), Network(seed=1).eval()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    z = torch.randn(4, 256, generator=torch.Generator().manual_seed(1))
    objective = LightHistoryMoonObjective(global_net, [frozen_copy(ProjectionHead(previous_net))], 5.0, 0.5)
    h_glob = global_net.backbone(x).flatten(1)
    z_glob = global_net.l2(torch.relu(global_net.l1(h_glob)))
    z_prev = previous_net.l2(torch.relu(previous_net.l1(h_glob)))  # the previous head, the global encoder
    sim_glob = torch.cosine_similarity(z, z_glob, dim=1) / 0.5
    sim_prev = torch.cosine_similarity(z, z_prev, dim=1) / 0.5
    expected = (-sim_glob + torch.log(sim_glob.exp() + sim_prev.exp())).mean()  # −log(e^glob / (e^glob + e^prev))
    assert torch.allclose(objective.contrastive(x, z), expected, atol=1e-6)
    # not the paper's z_prev, which runs the previous encoder: the two differ
    assert not torch.allclose(MoonObjective(global_net, [previous_net], 5.0, 0.5).contrastive(x, z), expected)


def test_light_history_state_holds_only_the_projection_head(tmp_path):
    executor, terms = train_rounds(tmp_path, light_history=True)
    assert terms["contrastive"] > 0
    record = torch.load(tmp_path / "job-1" / "nvflare_moon" / "moon_state.pt", weights_only=True)
    head_keys = {"l1.weight", "l1.bias", "l2.weight", "l2.bias"}
    assert [set(state) for state in record["payload"]["previous_models"]] == [head_keys, head_keys]
    for name in head_keys:  # round 1's upload is the trained network's head
        assert torch.equal(record["payload"]["previous_models"][-1][name], executor._net.state_dict()[name])
    # the whole local model is still kept, for submit_model, in its own record
    ctx = site_context(tmp_path)
    executor.save_local_model(1, ctx)
    round_number, local_model = executor.load_local_model(ctx)
    assert round_number == 1 and set(local_model) == set(executor._net.state_dict())


@pytest.mark.parametrize("written, read", [(False, True), (True, False)], ids=["full_read_light", "light_read_full"])
def test_a_history_of_the_other_kind_is_set_aside_not_misread(tmp_path, caplog, written, read):
    train_rounds(tmp_path, rounds=1, light_history=written)
    ctx = site_context(tmp_path)
    executor = MoonExecutor(
        model=Network(seed=0), data=DataSpec(dataset=SITE_DATA), settings=MoonSettings(light_history=read)
    )
    executor._setup(ctx)
    with caplog.at_level(logging.WARNING):
        assert executor.make_objective(1, ctx).previous_models == []
    assert "do not match" in caplog.text and "without the contrastive term" in caplog.text
    assert [f for f in os.listdir(tmp_path / "job-1" / "nvflare_moon") if ".unusable-other-network-" in f]


def test_light_history_needs_the_projection_model():
    with pytest.raises(ValueError, match="light_history=True needs a ProjectionModel"):
        MoonExecutor(model=torch.nn.Linear(2, 2), data=SYNTHETIC, settings=MoonSettings(light_history=True))
    with pytest.raises(ValueError, match="light_history must be True or False"):
        MoonExecutor(model=Network(seed=0), data=SYNTHETIC, settings=MoonSettings(light_history="yes"))
