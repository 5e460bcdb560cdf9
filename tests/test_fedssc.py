"""FedSSC: the prototype loss, the class means a site uploads, the server's draw, and the whole job in the simulator."""

import ast
import json
import logging
import math
import re

import numpy as np
import pytest
import torch
import torch.nn as nn
from nvflare.apis.fl_constant import ReturnCode
from nvflare.app_common.abstract.fl_model import FLModel

from nvflare_moon.core.fedssc import FedSSCSettings
from nvflare_moon.core.losses import prototype_contrastive_loss
from nvflare_moon.core.moon import MoonSettings
from nvflare_moon.core.objectives import FedSSCObjective, MoonObjective
from nvflare_moon.core.prototypes import (
    ALTERNATE_AVAILABLE,
    ALTERNATE_PROTOTYPES,
    CLASS_COUNTS,
    CLASS_MEANS,
    PROTOTYPE_AVAILABLE,
    PROTOTYPE_SOURCES,
    PROTOTYPES,
    ClassMeanAccumulator,
    prepare_upload,
    read_shared_prototypes,
    select_prototypes,
    usable_class_means,
)
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.core.training import frozen_copy, sgd, train_local
from nvflare_moon.executors import FedSSCExecutor
from nvflare_moon.models import Network
from nvflare_moon.recipes import FedSSCRecipe, FedSSCScriptRecipe
from nvflare_moon.server import PrototypeSharingAggregator

from .conftest import REPO, TINY_TRAINING, export_and_run
from .executor_harness import (
    NUM_CLASSES,
    PROJECTION_DIM,
    global_weights,
    run_task,
    site_context,
    started,
    tiny_dataset,
    tiny_net,
)

SITES = ["site-1", "site-2"]
ROUNDS = 2


# ---- ℓ_glob ------------------------------------------------------------------------------------------------------


