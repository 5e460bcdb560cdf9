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

The math is :class:`~nvflare_moon.core.objectives.MoonObjective` and
:class:`~nvflare_moon.core.objectives.FedSSCObjective`, the same objects :class:`~nvflare_moon.executors.MoonExecutor`
and :class:`~nvflare_moon.executors.FedSSCExecutor` train with.
"""

import logging
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.nn as nn

from ..core.objectives import FedSSCObjective, MoonObjective, Representation, projection_of
from ..core.schedules import describe_mu_schedule, scheduled_mu
from ..core.prototypes import CLASS_COUNTS, CLASS_MEANS, PROTOTYPES, prepare_upload, read_shared_prototypes
from ..core.training import TermMeans, frozen_copy
from .common import check_received_weights, site_identity
from .meta import (
    FEDSSC_MIN_CLASS_COUNT,
    FEDSSC_MU_GLOB,
    FEDSSC_PROTOTYPE_CLIP_NORM,
    FEDSSC_PROTOTYPE_NOISE_STD,
    MOON_MU,
    MOON_MU_OFF_ROUNDS,
    MOON_MU_RAMP_ROUNDS,
    MOON_NUM_PREVIOUS_MODELS,
    MOON_TEMPERATURE,
    NUM_SAMPLES,
    read_setting,
)
from .uploads import ScriptUploads

logger = logging.getLogger(__name__)


class PTMoonHelper:
    """MOON's model-contrastive term for a Client API script: ``loss = your_loss + helper.loss(x, z)``.

    Every round, after loading the received weights into ``model``: :meth:`start_round` reads μ (and its cold-start
    schedule), τ and m from the meta (sent by :class:`~nvflare_moon.client_api_recipes.MoonScriptRecipe`), freezes a copy of the global model and
    loads this site's last m saved models; :meth:`loss` gives μ·ℓ_con for a batch; :meth:`save_local_model` stores the
    trained model for the next rounds, in the job's run folder on the site (see :mod:`nvflare_moon.client.state`), so
    that MOON is the same algorithm when NVFlare restarts the script for every task (``-t < -n``).

    Args:
        model: the network being trained (any ``nn.Module``).
        representation_fn: ``(model, x) -> z [B, D]``, the representation MOON contrasts (the paper: the projection
            head's output). Default: ``model(x).projection``, as :class:`~nvflare_moon.models.Network` returns it.
        state_dir: a folder that persists across rounds, for when the run folder cannot be found from the working
            directory; the state then goes to ``<state_dir>/<job id>/<site>``.
        job_id, site: default the running job's and site's (``flare.get_job_id()``, ``flare.get_site_name()``);
            give both to use the helper outside NVFlare (tests).
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
    ):
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
        if representation_fn is not None and not callable(representation_fn):
            raise ValueError(f"representation_fn must be a function (model, x) -> z, got {representation_fn!r}")
        self.model = model
        self.representation_fn = representation_fn
        self.state_dir = state_dir
        self.job_id = job_id
        self.site = site
        self.mu: Optional[float] = None
        self.temperature: Optional[float] = None
        self.num_previous_models: Optional[int] = None
        self.objective: Optional[MoonObjective] = None
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
        round_number = input_model.current_round or 0
        mu = read_setting(meta, MOON_MU, self.RECIPE, low=0)
        self.temperature = read_setting(meta, MOON_TEMPERATURE, self.RECIPE, low=0, low_inclusive=False)
        self.num_previous_models = read_setting(meta, MOON_NUM_PREVIOUS_MODELS, self.RECIPE, low=1, integer=True)
        off, ramp = (
            read_setting(meta, key, self.RECIPE, low=0, integer=True, optional=True) or 0
            for key in (MOON_MU_OFF_ROUNDS, MOON_MU_RAMP_ROUNDS)
        )
        self.mu = scheduled_mu(round_number, mu, off, ramp)
        name = type(self).__name__
        check_received_weights(self.model, input_model.params, name)
        uploads = self._script_uploads()
        schedule = describe_mu_schedule(mu, off, ramp)
        logger.info(f"{uploads.site}: round {round_number}: mu = {self.mu:g}" + (f" ({schedule})" if schedule else ""))
        previous = uploads.start_round(
            round_number, self.model, self.num_previous_models, without="the contrastive term"
        )
        self.objective = MoonObjective(
            frozen_copy(self.model), previous, self.mu, self.temperature, self.representation_fn or projection_of
        )
        self._terms = TermMeans()
        self._saved = False

    @property
    def previous_models(self) -> List[nn.Module]:
        """This round's previous local models, frozen, oldest first (empty in a site's first round)."""
        return self._started().previous_models

    def loss(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """μ·ℓ_con(z, z_glob, z_prev) for the batch ``x`` whose representation under ``model`` is ``z`` (with its
        gradient); exactly 0 without a previous model."""
        contrastive = self._started().contrastive(x, z)
        if contrastive is None:
            return z.new_zeros(())
        self._terms.add("contrastive", contrastive)
        return self.mu * contrastive

    def mean_terms(self) -> Dict[str, float]:
        """The round's mean of each term added so far (``contrastive``, ...), unweighted, for logs and metrics."""
        return self._terms.means()

    def save_local_model(self) -> None:
        """Store ``model`` as this round's upload; call it after training, before ``flare.send``."""
        self._started()
        self._uploads.save(self.model)
        self._saved = True

    def upload_meta(self, num_samples: int) -> Dict[str, Any]:
        """The meta to send with the trained weights: ``num_samples``, the server's FedAvg weight."""
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"num_samples must be the positive number of training samples, got {num_samples!r}")
        if not self._saved:
            name = type(self).__name__
            logger.warning(f"upload_meta() before {name}.save_local_model(): this round's model is not kept")
        return {NUM_SAMPLES: num_samples}

    def _script_uploads(self) -> ScriptUploads:
        if self._uploads is None:
            name = type(self).__name__
            job_id, site = site_identity(self.job_id, self.site, name)
            self._uploads = ScriptUploads(
                self.STATE_NAME, job_id, site, self.state_dir, save_call=f"{name}.save_local_model()"
            )
        return self._uploads

    def _started(self) -> MoonObjective:
        if self.objective is None:
            raise RuntimeError(f"call {type(self).__name__}.start_round(input_model) at the start of every round")
        return self.objective


