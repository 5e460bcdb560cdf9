"""MOON and FedSSC inside a user's own Client API training script.

    helper = PTMoonHelper(model, representation_fn=lambda net, x: net.features(x))
    while flare.is_running():
        input_model = flare.receive()
        model.load_state_dict(input_model.params)
        if flare.is_train():
            helper.start_round(input_model)                # μ, τ, m from the meta; frozen global; previous model(s)
            for x, y in loader:
                z = model.features(x); logits = model.head(z)
                loss = criterion(logits, y) + helper.loss(x, z)
                ...
            helper.save_local_model()                      # this round's model becomes next round's previous one
            flare.send(flare.FLModel(params=model.state_dict(), meta=helper.upload_meta(len(train_set))))

The rounds are :class:`~nvflare_moon.core.moon.MoonRound` and :class:`~nvflare_moon.core.fedssc.FedSSCRound`, the
objects :class:`~nvflare_moon.executors.MoonExecutor` and :class:`~nvflare_moon.executors.FedSSCExecutor` train with,
and the settings are :class:`~nvflare_moon.core.moon.MoonSettings` and :class:`~nvflare_moon.core.fedssc.FedSSCSettings`
as the recipes send them: every option of the executors works here too.
"""

import logging
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn

from ..core.fedssc import FedSSCRound, FedSSCSettings
from ..core.moon import MoonRound, MoonSettings
from ..core.objectives import Representation, projection_of
from ..core.training import TermMeans
from ..core.validation import check_module, check_number
from .common import check_received_weights, check_upload_count, site_identity
from .meta import NUM_SAMPLES
from .uploads import ScriptUploads

logger = logging.getLogger(__name__)


