"""Framework-free local training: the SGD loop over a round's objective (see :mod:`nvflare_moon.core.objectives`),
frozen model copies and evaluation. Nothing here knows about NVFlare, so every method can be tested on plain tensors.
"""

import copy
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..models import ModelOutput
from .clinical_metrics import ClinicalMetrics, clinical_metrics

Batch = Tuple[torch.Tensor, torch.Tensor]
LossTerms = Dict[str, torch.Tensor]  # the named parts of a loss, as objectives return them
Objective = Callable[[ModelOutput, torch.Tensor, torch.Tensor], Tuple[torch.Tensor, LossTerms]]  # (out, x, y)
# one optimizer step: (model, objective, optimizer, x, y) -> (loss, terms)
Step = Callable[
    [nn.Module, Objective, torch.optim.Optimizer, torch.Tensor, torch.Tensor], Tuple[torch.Tensor, LossTerms]
]


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy in eval mode that takes no gradient: how MOON runs the global and previous models."""
    frozen = copy.deepcopy(model).eval()
    frozen.requires_grad_(False)
    return frozen


class TermMeans:
    """Running means of named loss terms, each over the steps in which it was computed (a term absent in some steps,
    such as FedSiam-DA's history term in a first epoch, is not diluted by them). Kept on the device: no sync per step."""

    def __init__(self):
        self._sums: Dict[str, torch.Tensor] = {}
        self._counts: Dict[str, int] = {}

    def add(self, name: str, value: torch.Tensor) -> None:
        self._sums[name] = self._sums.get(name, 0.0) + value.detach().float()
        self._counts[name] = self._counts.get(name, 0) + 1

    def mean(self, name: str) -> float:
        return float(self._sums[name]) / self._counts[name]

    def means(self) -> Dict[str, float]:
        return {name: self.mean(name) for name in self._sums}


@dataclass
class TrainResult:
    steps: int = 0
    aborted: bool = False
    mean_terms: Dict[str, float] = field(default_factory=dict)


def train_local(
    model: nn.Module,
    batches: Iterable[Batch],
    objective: Objective,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    device: torch.device,
    should_stop: Callable[[], bool] = lambda: False,
    after_step: Optional[Callable[[], None]] = None,
    log: Optional[Callable[[str], None]] = None,
    before_epoch: Optional[Callable[[int], None]] = None,
    amp: bool = False,
    step: Optional[Step] = None,
) -> TrainResult:
    """Run ``epochs`` passes of SGD over ``batches`` on ``objective``; report the mean of every loss term over the
    steps that computed it (:class:`TermMeans`).

    ``should_stop`` is polled before every step (NVFlare's abort signal); ``after_step`` runs after every optimizer
    step (SCAFFOLD's correction); ``before_epoch(epoch)`` runs before every epoch, 0-based (FedSSC starts collecting
    class means before the last one, FedSiam-DA takes its history snapshot). ``amp``: mixed precision
    (:class:`MixedPrecisionStep`); False: every step in float32 (:func:`float32_step`). ``step``: another optimizer
    step in their place (DP-SGD's, :class:`~.dp_training.DPSGD`).
    """
    model.train()
    if step is None:
        step = MixedPrecisionStep(device) if amp else float32_step
    terms_so_far = TermMeans()
    result = TrainResult()
    for epoch in range(epochs):
        if before_epoch is not None:
            before_epoch(epoch)
        for x, y in batches:
            if should_stop():
                result.aborted = True
                return result
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss, terms = step(model, objective, optimizer, x, y)
            if after_step is not None:
                after_step()
            terms["loss"] = loss
            for name, value in terms.items():
                terms_so_far.add(name, value)
            result.steps += 1
        if log is not None and result.steps:
            log(f"epoch {epoch + 1}/{epochs}: loss {terms_so_far.mean('loss'):.4f}")
    result.mean_terms = terms_so_far.means()
    return result


def float32_step(
    model: nn.Module, objective: Objective, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> Tuple[torch.Tensor, LossTerms]:
    """One optimizer step on the batch ``(x, y)``: the objective's loss and terms, its gradient, the step."""
    loss, terms = objective(model(x), x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss, terms


class MixedPrecisionStep:
    """:func:`float32_step` with the forward pass and the objective under ``torch.autocast``, for speed and memory on
    a GPU: float16 there, with a ``GradScaler`` that keeps small gradients from vanishing in float16 (a new one every
    round, like the optimizer; a step whose scaled gradients overflow is skipped); bfloat16 elsewhere (the CPU, where
    it serves checks: it is slower than float32 without bfloat16 instructions), which has float32's range and needs no
    scaler. The weights and the optimizer stay float32."""

    def __init__(self, device: torch.device):
        on_gpu = device.type == "cuda"
        self.device_type = device.type
        self.dtype = torch.float16 if on_gpu else torch.bfloat16
        self.scaler = torch.amp.GradScaler("cuda") if on_gpu else None

    def __call__(
        self, model: nn.Module, objective: Objective, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
    ) -> Tuple[torch.Tensor, LossTerms]:
        with torch.autocast(self.device_type, dtype=self.dtype):
            loss, terms = objective(model(x), x, y)
        optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(optimizer)
            self.scaler.update()
        return loss, terms


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: Iterable[Batch], device: torch.device, kept: Optional[List[Batch]] = None
) -> Dict[str, float]:
    """Top-1 accuracy and mean cross-entropy of ``model`` over ``batches``; each batch's labels and softmax
    probabilities, on the CPU, are appended to ``kept`` where given."""
    model.eval()
    correct, loss_sum, count = 0, 0.0, 0
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(x).logits
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(dim=1) == y).sum())
        count += len(y)
        if kept is not None:
            kept.append((y.cpu(), logits.float().softmax(dim=1).cpu()))
    if count == 0:
        raise ValueError("evaluate() got an empty dataset")
    return {"accuracy": correct / count, "loss": loss_sum / count}


def clinical_evaluation(
    model: nn.Module, batches: Iterable[Batch], device: torch.device
) -> Tuple[Dict[str, float], ClinicalMetrics]:
    """:func:`evaluate`'s figures with AUROC, sensitivity, specificity, balanced accuracy and F1 added
    (:mod:`nvflare_moon.core.clinical_metrics`), and those figures with the confusion matrix."""
    kept: List[Batch] = []
    figures = evaluate(model, batches, device, kept)
    clinical = clinical_metrics(torch.cat([y for y, _ in kept]).numpy(), torch.cat([p for _, p in kept]).numpy())
    return {**figures, **clinical.scalars}, clinical


def sgd(model: nn.Module, lr: float, momentum: float, weight_decay: float) -> torch.optim.SGD:
    """The papers' optimiser. A new one every round: MOON does not carry the momentum buffer across rounds."""
    return torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=lr, momentum=momentum, weight_decay=weight_decay
    )
