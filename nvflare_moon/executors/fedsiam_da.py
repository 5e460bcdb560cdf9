"""FedSiam-DA's client: Siamese local training against a trainable copy of the global model and a history model.

The round is :class:`~nvflare_moon.core.fedsiam_da.FedSiamDARound`, the object
:class:`~nvflare_moon.client.PTFedSiamDAHelper` runs in a Client API script; the previous upload is kept in a
job-scoped state file so that a restarted client process (``-t < -n``) still has it.
"""

from typing import Optional

from nvflare.apis.fl_context import FLContext

from ..core.fedsiam_da import FedSiamDARound, FedSiamDASettings
from ..core.previous_uploads import StoredUploads
from ..core.specs import spec_argument
from ..core.training import sgd
from .fedavg import FedAvgExecutor


class FedSiamDAExecutor(FedAvgExecutor):
    """FedSiam-DA: ``CE + μ·[½·D(p_g, z_l) + ½·D(p_l, z_g) + cos(b_l, sg(z_h))]``, b_l = z_l or p_l; all
    :class:`FedAvgExecutor` arguments apply but ``amp`` and DP-SGD's (``dp_*``). The model needs the SimSiam predictor
    (``Network(predictor_hidden_dim=64)``).

    Args:
        settings: a :class:`~nvflare_moon.core.fedsiam_da.FedSiamDASettings`; None: its defaults (μ = 0.01, the best
            of a sweep on CIFAR-10; the epoch history; the history term on the projection). Its fields by their old
            flat names (``mu=``, ...) are accepted until the next release, with a DeprecationWarning.
    """

    STATE_NAME = "fedsiam_da_state"
    dp_refusal = (
        "its working copy of the global model trains on the site's records with a plain optimizer of its own, and "
        "every local gradient reads it, so no sample's influence would be bounded (and its predictor has BatchNorm)"
    )

    def __init__(self, *args, settings: Optional[FedSiamDASettings] = None, **kwargs):
        settings = spec_argument(FedSiamDASettings, settings, kwargs, owner=type(self).__name__, argument="settings")
        super().__init__(*args, **kwargs)
        self.settings = settings
        if getattr(self.model, "predictor", None) is None:
            raise ValueError(
                "model has no SimSiam predictor: build it with predictor_hidden_dim=64, "
                "e.g. nvflare_moon.models.Network(predictor_hidden_dim=64) (FedSiamDARecipe does)"
            )
        if self.training.amp:
            raise ValueError(
                "amp=True cannot be used with FedSiam-DA: its working copy of the global model steps with an optimizer "
                "of its own, which mixed precision's gradient scaler does not cover; set amp=False"
            )
        if self.training.batch_size < 2:
            raise ValueError(
                f"batch_size must be >= 2 for FedSiam-DA (the predictor's BatchNorm), got {self.training.batch_size}"
            )

    def make_round(self, fl_ctx: FLContext) -> FedSiamDARound:
        return FedSiamDARound(
            self.settings,
            self._net,
            StoredUploads(self.job_state(self.STATE_NAME, fl_ctx)),
            fl_ctx.get_identity_name(),
            make_optimizer=lambda model: sgd(
                model, self.training.lr, self.training.momentum, self.training.weight_decay
            ),
        )