class PTMoonHelper:
    """MOON's model-contrastive term for a Client API script: ``loss = your_loss + helper.loss(x, z)``.

    Every round, after loading the received weights into ``model``: :meth:`start_round` reads the settings from the
    meta (:class:`~nvflare_moon.core.moon.MoonSettings`, sent by
    :class:`~nvflare_moon.recipes.MoonScriptRecipe`) and starts the round (a frozen copy of the global
    model, this site's last m saved models); :meth:`loss` gives μ·ℓ_con (or the ℓ2 ablation) for a batch;
    :meth:`save_local_model` stores the trained model for the next rounds, in the job's run folder on the site (see
    :mod:`nvflare_moon.client.state`), so that MOON is the same algorithm when NVFlare restarts the script for every
    task (``-t < -n``).

    Args:
        model: the network being trained (any ``nn.Module``; ``feature_noise_std`` and ``light_history`` need a
            :class:`~nvflare_moon.models.ProjectionModel`).
        representation_fn: ``(model, x) -> z [B, D]``, the representation MOON contrasts (the paper: the projection
            head's output). Default: ``model(x).projection``, as :class:`~nvflare_moon.models.Network` returns it.
        state_dir: a folder that persists across rounds, for when the run folder cannot be found from the working
            directory; the state then goes to ``<state_dir>/<job id>/<site>``.
        job_id, site: default the running job's and site's (``flare.get_job_id()``, ``flare.get_site_name()``);
            give both to use the helper outside NVFlare (tests).
        seed: the seed of the feature noise (``feature_noise_std > 0``), as the executors' ``seed``.
    """

    STATE_NAME = "moon_state"
    RECIPE = "MoonScriptRecipe"

    def __init__(
        self,
        model: nn.Module,
        representation_fn: Optional[Representation] = None,
        state_dir: Optional[str] = None,
        job_id: Optional[str] = None,
        site: Optional[str] = None,
        seed: int = 0,
    ):
        check_module("model", model)
        if representation_fn is not None and not callable(representation_fn):
            raise ValueError(f"representation_fn must be a function (model, x) -> z, got {representation_fn!r}")
        check_number("seed", seed, low=0, integer=True)
        self.model = model
        self.representation_fn = representation_fn
        self.state_dir = state_dir
        self.job_id = job_id
        self.site = site
        self.seed = seed
        self.settings: Optional[MoonSettings] = None
        self.round: Optional[MoonRound] = None
        self._uploads: Optional[ScriptUploads] = None
        self._terms = TermMeans()
        self._saved = False

    def start_round(self, input_model) -> None:
        """Begin a training round on the received ``input_model`` (an ``FLModel``), whose weights ``model`` holds.

        Raises:
            ValueError: the meta lacks the method's settings (run with the recipe), or ``model`` does not hold the
                received weights.
            StateFolderNotFound: see :func:`~nvflare_moon.client.state.state_folder`.
        """
        meta = input_model.meta or {}
        self.settings = MoonSettings.from_meta(meta, self.RECIPE)
        check_received_weights(self.model, input_model.params, type(self).__name__)
        self.round = self._moon_round()
        self.round.start(input_model.current_round or 0, meta)
        self._terms = TermMeans()
        self._saved = False

    @property
    def mu(self) -> Optional[float]:
        """This round's μ, after the cold start."""
        return None if self.round is None else self.round.mu

    @property
    def objective(self):
        """This round's MOON objective (:class:`~nvflare_moon.core.objectives.MoonObjective`, ...)."""
        return self._started().objective

    @property
    def previous_models(self) -> List[nn.Module]:
        """This round's previous local models, frozen, oldest first (empty in a site's first round)."""
        return getattr(self.objective, "previous_models", [])

    def loss(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """μ·ℓ_con(z, z_glob, z_prev) (or μ·ℓ_ℓ2) for the batch ``x`` whose representation under ``model`` is ``z``
        (with its gradient); exactly 0 when the term is dropped (no previous model yet, μ = 0)."""
        weighted, parts = self.objective.weighted_penalty(x, z)
        if weighted is None:
            return z.new_zeros(())
        for name, value in parts.items():
            self._terms.add(name, value)
        return weighted

    def mean_terms(self) -> Dict[str, float]:
        """The round's mean of each term added so far (``contrastive``, ...), unweighted, for logs and metrics."""
        return self._terms.means()

    def save_local_model(self) -> None:
        """Store ``model`` as this round's upload; call it after training, before ``flare.send``."""
        self._moon_part().finish()
        self._saved = True

    def upload_meta(self, num_samples: int) -> Dict[str, Any]:
        """The meta to send with the trained weights: ``num_samples``, the server's FedAvg weight."""
        check_upload_count(num_samples, self._saved, f"{type(self).__name__}.save_local_model()")
        return {NUM_SAMPLES: num_samples}

    def _moon_round(self) -> MoonRound:
        if self._uploads is None:
            name = type(self).__name__
            job_id, site = site_identity(self.job_id, self.site, name)
            self._uploads = ScriptUploads(
                self.STATE_NAME, job_id, site, self.state_dir, save_call=f"{name}.save_local_model()"
            )
        representation = self.representation_fn or projection_of
        return MoonRound(self.settings, self.model, self._uploads, self._uploads.site, self.seed, representation)

    def _moon_part(self) -> MoonRound:
        return self._started()

    def _started(self):
        if self.round is None:
            raise RuntimeError(f"call {type(self).__name__}.start_round(input_model) at the start of every round")
        return self.round


class PTFedSSCHelper(PTMoonHelper):
    """FedSSC for a Client API script: MOON's term plus the prototype term, ``helper.loss(x, z, y)``.

    Beside what :class:`PTMoonHelper` does, :meth:`start_round` reads FedSSC's settings
    (:class:`~nvflare_moon.core.fedssc.FedSSCSettings`) and the shared class prototypes from the meta (none in round 0:
    the term is dropped), :meth:`loss` adds μ_glob·ℓ_glob and keeps the per-class mean of z, and :meth:`upload_meta`
    returns the class means and counts to send. The paper keeps the means of the last local epoch: call
    :meth:`record_class_means` before it (without the call, the means cover the whole round). Run with
    :class:`~nvflare_moon.recipes.FedSSCScriptRecipe`.

    Args:
        num_classes: K, the number of classes (the prototypes are K × D, D the size of z).
        model, representation_fn, state_dir, job_id, site, seed: as for :class:`PTMoonHelper`.
    """

    STATE_NAME = "fedssc_state"
    RECIPE = "FedSSCScriptRecipe"

    def __init__(self, model: nn.Module, num_classes: int, **kwargs):
        super().__init__(model, **kwargs)
        check_number("num_classes", num_classes, low=2, integer=True)
        self.num_classes = num_classes
        self.fedssc_settings: Optional[FedSSCSettings] = None

    def start_round(self, input_model) -> None:
        """As :meth:`PTMoonHelper.start_round`, plus FedSSC's settings and the shared prototypes."""
        meta = input_model.meta or {}
        self.settings = MoonSettings.from_meta(meta, self.RECIPE)
        self.fedssc_settings = FedSSCSettings.from_meta(meta, self.RECIPE)
        check_received_weights(self.model, input_model.params, type(self).__name__)
        self.round = FedSSCRound(self._moon_round(), self.fedssc_settings, self.num_classes)
        self.round.start(input_model.current_round or 0, meta)
        self._terms = TermMeans()
        self._saved = False

    @property
    def mu(self) -> Optional[float]:
        return None if self.round is None else self.round.moon.mu

    @property
    def previous_models(self) -> List[nn.Module]:
        return self._moon_part().objective.previous_models

    def record_class_means(self) -> None:
        """Restart the per-class means: call before the last local epoch to upload that epoch's, as the paper does."""
        self._started().record_class_means()

    def loss(self, x: torch.Tensor, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """μ_moon·ℓ_con + μ_glob·ℓ_glob for the batch ``x`` with labels ``y`` and representation ``z``; records the
        class means of ``z``."""
        fedssc = self._started()
        if fedssc.prototype_dim is not None and z.shape[1] != fedssc.prototype_dim:
            raise ValueError(f"z has {z.shape[1]} features but the received prototypes have {fedssc.prototype_dim}")
        loss, terms = fedssc.objective.add_terms(z.new_zeros(()), x, z, y)
        for name, value in terms.items():
            self._terms.add(name, value)
        return loss

    def upload_meta(self, num_samples: int) -> Dict[str, Any]:
        """``num_samples`` and this round's class means and counts (classes below ``min_class_count`` withheld,
        clipped and noised as the recipe says)."""
        return {**super().upload_meta(num_samples), **self._started().class_upload()}

    def _moon_part(self) -> MoonRound:
        return self._started().moon
