"""The figures a medical imaging team reads off a classifier, computed by scikit-learn from one test set's labels and
predicted class probabilities. Framework-free: numpy in, floats out.

For a test set of N images and C classes, with p the (N, C) softmax probabilities, ŷ = argmax p and, for class k,
TP_k, FN_k, FP_k, TN_k its one-vs-rest counts:

    sensitivity_k = TP_k / (TP_k + FN_k)        (recall, true-positive rate)
    specificity_k = TN_k / (TN_k + FP_k)        (true-negative rate)
    auroc_k       = P(p_ik > p_jk | y_i = k, y_j ≠ k)   (area under the one-vs-rest ROC curve, ties count ½)

With two classes, class 1 is the positive one (the second of ``class_names``: ``["normal", "pneumonia"]``), and
``sensitivity``, ``specificity`` and ``auroc`` are class 1's. With more, they are the unweighted means over the classes
(macro), and each class's AUROC is also reported as ``auroc_class<k>``. ``balanced_accuracy`` is the macro mean of
the sensitivities, ``f1`` the macro F1. A figure that a test set cannot define (no positive image, a single class) is
left out rather than reported as 0 or NaN, so that a site's mean over rounds and the sites' weighted mean skip it.
"""

import warnings
from dataclasses import dataclass
from typing import Dict, List

import numpy as np

# the figures a site reports with clinical_metrics=True; auroc_class<k> come with them where C > 2
CLINICAL_FIGURES = ("auroc", "sensitivity", "specificity", "balanced_accuracy", "f1")


@dataclass(frozen=True)
class ClinicalMetrics:
    """One test set's figures: ``scalars`` (the names above, defined ones only) and the (C, C) confusion matrix,
    rows the true class, columns the predicted one."""

    scalars: Dict[str, float]
    confusion: List[List[int]]


def clinical_metrics(labels: np.ndarray, probabilities: np.ndarray) -> ClinicalMetrics:
    """The figures of predictions ``probabilities`` (N, C), rows summing to 1, against ``labels`` (N,) in [0, C)."""
    # here, not at the top: scikit-learn's import costs about 1 s of CPU, paid at every client process start
    # (one per task at -t < -n) by jobs that never ask for clinical metrics
    from sklearn.metrics import balanced_accuracy_score, confusion_matrix, f1_score

    labels, probabilities = np.asarray(labels), np.asarray(probabilities, dtype=np.float64)
    if probabilities.ndim != 2 or probabilities.shape[1] < 2 or len(labels) != len(probabilities) or not len(labels):
        raise ValueError(
            f"expected labels (N,) and probabilities (N, C >= 2), got {labels.shape}, {probabilities.shape}"
        )
    num_classes = probabilities.shape[1]
    predicted = probabilities.argmax(axis=1)
    confusion = confusion_matrix(labels, predicted, labels=np.arange(num_classes))
    with warnings.catch_warnings():  # a class predicted but absent from this test set is expected at a site
        warnings.filterwarnings("ignore", "y_pred contains classes not in y_true")
        scalars = {
            "balanced_accuracy": float(balanced_accuracy_score(labels, predicted)),
            "f1": float(f1_score(labels, predicted, average="macro", zero_division=0)),
        }
    per_class = [_one_vs_rest(confusion, labels, probabilities, k) for k in range(num_classes)]
    if num_classes == 2:
        scalars.update(per_class[1])
    else:
        for name in ("auroc", "sensitivity", "specificity"):
            defined = [figures[name] for figures in per_class if name in figures]
            if defined:
                scalars[name] = float(np.mean(defined))
        scalars.update({f"auroc_class{k}": f["auroc"] for k, f in enumerate(per_class) if "auroc" in f})
    return ClinicalMetrics(scalars=scalars, confusion=confusion.tolist())


def _one_vs_rest(confusion: np.ndarray, labels: np.ndarray, probabilities: np.ndarray, k: int) -> Dict[str, float]:
    """Class ``k``'s sensitivity, specificity and AUROC against the other classes, where the test set defines them."""
    tp = confusion[k, k]
    fn = confusion[k].sum() - tp
    fp = confusion[:, k].sum() - tp
    tn = confusion.sum() - tp - fn - fp
    figures = {}
    if tp + fn:
        figures["sensitivity"] = float(tp / (tp + fn))
    if tn + fp:
        figures["specificity"] = float(tn / (tn + fp))
    if tp + fn and tn + fp:  # both positives and negatives among the labels
        from sklearn.metrics import roc_auc_score  # imported by clinical_metrics already: see there

        figures["auroc"] = float(roc_auc_score(labels == k, probabilities[:, k]))
    return figures
