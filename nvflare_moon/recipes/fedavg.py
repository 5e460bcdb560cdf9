"""FedAvg on the MOON network, the recipe every method's executor recipe builds on (see the package's docstring)."""

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Tuple

from nvflare.apis.analytix import ANALYTIC_EVENT_TYPE
from nvflare.apis.executor import Executor
from nvflare.apis.filter import Filter
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.utils.math_utils import parse_compare_criteria
from nvflare.app_common.widgets.convert_to_fed_event import ConvertToFedEvent
from nvflare.app_common.workflows.fedavg import FedAvg
from nvflare.app_opt.pt.job_config.model import PTModel
from nvflare.job_config.api import FedJob
from nvflare.job_config.script_runner import FrameworkType

from ..core.dp import DPSettings
from ..core.sampling import sites_per_round
from ..core.specs import DataSpec, TrainingSpec
from ..core.validation import check_choice, check_number
from ..data import DATASETS, NUM_CLASSES
from ..data.site_data import site_data_settings
from ..data.site_files import SITE_DATASETS
from ..executors import FedAvgExecutor
from ..filters.encryption import add_encrypted_server, add_encryption_filters, check_encryption
from ..filters.privacy import (
    add_update_filters,
    check_privacy_filters,
    check_quantization,
    refuse_unsupported,
    sends_weight_diff,
    withholds_entries,
)
from ..models import Network
from ..server import (
    GlobalModelEvaluator,
    RunOutcomeCheck,
    SampledFedAvg,
    ShardCoverageCheck,
    SiteMetricsRecorder,
    TrainTaskSettings,
    WeightedFedAvgAggregator,
)
from ..server.evaluator import check_key_metric
from ..sim.fixes import COMPONENT_ID, SimulatorFixes
from .sites import (
    PluginRecipe,
    add_client_apps,
    byoc_marker,
    check_per_site_config,
    site_path_from_data_root,
)

# What set_per_site_config may set for one site: where its data is and what it computes on, never the algorithm.
PER_SITE_KEYS = ("site_path", "data_root", "device", "num_threads")


