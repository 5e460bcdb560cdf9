"""Local objectives: each maps the local model's output on a batch to ``(loss, terms)``.

``terms`` are the named parts of the loss (``ce``, ``contrastive``, ...) that the executors report. An objective is
built once per round, holding whatever the round needs (the frozen global model, previous models, prototypes).
"""

from typing import Dict, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .losses import model_contrastive_loss
from .models import ModelOutput

LossTerms = Dict[str, torch.Tensor]


class CrossEntropyObjective:
    """FedAvg's local objective: CE(logits, y)."""

    def __call__(self, out: ModelOutput, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, LossTerms]:
        ce = F.cross_entropy(out.logits, y)
        return ce, {"ce": ce}


class MoonObjective(CrossEntropyObjective):
    """MOON's local objective: CE(logits, y) + μ·ℓ_con(z, z_glob, z_prev), see :func:`model_contrastive_loss`.

    Args:
        global_model: the round's received global model, frozen.
        previous_models: the party's previous local models, oldest first, frozen; empty drops the term.
        mu: μ ≥ 0.
        temperature: τ > 0.
    """

    def __init__(self, global_model: nn.Module, previous_models: Sequence[nn.Module], mu: float, temperature: float):
        self.global_model = global_model
        self.previous_models = list(previous_models)
        self.mu = mu
        self.temperature = temperature

    def __call__(self, out: ModelOutput, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, LossTerms]:
        ce, terms = super().__call__(out, x, y)
        if not self.previous_models:
            return ce, terms
        with torch.no_grad():
            z_glob = self.global_model(x).projection
            z_prev = [m(x).projection for m in self.previous_models]
        contrastive = model_contrastive_loss(out.projection, z_glob, z_prev, self.temperature)
        terms["contrastive"] = contrastive
        return ce + self.mu * contrastive, terms
