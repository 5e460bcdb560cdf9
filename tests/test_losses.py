import math

import pytest
import torch
import torch.nn.functional as F

from nvflare_moon.core.losses import model_contrastive_loss


def test_value_matches_a_hand_computation():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    z_prev = torch.tensor([[-1.0, 0.0], [3.0, 0.0]])
    tau = 0.5
    # sample 0: cos(z, z_glob) = 1/sqrt(2), cos(z, z_prev) = -1; sample 1: 1 and 0
    s0 = -math.log(math.exp(2 / math.sqrt(2)) / (math.exp(2 / math.sqrt(2)) + math.exp(-2)))
    s1 = -math.log(math.exp(2) / (math.exp(2) + math.exp(0)))
    got = model_contrastive_loss(z, z_glob, [z_prev], tau)
    assert got.item() == pytest.approx((s0 + s1) / 2, rel=1e-6)


def test_two_previous_models_enter_the_denominator():
    z, zg, p1, p2 = (
        torch.tensor([[1.0, 0.0]]),
        torch.tensor([[1.0, 0.0]]),
        torch.tensor([[0.0, 1.0]]),
        torch.tensor([[-1.0, 0.0]]),
    )
    expected = -math.log(math.exp(1) / (math.exp(1) + math.exp(0) + math.exp(-1)))
    assert model_contrastive_loss(z, zg, [p1, p2], 1.0).item() == pytest.approx(expected, rel=1e-6)


def test_previous_equal_to_global_gives_ln2_and_zero_gradient():
    z = torch.randn(8, 16, requires_grad=True)
    z_glob = torch.randn(8, 16)
    loss = model_contrastive_loss(z, z_glob, [z_glob.clone()], 0.5)
    assert loss.item() == pytest.approx(math.log(2), rel=1e-6)
    (5.0 * loss).backward()
    assert torch.count_nonzero(z.grad) == 0


def test_no_gradient_reaches_global_or_previous_models():
    z = torch.randn(4, 8, requires_grad=True)
    z_glob = torch.randn(4, 8, requires_grad=True)
    z_prev = torch.randn(4, 8, requires_grad=True)
    model_contrastive_loss(z, z_glob, [z_prev], 0.5).backward()
    assert z.grad is not None and torch.count_nonzero(z.grad) > 0
    assert z_glob.grad is None and z_prev.grad is None


def test_exactly_zero_without_previous_model():
    z = torch.randn(4, 8, requires_grad=True)
    loss = model_contrastive_loss(z, torch.randn(4, 8), [], 0.5)
    assert loss.item() == 0.0


def test_agrees_with_the_reference_code_formulation():
    # QinbinLi/MOON: logits = cat(cos(z, z_glob), cos(z, z_prev)) / tau, CE with label 0
    torch.manual_seed(0)
    z, zg, zp = torch.randn(5, 7), torch.randn(5, 7), torch.randn(5, 7)
    logits = torch.stack([F.cosine_similarity(z, zg), F.cosine_similarity(z, zp)], dim=1) / 0.5
    expected = F.cross_entropy(logits, torch.zeros(5, dtype=torch.long))
    torch.testing.assert_close(model_contrastive_loss(z, zg, [zp], 0.5), expected)