@dataclass(eq=False, kw_only=True)
class FedAvgBaselineRecipe(PluginRecipe):
    """FedAvg on the MOON network (the papers' baseline); other recipes change only the executor.

    Args:
        name: job name.
        min_clients: sites trained per round (all of them unless ``num_sites`` is larger).
        num_rounds: communication rounds.
        num_sites: sites the data is split over; defaults to ``min_clients``. Run the simulator with ``-n num_sites``.
        sample_fraction: partial participation: each round trains ``round(num_sites·sample_fraction)`` sites drawn
            from ``seed`` and the round (:class:`SampledFedAvg`); the paper uses 0.2 with 100 sites. It needs
            ``min_clients == num_sites``, so that every site is there for the draw. 1 trains every site.
        dataset, data_root, site_path, download, site_data, partition, beta, seed, local_epochs, batch_size, lr,
            momentum, weight_decay, device, num_threads, amp: passed to the executor (:class:`DataSpec`,
            :class:`TrainingSpec`). With ``dataset="image_folder"`` or ``"datalist"`` every site trains on its own
            images (``site_data`` gives ``class_names`` and the image settings; see ``docs/hospital_data.md``), found
            at the site's ``site_path``: leave it unset for the sites to choose, or give one per site with
            ``set_per_site_config(recipe, {"hospital-1": {"site_path": ...}})`` (keys: :data:`PER_SITE_KEYS`).
        server_evaluation: evaluate every round's global model on the server's copy of the test split (the papers'
            figure and the key metric). False where the server holds no data: the key metric is then the weighted
            mean of the sites' local accuracy of the global model. Default: True for a named dataset, False for the
            sites' own images (the server has none).
        stop_cond: NVFlare's early stopping, ``"<metric> >= <value>"`` on the round's metrics: ``test_accuracy``
            (server evaluation) or the weighted means of the sites' metrics (``accuracy``, ``local_model_accuracy``,
            ``train_loss``, ...). With it, NVFlare's ``FedAvg`` saves ``FL_global_model.pt`` only when the metric
            improves. None: off.
        patience: stop after this many rounds without improvement of the ``stop_cond`` metric (needs ``stop_cond``).
        arch: a key of :data:`~nvflare_moon.models.BACKBONES`: ``"simple_cnn"``, ``"resnet50"`` (the papers' CIFAR
            form), or torchvision's ``"resnet18"``, ``"resnet34"``, ``"resnet50_imagenet"``, ``"densenet121"``,
            ``"efficientnet_b0"`` (see :class:`~nvflare_moon.models.Network`).
        initial_weights: the absolute path of a weights file (a torchvision state dict of ``arch``, or a whole
            network's) that the server's initial model starts from, read where the recipe is built and again by the
            server when the job starts; the sites receive the model and need no file. None: seeded random weights.
        out_dim: size of the projection z.
        byoc: add an (empty of code) ``custom/`` folder so that the job passes NVFlare's default class allow-list;
            set False for sites that allow-list ``nvflare_moon.``.
        quantization: compress the weights on the wire with NVFlare's quantizer/dequantizer filters on both sides:
            ``"float16"``, ``"adaquant"`` (CPU), ``"blockwise8"``, ``"float4"``, ``"normfloat4"`` (NVFlare runs these
            three on a GPU, at the server and every site). None: off. Needs bitsandbytes (extra ``compression``).
        privacy_filters: NVFlare's ``PercentilePrivacy``, ``SVTPrivacy`` or ``ExcludeVars`` instances, applied in
            this order to the sites' train results (see :mod:`nvflare_moon.filters.privacy`). Refused for SCAFFOLD.
        encryption: ``"ckks"``: aggregate under NVFlare's homomorphic encryption (see :mod:`nvflare_moon.filters.encryption`),
            on a federation provisioned with its ``HEBuilder``; needs ``server_evaluation=False`` and none of
            ``quantization``, ``privacy_filters``, ``sample_fraction < 1``, ``stop_cond``. FedAvg, FedProx and MOON.
            None: off.
        clinical_metrics: every site's local metrics (and the server's evaluation, where it has test data) also hold
            AUROC, sensitivity, specificity, balanced accuracy and F1 (:mod:`nvflare_moon.core.clinical_metrics`),
            per site and weighted across sites, in the log, TensorBoard and ``global_metrics.jsonl``; ``stop_cond``
            may then read them (``"auroc >= 0.9"``).
        key_metric, key_metric_mode: the figure that picks ``best_FL_global_model.pt`` (``"auroc"``: the sites'
            weighted mean AUROC of the global model, or the server's where it evaluates) and whether higher is better
            (see :class:`GlobalModelEvaluator`). None: accuracy, higher is better.
        dp_noise_multiplier, dp_target_epsilon, dp_delta, dp_max_grad_norm: DP-SGD in every site's local training
            (see :class:`FedAvgExecutor` and ``docs/differential_privacy.md``): one of σ (``dp_noise_multiplier``) or
            the ε each site may spend in the job (``dp_target_epsilon``), δ, and the clipping norm C. FedAvg,
            FedProx, MOON and SCAFFOLD, on a network without BatchNorm (``arch="simple_cnn"``). None: off.
    """

    option_limits: ClassVar[Dict[str, str]] = {}  # option -> why this method cannot take it (refused at build)

    name: str = "fedavg_cifar10"
    min_clients: int = 10
    num_rounds: int = 100
    num_sites: Optional[int] = None
    dataset: str = DataSpec.dataset
    data_root: Optional[str] = DataSpec.data_root
    site_path: Optional[str] = DataSpec.site_path
    download: bool = DataSpec.download
    site_data: Optional[Dict[str, Any]] = DataSpec.site_data
    arch: str = "simple_cnn"
    initial_weights: Optional[str] = None
    out_dim: int = 256
    partition: str = DataSpec.partition
    beta: float = DataSpec.beta
    seed: int = DataSpec.seed
    local_epochs: int = TrainingSpec.local_epochs
    batch_size: int = TrainingSpec.batch_size
    lr: float = TrainingSpec.lr
    momentum: float = TrainingSpec.momentum
    weight_decay: float = TrainingSpec.weight_decay
    device: str = TrainingSpec.device
    num_threads: Optional[int] = TrainingSpec.num_threads
    amp: bool = TrainingSpec.amp
    dp_noise_multiplier: Optional[float] = None
    dp_target_epsilon: Optional[float] = None
    dp_delta: float = DPSettings.delta
    dp_max_grad_norm: float = DPSettings.max_grad_norm
    sample_fraction: float = 1.0
    server_evaluation: Optional[bool] = None
    stop_cond: Optional[str] = None
    patience: Optional[int] = None
    byoc: bool = True
    quantization: Optional[str] = None
    privacy_filters: Optional[List[Filter]] = None
    encryption: Optional[str] = None
    clinical_metrics: bool = TrainingSpec.clinical_metrics
    key_metric: Optional[str] = None
    key_metric_mode: Optional[str] = None

    def __post_init__(self):
        """Check the options, build the specs every site's executor takes (once, here where the job is built) and
        the job's server side; the clients' apps are added when the job is built (:meth:`_prepare_client_apps`)."""
        if self.num_sites is None:
            self.num_sites = self.min_clients
        if self.server_evaluation is None:
            self.server_evaluation = self.dataset not in SITE_DATASETS  # the sites' own images: none on the server
        self.privacy_filters = check_job_options(self)
        self.allow_partial_updates = withholds_entries(self.privacy_filters)  # for make_aggregator
        self.framework = FrameworkType.PYTORCH  # what NVFlare's recipe helpers (add_cross_site_evaluation) read
        self._network_args = self._network_args_for(self.dataset, self.site_data, self.seed)
        self.data_spec, self.training_spec = self._specs()
        self._executor_args = dict(
            model=self.network(),
            data=self.data_spec,
            training=self.training_spec,
            dp=DPSettings.from_arguments(
                self.dp_noise_multiplier, self.dp_target_epsilon, self.dp_delta, self.dp_max_grad_norm
            ),
            send_weight_diff=sends_weight_diff(self.privacy_filters),
            encrypted_aggregation=self.encryption is not None,
        )
        executor = self.make_executor(self._executor_args)  # the method's own arguments checked before the job
        self._tasks = [executor.train_task_name, executor.validate_task_name, executor.submit_model_task_name]
        self.per_site_config: Optional[Dict[str, Dict[str, Any]]] = None
        super().__init__(self._server_job())

    # ---- the steps of the constructor ---------------------------------------------------------------------------

    def _specs(self) -> Tuple[DataSpec, TrainingSpec]:
        """Where every site's data comes from and how it trains, checked."""
        data = DataSpec(
            dataset=self.dataset,
            data_root=self.data_root,
            site_path=self.site_path,
            download=self.download,
            site_data=self.site_data,
            num_sites=self.num_sites,
            partition=self.partition,
            beta=self.beta,
            seed=self.seed,
        )
        training = TrainingSpec(
            local_epochs=self.local_epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            device=self.device,
            num_threads=self.num_threads,
            amp=self.amp,
            clinical_metrics=self.clinical_metrics,
        )
        return data, training

    def _network_args_for(self, dataset: str, site_data: Optional[Dict[str, Any]], seed: int) -> Dict[str, Any]:
        """The :class:`Network` arguments of this job's model, for the clients and the server alike."""
        image_settings = site_data_settings(dataset, site_data, seed)  # checked here, where the job is built
        if image_settings is None:
            self.num_classes = NUM_CLASSES[dataset]
            image_args = {}
        else:
            self.num_classes = len(image_settings.class_names)
            image_args = dict(in_channels=image_settings.channels, image_size=image_settings.image_size)
        return dict(num_classes=self.num_classes, seed=seed, **image_args, **self.extra_network_args())

    def network(self, initial_weights: Optional[str] = None) -> Network:
        """A new copy of the job's network (the same initial weights every time: they come from its seed, or from
        ``initial_weights``, which only the server's initial model is given)."""
        return Network(arch=self.arch, out_dim=self.out_dim, initial_weights=initial_weights, **self._network_args)

    def _server_job(self) -> FedJob:
        """The job with its server: the controller and its aggregator, the persistor, the global evaluation and the
        run checks (the clients' apps are added when the job is built, see :meth:`_prepare_client_apps`)."""
        job = FedJob(name=self.name, min_clients=self.min_clients)
        job.set_app_packages(["nvflare_moon"])
        job.to_server(SimulatorFixes(), id=COMPONENT_ID)
        if self.encryption is not None:
            add_encrypted_server(
                job, self.network(self.initial_weights), self.min_clients, self.num_rounds, self._tasks[0]
            )
            job.to_server(SiteMetricsRecorder(model=self.network()), id="global_evaluator")
            if self.task_meta():
                job.to_server(TrainTaskSettings(client_settings=self.task_meta()), id="task_settings")
        else:
            job.comp_ids = job.to_server(
                PTModel(model=self.network(self.initial_weights)), id="persistor"
            )  # the ids NVFlare's helpers read
            job.to_server(self._controller(), id="controller")
            test_data = dict(dataset=self.dataset, data_root=self.data_root, download=self.download)
            evaluator = GlobalModelEvaluator(
                model=self.network(),
                **(test_data if self.server_evaluation else dict(dataset=None)),
                device=self.device,
                key_metric=self.key_metric,
                key_metric_mode=self.key_metric_mode,
                clinical_metrics=self.clinical_metrics,
            )
            job.to_server(evaluator, id="global_evaluator")
        if self.dataset not in SITE_DATASETS:  # the sites' own images are not shards of one split: nothing to cover
            job.to_server(ShardCoverageCheck(num_sites=self.num_sites), id="shard_coverage_check")
        job.to_server(RunOutcomeCheck(controller_id="controller"), id="run_outcome_check")
        if self.byoc:
            job.to_server(byoc_marker())
        return job

    def _controller(self) -> FedAvg:
        """NVFlare's FedAvg controller with our aggregator, or :class:`SampledFedAvg` under partial participation."""
        controller_args = dict(
            num_clients=self.min_clients,
            num_rounds=self.num_rounds,
            aggregator=self.make_aggregator(),
            stop_cond=self.stop_cond,
            patience=self.patience,
            **self.controller_args(),
        )
        if self.sample_fraction < 1:
            return SampledFedAvg(sample_fraction=self.sample_fraction, sample_seed=self.seed, **controller_args)
        return FedAvg(**controller_args)

    def _apply_per_site_config(self, config: Dict[str, Dict]) -> None:
        """NVFlare's ``set_per_site_config``: one client app per named site, with that site's :data:`PER_SITE_KEYS`
        (its data path, device, threads); refused for any other key, so that nothing is silently ignored."""
        if self.data_spec.own_images:
            config = site_path_from_data_root(config, type(self).__name__)
        self.per_site_config = check_per_site_config(
            config, PER_SITE_KEYS, self.min_clients, type(self).__name__, self._site_executor
        )

    def _prepare_client_apps(self) -> None:
        """The clients' apps: one for every site, or one per site named by ``set_per_site_config``."""
        add_client_apps(self._job, self.per_site_config, self._site_components, [byoc_marker()] if self.byoc else [])

    def _site_executor(self, overrides: Dict[str, Any]) -> Executor:
        """The executor of a site named by ``set_per_site_config``, with its :data:`PER_SITE_KEYS` in the specs."""
        return self.make_executor(
            dict(
                self._executor_args,
                data=dataclasses.replace(self.data_spec, **_fields_of(DataSpec, overrides)),
                training=dataclasses.replace(self.training_spec, **_fields_of(TrainingSpec, overrides)),
            )
        )

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


