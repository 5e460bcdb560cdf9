"""Recipes in NVFlare 2.9's style: one object describes a whole job, which runs in an ``ExecEnv`` or is exported.

    recipe = MoonRecipe(min_clients=10, num_rounds=100, data_root="/data")
    recipe.execute(SimEnv(num_clients=10, num_threads=4))      # or: recipe.export("jobs/moon_cifar10")

Every recipe builds the same server (NVFlare's ``FedAvg`` controller, or :class:`SampledFedAvg` with
``sample_fraction < 1``, with our weighted aggregator, a ``PTFileModelPersistor`` and the once-per-round
:class:`GlobalModelEvaluator`) and differs in the client executor and, for SCAFFOLD, FedProx and FedSSC, in what the
server sends beside the model (FedSiam-DA also changes how the aggregator combines the models).
The committed folders in ``jobs/`` are exported from these recipes (``python -m nvflare_moon.export_jobs``).

Every recipe is a PyTorch recipe to NVFlare's helpers (``framework``, and the persistor's id in ``_job.comp_ids``),
its executors answer ``validate`` and ``submit_model``, and its clients forward analytics events to the server, so::

    add_cross_site_evaluation(recipe)             # nvflare.recipe.utils: every site's row for every model
    add_experiment_tracking(recipe, "mlflow")     # the sites' figures, streamed through NVFlare
"""

from typing import Any, Dict, List, Optional

from nvflare.apis.analytix import ANALYTIC_EVENT_TYPE
from nvflare.apis.executor import Executor
from nvflare.apis.filter import Filter
from nvflare.app_common.widgets.convert_to_fed_event import ConvertToFedEvent
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.app_constant import AlgorithmConstants
from nvflare.app_common.utils.math_utils import parse_compare_criteria
from nvflare.app_common.workflows.fedavg import FedAvg
from nvflare.app_opt.pt.job_config.model import PTModel
from nvflare.job_config.api import FedJob
from nvflare.job_config.script_runner import FrameworkType
from nvflare.recipe.spec import Recipe

from .data import NUM_CLASSES
from .data.site_files import SITE_DATASETS
from .recipe_sites import add_client_apps, byoc_marker, check_per_site_config
from .executors.fedavg import site_data_settings
from .executors import (
    FedAvgExecutor,
    FedProxExecutor,
    FedSiamDAExecutor,
    FedSSCExecutor,
    MoonExecutor,
    ScaffoldExecutor,
)
from .core.sampling import sites_per_round
from .models import Network
from .encryption import WHY_NOT_ENCRYPTED, add_encrypted_server, add_encryption_filters, check_encryption
from .privacy import (
    SCAFFOLD_LIMITS,
    add_update_filters,
    check_privacy_filters,
    check_quantization,
    refuse_unsupported,
    sends_weight_diff,
    withholds_entries,
)
from .server import (
    DualAggregator,
    GlobalModelEvaluator,
    PrototypeSharingAggregator,
    RunOutcomeCheck,
    SampledFedAvg,
    ScaffoldAggregator,
    ShardCoverageCheck,
    SiteMetricsRecorder,
    TrainTaskSettings,
    WeightedFedAvgAggregator,
)
from .validation import check_number

# MOON's best μ per dataset in the MOON paper (Li, He and Song, CVPR 2021, Sec. 4.2: 5 on CIFAR-10, 1 on CIFAR-100 and
# Tiny-ImageNet; 10 with 50 or more sites, which the scalability jobs set). "synthetic" stands in for CIFAR-10.
# A site's own images get 1, the paper's value on every dataset but CIFAR-10.
MOON_MU = {"cifar10": 5.0, "cifar100": 1.0, "tinyimagenet": 1.0, "synthetic": 5.0, "image_folder": 1.0, "datalist": 1.0}
# What set_per_site_config may set for one site: where its data is and what it computes on, never the algorithm.
PER_SITE_KEYS = ("data_root", "device", "num_threads")


