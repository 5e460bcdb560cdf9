import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from nvflare_moon.core.objectives import CrossEntropyObjective, MoonObjective
from nvflare_moon.core.training import evaluate, frozen_copy, sgd, train_local
from nvflare_moon.models import ProjectionModel


def tiny_net(seed=0, batchnorm=False):
    torch.manual_seed(seed)
    layers = [nn.Flatten(), nn.Linear(12, 6)] + ([nn.BatchNorm1d(6)] if batchnorm else [])
    return ProjectionModel(nn.Sequential(*layers), feat_dim=6, num_classes=3, out_dim=4)


def batches(n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 3, 2, 2, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def test_frozen_copy_is_in_eval_mode_and_takes_no_gradient():
    net = tiny_net(batchnorm=True)
    frozen = frozen_copy(net)
    assert not frozen.training and all(not p.requires_grad for p in frozen.parameters())
    assert net.training and all(p.requires_grad for p in net.parameters())


def test_moon_objective_without_previous_model_is_plain_cross_entropy():
    net = tiny_net()
    x, y = batches(1)[0]
    out = net(x)
    loss, terms = MoonObjective(frozen_copy(net), [], mu=5.0, temperature=0.5)(out, x, y)
    expected, _ = CrossEntropyObjective()(out, x, y)
    assert loss.item() == pytest.approx(expected.item())
    assert "contrastive" not in terms


def test_moon_objective_with_previous_equal_to_global_adds_mu_ln2():
    net = tiny_net()
    x, y = batches(1)[0]
    out = net(x)
    glob = frozen_copy(net)
    loss, terms = MoonObjective(glob, [frozen_copy(net)], mu=5.0, temperature=0.5)(out, x, y)
    assert terms["contrastive"].item() == pytest.approx(math.log(2), rel=1e-5)
    assert loss.item() == pytest.approx(terms["ce"].item() + 5.0 * math.log(2), rel=1e-5)


def test_moon_objective_pairs_z_with_the_global_models_projection_and_pushes_it_from_the_previous_ones():
    local, glob, previous = tiny_net(seed=0), frozen_copy(tiny_net(seed=1)), frozen_copy(tiny_net(seed=2))
    x, y = batches(1)[0]
    out = local(x)
    loss, terms = MoonObjective(glob, [previous], mu=2.0, temperature=0.5)(out, x, y)
    # eq. 3 written out, with three different networks: positive pair (z, z_glob), negative pair (z, z_prev)
    with torch.no_grad():
        positive = F.cosine_similarity(out.projection, glob(x).projection, dim=1) / 0.5
        negative = F.cosine_similarity(out.projection, previous(x).projection, dim=1) / 0.5
        expected = (torch.logaddexp(positive, negative) - positive).mean()
        ce = F.cross_entropy(out.logits, y)
    assert terms["contrastive"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert loss.item() == pytest.approx(ce.item() + 2.0 * expected.item(), rel=1e-5)


def test_training_changes_only_the_local_model():
    net = tiny_net(batchnorm=True)
    glob, prev = frozen_copy(net), frozen_copy(tiny_net(seed=3, batchnorm=True))
    before = {
        k: v.clone() for k, v in list(glob.state_dict().items()) + [("p." + k, v) for k, v in prev.state_dict().items()]
    }
    objective = MoonObjective(glob, [prev], mu=5.0, temperature=0.5)
    result = train_local(net, batches(), objective, sgd(net, 0.1, 0.9, 1e-5), epochs=2, device=torch.device("cpu"))
    assert result.steps == 8 and not result.aborted
    assert set(result.mean_terms) == {"ce", "contrastive", "loss"}
    after = {k: v for k, v in list(glob.state_dict().items()) + [("p." + k, v) for k, v in prev.state_dict().items()]}
    for k in before:
        torch.testing.assert_close(before[k], after[k])  # running stats too: they ran in eval mode
    assert all(p.grad is None for p in list(glob.parameters()) + list(prev.parameters()))
    assert not torch.equal(net.l1.weight, glob.l1.weight)


def test_mean_terms_are_the_average_over_steps():
    net = tiny_net()
    data = batches(3)
    seen = []

    def objective(out, x, y):
        loss, terms = CrossEntropyObjective()(out, x, y)
        seen.append(loss.item())
        return loss, terms

    result = train_local(net, data, objective, sgd(net, 0.01, 0.0, 0.0), epochs=1, device=torch.device("cpu"))
    assert result.mean_terms["loss"] == pytest.approx(sum(seen) / 3, rel=1e-6)


def test_each_term_is_averaged_over_the_steps_that_computed_it():
    """A term computed only in the second epoch (FedSiam-DA's history term in round 0) is its mean over those steps,
    not diluted by the steps without it; a term in every step is the mean over all of them."""
    net = tiny_net()
    epoch = []
    extra_values = []

    def objective(out, x, y):
        loss, terms = CrossEntropyObjective()(out, x, y)
        if epoch[-1] == 1:
            extra = torch.tensor(float(len(extra_values) + 1))  # 1, 2, 3
            extra_values.append(extra.item())
            terms["extra"] = extra
        return loss, terms

    result = train_local(
        net,
        batches(3),
        objective,
        sgd(net, 0.01, 0.0, 0.0),
        epochs=2,
        device=torch.device("cpu"),
        before_epoch=epoch.append,
    )
    assert result.steps == 6 and extra_values == [1.0, 2.0, 3.0]
    assert result.mean_terms["extra"] == pytest.approx(2.0)  # (1 + 2 + 3) / 3, not / 6


def test_abort_stops_before_the_next_step():
    net = tiny_net()
    calls = iter([False, False, True])
    result = train_local(
        net,
        batches(),
        CrossEntropyObjective(),
        sgd(net, 0.01, 0.9, 0),
        epochs=5,
        device=torch.device("cpu"),
        should_stop=lambda: next(calls),
    )
    assert result.aborted and result.steps == 2


def test_after_step_runs_after_every_optimizer_step():
    net = tiny_net()
    count = []
    train_local(
        net,
        batches(),
        CrossEntropyObjective(),
        sgd(net, 0.01, 0.9, 0),
        2,
        torch.device("cpu"),
        after_step=lambda: count.append(1),
    )
    assert len(count) == 8


def test_new_optimizer_has_no_momentum_buffer():
    net = tiny_net()
    opt = sgd(net, 0.01, 0.9, 1e-5)
    assert opt.defaults["lr"] == 0.01 and opt.defaults["momentum"] == 0.9 and opt.defaults["weight_decay"] == 1e-5
    assert all(not opt.state[p] for p in net.parameters())


def test_evaluate_counts_correct_predictions():
    net = tiny_net()
    x, _ = batches(1)[0]
    pred = net.eval()(x).logits.argmax(1)
    y = pred.clone()
    y[:3] = (pred[:3] + 1) % 3
    result = evaluate(net, [(x, y)], torch.device("cpu"))
    assert result["accuracy"] == pytest.approx(5 / 8)
