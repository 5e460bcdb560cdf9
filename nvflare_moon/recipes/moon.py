"""MOON's recipes: executors (:class:`MoonRecipe`) and a Client API script (:class:`MoonScriptRecipe`)."""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from nvflare.apis.executor import Executor

from ..core.moon import MoonSettings
from ..core.settings import keep_settings
from ..executors import MoonExecutor
from .fedavg import FedAvgBaselineRecipe
from .script import ClientAPIRecipe

# MOON's best μ per dataset in the MOON paper (Li, He and Song, CVPR 2021, Sec. 4.2: 5 on CIFAR-10, 1 on CIFAR-100 and
# Tiny-ImageNet; 10 with 50 or more sites, which the scalability jobs set). "synthetic" stands in for CIFAR-10.
# A site's own images get 1, the paper's value on every dataset but CIFAR-10.
MOON_MU = {"cifar10": 5.0, "cifar100": 1.0, "tinyimagenet": 1.0, "synthetic": 5.0, "image_folder": 1.0, "datalist": 1.0}


@dataclass(eq=False, kw_only=True)
class MoonRecipe(FedAvgBaselineRecipe):
    """MOON (Li, He and Song, CVPR 2021) with the paper's CIFAR-10 defaults.

    Args:
        mu: weight of the model-contrastive term; None (default): the paper's best for the dataset (:data:`MOON_MU`: 5
            for CIFAR-10, 1 for CIFAR-100 and Tiny-ImageNet). The paper uses 10 with 50 or more sites.
        temperature: τ (paper: 0.5).
        num_previous_models: how many previous local models serve as negatives (paper: 1).
        representation_loss: ``"contrastive"`` (MOON), or the paper's ℓ2 ablation ``"l2"`` / ``"l2_squared"``
            (see :class:`MoonExecutor`).
        mu_off_rounds: cold start: μ = 0 in the first K rounds (default 0: off).
        mu_ramp_rounds: cold start: then μ rises linearly over R rounds (default 0); see
            ``docs/practical_options.md``.
        feature_noise_std: σ of the Gaussian noise on h before the projection head, relative to ‖h‖ (0: off).
        light_history: keep only the previous models' projection heads, an approximation of z_prev (default False;
            see ``docs/practical_options.md``).
        and every :class:`FedAvgBaselineRecipe` argument.
    """

    name: str = "moon_cifar10"
    mu: Optional[float] = None
    temperature: float = MoonSettings.temperature
    num_previous_models: int = MoonSettings.num_previous_models
    representation_loss: str = MoonSettings.representation_loss
    mu_off_rounds: int = MoonSettings.mu_off_rounds
    mu_ramp_rounds: int = MoonSettings.mu_ramp_rounds
    feature_noise_std: float = MoonSettings.feature_noise_std
    light_history: bool = MoonSettings.light_history

    def __post_init__(self):
        if self.mu is None:
            self.mu = MOON_MU.get(self.dataset, 5.0)  # an unknown dataset is refused with the job's options
        super().__post_init__()

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        return MoonExecutor(**common_args, settings=self.moon_settings())

    def moon_settings(self) -> MoonSettings:
        """MOON's settings of this job (for FedSSC, its MOON term)."""
        return MoonSettings(
            mu=self.mu,
            temperature=self.temperature,
            num_previous_models=self.num_previous_models,
            representation_loss=self.representation_loss,
            mu_off_rounds=self.mu_off_rounds,
            mu_ramp_rounds=self.mu_ramp_rounds,
            feature_noise_std=self.feature_noise_std,
            light_history=self.light_history,
        )


class MoonScriptRecipe(ClientAPIRecipe):
    """MOON for a Client API script that uses :class:`~nvflare_moon.client.PTMoonHelper`.

    Args:
        mu: μ ≥ 0 of the model-contrastive term (paper: 5 for CIFAR-10, 1 for CIFAR-100 and Tiny-ImageNet).
        temperature: τ > 0 (paper: 0.5).
        num_previous_models: m ≥ 1 previous local models as negatives (paper: 1).
        mu_off_rounds: cold start: μ = 0 in the first K rounds (default 0: off; ``docs/practical_options.md``).
        mu_ramp_rounds: cold start: then μ rises linearly over R rounds (default 0).
        representation_loss, feature_noise_std, light_history: the other options of
            :class:`~nvflare_moon.core.moon.MoonSettings` (the MOON paper's ℓ2 ablation, noise before the projection
            head, a light history), as for :class:`~nvflare_moon.executors.MoonExecutor`.
        **kwargs: every argument of NVFlare's PyTorch ``FedAvgRecipe`` but ``aggregator`` (``model``,
            ``min_clients``, ``num_rounds``, ``train_script``, ``train_args``, ``launch_external_process``, ...).
    """

    def __init__(
        self,
        *,
        name: str = "moon_script",
        mu: float = MoonSettings.mu,
        temperature: float = MoonSettings.temperature,
        num_previous_models: int = MoonSettings.num_previous_models,
        mu_off_rounds: int = MoonSettings.mu_off_rounds,
        mu_ramp_rounds: int = MoonSettings.mu_ramp_rounds,
        representation_loss: str = MoonSettings.representation_loss,
        feature_noise_std: float = MoonSettings.feature_noise_std,
        light_history: bool = MoonSettings.light_history,
        **kwargs,
    ):
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
        super().__init__(name=name, **kwargs)

    def client_settings(self) -> Dict[str, Any]:
        return self.moon_settings.to_meta()