class FedAvgBaselineRecipe(Recipe):
    """FedAvg on the MOON network (the papers' baseline); other recipes change only the executor.

    Args:
        name: job name.
        min_clients: sites trained per round (all of them unless ``num_sites`` is larger).
        num_rounds: communication rounds.
        num_sites: sites the data is split over; defaults to ``min_clients``. Run the simulator with ``-n num_sites``.
        sample_fraction: partial participation: each round trains ``round(num_sites·sample_fraction)`` sites drawn
            from ``seed`` and the round (:class:`SampledFedAvg`); the paper uses 0.2 with 100 sites. It needs
            ``min_clients == num_sites``, so that every site is there for the draw. 1 trains every site.
        dataset, data_root, download, site_data, partition, beta, seed, local_epochs, batch_size, lr, momentum,
            weight_decay, device, num_threads: passed to the executor (see :class:`FedAvgExecutor`). With
            ``dataset="image_folder"`` or ``"datalist"`` every site trains on its own images (``site_data`` gives
            ``class_names`` and the image settings; see ``docs/hospital_data.md``), and ``data_root`` is each site's
            own path: leave it unset for the sites to choose, or give one per site with
            ``set_per_site_config(recipe, {"hospital-1": {"data_root": ...}})`` (keys: :data:`PER_SITE_KEYS`).
        server_evaluation: evaluate every round's global model on the server's copy of the test split (the papers'
            figure and the key metric). False where the server holds no data: the key metric is then the weighted
            mean of the sites' local accuracy of the global model. Default: True for a named dataset, False for the
            sites' own images (the server has none).
        stop_cond: NVFlare's early stopping, ``"<metric> >= <value>"`` on the round's metrics: ``test_accuracy``
            (server evaluation) or the weighted means of the sites' figures (``accuracy``, ``local_model_accuracy``,
            ``train_loss``, ...). With it, NVFlare's ``FedAvg`` saves ``FL_global_model.pt`` only when the metric
            improves. None: off.
        patience: stop after this many rounds without improvement of the ``stop_cond`` metric (needs ``stop_cond``).
        arch: ``"simple_cnn"`` or ``"resnet50"``.
        out_dim: size of the projection z.
        byoc: add an (empty of code) ``custom/`` folder so that the job passes NVFlare's default class allow-list;
            set False for sites that allow-list ``nvflare_moon.``.
        quantization: compress the weights on the wire with NVFlare's quantizer/dequantizer filters on both sides:
            ``"float16"``, ``"adaquant"`` (CPU), ``"blockwise8"``, ``"float4"``, ``"normfloat4"`` (NVFlare runs these
            three on a GPU, at the server and every site). None: off. Needs bitsandbytes (extra ``compression``).
        privacy_filters: NVFlare's ``PercentilePrivacy``, ``SVTPrivacy`` or ``ExcludeVars`` instances, applied in
            this order to the sites' train results (see :mod:`nvflare_moon.privacy`). Refused for SCAFFOLD.
        encryption: ``"ckks"``: aggregate under NVFlare's homomorphic encryption (see :mod:`nvflare_moon.encryption`),
            on a federation provisioned with its ``HEBuilder``; needs ``server_evaluation=False`` and none of
            ``quantization``, ``privacy_filters``, ``sample_fraction < 1``, ``stop_cond``. FedAvg, FedProx and MOON.
            None: off.
    """

    option_limits: Dict[str, str] = {}  # option -> why this method cannot take it (refused at build)

    def __init__(
        self,
        *,
        name: str = "fedavg_cifar10",
        min_clients: int = 10,
        num_rounds: int = 100,
        num_sites: Optional[int] = None,
        dataset: str = "cifar10",
        data_root: Optional[str] = None,
        download: bool = True,
        site_data: Optional[Dict[str, Any]] = None,
        arch: str = "simple_cnn",
        out_dim: int = 256,
        partition: str = "dirichlet",
        beta: float = 0.5,
        seed: int = 0,
        local_epochs: int = 10,
        batch_size: int = 64,
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 1e-5,
        device: str = "auto",
        num_threads: Optional[int] = None,
        sample_fraction: float = 1.0,
        server_evaluation: Optional[bool] = None,
        stop_cond: Optional[str] = None,
        patience: Optional[int] = None,
        byoc: bool = True,
        quantization: Optional[str] = None,
        privacy_filters: Optional[List[Filter]] = None,
        encryption: Optional[str] = None,
    ):
        check_quantization(quantization)
        privacy_filters = check_privacy_filters(privacy_filters)
        refuse_unsupported(
            type(self).__name__, {"privacy_filters": privacy_filters, "encryption": encryption}, self.option_limits
        )
        check_number("min_clients", min_clients, low=1, integer=True)
        check_number("num_rounds", num_rounds, low=1, integer=True)
        num_sites = min_clients if num_sites is None else num_sites
        check_number("num_sites", num_sites, low=min_clients, integer=True)
        sites_per_round(num_sites, sample_fraction)
        if sample_fraction < 1 and num_sites != min_clients:
            raise ValueError(
                f"sample_fraction={sample_fraction} samples from all sites: set min_clients={num_sites} (= num_sites)"
            )
        if dataset not in MOON_MU:
            raise ValueError(f"dataset must be one of {sorted(MOON_MU)}, got {dataset!r}")
        own_images = dataset in SITE_DATASETS
        if server_evaluation is None:
            server_evaluation = not own_images
        if server_evaluation and own_images:
            raise ValueError(
                f"server_evaluation=True needs a test split on the server, which dataset={dataset!r} (the sites' own "
                "images) does not have; set server_evaluation=False: the key metric is then the sites' local accuracy"
            )
        if stop_cond is not None:
            try:
                parse_compare_criteria(stop_cond)
            except (ValueError, AttributeError) as e:
                raise ValueError(
                    f"stop_cond must read '<metric> <op> <value>' (e.g. 'test_accuracy >= 0.7'), got {stop_cond!r}: {e}"
                ) from e
        if patience is not None:
            check_number("patience", patience, low=1, integer=True)
            if stop_cond is None:
                raise ValueError(f"patience={patience} counts rounds without improvement of stop_cond's metric; set it")
        check_encryption(
            encryption,
            quantization=quantization,
            privacy_filters=privacy_filters,
            server_evaluation=server_evaluation,
            sample_fraction=sample_fraction,
            stop_cond=stop_cond,
        )
        self.min_clients = min_clients
        self.num_rounds = num_rounds
        self.num_sites = num_sites
        self.dataset = dataset
        self.site_data = site_data
        self.data_root = data_root
        self.out_dim = out_dim
        self.seed = seed
        self.sample_fraction = sample_fraction
        self.server_evaluation = server_evaluation
        self.stop_cond = stop_cond
        self.patience = patience
        self.byoc = byoc
        self.quantization = quantization
        self.privacy_filters = privacy_filters
        self.encryption = encryption
        self.allow_partial_updates = withholds_entries(privacy_filters)  # for make_aggregator
        self.framework = FrameworkType.PYTORCH  # what NVFlare's recipe helpers (add_cross_site_evaluation) read

        image_settings = site_data_settings(dataset, site_data, seed)  # checked here, where the job is built
        if image_settings is not None:
            self.num_classes = len(image_settings.class_names)
            image_args = dict(in_channels=image_settings.channels, image_size=image_settings.image_size)
        else:
            self.num_classes = NUM_CLASSES[dataset]
            image_args = {}

        def network() -> Network:
            return Network(
                arch=arch,
                num_classes=self.num_classes,
                out_dim=out_dim,
                seed=seed,
                **image_args,
                **self.extra_network_args(),
            )

        data_args = dict(dataset=dataset, data_root=data_root, download=download)
        self._executor_args = dict(
            model=network(),
            **data_args,
            site_data=site_data,
            num_sites=num_sites,
            partition=partition,
            beta=beta,
            seed=seed,
            local_epochs=local_epochs,
            batch_size=batch_size,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            device=device,
            num_threads=num_threads,
            send_weight_diff=sends_weight_diff(privacy_filters),
            encrypted_aggregation=encryption is not None,
        )
        executor = self.make_executor(self._executor_args)  # every argument checked before anything is built
        self._tasks = [executor.train_task_name, executor.validate_task_name, executor.submit_model_task_name]
        self.per_site_config: Optional[Dict[str, Dict[str, Any]]] = None

        job = FedJob(name=name, min_clients=min_clients)
        job.set_app_packages(["nvflare_moon"])
        if encryption is not None:
            add_encrypted_server(job, network(), min_clients, num_rounds, self._tasks[0])
            job.to_server(SiteMetricsRecorder(model=network()), id="global_evaluator")
            if self.task_meta():
                job.to_server(TrainTaskSettings(client_settings=self.task_meta()), id="task_settings")
        else:
            job.comp_ids = job.to_server(PTModel(model=network()), id="persistor")  # the ids NVFlare's helpers read
            controller_args = dict(
                num_clients=min_clients,
                num_rounds=num_rounds,
                aggregator=self.make_aggregator(),
                stop_cond=stop_cond,
                patience=patience,
                **self.controller_args(),
            )
            if sample_fraction < 1:
                controller = SampledFedAvg(sample_fraction=sample_fraction, sample_seed=seed, **controller_args)
            else:
                controller = FedAvg(**controller_args)
            job.to_server(controller, id="controller")
            test_data = dict(data_args) if server_evaluation else dict(dataset=None)
            job.to_server(GlobalModelEvaluator(model=network(), **test_data, device=device), id="global_evaluator")
        if not own_images:  # the sites' own images are not shards of one split: nothing to cover
            job.to_server(ShardCoverageCheck(num_sites=num_sites), id="shard_coverage_check")
        job.to_server(RunOutcomeCheck(controller_id="controller"), id="run_outcome_check")
        if byoc:
            job.to_server(byoc_marker())
        super().__init__(job)

    def _apply_per_site_config(self, config: Dict[str, Dict]) -> None:
        """NVFlare's ``set_per_site_config``: one client app per named site, with that site's :data:`PER_SITE_KEYS`
        (its data path, device, threads); refused for any other key, so that nothing is silently ignored."""
        self.per_site_config = check_per_site_config(
            config, PER_SITE_KEYS, self.min_clients, type(self).__name__, self._site_executor
        )

    def _prepare_client_apps(self) -> None:
        """The clients' apps: one for every site, or one per site named by ``set_per_site_config``."""
        add_client_apps(self._job, self.per_site_config, self._site_components, [byoc_marker()] if self.byoc else [])

    def _site_executor(self, overrides: Dict[str, Any]) -> Executor:
        return self.make_executor({**self._executor_args, **overrides})

    def _site_components(self, overrides: Dict[str, Any]) -> list:
        return [
            (self._site_executor(overrides), dict(tasks=self._tasks)),
            (ConvertToFedEvent(events_to_convert=[ANALYTIC_EVENT_TYPE]), dict(id="event_to_fed")),
        ]

    def _ensure_client_apps_prepared(self) -> None:
        """The clients' filters (quantization, privacy, encryption) go in once their apps exist, so that
        ``set_per_site_config`` still works after construction (NVFlare closes it once a client filter is added)."""
        if self._client_apps_prepared:
            return
        super()._ensure_client_apps_prepared()
        add_update_filters(self, self.quantization, self.privacy_filters, self._tasks[0], self._tasks[1:])
        if self.encryption is not None:
            add_encryption_filters(self, *self._tasks)

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        return FedAvgExecutor(**common_args)

    def make_aggregator(self) -> ModelAggregator:
        return WeightedFedAvgAggregator(allow_partial_updates=self.allow_partial_updates)

    def controller_args(self) -> Dict[str, Any]:
        """Extra arguments of NVFlare's FedAvg controller."""
        return {}

    def task_meta(self) -> Dict[str, Any]:
        """Under encryption, what the server puts in the meta of every train task (NVFlare's ``ScatterAndGather``
        sends no method settings, where its FedAvg controller takes them as :meth:`controller_args`)."""
        return {}

    def extra_network_args(self) -> Dict[str, Any]:
        """Extra :class:`Network` arguments (FedSiam-DA's predictor), for the clients' and the server's model."""
        return {}


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
        **kwargs: every :class:`FedAvgBaselineRecipe` argument.
    """

    def __init__(
        self,
        *,
        name: str = "moon_cifar10",
        mu: Optional[float] = None,
        temperature: float = 0.5,
        num_previous_models: int = 1,
        representation_loss: str = "contrastive",
        mu_off_rounds: int = 0,
        mu_ramp_rounds: int = 0,
        feature_noise_std: float = 0.0,
        light_history: bool = False,
        **kwargs,
    ):
        self.mu = MOON_MU.get(kwargs.get("dataset", "cifar10"), 5.0) if mu is None else mu  # unknown: refused below
        self.temperature = temperature
        self.num_previous_models = num_previous_models
        self.representation_loss = representation_loss
        self.mu_off_rounds = mu_off_rounds
        self.mu_ramp_rounds = mu_ramp_rounds
        self.feature_noise_std = feature_noise_std
        self.light_history = light_history
        super().__init__(name=name, **kwargs)

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        return MoonExecutor(**common_args, **self.moon_args(), representation_loss=self.representation_loss)

    def moon_args(self) -> Dict[str, Any]:
        """The executor arguments of MOON's term, shared with FedSSC."""
        return dict(
            mu=self.mu,
            temperature=self.temperature,
            num_previous_models=self.num_previous_models,
            mu_off_rounds=self.mu_off_rounds,
            mu_ramp_rounds=self.mu_ramp_rounds,
            feature_noise_std=self.feature_noise_std,
            light_history=self.light_history,
        )


