"""MOON's client (Li, He and Song, CVPR 2021): FedAvg's local training plus the model-contrastive term.

The round is :class:`~nvflare_moon.core.moon.MoonRound`, the object :class:`~nvflare_moon.client.PTMoonHelper` runs in
a Client API script. The site's previous local models (a FIFO of the last ``num_previous_models`` uploads) are kept in
a job-scoped state file, so MOON is the same algorithm whether the client process lives for the whole job or is
restarted for every task (NVFlare's simulator with ``-t < -n``). The MOON article's practical options, the cold start
(a μ schedule), noise before the projection head and a light history (previous projection heads only), are off by
default (``docs/practical_options.md``).
"""

from typing import Optional

from nvflare.apis.fl_context import FLContext

from ..core.moon import MoonRound, MoonSettings
from ..core.previous_uploads import StoredUploads
from ..core.specs import spec_argument
from .fedavg import FedAvgExecutor


class MoonExecutor(FedAvgExecutor):
    """MOON: ``CE + μ·ℓ_con(z, z_glob, z_prev)``; all :class:`FedAvgExecutor` arguments apply.

    Args:
        settings: a :class:`~nvflare_moon.core.moon.MoonSettings`; None: its defaults (the paper's: μ = 5 for
            CIFAR-10, τ = 0.5, m = 1, the contrastive loss, no cold start, no noise, the whole previous network).
            ``feature_noise_std > 0`` and ``light_history`` need a :class:`~nvflare_moon.models.ProjectionModel`.
            Its fields by their old flat names (``mu=``, ...) are accepted until the next release, with a
            DeprecationWarning.
    """

    STATE_NAME = "moon_state"

    def __init__(self, *args, settings: Optional[MoonSettings] = None, **kwargs):
        settings = spec_argument(MoonSettings, settings, kwargs, owner=type(self).__name__, argument="settings")
        super().__init__(*args, **kwargs)
        self.settings = settings
        self.settings.check_model(self.model)

    def make_round(self, fl_ctx: FLContext) -> MoonRound:
        uploads = StoredUploads(self.job_state(self.STATE_NAME, fl_ctx))
        return MoonRound(self.settings, self._net, uploads, fl_ctx.get_identity_name(), self.data.seed)