class PTFedSSCHelper(PTMoonHelper):
    """FedSSC for a Client API script: MOON's term plus the prototype term, ``helper.loss(x, z, y)``.

    Beside what :class:`PTMoonHelper` does, :meth:`start_round` reads μ_glob and the upload settings and the shared
    class prototypes from the meta (none in round 0: the term is dropped), :meth:`loss` adds μ_glob·ℓ_glob and keeps
    the per-class mean of z, and :meth:`upload_meta` returns the class means and counts to send. The paper keeps the
    means of the last local epoch: call :meth:`record_class_means` before it (without the call, the means cover the
    whole round). Run with :class:`~nvflare_moon.client_api_recipes.FedSSCScriptRecipe`.

    Args:
        num_classes: K, the number of classes (the prototypes are K × D, D the size of z).
        model, representation_fn, state_dir, job_id, site: as for :class:`PTMoonHelper`.
    """

    STATE_NAME = "fedssc_state"
    RECIPE = "FedSSCScriptRecipe"

    def __init__(self, model: nn.Module, num_classes: int, **kwargs):
        super().__init__(model, **kwargs)
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        self.num_classes = num_classes
        self.mu_glob: Optional[float] = None
        self.min_class_count: Optional[int] = None
        self.prototype_clip_norm: Optional[float] = None
        self.prototype_noise_std: Optional[float] = None
        self.fedssc: Optional[FedSSCObjective] = None
        self.prototype_dim: Optional[int] = None

    def start_round(self, input_model) -> None:
        """As :meth:`PTMoonHelper.start_round`, plus FedSSC's settings and the shared prototypes."""
        super().start_round(input_model)
        meta = input_model.meta or {}
        self.mu_glob = read_setting(meta, FEDSSC_MU_GLOB, self.RECIPE, low=0)
        self.min_class_count = read_setting(meta, FEDSSC_MIN_CLASS_COUNT, self.RECIPE, low=1, integer=True)
        self.prototype_clip_norm = read_setting(
            meta, FEDSSC_PROTOTYPE_CLIP_NORM, self.RECIPE, low=0, low_inclusive=False, optional=True
        )
        self.prototype_noise_std = read_setting(meta, FEDSSC_PROTOTYPE_NOISE_STD, self.RECIPE, low=0)
        where = f"{self._uploads.site}: round {input_model.current_round or 0}"
        shared = None
        try:
            dim = np.shape(meta[PROTOTYPES])[-1] if PROTOTYPES in meta else 0
            shared = read_shared_prototypes(meta, self.num_classes, dim, self._uploads.site)
        except (ValueError, IndexError) as e:
            logger.warning(f"{where}: {e}; training this round without the prototype term")
        prototypes = available = None
        if shared is None:
            logger.info(f"{where}: no shared prototypes, the prototype term is dropped")
        else:
            device = next(self.model.parameters()).device
            prototypes, available = (torch.as_tensor(a, device=device) for a in shared)
            self.prototype_dim = prototypes.shape[1]
            logger.info(f"{where}: received prototypes for {int(shared[1].sum())} of {self.num_classes} classes")
        self.fedssc = FedSSCObjective(
            self.objective, prototypes, available, self.mu_glob, self.temperature, self.num_classes
        )
        self.fedssc.record_class_means()

    def record_class_means(self) -> None:
        """Restart the per-class means: call before the last local epoch to upload that epoch's, as the paper does."""
        self._fedssc().record_class_means()

    def loss(self, x: torch.Tensor, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """μ_moon·ℓ_con + μ_glob·ℓ_glob for the batch ``x`` with labels ``y`` and representation ``z``; records the
        class means of ``z``."""
        loss = super().loss(x, z)
        fedssc = self._fedssc()
        if self.prototype_dim is not None and z.shape[1] != self.prototype_dim:
            raise ValueError(f"z has {z.shape[1]} features but the received prototypes have {self.prototype_dim}")
        prototype = fedssc.prototype_term(z, y)
        if prototype is None:
            return loss
        self._terms.add("prototype_contrastive", prototype)
        return loss + self.mu_glob * prototype

    def upload_meta(self, num_samples: int) -> Dict[str, Any]:
        """``num_samples`` and this round's class means and counts (classes below ``min_class_count`` withheld,
        clipped and noised as the recipe says)."""
        meta = super().upload_meta(num_samples)
        if self._fedssc().class_means is None or self.fedssc.class_means.empty:
            raise RuntimeError("no batch went through PTFedSSCHelper.loss(x, z, y) this round: no class means to send")
        means, counts = self.fedssc.class_means.result()
        means, counts = prepare_upload(
            means, counts, self.min_class_count, self.prototype_clip_norm, self.prototype_noise_std
        )
        meta.update({CLASS_MEANS: means, CLASS_COUNTS: counts})
        return meta

    def _fedssc(self) -> FedSSCObjective:
        if self.fedssc is None:
            raise RuntimeError("call PTFedSSCHelper.start_round(input_model) at the start of every round")
        return self.fedssc