class FedProxRecipe(FedAvgBaselineRecipe):
    """FedProx (Li et al., MLSys 2020): FedAvg plus the proximal term (μ/2)·‖w − w_glob‖².

    The FedAvg controller sends μ with every model (NVFlare's ``fedprox_mu`` convention), or under encryption
    :class:`TrainTaskSettings` beside NVFlare's ``ScatterAndGather``; :class:`FedProxExecutor` reads it.

    Args:
        mu: μ > 0 (the MOON paper's best: 0.01 for CIFAR-10, 0.001 for CIFAR-100 and Tiny-ImageNet).
        **kwargs: every :class:`FedAvgBaselineRecipe` argument.
    """

    def __init__(self, *, name: str = "fedprox_cifar10", mu: float = 0.01, **kwargs):
        check_number("mu", mu, low=0, low_inclusive=False)
        self.mu = mu
        super().__init__(name=name, **kwargs)

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        return FedProxExecutor(**common_args)

    def controller_args(self) -> Dict[str, Any]:
        return {"fedprox_mu": self.mu}

    def task_meta(self) -> Dict[str, Any]:
        return {AlgorithmConstants.FEDPROX_MU: self.mu}


class ScaffoldRecipe(FedAvgBaselineRecipe):
    """SCAFFOLD (Karimireddy et al., ICML 2020, option II) with the sites' controls persisted between rounds.

    The server is the FedAvg controller with :class:`ScaffoldAggregator` (weighted FedAvg of the weights, and
    ``c ← c + Σ Δc_i / N``); the clients run :class:`ScaffoldExecutor`. Takes every :class:`FedAvgBaselineRecipe`
    argument but ``privacy_filters``.
    """

    option_limits = {**SCAFFOLD_LIMITS, "encryption": WHY_NOT_ENCRYPTED["scaffold"]}

    def __init__(self, *, name: str = "scaffold_cifar10", **kwargs):
        super().__init__(name=name, **kwargs)

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        return ScaffoldExecutor(**common_args)

    def make_aggregator(self) -> ModelAggregator:
        return ScaffoldAggregator(num_sites=self.num_sites)


