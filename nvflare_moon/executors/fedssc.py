"""FedSSC's client (shared supervised-contrastive FL): MOON plus the InfoNCE against shared class prototypes.

Every round the site
- reads the prototypes and their availability mask that came with the global model (none in round 0: the prototype
  term is dropped and the loss is exactly MOON's);
- trains on ``CE + μ_moon·ℓ_moon + μ_glob·ℓ_glob`` (:class:`~nvflare_moon.core.objectives.FedSSCObjective`), keeping the
  per-class mean projection over the training forward passes of the last local epoch;
- uploads those means and counts beside the weights (:func:`~nvflare_moon.core.prototypes.prepare_upload`: classes with
  fewer than ``min_class_count`` samples withheld, optional clipping and Gaussian noise).
MOON's previous models persist between rounds as in :class:`MoonExecutor`.
"""

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import FLModel

from ..core.objectives import FedSSCObjective
from ..core.prototypes import CLASS_COUNTS, CLASS_MEANS, prepare_upload, read_shared_prototypes
from ..models import ProjectionModel
from ..validation import check_number
from .moon import MoonExecutor


class FedSSCExecutor(MoonExecutor):
    """FedSSC; all :class:`MoonExecutor` and :class:`FedAvgExecutor` arguments apply.

    Args:
        mu: μ_moon, the weight of MOON's term (paper: 5 for CIFAR-10, MOON's best μ for the dataset). The cold start
            (``mu_off_rounds``, ``mu_ramp_rounds``) schedules μ_moon only; μ_glob is constant, and the prototype term is
            absent in round 0 anyway. ``feature_noise_std`` also reaches the uploaded class means, which are computed
            from the noisy training forward passes.
        temperature: τ of both MOON's term and the prototype term (paper: 0.5).
        mu_glob: μ_glob ≥ 0, the weight of the prototype term (paper: 1).
        min_class_count: classes seen fewer times in the last local epoch are not uploaded (their mean and count are
            sent as 0). The server never shares a class below its own threshold (default also 10), so this only keeps
            means of a few images on the site.
        prototype_clip_norm: when set (> 0), each uploaded mean is scaled to L2 norm ≤ this value before the noise.
        prototype_noise_std: σ ≥ 0 of the Gaussian noise added to every entry of each uploaded mean (0: off). The loss
            uses cosines, so what matters is σ relative to the clip norm (or to the typical norm of z).
    """

    STATE_NAME = "fedssc_state"
    _always_serialize_args = MoonExecutor._always_serialize_args + (
        "mu_glob",
        "min_class_count",
        "prototype_clip_norm",
        "prototype_noise_std",
    )

    def __init__(
        self,
        *args,
        mu_glob: float = 1.0,
        min_class_count: int = 10,
        prototype_clip_norm: Optional[float] = None,
        prototype_noise_std: float = 0.0,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if not isinstance(self.model, ProjectionModel):
            raise ValueError(
                "model must be a ProjectionModel such as nvflare_moon.models.Network: "
                "FedSSC's prototypes have the shape of its classifier l3 (classes × projection size)"
            )
        check_number("mu_glob", mu_glob, low=0)
        check_number("min_class_count", min_class_count, low=1, integer=True)
        if prototype_clip_norm is not None:
            check_number("prototype_clip_norm", prototype_clip_norm, low=0, low_inclusive=False)
        check_number("prototype_noise_std", prototype_noise_std, low=0)
        self.mu_glob = mu_glob
        self.min_class_count = min_class_count
        self.prototype_clip_norm = prototype_clip_norm
        self.prototype_noise_std = prototype_noise_std
        self._shared: Optional[Tuple[np.ndarray, np.ndarray]] = None
        self._objective: Optional[FedSSCObjective] = None
        self._upload: Dict[str, np.ndarray] = {}

    def on_receive(self, received: FLModel, fl_ctx: FLContext) -> None:
        where = f"{fl_ctx.get_identity_name()}: round {received.current_round or 0}"
        num_classes, dim = self.model.l3.out_features, self.model.l3.in_features
        try:
            self._shared = read_shared_prototypes(received.meta or {}, num_classes, dim, fl_ctx.get_identity_name())
        except ValueError as e:
            self._shared = None
            self.log_warning(fl_ctx, f"{where}: {e}; training this round without the prototype term")
            return
        if self._shared is None:
            self.log_info(fl_ctx, f"{where}: no shared prototypes yet, the prototype term is dropped")
        else:
            self.log_info(
                fl_ctx, f"{where}: received prototypes for {int(self._shared[1].sum())} of {num_classes} classes"
            )

    def make_objective(self, round_number: int, fl_ctx: FLContext) -> FedSSCObjective:
        prototypes = available = None
        if self._shared is not None:
            prototypes, available = (torch.as_tensor(a, device=self._torch_device) for a in self._shared)
        self._objective = FedSSCObjective(
            super().make_objective(round_number, fl_ctx),
            prototypes,
            available,
            self.mu_glob,
            self.temperature,
            self.model.l3.out_features,
        )
        return self._objective

    def before_epoch(self, epoch: int) -> None:
        if epoch == self.local_epochs - 1:
            self._objective.record_class_means()

    def after_training(self, round_number: int, fl_ctx: FLContext) -> None:
        super().after_training(round_number, fl_ctx)
        means, counts = self._objective.class_means.result()
        means, counts = prepare_upload(
            means, counts, self.min_class_count, self.prototype_clip_norm, self.prototype_noise_std
        )
        self._upload = {CLASS_MEANS: means, CLASS_COUNTS: counts}
        self.log_info(
            fl_ctx,
            f"{fl_ctx.get_identity_name()}: round {round_number}: uploading the mean projection of "
            f"{int((counts > 0).sum())} classes (counts {counts.tolist()})",
        )

    def extra_meta(self) -> Dict[str, Any]:
        return self._upload
