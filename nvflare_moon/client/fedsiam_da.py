"""FedSiam-DA inside a user's own Client API training script.

    helper = PTFedSiamDAHelper(model, representation_fn=..., predictor_fn=...)
    ...
        helper.start_round(input_model, optimizer)     # μ and the history settings from the meta; working global copy
        for epoch in range(epochs):
            helper.start_epoch(epoch)                  # the epoch history snapshot
            for x, y in loader:
                z = ...; loss = criterion(logits, y) + helper.loss(x, z)
                optimizer.zero_grad(); loss.backward(); optimizer.step()
                helper.step()                          # the working global copy steps with your optimizer
        helper.save_local_model()

The round is :class:`~nvflare_moon.core.fedsiam_da.FedSiamDARound`, the object
:class:`~nvflare_moon.executors.FedSiamDAExecutor` trains with, and the settings are
:class:`~nvflare_moon.core.fedsiam_da.FedSiamDASettings` as :class:`~nvflare_moon.recipes.FedSiamDAScriptRecipe`
sends them.
"""

import logging
from typing import Any, Dict, Optional

import torch
import torch.nn as nn

from ..core.fedsiam_da import FedSiamDARound, FedSiamDASettings
from ..core.objectives import FedSiamDAObjective, Predictor, Representation, predictor_of, projection_of
from ..core.training import TermMeans
from ..core.validation import check_module
from .common import check_received_weights, check_upload_count, site_identity
from .meta import NUM_SAMPLES
from .uploads import ScriptUploads

logger = logging.getLogger(__name__)

RECIPE = "FedSiamDAScriptRecipe"


def optimizer_like(optimizer: torch.optim.Optimizer, model: nn.Module, copy: nn.Module) -> torch.optim.Optimizer:
    """A new optimizer of ``optimizer``'s class and parameter-group settings over ``copy``'s parameters, matched to
    ``model``'s by position (``copy`` is a deep copy of ``model``)."""
    position = {id(p): i for i, p in enumerate(model.parameters())}
    copied = list(copy.parameters())
    groups = []
    for group in optimizer.param_groups:
        try:
            params = [copied[position[id(p)]] for p in group["params"]]
        except KeyError:
            raise ValueError("the optimizer steps parameters that are not the model's; pass the model's optimizer")
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
    return type(optimizer)(groups)