class FedSSCRecipe(MoonRecipe):
    """FedSSC (shared supervised-contrastive FL) with the paper's defaults: MOON plus class prototypes that the server
    draws from the sites (:class:`PrototypeSharingAggregator`) and sends back with the next global model.

    Args:
        mu_moon: weight of MOON's term; None (default): MOON's best μ for the dataset, as the paper says
            (:data:`MOON_MU`: 5 for CIFAR-10, 1 for CIFAR-100 and Tiny-ImageNet).
        mu_glob: weight of the prototype term (paper: 1).
        temperature: τ of both terms (paper: 0.5).
        num_previous_models: as for MOON (paper: 1).
        min_class_count: the server draws a class's prototype only from sites with at least this many of its samples
            in their last local epoch, and sites withhold the others (paper: 10).
        prototype_clip_norm: clip each uploaded prototype to this L2 norm (None: off).
        prototype_noise_std: σ of the Gaussian noise added to uploaded prototypes (0: off).
        exclude_own_prototype: a site never gets its own class mean back as a prototype (default False; see
            :class:`PrototypeSharingAggregator`).
        **kwargs: every :class:`MoonRecipe` argument but ``mu`` and ``representation_loss`` (the cold start schedules
            μ_moon) and every :class:`FedAvgBaselineRecipe` argument; ``seed`` also seeds the server's draw.
    """

    option_limits = {"encryption": WHY_NOT_ENCRYPTED["fedssc"]}

    def __init__(
        self,
        *,
        name: str = "fedssc_cifar10",
        mu_moon: Optional[float] = None,
        mu_glob: float = 1.0,
        temperature: float = 0.5,
        num_previous_models: int = 1,
        min_class_count: int = 10,
        prototype_clip_norm: Optional[float] = None,
        prototype_noise_std: float = 0.0,
        exclude_own_prototype: bool = False,
        **kwargs,
    ):
        self.mu_glob = mu_glob
        self.min_class_count = min_class_count
        self.prototype_clip_norm = prototype_clip_norm
        self.prototype_noise_std = prototype_noise_std
        self.exclude_own_prototype = exclude_own_prototype
        super().__init__(
            name=name, mu=mu_moon, temperature=temperature, num_previous_models=num_previous_models, **kwargs
        )
        self.mu_moon = self.mu  # as MoonRecipe resolved it

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        return FedSSCExecutor(
            **common_args,
            **self.moon_args(),
            mu_glob=self.mu_glob,
            min_class_count=self.min_class_count,
            prototype_clip_norm=self.prototype_clip_norm,
            prototype_noise_std=self.prototype_noise_std,
        )

    def make_aggregator(self) -> ModelAggregator:
        return PrototypeSharingAggregator(
            num_classes=self.num_classes,
            prototype_dim=self.out_dim,
            min_class_count=self.min_class_count,
            seed=self.seed,
            exclude_own_prototype=self.exclude_own_prototype,
            allow_partial_updates=self.allow_partial_updates,
        )


