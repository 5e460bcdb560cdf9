"""FedSSC's client (shared supervised-contrastive FL): MOON plus the InfoNCE against shared class prototypes.

The round is :class:`~nvflare_moon.core.fedssc.FedSSCRound`, the object :class:`~nvflare_moon.client.PTFedSSCHelper`
runs in a Client API script: it reads the prototypes that came with the global model, trains on
``CE + μ_moon·ℓ_moon + μ_glob·ℓ_glob``, keeps the per-class mean projection over the last local epoch and uploads those
means and counts beside the weights. MOON's previous models persist between rounds as in :class:`MoonExecutor`.
"""

from typing import Optional

from nvflare.apis.fl_context import FLContext

from ..core.fedssc import FedSSCRound, FedSSCSettings
from ..core.settings import keep_settings
from ..models import ProjectionModel
from .moon import MoonExecutor


class FedSSCExecutor(MoonExecutor):
    """FedSSC; all :class:`MoonExecutor` and :class:`FedAvgExecutor` arguments apply but DP-SGD's (``dp_*``).

    Args:
        mu: μ_moon, the weight of MOON's term (paper: 5 for CIFAR-10, MOON's best μ for the dataset). The cold start
            (``mu_off_rounds``, ``mu_ramp_rounds``) schedules μ_moon only; μ_glob is constant, and the prototype term is
            absent in round 0 anyway. ``feature_noise_std`` also reaches the uploaded class means, which are computed
            from the noisy training forward passes.
        temperature: τ of both MOON's term and the prototype term (paper: 0.5).
        mu_glob, min_class_count, prototype_clip_norm, prototype_noise_std: the fields of
            :class:`~nvflare_moon.core.fedssc.FedSSCSettings` (μ_glob = 1, the paper's; classes seen fewer than 10
            times withheld; no clipping, no noise). The server never shares a class below its own threshold (default
            also 10), so ``min_class_count`` only keeps means of a few images on the site.
    """

    STATE_NAME = "fedssc_state"
    _always_serialize_args = MoonExecutor._always_serialize_args + (
        "mu_glob",
        "min_class_count",
        "prototype_clip_norm",
        "prototype_noise_std",
    )
    dp_refusal = (
        "the class means it uploads beside the weights are computed from the site's records outside DP-SGD, which "
        "would not cover them (prototype_clip_norm and prototype_noise_std are not accounted in ε)"
    )

    def __init__(
        self,
        *args,
        mu_glob: float = FedSSCSettings.mu_glob,
        min_class_count: int = FedSSCSettings.min_class_count,
        prototype_clip_norm: Optional[float] = FedSSCSettings.prototype_clip_norm,
        prototype_noise_std: float = FedSSCSettings.prototype_noise_std,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if not isinstance(self.model, ProjectionModel):
            raise ValueError(
                "model must be a ProjectionModel such as nvflare_moon.models.Network: "
                "FedSSC's prototypes have the shape of its classifier l3 (classes × projection size)"
            )
        self.fedssc_settings = keep_settings(
            self,
            FedSSCSettings(
                mu_glob=mu_glob,
                min_class_count=min_class_count,
                prototype_clip_norm=prototype_clip_norm,
                prototype_noise_std=prototype_noise_std,
            ),
        )

    def make_round(self, fl_ctx: FLContext) -> FedSSCRound:
        classifier = self.model.l3  # K × D
        return FedSSCRound(
            super().make_round(fl_ctx),
            self.fedssc_settings,
            classifier.out_features,
            classifier.in_features,
            last_epoch=self.local_epochs - 1,
        )