class PTFedSiamDAHelper:
    """FedSiam-DA's Siamese and history terms for a Client API script: ``loss = your_loss + helper.loss(x, z)``.

    :meth:`start_round` reads the settings (:class:`~nvflare_moon.core.fedsiam_da.FedSiamDASettings`) from the meta (sent by
    :class:`~nvflare_moon.recipes.FedSiamDAScriptRecipe`), makes the trainable working copy of the received
    global model with an optimizer like yours, and loads the site's previous upload as the history model;
    :meth:`start_epoch` takes the epoch history snapshot; :meth:`step` steps the working copy after your optimizer;
    :meth:`save_local_model` stores the trained model in the job's run folder (see :mod:`nvflare_moon.client.state`).

    Args:
        model: the network being trained; it needs a SimSiam predictor reachable through ``predictor_fn``.
        representation_fn: ``(model, x) -> z``; default ``model(x).projection``.
        predictor_fn: ``(model, z) -> p``; default ``model.predictor(z)`` (``Network(predictor_hidden_dim=64)``).
        state_dir, job_id, site: as for :class:`~nvflare_moon.client.PTMoonHelper`.
    """

    STATE_NAME = "fedsiam_da_state"

    def __init__(
        self,
        model: nn.Module,
        representation_fn: Optional[Representation] = None,
        predictor_fn: Optional[Predictor] = None,
        state_dir: Optional[str] = None,
        job_id: Optional[str] = None,
        site: Optional[str] = None,
    ):
        check_module("model", model)
        if predictor_fn is None and getattr(model, "predictor", None) is None:
            raise ValueError(
                "model has no SimSiam predictor: give it one (nvflare_moon.models.simsiam_predictor) and pass "
                "predictor_fn=lambda model, z: ... if it is not model.predictor"
            )
        self.model = model
        self.representation_fn = representation_fn
        self.predictor_fn = predictor_fn
        self.state_dir = state_dir
        self.job_id = job_id
        self.site = site
        self.settings: Optional[FedSiamDASettings] = None
        self.round: Optional[FedSiamDARound] = None
        self._uploads: Optional[ScriptUploads] = None
        self._terms = TermMeans()
        self._saved = False

    def start_round(self, input_model, optimizer: torch.optim.Optimizer) -> None:
        """Begin a training round on ``input_model`` (an ``FLModel``), whose weights ``model`` holds; ``optimizer``
        is the one that trains ``model`` this round (the working copy gets one like it)."""
        self.settings = FedSiamDASettings.from_meta(input_model.meta or {}, RECIPE)
        check_received_weights(self.model, input_model.params, type(self).__name__)
        if self._uploads is None:
            job_id, site = site_identity(self.job_id, self.site, type(self).__name__)
            self._uploads = ScriptUploads(
                self.STATE_NAME, job_id, site, self.state_dir, save_call="PTFedSiamDAHelper.save_local_model()"
            )
        self.round = FedSiamDARound(
            self.settings,
            self.model,
            self._uploads,
            self._uploads.site,
            make_optimizer=lambda working: optimizer_like(optimizer, self.model, working),
            representation=self.representation_fn or projection_of,
            predictor=self.predictor_fn or predictor_of,
        )
        self.round.start(input_model.current_round or 0, input_model.meta)
        self._terms = TermMeans()
        self._saved = False

    @property
    def mu(self) -> Optional[float]:
        return None if self.settings is None else self.settings.mu

    @property
    def objective(self) -> Optional[FedSiamDAObjective]:
        return None if self.round is None else self.round.objective

    @property
    def history_model(self) -> Optional[nn.Module]:
        """The frozen history model the next :meth:`loss` uses (None: the term is dropped)."""
        return self._started().history_model

    def start_epoch(self, epoch: int) -> None:
        """Call before every local epoch (0-based)."""
        self._started().start_epoch(epoch)

    def loss(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """μ·[½·D(p_g, z) + ½·D(p_l, z_g) + cos(b, sg(z_h))] (b: z or p_l, the history branch) for the batch ``x``
        whose projections under ``model`` are ``z`` (with its gradient); its backward also reaches the working global
        copy."""
        weighted, terms = self._started().weighted_penalty(x, z)
        for name, value in terms.items():
            self._terms.add(name, value)
        return weighted

    def step(self, scaler: Optional["torch.cuda.amp.GradScaler"] = None) -> None:
        """Step the working global copy; call right after your ``optimizer.step()`` (with mixed precision, after
        ``scaler.step(optimizer)`` and before ``scaler.update()``, passing the ``scaler``)."""
        objective = self._started()
        if scaler is None:
            objective.step_working_global()
        else:
            scaler.step(objective.working_optimizer)
            objective.working_optimizer.zero_grad(set_to_none=True)

    def mean_terms(self) -> Dict[str, float]:
        """The round's mean of ``siamese`` and ``history`` so far, for logs and metrics."""
        return self._terms.means()

    def save_local_model(self) -> None:
        """Store ``model`` as this round's upload (next round's history model); call it after training."""
        self._started()
        self.round.finish()
        self._saved = True

    def upload_meta(self, num_samples: int) -> Dict[str, Any]:
        """The meta to send with the trained weights: ``num_samples``, the server's FedAvg weight."""
        check_upload_count(num_samples, self._saved, "PTFedSiamDAHelper.save_local_model()")
        return {NUM_SAMPLES: num_samples}

    def _started(self) -> FedSiamDAObjective:
        if self.objective is None:
            raise RuntimeError("call PTFedSiamDAHelper.start_round(input_model, optimizer) at the start of every round")
        return self.objective
