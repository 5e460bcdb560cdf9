"""MOON's settings and one MOON round on a site, shared by :class:`~nvflare_moon.executors.MoonExecutor` and
:class:`~nvflare_moon.client.PTMoonHelper`.

A round, after the global weights are loaded into the network:

    objective = MoonRound(settings, network, uploads, site).start(round_number)
    ... train with objective (CE + μ_r·ℓ_con) ...
    round.finish()          # this round's model becomes the next rounds' previous one

μ_r follows the cold-start schedule (:func:`~.schedules.scheduled_mu`); the previous models come from the site's
stored uploads (:class:`~.previous_uploads.StoredUploads`), so the round is the same whether the client process lives
for the whole job or is restarted for every task (the simulator with ``-t < -n``).
"""

import dataclasses
import logging
from typing import Any, Dict, List, Mapping, Optional

import torch.nn as nn

from ..models import ProjectionHead, ProjectionModel
from .feature_noise import FeatureNoise
from .objectives import LightHistoryMoonObjective, MoonObjective, RepresentationL2Objective, projection_of
from .previous_uploads import StoredUploads
from .schedules import check_mu_schedule, describe_mu_schedule, scheduled_mu
from .settings import settings_from_meta, settings_to_meta
from .training import frozen_copy
from .validation import check_choice, check_flag, check_number

logger = logging.getLogger(__name__)

REPRESENTATION_LOSSES = ("contrastive", "l2", "l2_squared")
MOON_META_PREFIX = "moon_"


@dataclasses.dataclass(frozen=True)
class MoonSettings:
    """MOON's settings, checked.

    Args:
        mu: weight μ ≥ 0 of the contrastive term (paper: 5 for CIFAR-10, 1 for CIFAR-100 and Tiny-ImageNet).
        temperature: τ > 0 (paper: 0.5).
        num_previous_models: m ≥ 1, how many previous local models serve as negatives (paper: 1).
        representation_loss: ``"contrastive"`` (MOON) or the paper's ablation (Table 5), an ℓ2 pull of z towards
            z_glob with the same μ and no previous model: ``"l2"`` (μ·mean‖z − z_glob‖₂) or ``"l2_squared"``.
        mu_off_rounds: cold start: μ is 0 in rounds 0 … K−1 (0: the paper's constant μ).
        mu_ramp_rounds: cold start: then μ rises linearly over R rounds (0: straight to μ).
        feature_noise_std: σ ≥ 0 of the noise on the features h before the projection head, relative to ‖h‖
            (:class:`~.feature_noise.FeatureNoise`; 0: off). Needs a :class:`~nvflare_moon.models.ProjectionModel`.
        light_history: keep only the previous models' projection heads and compute z_prev from the global model's
            features (:class:`~.objectives.LightHistoryMoonObjective`; False: the paper's whole previous network).
            Needs a :class:`~nvflare_moon.models.ProjectionModel`.
    """

    # what an exported job shows even where it equals the default: the papers' settings
    _always_serialize_args = ("mu", "temperature", "num_previous_models")

    mu: float = 5.0
    temperature: float = 0.5
    num_previous_models: int = 1
    representation_loss: str = "contrastive"
    mu_off_rounds: int = 0
    mu_ramp_rounds: int = 0
    feature_noise_std: float = 0.0
    light_history: bool = False

    def __post_init__(self):
        check_choice("representation_loss", self.representation_loss, REPRESENTATION_LOSSES)
        check_mu_schedule(self.mu, self.mu_off_rounds, self.mu_ramp_rounds)
        check_number("temperature", self.temperature, low=0, low_inclusive=False)
        check_number("num_previous_models", self.num_previous_models, low=1, integer=True)
        check_number("feature_noise_std", self.feature_noise_std, low=0)
        check_flag("light_history", self.light_history)

    def check_model(self, model: nn.Module) -> None:
        """Raise ValueError, with the fix, when an option needs a :class:`ProjectionModel` and ``model`` is not one."""
        needs = (
            (
                "feature_noise_std > 0",
                self.feature_noise_std > 0,
                "which applies the noise before its projection head",
                "feature_noise_std=0",
            ),
            (
                "light_history=True",
                self.light_history,
                "whose projection head is what the history keeps",
                "light_history=False",
            ),
        )
        for option, needed, why, off in needs:
            if needed and not isinstance(model, ProjectionModel):
                raise ValueError(
                    f"{option} needs a ProjectionModel (nvflare_moon.models.Network, or your backbone wrapped in "
                    f"ProjectionModel), {why}; set {off}"
                )

    def to_meta(self) -> Dict[str, Any]:
        """The settings as ``FLModel.meta`` entries: ``moon_mu``, ``moon_temperature``, ..."""
        return settings_to_meta(self, MOON_META_PREFIX)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], recipe: str = "MoonScriptRecipe") -> "MoonSettings":
        """The settings a recipe sent in ``meta`` (see :func:`~.settings.settings_from_meta`)."""
        required = ("mu", "temperature", "num_previous_models")
        return settings_from_meta(cls, meta, MOON_META_PREFIX, required, recipe)

    def mu_in_round(self, round_number: int) -> float:
        """The μ in force in ``round_number``, after the cold start."""
        return scheduled_mu(round_number, self.mu, self.mu_off_rounds, self.mu_ramp_rounds)


