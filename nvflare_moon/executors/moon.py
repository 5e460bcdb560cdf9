"""MOON's client (Li, He and Song, CVPR 2021): FedAvg's local training plus the model-contrastive term.

The party's previous local models (a FIFO of the last ``num_previous_models`` uploads) are kept in a job-scoped state
file (see :mod:`.previous_uploads`), so MOON is the same algorithm whether the client process lives for the whole job
or is restarted for every task (NVFlare's simulator with ``-t < -n``). The MOON article's practical options, the
cold start (a μ schedule), noise before the projection head and a light history (previous projection heads only), are
off by default (``docs/practical_options.md``).
"""

from nvflare.apis.fl_context import FLContext

from ..core.feature_noise import FeatureNoise
from ..core.objectives import (
    CrossEntropyObjective,
    LightHistoryMoonObjective,
    MoonObjective,
    RepresentationL2Objective,
)
from ..core.schedules import check_mu_schedule, describe_mu_schedule, scheduled_mu
from ..core.training import frozen_copy
from ..models import ProjectionHead, ProjectionModel
from ..validation import check_choice, check_flag, check_number
from .fedavg import FedAvgExecutor
from .previous_uploads import PreviousUploadsExecutor


REPRESENTATION_LOSSES = ("contrastive", "l2", "l2_squared")


class MoonExecutor(PreviousUploadsExecutor):
    """MOON: ``CE + μ·ℓ_con(z, z_glob, z_prev)``; all :class:`FedAvgExecutor` arguments apply.

    Args:
        mu: weight μ ≥ 0 of the contrastive term (paper: 5 for CIFAR-10, 1 for CIFAR-100 and Tiny-ImageNet).
        temperature: τ > 0 (paper: 0.5).
        num_previous_models: m ≥ 1, how many previous local models serve as negatives (paper: 1).
        representation_loss: ``"contrastive"`` (MOON) or the paper's ablation (Table 5), an ℓ2 pull of z towards
            z_glob with the same μ and no previous model: ``"l2"`` (μ·mean‖z − z_glob‖₂) or ``"l2_squared"``
            (μ·mean‖z − z_glob‖₂²); see :class:`~nvflare_moon.core.objectives.RepresentationL2Objective`.
        mu_off_rounds: cold start: μ is 0 in rounds 0 … K−1 (default 0: the paper's constant μ).
        mu_ramp_rounds: cold start: then μ rises linearly over R rounds (default 0: straight to μ); see
            :func:`~nvflare_moon.core.schedules.scheduled_mu`. The μ in force is logged every round.
        feature_noise_std: σ ≥ 0 of the Gaussian noise added to the features h before the projection head during
            local training, relative to each sample's ‖h‖ (see :class:`~nvflare_moon.core.feature_noise.FeatureNoise`;
            0, the default: off). It needs a :class:`~nvflare_moon.models.ProjectionModel`.
        light_history: keep only the projection head of each previous model and compute z_prev from the global
            model's features, an approximation of the paper's z_prev (see
            :class:`~nvflare_moon.core.objectives.LightHistoryMoonObjective`; default False: the whole previous
            network, the paper's method). It needs a :class:`~nvflare_moon.models.ProjectionModel`.
    """

    STATE_NAME = "moon_state"
    _always_serialize_args = FedAvgExecutor._always_serialize_args + ("mu", "temperature", "num_previous_models")

    def __init__(
        self,
        *args,
        mu: float = 5.0,
        temperature: float = 0.5,
        num_previous_models: int = 1,
        representation_loss: str = "contrastive",
        mu_off_rounds: int = 0,
        mu_ramp_rounds: int = 0,
        feature_noise_std: float = 0.0,
        light_history: bool = False,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        check_choice("representation_loss", representation_loss, REPRESENTATION_LOSSES)
        check_mu_schedule(mu, mu_off_rounds, mu_ramp_rounds)
        check_number("temperature", temperature, low=0, low_inclusive=False)
        check_number("num_previous_models", num_previous_models, low=1, integer=True)
        check_number("feature_noise_std", feature_noise_std, low=0)
        check_flag("light_history", light_history)
        if feature_noise_std > 0 and not isinstance(self.model, ProjectionModel):
            raise ValueError(
                "feature_noise_std > 0 needs a ProjectionModel (nvflare_moon.models.Network, or your backbone wrapped "
                "in ProjectionModel), which applies the noise before its projection head; set feature_noise_std=0"
            )
        if light_history and not isinstance(self.model, ProjectionModel):
            raise ValueError(
                "light_history=True needs a ProjectionModel (nvflare_moon.models.Network, or your backbone wrapped in "
                "ProjectionModel), whose projection head is what the history keeps; set light_history=False"
            )
        self.mu = mu
        self.temperature = temperature
        self.num_previous_models = num_previous_models
        self.representation_loss = representation_loss
        self.mu_off_rounds = mu_off_rounds
        self.mu_ramp_rounds = mu_ramp_rounds
        self.feature_noise_std = feature_noise_std
        self.light_history = light_history

    def uploads_to_keep(self) -> int:
        return self.num_previous_models

    def history_network(self):
        return ProjectionHead(self._net) if self.light_history else self._net

    def make_objective(self, round_number: int, fl_ctx: FLContext) -> CrossEntropyObjective:
        site = fl_ctx.get_identity_name()
        mu = scheduled_mu(round_number, self.mu, self.mu_off_rounds, self.mu_ramp_rounds)
        schedule = describe_mu_schedule(self.mu, self.mu_off_rounds, self.mu_ramp_rounds)
        self.log_info(fl_ctx, f"{site}: round {round_number}: mu = {mu:g}" + (f" ({schedule})" if schedule else ""))
        if self.feature_noise_std > 0:
            self._net.feature_noise = FeatureNoise(self.feature_noise_std, self.seed, site, round_number)
        if self.representation_loss != "contrastive":
            squared = self.representation_loss == "l2_squared"
            return RepresentationL2Objective(frozen_copy(self._net), mu, squared=squared)
        # loaded in cold-start rounds too, so that the stored uploads stay complete (see after_training)
        previous_models = self.load_previous_uploads(round_number, fl_ctx, without="the contrastive term")
        if not previous_models:
            self.log_info(fl_ctx, f"round {round_number}: no previous local model yet, the contrastive term is dropped")
        if self.light_history:
            return LightHistoryMoonObjective(frozen_copy(self._net), previous_models, mu, self.temperature)
        return MoonObjective(frozen_copy(self._net), previous_models, mu, self.temperature)
