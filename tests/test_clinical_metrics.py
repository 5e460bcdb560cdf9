"""Clinical figures (nvflare_moon/core/clinical_metrics.py): hand-computed cases, scikit-learn on the same predictions,
the key metric that picks the best model, and two hospitals reporting them every round in the real simulator."""

import json
import re

import numpy as np
import pytest
import torch
import torch.nn as nn
from sklearn.metrics import roc_auc_score

from nvflare_moon.core.clinical_metrics import clinical_metrics
from nvflare_moon.core.training import clinical_evaluation, evaluate
from nvflare_moon.models import ModelOutput
from nvflare_moon.recipes import FedAvgBaselineRecipe, MoonRecipe
from nvflare_moon.server import GlobalModelEvaluator

from .conftest import run_simulator
from .site_images import set_site_paths, write_image_folder


def test_binary_figures_as_computed_by_hand():
    labels = np.array([0, 0, 1, 1, 1])
    p_positive = np.array([0.1, 0.4, 0.35, 0.8, 0.4])  # the last positive ties with a negative
    figures = clinical_metrics(labels, np.stack([1 - p_positive, p_positive], axis=1))
    # predicted (p > 0.5): 0 0 0 1 0 -> TP 1, FN 2, TN 2, FP 0
    assert figures.confusion == [[2, 0], [2, 1]]
    assert figures.scalars["sensitivity"] == pytest.approx(1 / 3)
    assert figures.scalars["specificity"] == 1.0
    assert figures.scalars["balanced_accuracy"] == pytest.approx((1 / 3 + 1) / 2)
    # F1: class 0 precision 2/4, recall 1 -> 2/3; class 1 precision 1, recall 1/3 -> 1/2
    assert figures.scalars["f1"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    # AUROC over the 3·2 positive-negative pairs: 0.35 beats 0.1; 0.8 beats both; 0.4 beats 0.1, ties 0.4 (1/2)
    assert figures.scalars["auroc"] == pytest.approx((1 + 2 + 1.5) / 6)
    assert "auroc_class0" not in figures.scalars  # two classes: class 1's figures only


def test_multiclass_figures_are_macro_means_and_skip_what_a_site_cannot_define():
    labels = np.array([0, 0, 1, 1])  # class 2 is absent from this site's test set
    probabilities = np.array([[0.7, 0.2, 0.1], [0.2, 0.3, 0.5], [0.1, 0.8, 0.1], [0.3, 0.6, 0.1]])
    figures = clinical_metrics(labels, probabilities)
    assert figures.confusion == [[1, 0, 1], [0, 2, 0], [0, 0, 0]]
    # sensitivity: class 0 1/2, class 1 1, class 2 undefined; specificity: class 0 1, class 1 1, class 2 3/4
    assert figures.scalars["sensitivity"] == pytest.approx(0.75)
    assert figures.scalars["specificity"] == pytest.approx((1 + 1 + 0.75) / 3)
    # class 0 against the rest: 0.7 and 0.2 against 0.1 and 0.3 -> 0.7 beats both, 0.2 beats 0.1 -> 3/4
    assert figures.scalars["auroc_class0"] == pytest.approx(0.75)
    assert figures.scalars["auroc_class1"] == 1.0 and "auroc_class2" not in figures.scalars
    assert figures.scalars["auroc"] == pytest.approx((0.75 + 1.0) / 2)
    assert not any(np.isnan(v) for v in figures.scalars.values())


class _Fixed(nn.Module):
    """Logits that are the input itself: the test chooses the predictions."""

    def forward(self, x):
        return ModelOutput(features=x, projection=x, logits=x)


def test_evaluation_matches_scikit_learn_on_the_same_predictions():
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(37, 2)), dtype=torch.float32)
    labels = torch.tensor(rng.integers(0, 2, 37))
    batches = [(logits[i : i + 8], labels[i : i + 8]) for i in range(0, 37, 8)]
    figures, clinical = clinical_evaluation(_Fixed(), batches, torch.device("cpu"))
    probabilities = logits.softmax(dim=1).numpy()
    assert figures["auroc"] == pytest.approx(roc_auc_score(labels.numpy(), probabilities[:, 1]))
    predicted = probabilities.argmax(axis=1)
    positives = labels.numpy() == 1
    assert figures["sensitivity"] == pytest.approx((predicted[positives] == 1).mean())
    assert figures["specificity"] == pytest.approx((predicted[~positives] == 0).mean())
    assert figures["accuracy"] == pytest.approx((predicted == labels.numpy()).mean())
    assert sum(map(sum, clinical.confusion)) == 37
    plain = evaluate(_Fixed(), batches, torch.device("cpu"))
    assert plain == {k: figures[k] for k in ("accuracy", "loss")}  # the clinical figures only add


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(key_metric="auroc"), "set clinical_metrics=True"),
        (dict(key_metric="auc", clinical_metrics=True), "key_metric must be one of"),
        (dict(key_metric="loss", key_metric_mode="lowest"), "key_metric_mode must be one of"),
    ],
)
def test_a_key_metric_the_run_does_not_report_is_refused_by_name(arguments, message):
    with pytest.raises(ValueError, match=message):
        FedAvgBaselineRecipe(dataset="synthetic", min_clients=2, **arguments)
    with pytest.raises(ValueError, match=message):
        GlobalModelEvaluator(model=nn.Linear(2, 2), dataset=None, **arguments)


