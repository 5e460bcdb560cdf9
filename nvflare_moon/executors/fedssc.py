"""FedSSC's client (shared supervised-contrastive FL): MOON plus the InfoNCE against shared class prototypes.

The round is :class:`~nvflare_moon.core.fedssc.FedSSCRound`, the object :class:`~nvflare_moon.client.PTFedSSCHelper`
runs in a Client API script: it reads the prototypes that came with the global model, trains on
``CE + μ_moon·ℓ_moon + μ_glob·ℓ_glob``, keeps the per-class mean projection over the last local epoch and uploads those
means and counts beside the weights. MOON's previous models persist between rounds as in :class:`MoonExecutor`.
"""

from typing import Optional

from nvflare.apis.fl_context import FLContext

from ..core.fedssc import FedSSCRound, FedSSCSettings
from ..core.specs import spec_argument
from ..models import ProjectionModel
from .moon import MoonExecutor


class FedSSCExecutor(MoonExecutor):
    """FedSSC; all :class:`MoonExecutor` and :class:`FedAvgExecutor` arguments apply but DP-SGD's (``dp_*``).

    Args:
        settings: MOON's term, a :class:`~nvflare_moon.core.moon.MoonSettings`: its ``mu`` is μ_moon (paper: 5 for
            CIFAR-10, MOON's best μ for the dataset), its ``temperature`` the τ of both terms (paper: 0.5). The cold
            start (``mu_off_rounds``, ``mu_ramp_rounds``) schedules μ_moon only; μ_glob is constant, and the prototype
            term is absent in round 0 anyway. ``feature_noise_std`` also reaches the uploaded class means, which are
            computed from the noisy training forward passes.
        fedssc_settings: the prototype term, a :class:`~nvflare_moon.core.fedssc.FedSSCSettings`; None: its
            defaults (μ_glob = 1, the paper's; classes seen fewer than 10 times withheld; no clipping, no noise). The
            server never shares a class below its own threshold (default also 10), so ``min_class_count`` only keeps
            means of a few images on the site.

    The settings' fields by their old flat names (``mu=``, ``mu_glob=``, ...) are accepted until the next release,
    with a DeprecationWarning.
    """

    STATE_NAME = "fedssc_state"
    dp_refusal = (
        "the class means it uploads beside the weights are computed from the site's records outside DP-SGD, which "
        "would not cover them (prototype_clip_norm and prototype_noise_std are not accounted in ε)"
    )

    def __init__(self, *args, fedssc_settings: Optional[FedSSCSettings] = None, **kwargs):
        fedssc_settings = spec_argument(
            FedSSCSettings, fedssc_settings, kwargs, owner=type(self).__name__, argument="fedssc_settings"
        )
        super().__init__(*args, **kwargs)
        if not isinstance(self.model, ProjectionModel):
            raise ValueError(
                "model must be a ProjectionModel such as nvflare_moon.models.Network: "
                "FedSSC's prototypes have the shape of its classifier l3 (classes × projection size)"
            )
        self.fedssc_settings = fedssc_settings

    def make_round(self, fl_ctx: FLContext) -> FedSSCRound:
        classifier = self.model.l3  # K × D
        return FedSSCRound(
            super().make_round(fl_ctx),
            self.fedssc_settings,
            classifier.out_features,
            classifier.in_features,
            last_epoch=self.training.local_epochs - 1,
        )
