"""Local objectives: each maps the local model's output on a batch to ``(loss, terms)``.

``terms`` are the named parts of the loss (``ce``, ``contrastive``, ...) that the executors report. An objective is
built once per round, holding whatever the round needs (the frozen global model, previous models, prototypes).
"""

import copy
from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from nvflare.app_opt.pt.fedproxloss import PTFedProxLoss

from ..models import ModelOutput
from .losses import model_contrastive_loss, prototype_contrastive_loss, representation_l2_loss, simsiam_distance
from .prototypes import ClassMeanAccumulator
from .training import LossTerms, frozen_copy

Representation = Callable[[nn.Module, torch.Tensor], torch.Tensor]  # (model, x) -> z
Predictor = Callable[[nn.Module, torch.Tensor], torch.Tensor]  # (model, z) -> p


def projection_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """z of a :class:`~nvflare_moon.models.ProjectionModel`: its output's ``projection``."""
    return model(x).projection


def predictor_of(model: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """p = predictor(z) of a model with FedSiam-DA's SimSiam predictor (``predictor_hidden_dim``)."""
    return model.predictor(z)


class CrossEntropyObjective:
    """FedAvg's local objective: CE(logits, y).

    ``weight_terms`` names the terms that read the weights alone and no sample (FedProx's proximal term): DP-SGD adds
    their gradient after privatising the rest, which is each sample's (:class:`~.dp_training.DPSGD`)."""

    weight_terms: Tuple[str, ...] = ()

    def __call__(self, out: ModelOutput, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, LossTerms]:
        ce = F.cross_entropy(out.logits, y)
        return ce, {"ce": ce}


class PenalizedObjective(CrossEntropyObjective):
    """CE(logits, y) + μ·penalty(x, z): the shape of MOON's objective and its ablation. A Client API helper adds
    ``μ·penalty`` to the script's own loss; the executors train on the whole objective."""

    mu: float

    def penalty(self, x: torch.Tensor, z: torch.Tensor) -> Tuple[Optional[torch.Tensor], LossTerms]:
        """The unweighted penalty of the batch ``x`` whose local representation is ``z``, and its named parts;
        ``(None, {})`` when the term is dropped this round."""
        raise NotImplementedError

    def weighted_penalty(self, x: torch.Tensor, z: torch.Tensor) -> Tuple[Optional[torch.Tensor], LossTerms]:
        """μ·penalty(x, z), the one place μ weighs it, and the unweighted parts; ``(None, {})`` when the term is
        dropped this round."""
        penalty, parts = self.penalty(x, z)
        return (None if penalty is None else self.mu * penalty), parts

    def __call__(self, out: ModelOutput, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, LossTerms]:
        ce, terms = super().__call__(out, x, y)
        weighted, parts = self.weighted_penalty(x, out.projection)
        if weighted is None:
            return ce, terms
        terms.update(parts)
        return ce + weighted, terms


class MoonObjective(PenalizedObjective):
    """MOON's local objective: CE(logits, y) + μ·ℓ_con(z, z_glob, z_prev), see :func:`model_contrastive_loss`.

    Args:
        global_model: the round's received global model, frozen.
        previous_models: the site's previous local models, oldest first, frozen; empty drops the term.
        mu: μ ≥ 0; 0 (a cold-start round, see :func:`~nvflare_moon.core.schedules.scheduled_mu`) also drops the term,
            which is then neither computed nor reported.
        temperature: τ > 0.
        representation: z of a model on a batch, ``(model, x) -> [B, D]``; default the ``projection`` of a
            :class:`~nvflare_moon.models.ProjectionModel`'s output.
    """

    def __init__(
        self,
        global_model: nn.Module,
        previous_models: Sequence[nn.Module],
        mu: float,
        temperature: float,
        representation: Representation = projection_of,
    ):
        self.global_model = global_model
        self.previous_models = list(previous_models)
        self.mu = mu
        self.temperature = temperature
        self.representation = representation

    def contrastive(self, x: torch.Tensor, z: torch.Tensor) -> Optional[torch.Tensor]:
        """ℓ_con of the batch ``x`` whose local representation is ``z``; None without a previous model or with μ = 0
        (then the frozen models are not even run)."""
        if not self.previous_models or self.mu == 0:
            return None
        with torch.no_grad():
            z_glob = self.representation(self.global_model, x)
            z_prev = [self.representation(m, x) for m in self.previous_models]
        return model_contrastive_loss(z, z_glob, z_prev, self.temperature)

    def penalty(self, x: torch.Tensor, z: torch.Tensor) -> Tuple[Optional[torch.Tensor], LossTerms]:
        contrastive = self.contrastive(x, z)
        return (None, {}) if contrastive is None else (contrastive, {"contrastive": contrastive})


class LightHistoryMoonObjective(MoonObjective):
    """MOON with the MOON article's light history (section 4.3, 内存优化): the previous models are only their
    projection heads g_prev (:class:`~nvflare_moon.models.ProjectionHead`), applied to the global model's features:

        z_glob = g_glob(f_glob(x)),   z_prev ≈ g_prev(f_glob(x))     instead of the paper's g_prev(f_prev(x))

    The approximation is exact when the previous local encoder equals the round's global encoder, and its error grows
    with how far the site's encoder drifted in its last round. It needs no previous encoder, so each step runs one
    frozen forward pass (the global model's) plus m heads instead of 1 + m whole networks. The global model must be a
    :class:`~nvflare_moon.models.ProjectionModel` (its output's ``features`` and ``projection`` are used).

    Args:
        global_model, mu, temperature: as for :class:`MoonObjective`.
        previous_heads: the site's previous projection heads, oldest first, frozen; empty drops the term.
    """

    def __init__(self, global_model: nn.Module, previous_heads: Sequence[nn.Module], mu: float, temperature: float):
        super().__init__(global_model, previous_heads, mu, temperature)

    def contrastive(self, x: torch.Tensor, z: torch.Tensor) -> Optional[torch.Tensor]:
        if not self.previous_models or self.mu == 0:
            return None
        with torch.no_grad():
            global_out = self.global_model(x)
            z_prev = [head(global_out.features) for head in self.previous_models]
        return model_contrastive_loss(z, global_out.projection, z_prev, self.temperature)


class RepresentationL2Objective(PenalizedObjective):
    """The MOON paper's loss ablation (Table 5): CE(logits, y) + μ·ℓ_ℓ2(z, z_glob), see :func:`representation_l2_loss`.

    It keeps MOON's pull towards the global model's representation and drops the push away from the previous model,
    so it needs no previous model and applies from round 0 on.

    Args:
        global_model: the round's received global model, frozen.
        mu: μ ≥ 0; 0 drops the penalty, which is then neither computed nor reported.
        squared: use the squared norm.
        representation: as for :class:`MoonObjective`.
    """

    def __init__(
        self, global_model: nn.Module, mu: float, squared: bool = False, representation: Representation = projection_of
    ):
        self.global_model = global_model
        self.mu = mu
        self.squared = squared
        self.representation = representation

    def penalty(self, x: torch.Tensor, z: torch.Tensor) -> Tuple[Optional[torch.Tensor], LossTerms]:
        if self.mu == 0:
            return None, {}
        with torch.no_grad():
            z_glob = self.representation(self.global_model, x)
        penalty = representation_l2_loss(z, z_glob, self.squared)
        return penalty, {"representation_l2": penalty}


class FedProxObjective(CrossEntropyObjective):
    """FedProx's local objective: CE(logits, y) + (μ/2)·Σ‖w − w_glob‖² over the parameters (NVFlare's
    :class:`~nvflare.app_opt.pt.PTFedProxLoss`). The reported ``proximal`` term is the μ-weighted penalty.

    Args:
        model: the local model being trained (the penalty reads its parameters, not the batch's output).
        global_model: the round's received global model, frozen.
        mu: μ ≥ 0.
    """

    weight_terms = ("proximal",)

    def __init__(self, model: nn.Module, global_model: nn.Module, mu: float):
        self.model = model
        self.global_model = global_model
        self.proximal = PTFedProxLoss(mu=mu)

    def __call__(self, out: ModelOutput, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, LossTerms]:
        ce, terms = super().__call__(out, x, y)
        proximal = self.proximal(self.model, self.global_model)
        terms["proximal"] = proximal
        return ce + proximal, terms


class FedSSCObjective:
    """FedSSC's local objective: MOON's plus the prototype term, ``CE + μ_moon·ℓ_moon + μ_glob·ℓ_glob``.

    ℓ_glob is :func:`prototype_contrastive_loss` of the batch against the shared class prototypes. Without prototypes
    (round 0, or a site that never received any) the loss is exactly MOON's. After :meth:`record_class_means` (the
    executor calls it before the last local epoch) every batch's projections also go into :attr:`class_means`, the
    per-class running mean the site uploads.

    Args:
        moon: the round's MOON objective, ``CE + μ_moon·ℓ_moon`` (:class:`MoonObjective`, or the ℓ2 ablation's).
        prototypes: the shared prototypes ``[K, D]`` on the training device, or None.
        available: ``[K]`` bool, the classes that have a prototype; None with ``prototypes``.
        mu_glob: μ_glob ≥ 0.
        temperature: τ > 0 of ℓ_glob (FedSSC uses MOON's).
        num_classes: K.
    """

    def __init__(
        self,
        moon: PenalizedObjective,
        prototypes: Optional[torch.Tensor],
        available: Optional[torch.Tensor],
        mu_glob: float,
        temperature: float,
        num_classes: int,
    ):
        if (prototypes is None) != (available is None):
            raise ValueError("prototypes and available must be given together")
        self.moon = moon
        self.prototypes = prototypes
        self.available = available
        self.mu_glob = mu_glob
        self.temperature = temperature
        self.num_classes = num_classes
        self.class_means: Optional[ClassMeanAccumulator] = None

    def record_class_means(self) -> None:
        """From now on, accumulate the per-class mean projection of the training forward passes."""
        self.class_means = ClassMeanAccumulator(self.num_classes)

    def prototype_term(self, z: torch.Tensor, y: torch.Tensor) -> Optional[torch.Tensor]:
        """ℓ_glob of the batch's projections ``z`` with labels ``y``, None without prototypes; records the class means
        once :meth:`record_class_means` was called."""
        if self.class_means is not None:
            self.class_means.add(z, y)
        if self.prototypes is None:
            return None
        return prototype_contrastive_loss(z, y, self.prototypes, self.available, self.temperature)

    def add_terms(
        self, loss: torch.Tensor, x: torch.Tensor, z: torch.Tensor, y: torch.Tensor
    ) -> Tuple[torch.Tensor, LossTerms]:
        """``loss + μ_moon·ℓ_moon + μ_glob·ℓ_glob`` of the batch ``x`` with projections ``z`` and labels ``y``, added in
        that order (a dropped term is not added), and the unweighted terms by name; records the class means. The
        executors add them to CE, a Client API script's helper (``PTFedSSCHelper.loss``) to zero."""
        weighted, terms = self.moon.weighted_penalty(x, z)
        if weighted is not None:
            loss = loss + weighted
        prototype = self.prototype_term(z, y)
        if prototype is not None:
            terms["prototype_contrastive"] = prototype
            loss = loss + self.mu_glob * prototype
        return loss, terms

    def __call__(self, out: ModelOutput, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, LossTerms]:
        ce = F.cross_entropy(out.logits, y)
        loss, terms = self.add_terms(ce, x, out.projection, y)
        return loss, {"ce": ce, **terms}


HISTORY_CHOICES = ("epoch", "round")
# Which output of the local model the history term compares with sg(z_h): the projection z_l, or the prediction p_l
# (the paper defines the history similarity "in the same way" as the global one, which is predictor-based).
HISTORY_BRANCHES = ("projection", "predictor")


class FedSiamDAObjective(PenalizedObjective):
    """FedSiam-DA's local objective, three branches on the same batch:

        ℓ = CE(local) + μ·[ ½·D(p_g, z_l) + ½·D(p_l, z_g) + cos(b_l, stopgrad(z_h)) ],   D(p, z) = −cos(p, stopgrad(z))

    where b_l, the local branch the history term reads, is z_l (``history_branch="projection"``) or p_l (``"predictor"``).

    - the local model gives z_l and p_l = predictor(z_l);
    - a **trainable working copy of the received global model**, made here from ``local_model`` (which holds the
      global weights when the round starts), gives z_g and p_g. It learns only through D(p_g, ·), with its own
      optimizer stepped by :meth:`step_working_global` (pass it to ``train_local`` as ``after_step``), so it moves in
      the same steps as the local model. It is discarded with the objective at the end of the round;
    - a frozen history model gives z_h. The last term pushes the local model away from it; without one it is dropped.

    Args:
        local_model: the model being trained; it must have a predictor (``predictor_hidden_dim``).
        previous_upload: the site's previous upload, frozen, or None (round 0, first participation).
        mu: μ ≥ 0.
        make_optimizer: builds the working copy's optimizer with the local one's settings,
            e.g. ``lambda m: sgd(m, lr, momentum, weight_decay)``.
        history: ``"epoch"`` (default): the local model at the end of the previous local epoch, and in the first epoch
            ``previous_upload``; ``"round"``: ``previous_upload`` throughout, as in MOON.
        history_branch: ``"projection"`` (default): the history term is cos(z_l, sg z_h), on the projection the
            classifier reads; ``"predictor"``: cos(p_l, sg z_h), through the predictor, like the Siamese terms.
        representation: z of a model on a batch, ``(model, x) -> [B, D]`` (default: a ProjectionModel's projection).
        predictor: p of a model's z, ``(model, z) -> [B, D]`` (default: ``model.predictor(z)``).
    """

    def __init__(
        self,
        local_model: nn.Module,
        previous_upload: Optional[nn.Module],
        mu: float,
        make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
        history: str = "epoch",
        representation: Representation = projection_of,
        predictor: Predictor = predictor_of,
        history_branch: str = "projection",
    ):
        if history not in HISTORY_CHOICES:
            raise ValueError(f"history must be one of {list(HISTORY_CHOICES)}, got {history!r}")
        if history_branch not in HISTORY_BRANCHES:
            raise ValueError(f"history_branch must be one of {list(HISTORY_BRANCHES)}, got {history_branch!r}")
        if predictor is predictor_of and getattr(local_model, "predictor", None) is None:
            raise ValueError(
                "FedSiam-DA needs a model with the SimSiam predictor: build it with predictor_hidden_dim=64"
            )
        self.local_model = local_model
        self.working_global = copy.deepcopy(local_model).train().requires_grad_(True)
        self.working_optimizer = make_optimizer(self.working_global)
        self.history_model = previous_upload
        self.mu = mu
        self.history = history
        self.history_branch = history_branch
        self.representation = representation
        self.predictor = predictor

    def start_epoch(self, epoch: int) -> None:
        """Call before every local epoch (0-based): with ``history="epoch"`` the local model as it is now, at the end
        of the previous epoch, becomes the history model."""
        if self.history == "epoch" and epoch > 0:
            self.history_model = frozen_copy(self.local_model)

    def step_working_global(self) -> None:
        """Apply the gradient the last backward left on the working global copy."""
        self.working_optimizer.step()
        self.working_optimizer.zero_grad(set_to_none=True)

    def penalty(self, x: torch.Tensor, z_l: torch.Tensor) -> Tuple[torch.Tensor, LossTerms]:
        """``½·D(p_g, z_l) + ½·D(p_l, z_g) + cos(b_l, sg(z_h))`` (the last term without a history model) of the batch
        ``x`` whose local projections are ``z_l``, and its named parts."""
        p_l = self.predictor(self.local_model, z_l)
        z_g = self.representation(self.working_global, x)
        p_g = self.predictor(self.working_global, z_g)
        siamese = 0.5 * simsiam_distance(p_g, z_l) + 0.5 * simsiam_distance(p_l, z_g)
        terms = {"siamese": siamese}
        if self.history_model is None:
            return siamese, terms
        with torch.no_grad():
            z_h = self.representation(self.history_model, x)
        branch = p_l if self.history_branch == "predictor" else z_l
        history = -simsiam_distance(branch, z_h)  # cos(b_l, stopgrad(z_h))
        terms["history"] = history
        return siamese + history, terms