def _record(round_number, site_figures):
    spread = {name: {"mean": value} for name, value in site_figures.items()}
    return {"round": round_number, "spread": spread, "train": dict(site_figures)}


@pytest.mark.parametrize(
    "key, mode, values, best",
    [("auroc", None, [0.6, 0.9, 0.8], 0.9), ("loss", None, [0.9, 0.5, 0.7], 0.5), ("loss", "max", [0.9, 0.5], 0.9)],
)
def test_the_best_model_follows_the_key_metric_and_its_direction(key, mode, values, best):
    evaluator = GlobalModelEvaluator(
        model=nn.Linear(2, 2), dataset=None, key_metric=key, key_metric_mode=mode, clinical_metrics=True
    )
    evaluator.announces_best_model = False  # no NVFlare engine to fire events on here
    for round_number, value in enumerate(values, start=1):
        chosen = evaluator._update_best(_record(round_number, {key: value}), round_number, fl_ctx=None)
    assert chosen["key_metric"] == key and chosen["best_value"] == best
    assert chosen["round"] == values.index(best)  # the sites measured the aggregate of the round before


CLASSES = ["normal", "pneumonia"]
HOSPITALS = ["hospital-1", "hospital-2"]
CONFUSION = re.compile(r"(hospital-\d): confusion matrix \(rows: true class\) (\[\[.*?\]\])")


@pytest.mark.e2e
def test_two_hospitals_report_auroc_sensitivity_and_specificity_every_round_and_pick_the_best_by_auroc(tmp_path):
    folders = {
        "hospital-1": write_image_folder(
            tmp_path / "h1", CLASSES, {"normal": 20, "pneumonia": 12}, {"normal": 8, "pneumonia": 5}, mode="L"
        ),
        "hospital-2": write_image_folder(
            tmp_path / "h2", CLASSES, {"normal": 10, "pneumonia": 18}, {"normal": 4, "pneumonia": 9}, mode="L"
        ),
    }
    recipe = MoonRecipe(
        name="clinical",
        dataset="image_folder",
        site_data={"class_names": CLASSES, "image_size": 16, "channels": 1},
        min_clients=2,
        num_rounds=3,
        local_epochs=1,
        batch_size=8,
        lr=0.01,
        num_threads=1,
        clinical_metrics=True,
        key_metric="auroc",
    )
    set_site_paths(recipe, folders)
    recipe.export(str(tmp_path / "jobs"))
    run = run_simulator(tmp_path / "jobs" / "clinical", tmp_path / "ws", n=2, t=1, clients=HOSPITALS, timeout=300)
    assert run.returncode == 0, run.output[-3000:]
    rounds = run.global_metrics()
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for record in rounds:
        for site in HOSPITALS:
            figures = record["site_metrics"][site]
            assert {"auroc", "sensitivity", "specificity", "balanced_accuracy", "f1"} <= set(figures)
            assert {"local_model_auroc", "local_model_sensitivity"} <= set(figures)  # the trained model's too
        assert set(record["spread"]) >= {"auroc", "sensitivity", "specificity"}
        weights = record["site_weights"]
        weighted = sum(weights[s] * record["site_metrics"][s]["auroc"] for s in HOSPITALS) / sum(weights.values())
        assert record["spread"]["auroc"]["mean"] == pytest.approx(weighted)
    # each site's sensitivity and specificity are those of the confusion matrix it logged (global model first)
    logged = {}
    for site, matrix in CONFUSION.findall(run.output):
        logged.setdefault(site, []).append(json.loads(matrix))
    for site in HOSPITALS:
        assert len(logged[site]) == 2 * len(rounds)  # the received global model's and the trained one's, per round
        (tn, fp), (fn, tp) = logged[site][0]
        assert tn + fp + fn + tp == 13  # its test split
        assert rounds[0]["site_metrics"][site]["sensitivity"] == pytest.approx(tp / (tp + fn))
        assert rounds[0]["site_metrics"][site]["specificity"] == pytest.approx(tn / (tn + fp))
    means = [r["spread"]["auroc"]["mean"] for r in rounds]
    best = rounds[-1]["best_model"]
    assert best["key_metric"] == "auroc" and best["best_value"] == max(means)
    assert best["round"] == means.index(max(means)) - 1  # the aggregate the sites had received
