"""Recipes for Client API scripts that use the helpers of :mod:`nvflare_moon.client`, in NVFlare 2.9's style.

    recipe = MoonScriptRecipe(model=Net(), min_clients=2, num_rounds=20, train_script="client_moon.py", mu=5.0)
    run = recipe.execute(SimEnv(num_clients=2, num_threads=1))

Each is NVFlare's PyTorch :class:`~nvflare.app_opt.pt.recipes.fedavg.FedAvgRecipe`, so every one of its arguments keeps
working (``launch_external_process``, ``launch_once``, ``key_metric``, ``stop_cond``, ``patience``,
``set_per_site_config``, ``add_experiment_tracking``, ``add_cross_site_evaluation``, ...), with our server side: the
FedAvg controller (:class:`~nvflare_moon.server.SettingsFedAvg`) sends the method's settings with every training model
(a method's settings dataclass, e.g. :class:`~nvflare_moon.core.moon.MoonSettings`, in its ``to_meta`` form; keys in
:mod:`nvflare_moon.client.meta`), and the aggregator is ours: weighted FedAvg by the ``num_samples`` each site
sends, refusing bad updates (:class:`~nvflare_moon.server.WeightedFedAvgAggregator`), plus FedSSC's prototype sharing
(:class:`~nvflare_moon.server.PrototypeSharingAggregator`) or FedSiam-DA's dual aggregation
(:class:`~nvflare_moon.server.DualAggregator`). The ``aggregator`` argument is therefore not taken. Every one takes
``quantization`` (NVFlare's quantizer/dequantizer filters on both sides, as the recipes of :mod:`nvflare_moon.recipes`
do; see :mod:`nvflare_moon.privacy`).
"""

from typing import Any, Dict, Optional

from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.workflows.fedavg import FedAvg
from nvflare.app_opt.pt.recipes.fedavg import FedAvgRecipe

from .core.dual_aggregation import VECTORS
from .core.fedsiam_da import FedSiamDASettings
from .core.fedssc import FedSSCSettings
from .core.moon import MoonSettings
from .core.settings import settings_from_arguments
from .privacy import add_update_filters, check_quantization
from .server import (
    DualAggregator,
    PrototypeSharingAggregator,
    ScaffoldAggregator,
    SettingsFedAvg,
    WeightedFedAvgAggregator,
)
from .validation import check_choice, check_number


class _ScriptRecipe(FedAvgRecipe):
    """FedAvgRecipe with our aggregator and the method's settings in every training model's meta."""

    def __init__(self, *, quantization: Optional[str] = None, **kwargs):
        check_quantization(quantization)
        self.quantization = quantization
        if kwargs.get("aggregator") is not None:
            raise ValueError(
                f"{type(self).__name__} brings its own aggregator (the method's server side); do not pass aggregator="
            )
        kwargs.pop("aggregator", None)
        super().__init__(aggregator=self.make_aggregator(), **kwargs)
        # our classes come from the installed package; a copy in the job's custom/ would shadow it, partially
        self._job.set_app_packages(["nvflare_moon"])

    def _ensure_client_apps_prepared(self) -> None:
        """The clients' filters go in once their apps exist, so that ``set_per_site_config`` still works after
        construction (NVFlare closes it once a client filter is added)."""
        if self._client_apps_prepared:
            return
        super()._ensure_client_apps_prepared()
        add_update_filters(self, self.quantization, [], "train", ["validate", "submit_model"])  # ClientAPIExecutor's

    def make_aggregator(self) -> ModelAggregator:
        return WeightedFedAvgAggregator()

    def client_settings(self) -> Dict[str, Any]:
        """Meta key → value sent with every training model."""
        raise NotImplementedError

    def _create_controller(self, persistor_id: str, model_params, model_aggregator) -> FedAvg:
        # FedAvgRecipe's controller, of our class (same arguments), plus the settings
        return SettingsFedAvg(
            num_clients=self.min_clients,
            num_rounds=self.num_rounds,
            persistor_id=persistor_id,
            model=model_params,
            save_filename=self.save_filename,
            aggregator=model_aggregator,
            stop_cond=self.stop_cond,
            patience=self.patience,
            task_name="train",
            exclude_vars=self.exclude_vars,
            aggregation_weights=self.aggregation_weights,
            memory_gc_rounds=self.server_memory_gc_rounds,
            enable_tensor_disk_offload=self.enable_tensor_disk_offload,
            client_settings=self.client_settings(),
            **self._get_controller_kwargs(),
        )