def _fields_of(spec: type, values: Dict[str, Any]) -> Dict[str, Any]:
    """The entries of ``values`` that are fields of the dataclass ``spec``."""
    names = {field.name for field in dataclasses.fields(spec)}
    return {name: value for name, value in values.items() if name in names}


def check_job_options(recipe: FedAvgBaselineRecipe) -> List[Filter]:
    """Raise ValueError, naming the argument, for a job option this job cannot run with (the executor's arguments
    are checked by their specs); the checked privacy filters."""
    check_quantization(recipe.quantization)
    privacy_filters = check_privacy_filters(recipe.privacy_filters)
    options = {"privacy_filters": privacy_filters, "encryption": recipe.encryption}
    refuse_unsupported(type(recipe).__name__, options, recipe.option_limits)
    check_number("min_clients", recipe.min_clients, low=1, integer=True)
    check_number("num_rounds", recipe.num_rounds, low=1, integer=True)
    check_number("num_sites", recipe.num_sites, low=recipe.min_clients, integer=True)
    sites_per_round(recipe.num_sites, recipe.sample_fraction)
    if recipe.sample_fraction < 1 and recipe.num_sites != recipe.min_clients:
        raise ValueError(
            f"sample_fraction={recipe.sample_fraction} samples from all sites: set min_clients={recipe.num_sites} "
            "(= num_sites)"
        )
    check_choice("dataset", recipe.dataset, DATASETS + SITE_DATASETS)
    if recipe.server_evaluation and recipe.dataset in SITE_DATASETS:
        raise ValueError(
            f"server_evaluation=True needs a test split on the server, which dataset={recipe.dataset!r} (the sites' "
            "own images) does not have; set server_evaluation=False: the key metric is then the sites' local "
            "accuracy"
        )
    check_stop_condition(recipe.stop_cond, recipe.patience)
    check_initial_weights_path(recipe.initial_weights)
    check_key_metric(recipe.key_metric, recipe.key_metric_mode, recipe.clinical_metrics)
    check_encryption(
        recipe.encryption,
        quantization=recipe.quantization,
        privacy_filters=privacy_filters,
        server_evaluation=recipe.server_evaluation,
        sample_fraction=recipe.sample_fraction,
        stop_cond=recipe.stop_cond,
    )
    return privacy_filters


def check_initial_weights_path(initial_weights: Optional[str]) -> None:
    """Raise ValueError unless ``initial_weights`` is None or an absolute path: the server reads the file again when
    the job starts, in a working folder of its own (the file's content is checked where the network is built)."""
    if initial_weights is not None and not (isinstance(initial_weights, str) and os.path.isabs(initial_weights)):
        raise ValueError(
            f"initial_weights must be the absolute path of a weights file, which the server reads when the job "
            f"starts, got {initial_weights!r}"
        )


def check_stop_condition(stop_cond: Optional[str], patience: Optional[int]) -> None:
    """Raise ValueError unless ``stop_cond`` is None or NVFlare's ``"<metric> <op> <value>"``, and ``patience`` None
    or a positive count that comes with a ``stop_cond``."""
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
