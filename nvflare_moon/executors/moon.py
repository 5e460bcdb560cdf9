"""MOON's client (Li, He and Song, CVPR 2021): FedAvg's local training plus the model-contrastive term.

The round is :class:`~nvflare_moon.core.moon.MoonRound`, the object :class:`~nvflare_moon.client.PTMoonHelper` runs in
a Client API script. The site's previous local models (a FIFO of the last ``num_previous_models`` uploads) are kept in
a job-scoped state file, so MOON is the same algorithm whether the client process lives for the whole job or is
restarted for every task (NVFlare's simulator with ``-t < -n``). The MOON article's practical options, the cold start
(a μ schedule), noise before the projection head and a light history (previous projection heads only), are off by
default (``docs/practical_options.md``).
"""

from nvflare.apis.fl_context import FLContext

from ..core.moon import MoonRound, MoonSettings
from ..core.previous_uploads import StoredUploads
from ..core.settings import keep_settings
from .fedavg import FedAvgExecutor


class MoonExecutor(FedAvgExecutor):
    """MOON: ``CE + μ·ℓ_con(z, z_glob, z_prev)``; all :class:`FedAvgExecutor` arguments apply.

    Args:
        mu, temperature, num_previous_models, representation_loss, mu_off_rounds, mu_ramp_rounds, feature_noise_std,
        light_history: the fields of :class:`~nvflare_moon.core.moon.MoonSettings`, with its defaults (the paper's:
        μ = 5 for CIFAR-10, τ = 0.5, m = 1, the contrastive loss, no cold start, no noise, the whole previous
        network). ``feature_noise_std > 0`` and ``light_history`` need a :class:`~nvflare_moon.models.ProjectionModel`.
    """

    STATE_NAME = "moon_state"
    _always_serialize_args = FedAvgExecutor._always_serialize_args + ("mu", "temperature", "num_previous_models")

    def __init__(
        self,
        *args,
        mu: float = MoonSettings.mu,
        temperature: float = MoonSettings.temperature,
        num_previous_models: int = MoonSettings.num_previous_models,
        representation_loss: str = MoonSettings.representation_loss,
        mu_off_rounds: int = MoonSettings.mu_off_rounds,
        mu_ramp_rounds: int = MoonSettings.mu_ramp_rounds,
        feature_noise_std: float = MoonSettings.feature_noise_std,
        light_history: bool = MoonSettings.light_history,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.moon_settings = keep_settings(
            self,
            MoonSettings(
                mu=mu,
                temperature=temperature,
                num_previous_models=num_previous_models,
                representation_loss=representation_loss,
                mu_off_rounds=mu_off_rounds,
                mu_ramp_rounds=mu_ramp_rounds,
                feature_noise_std=feature_noise_std,
                light_history=light_history,
            ),
        )
        self.moon_settings.check_model(self.model)

    def make_round(self, fl_ctx: FLContext) -> MoonRound:
        uploads = StoredUploads(self.job_state(self.STATE_NAME, fl_ctx))
        return MoonRound(self.moon_settings, self._net, uploads, fl_ctx.get_identity_name(), self.seed)
