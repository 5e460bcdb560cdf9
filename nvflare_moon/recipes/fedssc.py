"""FedSSC's recipes: executors (:class:`FedSSCRecipe`) and a Client API script (:class:`FedSSCScriptRecipe`)."""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from nvflare.apis.executor import Executor
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator

from ..core.fedssc import FedSSCSettings
from ..core.moon import MoonSettings
from ..core.settings import keep_settings
from ..core.validation import take_renamed
from ..executors import FedSSCExecutor
from ..filters.encryption import WHY_NOT_ENCRYPTED
from ..server import PrototypeSharingAggregator
from .moon import MoonRecipe, MoonScriptRecipe


@dataclass(eq=False, kw_only=True)
class FedSSCRecipe(MoonRecipe):
    """FedSSC (shared supervised-contrastive FL) with the paper's defaults: MOON plus class prototypes that the server
    draws from the sites (:class:`PrototypeSharingAggregator`) and sends back with the next global model.

    Args:
        mu: μ_moon, the weight of MOON's term; None (default): MOON's best μ for the dataset, as the paper says
            (:data:`MOON_MU`: 5 for CIFAR-10, 1 for CIFAR-100 and Tiny-ImageNet). ``mu_moon``, its old name, is
            accepted until the next release, with a DeprecationWarning.
        mu_glob: weight of the prototype term (paper: 1).
        temperature: τ of both terms (paper: 0.5).
        num_previous_models: as for MOON (paper: 1).
        min_class_count: the server draws a class's prototype only from sites with at least this many of its samples
            in their last local epoch, and sites withhold the others (paper: 10).
        prototype_clip_norm: clip each uploaded prototype to this L2 norm (None: off).
        prototype_noise_std: σ of the Gaussian noise added to uploaded prototypes (0: off).
        exclude_own_prototype: a site never gets its own class mean back as a prototype (default False; see
            :class:`PrototypeSharingAggregator`).
        and every :class:`MoonRecipe` argument but ``representation_loss`` (the cold start schedules μ_moon), and
        every :class:`FedAvgBaselineRecipe` argument; ``seed`` also seeds the server's draw.
    """

    option_limits = {"encryption": WHY_NOT_ENCRYPTED["fedssc"]}

    name: str = "fedssc_cifar10"
    mu_glob: float = FedSSCSettings.mu_glob
    min_class_count: int = FedSSCSettings.min_class_count
    prototype_clip_norm: Optional[float] = FedSSCSettings.prototype_clip_norm
    prototype_noise_std: float = FedSSCSettings.prototype_noise_std
    exclude_own_prototype: bool = False
    mu_moon: Optional[float] = None  # the old name of mu, until the next release

    def __post_init__(self):
        old_name = {} if self.mu_moon is None else {"mu_moon": self.mu_moon}
        self.mu = take_renamed(old_name, "mu_moon", "mu", self.mu, None, owner="FedSSCRecipe")
        if self.representation_loss != MoonSettings.representation_loss:
            raise ValueError(
                "FedSSCRecipe has no representation_loss: its MOON term is the contrastive loss (the l2 ablation is "
                "MoonRecipe's); remove the argument"
            )
        super().__post_init__()

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        fedssc_settings = FedSSCSettings(
            mu_glob=self.mu_glob,
            min_class_count=self.min_class_count,
            prototype_clip_norm=self.prototype_clip_norm,
            prototype_noise_std=self.prototype_noise_std,
        )
        return FedSSCExecutor(**common_args, settings=self.moon_settings(), fedssc_settings=fedssc_settings)

    def make_aggregator(self) -> ModelAggregator:
        return PrototypeSharingAggregator(
            num_classes=self.num_classes,
            prototype_dim=self.out_dim,
            min_class_count=self.min_class_count,
            seed=self.seed,
            exclude_own_prototype=self.exclude_own_prototype,
            allow_partial_updates=self.allow_partial_updates,
        )


class FedSSCScriptRecipe(MoonScriptRecipe):
    """FedSSC for a Client API script that uses :class:`~nvflare_moon.client.PTFedSSCHelper`: MOON plus class
    prototypes that the server draws from the sites' class means and sends back with the next global model.

    Args:
        num_classes: K.
        prototype_dim: D, the size of the representation z the script's helper contrasts.
        mu: μ_moon, the weight of MOON's term (paper: 5 for CIFAR-10); ``mu_moon``, its old name, is accepted until
            the next release, with a DeprecationWarning.
        mu_glob: μ_glob ≥ 0 of the prototype term (paper: 1).
        temperature: τ of both terms (paper: 0.5).
        num_previous_models: m, as for MOON.
        mu_off_rounds, mu_ramp_rounds: the cold start of μ_moon, as for MOON (default off).
        min_class_count: sites upload, and the server draws from, only classes with at least this many samples
            (paper: 10).
        prototype_clip_norm: clip each uploaded mean to this L2 norm (None: off).
        prototype_noise_std: σ of the Gaussian noise on uploaded means (0: off).
        seed: seed of the server's prototype draw.
        exclude_own_prototype: a site never gets its own class mean back (the helper takes the alternate the server
            sends; see :class:`~nvflare_moon.server.PrototypeSharingAggregator`). Default False.
        **kwargs: as for :class:`MoonScriptRecipe`.
    """

    def __init__(
        self,
        *,
        name: str = "fedssc_script",
        num_classes: int,
        prototype_dim: int,
        mu: float = MoonSettings.mu,
        mu_glob: float = FedSSCSettings.mu_glob,
        temperature: float = MoonSettings.temperature,
        num_previous_models: int = MoonSettings.num_previous_models,
        min_class_count: int = FedSSCSettings.min_class_count,
        prototype_clip_norm: Optional[float] = FedSSCSettings.prototype_clip_norm,
        prototype_noise_std: float = FedSSCSettings.prototype_noise_std,
        seed: int = 0,
        exclude_own_prototype: bool = False,
        **kwargs,
    ):
        mu = take_renamed(kwargs, "mu_moon", "mu", mu, MoonSettings.mu, owner="FedSSCScriptRecipe")
        self.fedssc_settings = keep_settings(
            self,
            FedSSCSettings(
                mu_glob=mu_glob,
                min_class_count=min_class_count,
                prototype_clip_norm=prototype_clip_norm,
                prototype_noise_std=prototype_noise_std,
            ),
        )
        self.num_classes = num_classes
        self.prototype_dim = prototype_dim
        self.seed = seed
        self.exclude_own_prototype = exclude_own_prototype
        super().__init__(name=name, mu=mu, temperature=temperature, num_previous_models=num_previous_models, **kwargs)

    def make_aggregator(self) -> ModelAggregator:
        return PrototypeSharingAggregator(
            num_classes=self.num_classes,
            prototype_dim=self.prototype_dim,
            min_class_count=self.min_class_count,
            seed=self.seed,
            exclude_own_prototype=self.exclude_own_prototype,
        )

    def client_settings(self) -> Dict[str, Any]:
        return {**super().client_settings(), **self.fedssc_settings.to_meta()}