class FedSiamDARecipe(FedAvgBaselineRecipe):
    """FedSiam-DA: Siamese local training (:class:`FedSiamDAExecutor`) on the network with a SimSiam predictor, and
    dual aggregation on the server (:class:`DualAggregator`).

    Args:
        mu: weight μ of the Siamese and history terms (not published; default 0.01, the best of the sweep in
            docs/fedssc_fedsiam.md: 1 does not learn, 0.1 and 0.01 are level with FedAvg after 10 quick rounds).
        history: ``"epoch"`` (default: the previous local epoch's model) or ``"round"`` (the previous round's upload).
        history_branch: what the history term compares with the history model's z_h: ``"projection"`` (default, z_l)
            or ``"predictor"`` (p_l).
        predictor_hidden_dim: the predictor's hidden size (256→64→256 by default).
        cosine_floor: ε that a non-positive cosine is clamped to in the dual aggregation.
        cosine_vector: vec(w) of the dual aggregation's cosine: ``"state"`` (default, BatchNorm running statistics
            included) or ``"parameters"`` (without them).
        **kwargs: every :class:`FedAvgBaselineRecipe` argument.
    """

    option_limits = {"encryption": WHY_NOT_ENCRYPTED["fedsiam_da"]}

    def __init__(
        self,
        *,
        name: str = "fedsiam_da_cifar10",
        mu: float = 0.01,
        history: str = "epoch",
        history_branch: str = "projection",
        predictor_hidden_dim: int = 64,
        cosine_floor: float = 1e-6,
        cosine_vector: str = "state",
        **kwargs,
    ):
        self.mu = mu
        self.history = history
        self.history_branch = history_branch
        self.predictor_hidden_dim = predictor_hidden_dim
        self.cosine_floor = cosine_floor
        self.cosine_vector = cosine_vector
        super().__init__(name=name, **kwargs)

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        return FedSiamDAExecutor(**common_args, mu=self.mu, history=self.history, history_branch=self.history_branch)

    def make_aggregator(self) -> ModelAggregator:
        return DualAggregator(
            cosine_floor=self.cosine_floor,
            cosine_vector=self.cosine_vector,
            allow_partial_updates=self.allow_partial_updates,
        )

    def extra_network_args(self) -> Dict[str, Any]:
        return {"predictor_hidden_dim": self.predictor_hidden_dim}