def test_prototype_loss_matches_a_hand_computation():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    labels = torch.tensor([0, 1, 2])
    prototypes = torch.tensor([[3.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    available = torch.tensor([True, True, False])
    # sample 0: cos to P0 = 1, to P1 = 1/√2; sample 1: cos to P1 = 1/√2, to P0 = 0; sample 2 (class 2, no prototype): 0
    tau = 0.5
    s0 = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(1 / math.sqrt(2) / tau)))
    s1 = -math.log(math.exp(1 / math.sqrt(2) / tau) / (math.exp(1 / math.sqrt(2) / tau) + math.exp(0)))
    got = prototype_contrastive_loss(z, labels, prototypes, available, tau)
    assert got.item() == pytest.approx((s0 + s1) / 3, rel=1e-6)  # the mean over the whole batch


def test_prototype_loss_keeps_the_positive_in_the_denominator():
    z, labels = torch.randn(4, 3), torch.zeros(4, dtype=torch.long)
    only_own_class = torch.tensor([True, False, False])
    assert prototype_contrastive_loss(z, labels, torch.randn(3, 3), only_own_class, 0.5).item() == pytest.approx(0.0)


def test_prototype_loss_agrees_with_the_formula_on_random_data():
    torch.manual_seed(0)
    z, labels, prototypes = torch.randn(6, 5), torch.randint(0, 4, (6,)), torch.randn(4, 5)
    available = torch.tensor([True, False, True, True])
    expected = 0.0
    for zi, yi in zip(z, labels):
        if available[yi]:
            cos = {c: torch.nn.functional.cosine_similarity(zi, prototypes[c], dim=0).item() for c in (0, 2, 3)}
            expected += -math.log(math.exp(cos[int(yi)] / 0.3) / sum(math.exp(v / 0.3) for v in cos.values()))
    got = prototype_contrastive_loss(z, labels, prototypes, available, 0.3)
    assert got.item() == pytest.approx(expected / 6, rel=1e-5)


def test_prototypes_get_no_gradient_and_samples_without_a_prototype_contribute_nothing():
    z = torch.randn(4, 3, requires_grad=True)
    prototypes = torch.randn(3, 3, requires_grad=True)
    prototypes.data[2] = float("nan")  # an unavailable row is never read
    labels = torch.tensor([0, 1, 2, 2])
    loss = prototype_contrastive_loss(z, labels, prototypes, torch.tensor([True, True, False]), 0.5)
    loss.backward()
    assert torch.isfinite(loss) and prototypes.grad is None
    assert torch.count_nonzero(z.grad[:2]) > 0 and torch.count_nonzero(z.grad[2:]) == 0


def test_prototype_loss_is_exactly_zero_when_no_sample_has_a_prototype():
    z = torch.randn(3, 2, requires_grad=True)
    only_class_0 = torch.tensor([True, False, False])
    loss = prototype_contrastive_loss(z, torch.tensor([1, 1, 2]), torch.randn(3, 2), only_class_0, 0.5)
    assert loss.item() == 0.0


# ---- the objective and the class means -------------------------------------------------------------------------


def batches(n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 3, 2, 2, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def moon(net):
    return MoonObjective(frozen_copy(net), [frozen_copy(tiny_net(seed=5))], mu=5.0, temperature=0.5)


def test_without_prototypes_the_loss_is_exactly_moons():
    net = tiny_net()
    x, y = batches(1)[0]
    out = net(x)
    moon_objective = moon(net)
    objective = FedSSCObjective(moon_objective, None, None, mu_glob=1.0, temperature=0.5, num_classes=3)
    loss, terms = objective(out, x, y)
    expected, _ = moon_objective(out, x, y)
    assert loss.item() == expected.item()
    assert "prototype_contrastive" not in terms and "contrastive" in terms


def test_with_prototypes_the_loss_adds_mu_glob_times_the_prototype_term():
    net = tiny_net()
    x, y = batches(1)[0]
    out = net(x)
    prototypes, available = torch.randn(3, 4), torch.tensor([True, True, False])
    objective = FedSSCObjective(moon(net), prototypes, available, mu_glob=2.0, temperature=0.3, num_classes=3)
    loss, terms = objective(out, x, y)
    glob = prototype_contrastive_loss(out.projection, y, prototypes, available, 0.3)
    assert terms["prototype_contrastive"].item() == pytest.approx(glob.item())
    assert loss.item() == pytest.approx(terms["ce"].item() + 5.0 * terms["contrastive"].item() + 2.0 * glob.item())


def test_class_means_cover_the_last_epochs_forward_passes_only():
    net, data = tiny_net(), batches()
    objective = FedSSCObjective(moon(net), None, None, mu_glob=1.0, temperature=0.5, num_classes=3)

    def before_epoch(epoch):
        if epoch == 1:
            objective.record_class_means()

    # lr 0: the weights do not move, so the forward passes of the last epoch are those of the initial model
    train_local(net, data, objective, sgd(net, 0.0, 0.0, 0.0), 2, torch.device("cpu"), before_epoch=before_epoch)
    means, counts = objective.class_means.result()
    x, y = torch.cat([b[0] for b in data]), torch.cat([b[1] for b in data])
    with torch.no_grad():
        z = net(x).projection
    np.testing.assert_array_equal(counts, np.bincount(y.numpy(), minlength=3))  # one epoch, not two
    for c in range(3):
        np.testing.assert_allclose(means[c], z[y == c].mean(0).numpy(), rtol=1e-5, atol=1e-6)
    assert means.dtype == np.float32 and counts.dtype == np.int64


def test_class_mean_accumulator_detaches_what_it_records():
    """The sums must not hold the autograd graph of the batches (that would keep every batch's graph alive)."""
    acc = ClassMeanAccumulator(num_classes=2)
    w = torch.tensor(2.0, requires_grad=True)
    z = w * torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    acc.add(z, torch.tensor([0, 1]))
    acc.add(z, torch.tensor([1, 1]))
    assert z.requires_grad and z.grad_fn is not None
    assert not acc._sums.requires_grad and acc._sums.grad_fn is None
    np.testing.assert_allclose(acc.result()[0], [[2.0, 4.0], [(6 + 2 + 6) / 3, (8 + 4 + 8) / 3]])


def test_class_mean_accumulator_by_hand():
    acc = ClassMeanAccumulator(num_classes=3)
    acc.add(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([0, 0]))
    acc.add(torch.tensor([[5.0, 6.0]]), torch.tensor([2]))
    means, counts = acc.result()
    np.testing.assert_allclose(means, [[2.0, 3.0], [0.0, 0.0], [5.0, 6.0]])
    np.testing.assert_array_equal(counts, [2, 0, 1])


# ---- what leaves a site ------------------------------------------------------------------------------------------


def test_upload_withholds_classes_below_the_threshold_and_is_otherwise_unchanged_by_default():
    means = np.array([[3.0, 4.0], [1.0, 1.0], [0.5, 0.5]], np.float32)
    means_out, counts_out = prepare_upload(means, np.array([12, 9, 10]), min_class_count=10)
    np.testing.assert_array_equal(means_out, [[3.0, 4.0], [0.0, 0.0], [0.5, 0.5]])
    np.testing.assert_array_equal(counts_out, [12, 0, 10])


def test_upload_clipping_and_noise():
    means = np.array([[3.0, 4.0], [0.3, 0.4], [1.0, 0.0]], np.float32)
    counts = np.array([20, 20, 1])
    clipped, _ = prepare_upload(means, counts, 10, clip_norm=1.0)
    np.testing.assert_allclose(clipped, [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]], rtol=1e-6)  # only longer ones shrink
    rng = np.random.default_rng(0)
    noisy, _ = prepare_upload(np.zeros((2, 20000), np.float32), np.array([20, 0]), 10, 1.0, 0.5, rng)
    assert np.std(noisy[0]) == pytest.approx(0.5, rel=0.03)
    assert not noisy[1].any()  # a withheld class stays zero: no noise reveals that it exists


@pytest.mark.parametrize(
    "arguments, name",
    [
        (lambda: {"fedssc_settings": FedSSCSettings(mu_glob=-1.0)}, "mu_glob"),
        (lambda: {"fedssc_settings": FedSSCSettings(min_class_count=0)}, "min_class_count"),
        (lambda: {"fedssc_settings": FedSSCSettings(prototype_clip_norm=0.0)}, "prototype_clip_norm"),
        (lambda: {"fedssc_settings": FedSSCSettings(prototype_noise_std=-0.1)}, "prototype_noise_std"),
        (lambda: {"settings": MoonSettings(mu=-1.0)}, "mu"),
    ],
    ids=["mu_glob", "min_class_count", "prototype_clip_norm", "prototype_noise_std", "mu"],
)
def test_bad_executor_arguments_are_refused_by_name(arguments, name):
    with pytest.raises(ValueError, match=name):
        FedSSCExecutor(model=Network(), **arguments())


def test_executor_needs_a_projection_model():
    class Other(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(ValueError, match="ProjectionModel"):
        FedSSCExecutor(model=Other())


# ---- the executor ------------------------------------------------------------------------------------------------

EXECUTOR_LABELS = [0] * 6 + [1] * 4 + [2] * 2  # 12 samples, 3 whole batches of 4: every sample in every epoch


def fedssc_site(tmp_path, local_epochs=2):
    executor = FedSSCExecutor(
        model=tiny_net(),
        data=DataSpec(dataset=tiny_dataset(EXECUTOR_LABELS)),
        training=TrainingSpec(local_epochs=local_epochs, batch_size=4, lr=0.05, device="cpu"),
        fedssc_settings=FedSSCSettings(min_class_count=1),
    )
    ctx = site_context(tmp_path)
    return started(executor, ctx), ctx


def test_class_means_are_collected_over_the_last_local_epoch_only(tmp_path):
    executor, ctx = fedssc_site(tmp_path, local_epochs=3)
    code, reply = run_task(executor, ctx, global_weights())
    assert code == ReturnCode.OK
    assert reply.meta[CLASS_COUNTS].tolist() == [6, 4, 2]  # one epoch's samples per class, not two or three
    assert reply.meta[CLASS_MEANS].shape == (NUM_CLASSES, PROJECTION_DIM)
    executor.make_objective(1, ctx)
    executor.before_epoch(0)
    executor.before_epoch(1)
    assert executor._round.objective.class_means is None
    executor.before_epoch(2)
    assert executor._round.objective.class_means is not None


def test_executor_uploads_the_mean_projections_of_the_last_local_epoch(tmp_path):
    """The uploaded means are those of the training forward passes of the last epoch (the model moves between
    epochs, so the first epoch's, or all epochs', means differ)."""
    executor, ctx = fedssc_site(tmp_path, local_epochs=3)
    dataset = executor.data.dataset
    label_of = {x.numpy().tobytes(): int(y) for x, y in dataset}
    forwards = []  # (projections, labels) of every training forward pass, in order

    def record(module, inputs, out):
        if module.training:
            labels = [label_of[x.numpy().tobytes()] for x in inputs[0]]
            forwards.append((out.projection.detach().clone(), torch.tensor(labels)))

    executor.model.register_forward_hook(record)
    code, reply = run_task(executor, ctx, global_weights())
    assert code == ReturnCode.OK and len(forwards) == 9  # 3 epochs × 3 batches of 4

    def class_means(passes):
        z, y = torch.cat([p[0] for p in passes]), torch.cat([p[1] for p in passes])
        return np.stack([z[y == c].mean(0).numpy() for c in range(NUM_CLASSES)])

    np.testing.assert_allclose(reply.meta[CLASS_MEANS], class_means(forwards[6:]), rtol=1e-5, atol=1e-6)
    assert not np.allclose(class_means(forwards[:3]), class_means(forwards[6:]), atol=1e-3)  # the test discriminates


def test_prototypes_that_do_not_fit_give_a_warning_and_a_round_without_the_term(tmp_path, caplog):
    executor, ctx = fedssc_site(tmp_path)
    fitting = {PROTOTYPES: np.ones((NUM_CLASSES, PROJECTION_DIM), np.float32), PROTOTYPE_AVAILABLE: np.ones(3, bool)}
    _, with_prototypes = run_task(executor, ctx, global_weights(), round_number=0, meta=fitting)
    assert "train_prototype_contrastive" in with_prototypes.metrics
    malformed = {**fitting, PROTOTYPES: np.ones((NUM_CLASSES, PROJECTION_DIM + 1), np.float32)}
    with caplog.at_level(logging.WARNING):
        code, reply = run_task(executor, ctx, global_weights(), round_number=1, meta=malformed)
    assert code == ReturnCode.OK and "train_prototype_contrastive" not in reply.metrics
    assert "site-1: round 1: received prototypes of float32 (3, 5), expected float (3, 4)" in caplog.text
    assert "training this round without the prototype term" in caplog.text
    assert reply.meta[CLASS_COUNTS].tolist() == [6, 4, 2]  # it still uploads its class means


# ---- the server's draw -------------------------------------------------------------------------------------------

K, D = 4, 3


def upload(site_index, counts):
    means = np.full((K, D), float(site_index), np.float32) + np.arange(K, dtype=np.float32)[:, None] / 10
    return means, np.array(counts, np.int64)


def test_only_sites_at_or_above_the_threshold_are_drawn_and_missing_classes_are_masked():
    uploads = {"a": upload(1, [10, 9, 0, 50]), "b": upload(2, [11, 9, 0, 0]), "c": upload(3, [0, 9, 0, 10])}
    chosen = {c: set() for c in range(K)}
    for seed in range(200):
        shared = select_prototypes(uploads, K, D, min_class_count=10, rng=np.random.default_rng(seed))
        np.testing.assert_array_equal(shared.available, [True, False, False, True])
        for c, site in shared.sources.items():
            chosen[c].add(site)
            np.testing.assert_array_equal(shared.prototypes[c], uploads[site][0][c])
        assert not shared.prototypes[1].any() and not shared.prototypes[2].any()
    assert chosen == {0: {"a", "b"}, 1: set(), 2: set(), 3: {"a", "c"}}  # every eligible site, and only those


def test_draw_is_uniform_among_eligible_sites():
    uploads = {s: upload(i, [10] * K) for i, s in enumerate("abcd")}
    picks = [select_prototypes(uploads, K, D, 10, np.random.default_rng(s)).sources[0] for s in range(2000)]
    frequencies = np.array([picks.count(s) for s in "abcd"]) / len(picks)
    np.testing.assert_allclose(frequencies, 0.25, atol=0.04)


def test_draw_is_reproducible_for_a_seed_and_ignores_arrival_order():
    uploads = {s: upload(i, [10] * K) for i, s in enumerate("abcde")}
    reversed_order = dict(reversed(list(uploads.items())))
    first = select_prototypes(uploads, K, D, 10, np.random.default_rng([7, 3])).sources
    assert select_prototypes(reversed_order, K, D, 10, np.random.default_rng([7, 3])).sources == first
    others = [select_prototypes(uploads, K, D, 10, np.random.default_rng([7, r])).sources for r in range(4, 10)]
    assert any(o != first for o in others)


def test_nan_and_wrong_shapes_are_refused_with_the_reason():
    means, counts = upload(1, [20, -1, 20, 20])
    means[2, 1] = np.nan
    usable_means, usable_counts, problems = usable_class_means(means, counts, K, D)
    np.testing.assert_array_equal(usable_counts, [20, 0, 0, 20])
    assert np.isfinite(usable_means).all()
    assert problems == ["class 2: its mean holds NaN or Inf", "class 1: negative count -1"]
    _, counts_wrong, problems = usable_class_means(np.zeros((K, D + 1), np.float32), counts, K, D)
    assert not counts_wrong.any() and "shape (4, 3)" in problems[0]
    _, counts_wrong, problems = usable_class_means(means, counts[:2], K, D)
    assert not counts_wrong.any() and "class_counts" in problems[0]


def site_result(site, n, weight, means=None, counts=None):
    meta = {"client_name": site, "num_samples": n}
    if means is not None:
        meta.update({CLASS_MEANS: means, CLASS_COUNTS: counts})
    return FLModel(params={"w": np.array([weight], np.float32)}, metrics={"train_loss": 1.0}, meta=meta)


def test_aggregator_shares_drawn_prototypes_as_numpy_and_warns_naming_the_site(caplog):
    bad = upload(2, [20, 20, 20, 20])[0]
    bad[0] = np.inf
    results = [
        site_result("site-1", 100, 1.0, *upload(1, [20, 5, 0, 20])),
        site_result("site-2", 300, 5.0, bad, np.array([20, 5, 0, 0])),
        site_result("site-3", 100, 3.0, np.zeros((K + 1, D), np.float32), np.array([20] * (K + 1))),
        site_result("site-4", 100, 3.0),  # no class means at all: its weights still count
    ]
    aggregator = PrototypeSharingAggregator(num_classes=K, prototype_dim=D, min_class_count=10, seed=3)
    with caplog.at_level(logging.WARNING):
        assert all(aggregator.accept_model(r) for r in results)
        result = aggregator.aggregate_model()
    assert "site-2" in caplog.text and "class 0" in caplog.text
    assert "site-3" in caplog.text and "shape" in caplog.text and "site-4" in caplog.text
    np.testing.assert_allclose(result.params["w"], [(100 * 1 + 300 * 5 + 100 * 3 + 100 * 3) / 600])
    prototypes, available = result.meta[PROTOTYPES], result.meta[PROTOTYPE_AVAILABLE]
    assert isinstance(prototypes, np.ndarray) and prototypes.dtype == np.float32 and prototypes.shape == (K, D)
    assert isinstance(available, np.ndarray) and available.dtype == bool
    np.testing.assert_array_equal(available, [True, False, False, True])  # site-2's class 0 (Inf) was refused
    np.testing.assert_array_equal(prototypes[[0, 3]], upload(1, [0] * K)[0][[0, 3]])  # so site-1 is the only source
    assert result.meta["site_prototype_classes"] == {"site-1": 2, "site-2": 0, "site-3": 0, "site-4": 0}
    assert aggregator._class_means == {}  # ready for the next round


def test_excluding_the_own_prototype_gives_each_site_a_uniform_draw_among_the_others():
    uploads = {"a": upload(1, [10, 10, 0, 50]), "b": upload(2, [11, 0, 0, 10]), "c": upload(3, [0, 0, 0, 10])}
    received = {site: {c: [] for c in range(K)} for site in uploads}
    for seed in range(2000):
        shared = select_prototypes(uploads, K, D, 10, np.random.default_rng(seed), exclude_own=True)
        meta = shared.meta()
        assert meta[PROTOTYPE_SOURCES] == [shared.sources.get(c, "") for c in range(K)]
        for site in uploads:
            prototypes, available = read_shared_prototypes(meta, K, D, site)
            for c in range(K):
                if available[c]:
                    (owner,) = [s for s in uploads if np.array_equal(uploads[s][0][c], prototypes[c])]
                    received[site][c].append(owner)
    # class 0: a and b eligible: each gets the other's, always
    assert set(received["a"][0]) == {"b"} and set(received["b"][0]) == {"a"} and len(received["c"][0]) == 2000
    # class 1: only a is eligible: a gets no prototype of it, the others get a's
    assert received["a"][1] == [] and set(received["b"][1]) == {"a"}
    # class 3: all three eligible: every site gets the two others, each about half of the time
    for site in uploads:
        owners = received[site][3]
        assert len(owners) == 2000 and site not in owners
        assert all(owners.count(other) / 2000 == pytest.approx(0.5, abs=0.04) for other in set(uploads) - {site})
    plain = select_prototypes(uploads, K, D, 10, np.random.default_rng(0)).meta()
    assert set(plain) == {PROTOTYPES, PROTOTYPE_AVAILABLE}  # off by default: nothing more is sent
    assert {ALTERNATE_PROTOTYPES, ALTERNATE_AVAILABLE} <= set(shared.meta())


def test_aggregator_and_recipe_pass_the_exclusion_option(tmp_path):
    aggregator = PrototypeSharingAggregator(
        num_classes=K, prototype_dim=D, min_class_count=1, exclude_own_prototype=True
    )
    for site, seed in (("site-1", 1), ("site-2", 2)):
        means, counts = upload(seed, [5, 5, 5, 5])
        meta = {"client_name": site, "num_samples": 10, CLASS_MEANS: means, CLASS_COUNTS: counts}
        assert aggregator.accept_model(FLModel(params={"w": np.ones(2, np.float32)}, meta=meta))
    meta = aggregator.aggregate_model().meta
    assert len(meta[PROTOTYPE_SOURCES]) == K and set(meta[PROTOTYPE_SOURCES]) <= {"site-1", "site-2"}
    assert meta[ALTERNATE_AVAILABLE].all()
    with pytest.raises(ValueError, match="exclude_own_prototype"):
        PrototypeSharingAggregator(num_classes=K, exclude_own_prototype=1)
    FedSSCRecipe(name="exclude", exclude_own_prototype=True).export(str(tmp_path))
    server = json.loads((tmp_path / "exclude/app/config/config_fed_server.json").read_text())
    assert server["workflows"][0]["args"]["aggregator"]["args"]["exclude_own_prototype"] is True


def test_mu_defaults_to_moons_best_mu_for_the_dataset():
    assert FedSSCRecipe().mu == 5.0
    assert FedSSCRecipe(dataset="cifar100").mu == 1.0
    assert FedSSCRecipe(dataset="tinyimagenet").mu == 1.0
    assert FedSSCRecipe(dataset="cifar100", mu=3.0).mu == 3.0
    recipe = FedSSCRecipe(dataset="cifar100")
    assert recipe.moon_settings().mu == 1.0  # what the executor gets


def test_the_old_name_mu_moon_still_works_for_one_release_with_a_warning(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"FedSSCRecipe\(mu_moon=\.\.\.\) is deprecated .* use mu=") as warned:
        assert FedSSCRecipe(mu_moon=3.0).moon_settings().mu == 3.0
    assert warned[0].filename == __file__  # the user's line, not the recipe's
    script = tmp_path / "client.py"
    script.write_text("")
    with pytest.warns(DeprecationWarning, match="FedSSCScriptRecipe"):
        recipe = FedSSCScriptRecipe(
            model=Network(), min_clients=2, train_script=str(script), num_classes=10, prototype_dim=256, mu_moon=3.0
        )
    assert recipe.client_settings()["moon_mu"] == 3.0
    with pytest.raises(TypeError, match="give mu alone, not mu and mu_moon"):
        FedSSCRecipe(mu=2.0, mu_moon=3.0)


def test_site_reads_what_the_server_sent_and_refuses_what_does_not_fit():
    assert read_shared_prototypes({}, K, D) is None
    sent = {PROTOTYPES: np.ones((K, D), np.float32), PROTOTYPE_AVAILABLE: np.array([True, False, True, True])}
    prototypes, available = read_shared_prototypes(sent, K, D)
    assert prototypes.shape == (K, D) and available.tolist() == [True, False, True, True]
    with pytest.raises(ValueError, match="expected float"):
        read_shared_prototypes(sent, K + 1, D)
    sent[PROTOTYPES] = np.full((K, D), np.nan, np.float32)
    with pytest.raises(ValueError, match="NaN"):
        read_shared_prototypes(sent, K, D)


# ---- the whole job -----------------------------------------------------------------------------------------------


def test_committed_job_has_the_papers_defaults():
    client = json.loads((REPO / "jobs/fedssc_cifar10/app/config/config_fed_client.json").read_text())
    args = client["executors"][0]["executor"]["args"]
    expected = dict(
        settings=dict(mu=5.0, temperature=0.5),
        fedssc_settings=dict(mu_glob=1.0, min_class_count=10, prototype_clip_norm=None, prototype_noise_std=0.0),
        data=dict(dataset="cifar10", num_sites=10),
        training=dict(local_epochs=10),
    )
    assert {spec: {k: args[spec]["args"][k] for k in fields} for spec, fields in expected.items()} == expected
    server = json.loads((REPO / "jobs/fedssc_cifar10/app/config/config_fed_server.json").read_text())
    aggregator = server["workflows"][0]["args"]["aggregator"]
    assert aggregator["path"].endswith("PrototypeSharingAggregator")
    assert aggregator["args"] == dict(
        num_classes=10, prototype_dim=256, min_class_count=10, seed=0, exclude_own_prototype=False
    )


def test_recipe_refuses_bad_settings_by_name():
    with pytest.raises(ValueError, match="mu_glob"):
        FedSSCRecipe(mu_glob=-1.0)
    with pytest.raises(ValueError, match="prototype_noise_std"):
        FedSSCRecipe(prototype_noise_std=-1.0)


@pytest.fixture(scope="module")
def fedssc_run(tmp_path_factory):
    recipe = FedSSCRecipe(name="fedssc_tiny", min_clients=2, num_rounds=ROUNDS, **TINY_TRAINING)
    # -t < -n: the simulator restarts the client processes for every task
    return export_and_run(recipe, tmp_path_factory.mktemp("fedssc_e2e"), n=2, t=1)


@pytest.mark.e2e
def test_fedssc_job_runs_with_restarted_clients(fedssc_run):
    run = fedssc_run
    assert run.returncode == 0, run.output[-3000:]
    metrics = run.global_metrics()
    assert [m["round"] for m in metrics] == list(range(ROUNDS))
    for site in SITES:
        record = torch.load(run.site_dir(site) / "nvflare_moon" / "fedssc_state.pt", weights_only=True)
        assert record["round"] == ROUNDS - 1  # MOON's previous model, persisted
        for later in metrics[1:]:
            assert later["site_metrics"][site]["train_contrastive"] > 0


@pytest.mark.e2e
def test_prototypes_make_the_round_trip_through_nvflare(fedssc_run):
    run = fedssc_run
    metrics = run.global_metrics()
    assert run.output.count("no shared prototypes yet, the prototype term is dropped") == len(SITES)  # round 0 only
    for site in SITES:
        assert "train_prototype_contrastive" not in metrics[0]["site_metrics"][site]
        for later in metrics[1:]:
            assert later["site_metrics"][site]["train_prototype_contrastive"] > 0
    for r in range(ROUNDS - 1):
        shared = sum(metrics[r]["site_prototype_classes"].values())  # drawn by the server after round r
        assert shared >= 2
        # ... and received by every site with the next global model
        assert run.output.count(f"round {r + 1}: received prototypes for {shared} of 10 classes") == len(SITES)
    # the last draw, as the server stored it with the final global model: numpy through and through
    meta = torch.load(run.server_dir() / "app_server" / "FL_global_model.pt", weights_only=False)["meta_props"]
    prototypes, available = meta[PROTOTYPES], meta[PROTOTYPE_AVAILABLE]
    assert prototypes.dtype == np.float32 and prototypes.shape == (10, 256) and available.dtype == bool
    assert available.sum() == sum(metrics[-1]["site_prototype_classes"].values())
    assert np.all(np.linalg.norm(prototypes[available], axis=1) > 0) and not prototypes[~available].any()


@pytest.fixture(scope="module")
def fedssc_options_run(tmp_path_factory):
    recipe = FedSSCRecipe(
        name="fedssc_options",
        min_clients=2,
        num_rounds=2,
        prototype_clip_norm=1.0,
        prototype_noise_std=0.01,
        exclude_own_prototype=True,
        **TINY_TRAINING,
    )
    return export_and_run(recipe, tmp_path_factory.mktemp("fedssc_options_e2e"), n=2, t=2)


@pytest.mark.e2e
def test_clipping_noise_and_exclusion_end_to_end(fedssc_options_run):
    """Uploaded prototypes are clipped to norm 1 and then noised; with two sites each site trains on the other's."""
    run, sites = fedssc_options_run, SITES
    assert run.returncode == 0, run.output[-3000:]
    metrics = run.global_metrics()
    assert [m["round"] for m in metrics] == [0, 1]
    meta = torch.load(run.server_dir() / "app_server" / "FL_global_model.pt", weights_only=False)["meta_props"]
    available = meta[PROTOTYPE_AVAILABLE]
    norms = np.linalg.norm(meta[PROTOTYPES][available], axis=1)
    # clipped to ≤ 1, then N(0, 0.01²) per entry: a noise vector of norm ≈ 0.01·√256 = 0.16
    assert available.any() and np.all(norms < 1.0 + 0.5) and np.any(np.abs(norms - 1.0) > 1e-4)
    assert set(s for s in meta[PROTOTYPE_SOURCES] if s) <= set(sites)
    assert np.all(meta[ALTERNATE_AVAILABLE] <= available)
    # Round 1 trains on round 0's draw. With two sites, a class drawn from site A reaches A only as B's mean, so A
    # lacks the classes drawn from it that B did not have enough of: predict each site's count from the logs.
    counts = {
        site: np.array(json.loads(re.search(rf"{site}: round 0: uploading .*\(counts (\[.*?\])\)", run.output)[1]))
        for site in sites
    }
    drawn = ast.literal_eval(re.search(r"round 0: shared prototypes .*\(class: source site\) (\{.*?\})", run.output)[1])
    for site, other in (sites, sites[::-1]):
        expected = sum(1 for c, source in drawn.items() if source != site or counts[other][c] >= 10)
        assert f"{site}: round 1: received prototypes for {expected} of 10 classes" in run.output
    assert any(
        source == site and counts[other][c] < 10 for c, source in drawn.items() for site, other in (sites, sites[::-1])
    ), "the run has no class that tests the exclusion"