class MoonRound:
    """One MOON round on one site.

    Args:
        settings: the method's settings.
        network: the local network, holding the round's global weights when :meth:`start` runs.
        uploads: the site's stored uploads (the previous local models).
        site: the site's name, for logs and the feature noise's seed.
        seed: the run's seed, for the feature noise.
        representation: z of a model on a batch, ``(model, x) -> [B, D]`` (default: a ProjectionModel's projection).
    """

    def __init__(
        self,
        settings: MoonSettings,
        network: nn.Module,
        uploads: StoredUploads,
        site: str,
        seed: int = 0,
        representation=projection_of,
    ):
        settings.check_model(network)
        self.settings = settings
        self.network = network
        self.uploads = uploads
        self.site = site
        self.seed = seed
        self.representation = representation
        self.mu: Optional[float] = None
        self.objective = None

    @property
    def history_network(self) -> nn.Module:
        """What each upload keeps: the whole network, or its projection head alone (light history)."""
        return ProjectionHead(self.network) if self.settings.light_history else self.network

    @property
    def keeps_local_model(self) -> bool:
        """Whether the uploads hold the whole trained model (then no second copy of it is stored)."""
        return not self.settings.light_history

    def start(self, round_number: int, meta: Optional[Mapping[str, Any]] = None):
        """The round's objective, CE + μ_r·ℓ_con (or the ℓ2 ablation); ``meta`` is not read (MOON needs nothing from
        the server beside the weights)."""
        settings = self.settings
        self.mu = settings.mu_in_round(round_number)
        schedule = describe_mu_schedule(settings.mu, settings.mu_off_rounds, settings.mu_ramp_rounds)
        logger.info(f"{self.site}: round {round_number}: mu = {self.mu:g}" + (f" ({schedule})" if schedule else ""))
        if settings.feature_noise_std > 0:
            self.network.feature_noise = FeatureNoise(settings.feature_noise_std, self.seed, self.site, round_number)
        if settings.representation_loss != "contrastive":
            self.uploads.skip(round_number)
            squared = settings.representation_loss == "l2_squared"
            self.objective = RepresentationL2Objective(
                frozen_copy(self.network), self.mu, squared=squared, representation=self.representation
            )
            return self.objective
        # loaded in cold-start rounds too, so that the stored uploads stay complete (see finish)
        previous = self._previous_models(round_number)
        if settings.light_history:
            self.objective = LightHistoryMoonObjective(
                frozen_copy(self.network), previous, self.mu, settings.temperature
            )
        else:
            self.objective = MoonObjective(
                frozen_copy(self.network), previous, self.mu, settings.temperature, self.representation
            )
        return self.objective

    def _previous_models(self, round_number: int) -> List[nn.Module]:
        keep = self.settings.num_previous_models
        previous = self.uploads.start(round_number, self.history_network, keep, without="the contrastive term")
        if not previous:
            logger.info(
                f"{self.site}: round {round_number}: no previous local model yet, the contrastive term is dropped"
            )
        return previous

    def before_epoch(self, epoch: int) -> None:
        """MOON does nothing between epochs."""

    def after_step(self) -> None:
        """MOON does nothing between steps."""

    def finish(self) -> Dict[str, Any]:
        """Store this round's model as an upload; MOON sends nothing beside the weights."""
        self.uploads.save(self.history_network)
        return {}
