"""The MOON paper's loss ablation (Table 5): the ℓ2 representation penalty, its objective and how a job selects it."""

import json

import pytest
import torch
import torch.nn.functional as F

from nvflare_moon.core.losses import representation_l2_loss
from nvflare_moon.core.moon import MoonSettings
from nvflare_moon.core.objectives import RepresentationL2Objective
from nvflare_moon.core.specs import DataSpec
from nvflare_moon.core.training import frozen_copy
from nvflare_moon.executors import MoonExecutor
from nvflare_moon.models import Network
from nvflare_moon.recipes import MoonRecipe

from .executor_harness import site_context

SYNTHETIC = DataSpec(dataset="synthetic")


def test_value_matches_a_hand_computation():
    z = torch.tensor([[3.0, 4.0], [1.0, 1.0]])
    z_glob = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    # ‖(3, 4)‖ = 5 and ‖(0, −1)‖ = 1: mean 3; squared: (25 + 1) / 2 = 13
    assert representation_l2_loss(z, z_glob).item() == pytest.approx(3.0)
    assert representation_l2_loss(z, z_glob, squared=True).item() == pytest.approx(13.0)


def test_gradient_reaches_only_the_local_projection():
    z = torch.tensor([[3.0, 4.0]], requires_grad=True)
    z_glob = torch.zeros(1, 2, requires_grad=True)
    representation_l2_loss(z, z_glob).backward()
    torch.testing.assert_close(z.grad, torch.tensor([[0.6, 0.8]]))  # d‖z‖/dz = z/‖z‖
    assert z_glob.grad is None


def test_zero_with_a_zero_gradient_where_local_equals_global():
    # every round's first step: the local model is the global model, so z = z_glob exactly
    z = torch.randn(4, 8, requires_grad=True)
    loss = representation_l2_loss(z, z.detach().clone())
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(z.grad).all() and torch.count_nonzero(z.grad) == 0


def test_objective_is_cross_entropy_plus_mu_times_the_penalty():
    torch.manual_seed(0)
    local, global_ = Network(seed=0), frozen_copy(Network(seed=1))
    x, y = torch.randn(6, 3, 32, 32), torch.randint(0, 10, (6,))
    out = local(x)
    loss, terms = RepresentationL2Objective(global_, mu=0.5)(out, x, y)
    ce = F.cross_entropy(out.logits, y)
    penalty = (out.projection - global_(x).projection).norm(dim=1).mean()
    assert loss.item() == pytest.approx((ce + 0.5 * penalty).item(), rel=1e-5)
    assert set(terms) == {"ce", "representation_l2"} and terms["representation_l2"].item() > 0
    loss.backward()
    assert all(p.grad is None for p in global_.parameters())


def test_executor_and_recipe_select_the_ablation():
    with pytest.raises(ValueError, match="representation_loss"):
        MoonExecutor(model=Network(seed=0), data=SYNTHETIC, settings=MoonSettings(representation_loss="cosine"))
    assert MoonExecutor(model=Network(seed=0), data=SYNTHETIC).settings.representation_loss == "contrastive"
    recipe = MoonRecipe(name="moon_l2", dataset="synthetic", min_clients=2, representation_loss="l2")
    assert recipe.representation_loss == "l2"
    with pytest.raises(ValueError, match="representation_loss"):
        MoonRecipe(name="bad", dataset="synthetic", min_clients=2, representation_loss="L2")


def test_exported_job_names_the_penalty(tmp_path):
    recipe = MoonRecipe(name="moon_l2", dataset="synthetic", min_clients=2, representation_loss="l2_squared")
    recipe.export(str(tmp_path))
    config = json.loads((tmp_path / "moon_l2" / "app" / "config" / "config_fed_client.json").read_text())
    assert config["executors"][0]["executor"]["args"]["settings"]["args"]["representation_loss"] == "l2_squared"


@pytest.mark.parametrize("representation_loss, power", [("l2", 1), ("l2_squared", 2)])
def test_the_executor_trains_on_the_penalty_it_was_given(representation_loss, power, tmp_path):
    settings = MoonSettings(representation_loss=representation_loss)
    executor = MoonExecutor(model=Network(seed=0), data=SYNTHETIC, settings=settings)
    executor._net = executor.model  # as after the set-up, holding the received global weights
    objective = executor.make_objective(0, fl_ctx=site_context(tmp_path))
    with torch.no_grad():
        executor._net.l2.bias.add_(0.5)  # a local step away from the global model
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    out = executor._net(x)
    _, terms = objective(out, x, y)
    distance = (out.projection - Network(seed=0)(x).projection).norm(dim=1)  # to the received weights
    assert terms["representation_l2"].item() == pytest.approx((distance**power).mean().item(), rel=1e-5)