class MoonScriptRecipe(_ScriptRecipe):
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
        mu: float = 5.0,
        temperature: float = 0.5,
        num_previous_models: int = 1,
        mu_off_rounds: int = 0,
        mu_ramp_rounds: int = 0,
        representation_loss: str = "contrastive",
        feature_noise_std: float = 0.0,
        light_history: bool = False,
        **kwargs,
    ):
        self.moon_settings = settings_from_arguments(MoonSettings, locals(), self)
        super().__init__(name=name, **kwargs)

    def client_settings(self) -> Dict[str, Any]:
        return self.moon_settings.to_meta()


class FedSSCScriptRecipe(MoonScriptRecipe):
    """FedSSC for a Client API script that uses :class:`~nvflare_moon.client.PTFedSSCHelper`: MOON plus class
    prototypes that the server draws from the sites' class means and sends back with the next global model.

    Args:
        num_classes: K.
        prototype_dim: D, the size of the representation z the script's helper contrasts.
        mu_moon: μ of MOON's term (paper: 5 for CIFAR-10).
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
        mu_moon: float = 5.0,
        mu_glob: float = 1.0,
        temperature: float = 0.5,
        num_previous_models: int = 1,
        min_class_count: int = 10,
        prototype_clip_norm: Optional[float] = None,
        prototype_noise_std: float = 0.0,
        seed: int = 0,
        exclude_own_prototype: bool = False,
        **kwargs,
    ):
        self.fedssc_settings = settings_from_arguments(FedSSCSettings, locals(), self)
        self.num_classes = num_classes
        self.prototype_dim = prototype_dim
        self.mu_moon = mu_moon
        self.seed = seed
        self.exclude_own_prototype = exclude_own_prototype
        super().__init__(
            name=name, mu=mu_moon, temperature=temperature, num_previous_models=num_previous_models, **kwargs
        )

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


class FedSiamDAScriptRecipe(_ScriptRecipe):
    """FedSiam-DA for a Client API script that uses :class:`~nvflare_moon.client.PTFedSiamDAHelper`, with the dual
    aggregation on the server.

    Args:
        mu: μ of the Siamese and history terms (not published; default 0.01, the best of a sweep on CIFAR-10, see
            docs/fedssc_fedsiam.md).
        history: ``"epoch"`` (the previous local epoch's model) or ``"round"`` (the previous round's upload).
        history_branch: ``"projection"`` (the history term reads z) or ``"predictor"`` (it reads p = predictor(z)).
        cosine_floor: ε that a non-positive cosine is clamped to in the dual aggregation.
        cosine_vector: vec(w) of the dual aggregation's cosine: ``"state"`` (BatchNorm running statistics included)
            or ``"parameters"``.
        **kwargs: as for :class:`MoonScriptRecipe`.
    """

    def __init__(
        self,
        *,
        name: str = "fedsiam_da_script",
        mu: float = 0.01,
        history: str = "epoch",
        history_branch: str = "projection",
        cosine_floor: float = 1e-6,
        cosine_vector: str = "state",
        **kwargs,
    ):
        self.fedsiam_da_settings = settings_from_arguments(FedSiamDASettings, locals(), self)
        check_number("cosine_floor", cosine_floor, low=0, low_inclusive=False)
        check_choice("cosine_vector", cosine_vector, VECTORS)
        self.cosine_floor = cosine_floor
        self.cosine_vector = cosine_vector
        super().__init__(name=name, **kwargs)

    def make_aggregator(self) -> ModelAggregator:
        return DualAggregator(cosine_floor=self.cosine_floor, cosine_vector=self.cosine_vector)

    def client_settings(self) -> Dict[str, Any]:
        return self.fedsiam_da_settings.to_meta()


class ScaffoldScriptRecipe(_ScriptRecipe):
    """SCAFFOLD for a Client API script that uses :class:`~nvflare_moon.client.PTPersistentScaffoldHelper` (c_i
    persisted between rounds): weighted FedAvg of the weights and ``c ← c + Σ Δc_i / N`` on the server
    (:class:`~nvflare_moon.server.ScaffoldAggregator`), N = ``min_clients``.

    Args:
        **kwargs: as for :class:`MoonScriptRecipe`.
    """

    def __init__(self, *, name: str = "scaffold_script", **kwargs):
        self.num_sites = kwargs.get("min_clients")  # the aggregator is built before FedAvgRecipe stores min_clients
        super().__init__(name=name, **kwargs)

    def make_aggregator(self) -> ModelAggregator:
        return ScaffoldAggregator(num_sites=self.num_sites)

    def client_settings(self) -> Dict[str, Any]:
        return {}
