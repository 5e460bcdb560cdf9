"""FedAvg's client, and the NVFlare wiring every method shares.

:class:`FedAvgExecutor` receives the global model, trains it locally with the papers' optimiser on the site's data and
returns the weights with the number of training samples. A method is the round object it holds
(:mod:`nvflare_moon.core.rounds`: the objective, the hooks during training, the state kept between rounds and what
is sent beside the weights): a method's executor takes its settings whole (``settings=``) and overrides
:meth:`make_round` alone. The training loop lives in :mod:`nvflare_moon.core.training`; the executor's other parts are helpers beside
it: the site's data and local evaluation (:mod:`.local_data`), its state stores (:mod:`.site_states`), the weights'
way to and from the server (:mod:`.weight_exchange`) and the cross-site answers (:mod:`.cross_site`).

Every executor also evaluates on the site's own test data and answers NVFlare's cross-site evaluation tasks:

- ``train``: the reply's metrics carry ``accuracy``/``loss`` of the *received* global model on the local test data,
  measured before training (NVFlare's convention: the figure its model selectors and ``key_metric`` read), and
  ``local_model_accuracy``/``local_model_loss`` of the site's trained model (the personalised figure);
- ``validate``: the received model's ``accuracy``/``loss`` on the local test data;
- ``submit_model``: the site's last trained local model, read from the job-scoped state written by ``train``, so it
  is there when the process has been restarted since (the simulator with ``-t < -n``).
"""

import time
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
from nvflare.apis.analytix import AnalyticsDataType
from nvflare.apis.event_type import EventType
from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import ReservedHeaderKey, Shareable, make_reply
from nvflare.apis.signal import Signal
from nvflare.apis.utils.analytix_utils import create_analytic_dxo, send_analytic_dxo
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.utils.fl_model_utils import FLModelUtils
from torch.utils.data import Dataset

from ..core.dp import DPSettings, check_dp_training
from ..core.dp_training import DPSGD, LEDGER_STATE, SitePrivacy, without_training_figures
from ..core.job_state import ContinuedStateStore
from ..core.rounds import FedAvgRound
from ..core.runtime import resolve_device, resolve_num_threads
from ..core.specs import DataSpec, TrainingSpec, executor_specs
from ..core.state import SiteStateStore
from ..core.training import TrainResult, sgd, train_local
from ..core.validation import JOB_REFUSED_HEADER, check_module
from ..core.weights import load_numpy_state
from ..data.site_data import site_data_settings
from ..models import check_num_classes
from . import weight_exchange
from .cross_site import format_metrics, submit_model_reply, validate_reply
from .local_data import LocalEvaluation, check_one_batch, open_site_source, round_batches
from .site_identity import check_site_identity
from .site_states import SiteStates
from .weight_exchange import WeightExchange

LOCAL_MODEL_STATE = "local_model"  # the state record that keeps the site's last trained model for ``submit_model``


class FedAvgExecutor(Executor):
    """Local training for FedAvg: CE on the site's shard, SGD with a new optimizer every round.

    Args:
        model: the network, an ``nn.Module`` returning ``(h, z, logits)``: :class:`~nvflare_moon.models.Network`, or
            any backbone wrapped in :class:`~nvflare_moon.models.ProjectionModel`.
        data: where the site's data comes from, a :class:`~nvflare_moon.core.specs.DataSpec` (its ``dataset`` may
            also be a map-style torch ``Dataset`` of ``(image tensor, label)``, this site's own data, used whole).
            None: ``DataSpec()``, the paper's CIFAR-10 split.
        training: how the site trains and evaluates, a :class:`~nvflare_moon.core.specs.TrainingSpec`. None: the
            paper's settings, ``TrainingSpec()``.
        dp: DP-SGD in local training, a :class:`~nvflare_moon.core.dp.DPSettings` (``docs/differential_privacy.md``);
            the site reports the ε it has spent (``dp_epsilon``) every round. None (default): off.
        val_dataset: this site's own test data, a map-style ``Dataset`` of ``(image tensor, label)``. Default: with a
            dataset name, the site's class-proportional share of the test split
            (:func:`~nvflare_moon.data.site_test_arrays`); with its own images, its test split or ``val_fraction``
            of its training images; with a ``Dataset``, none (no local metrics, a warning).
        train_task_name, validate_task_name, submit_model_task_name: the tasks this executor answers (NVFlare's
            names by default, which its ``CrossSiteModelEval`` sends).
        resume_from_job_id, resume_state_dir: the failed job this job continues
            (:mod:`nvflare_moon.ops.continuation`), whose state this site takes where it has none of its own yet
            (:class:`~nvflare_moon.executors.site_states.SiteStates`).
        send_weight_diff, encrypted_aggregation: send w_local − w_global instead of the weights; the job runs
            NVFlare's HE filters (:class:`~nvflare_moon.executors.weight_exchange.WeightExchange`).
        **flat_fields: the specs' fields by their old flat names (``lr=``, ``beta=``, ``dp_target_epsilon=``, ...),
            accepted until the next release with a DeprecationWarning.
    """

    dp_refusal: Optional[str] = None  # why the method cannot train with DP-SGD; None: it can

    def __init__(
        self,
        model: nn.Module,
        data: Optional[DataSpec] = None,
        training: Optional[TrainingSpec] = None,
        dp: Optional[DPSettings] = None,
        val_dataset: Optional[Dataset] = None,
        train_task_name: str = AppConstants.TASK_TRAIN,
        validate_task_name: str = AppConstants.TASK_VALIDATION,
        submit_model_task_name: str = AppConstants.TASK_SUBMIT_MODEL,
        resume_from_job_id: Optional[str] = None,
        resume_state_dir: Optional[str] = None,
        send_weight_diff: bool = False,
        encrypted_aggregation: bool = False,
        **flat_fields: Any,
    ):
        super().__init__()
        check_module("model", model)
        if val_dataset is not None and not isinstance(val_dataset, Dataset):
            raise ValueError(f"val_dataset must be a torch Dataset or None, got {type(val_dataset).__name__}")
        self.model, self.val_dataset = model, val_dataset
        self.data, self.training, self.dp = executor_specs(type(self).__name__, data, training, dp, flat_fields)
        self.train_task_name = train_task_name
        self.validate_task_name = validate_task_name
        self.submit_model_task_name = submit_model_task_name
        self.resume_from_job_id, self.resume_state_dir = resume_from_job_id, resume_state_dir
        self.send_weight_diff, self.encrypted_aggregation = send_weight_diff, encrypted_aggregation
        self._site_data_settings = site_data_settings(self.data.dataset, self.data.site_data, self.data.seed)
        self._states = SiteStates(resume_from_job_id, resume_state_dir)
        self._exchange = WeightExchange(send_weight_diff, encrypted_aggregation)
        if self.dp is not None:
            check_dp_training(model, self.training.amp, type(self).__name__, self.dp_refusal)
        self._net: Optional[nn.Module] = None
        self._setup_error: Optional[str] = None
        self._source = None  # the site's data source (nvflare_moon.data.sources), opened at the job's start
        self._num_samples = 0
        self._torch_device = torch.device("cpu")
        self._local_evaluation: Optional[LocalEvaluation] = None
        self._round = None  # the method's round object (nvflare_moon.core.rounds), made anew every round
        self._upload_meta: Dict[str, Any] = {}

    # ---- set-up -----------------------------------------------------------------------------------------------

    def handle_event(self, event_type: str, fl_ctx: FLContext):
        if event_type == EventType.START_RUN:
            try:
                self._setup(fl_ctx)
            except Exception as e:
                # Kept to answer the first task with: a failed reply makes NVFlare's controller end the job (the
                # simulator exits 2), where a panic on the site leaves the server waiting for its answer.
                self._setup_error = f"{fl_ctx.get_identity_name()} cannot start training: {e}"
                self.log_error(fl_ctx, self._setup_error)

    def _setup(self, fl_ctx: FLContext) -> None:
        check_site_identity(fl_ctx)
        if self.encrypted_aggregation:
            weight_exchange.check_he_context(fl_ctx)
        site = fl_ctx.get_identity_name()
        torch.set_num_threads(resolve_num_threads(self.training.num_threads))
        self._torch_device = resolve_device(self.training.device)
        own_images = self.data.own_images  # only they resolve a path in the site's workspace
        workspace_root = fl_ctx.get_engine().get_workspace().get_root_dir() if own_images else None
        self._source = open_site_source(
            self.data, self._site_data_settings, self.val_dataset, site, workspace_root, self._torch_device
        )
        if self._source.num_classes is not None:
            check_num_classes(self.model, self._source.num_classes, self.data.dataset)
        self._num_samples = self._source.num_samples
        check_one_batch(site, self._num_samples, self.training.batch_size, self.data)
        self._local_evaluation = LocalEvaluation(
            self._source, self.val_dataset, self._torch_device, self.training.clinical_metrics
        )
        self._net = self.model.to(self._torch_device)
        self.log_info(
            fl_ctx,
            f"{site}: {self._num_samples} training samples ({self._source.description}), "
            f"{self._num_samples // self.training.batch_size} batches/epoch, device {self._torch_device}, "
            f"{torch.get_num_threads()} threads",
        )

    def evaluate_locally(self, model: nn.Module, fl_ctx: FLContext) -> Dict[str, float]:
        """``accuracy`` and ``loss`` of ``model`` on the site's local test data, and the clinical figures where asked
        for; empty when the site has none."""
        site, evaluation = fl_ctx.get_identity_name(), self._local_evaluation
        warn = evaluation.missing is None
        figures, confusion = evaluation.evaluate(model)
        if warn and evaluation.missing is not None:
            self.log_warning(
                fl_ctx, f"{site} has no local test data ({evaluation.missing}); its local metrics are not reported"
            )
        if confusion is not None:
            self.log_info(fl_ctx, f"{site}: confusion matrix (rows: true class) {confusion}")
        return figures

    # ---- the tasks --------------------------------------------------------------------------------------------

    def execute(self, task_name: str, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        tasks = {
            self.train_task_name: self._train,
            self.validate_task_name: lambda task, ctx, signal: validate_reply(self, task, ctx),
            self.submit_model_task_name: lambda task, ctx, signal: submit_model_reply(self, ctx),
        }
        if task_name not in tasks:
            return make_reply(ReturnCode.TASK_UNKNOWN)
        if self._net is None or shareable.get_header(JOB_REFUSED_HEADER):
            return refusal_reply(shareable, self._setup_error, fl_ctx)
        return tasks[task_name](shareable, fl_ctx, abort_signal)

    def _train(self, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        received = FLModelUtils.from_shareable(shareable, fl_ctx)
        round_number = received.current_round or 0
        site = fl_ctx.get_identity_name()
        try:
            load_numpy_state(self._net, self.received_params(received))
            global_metrics = self.evaluate_locally(self._net, fl_ctx)
            objective = self.make_objective(round_number, fl_ctx, received.meta or {})
            privacy = self.site_privacy(fl_ctx)
            dp_step = None if privacy is None else privacy.start_round(self._net, received.total_rounds)
        except ValueError as e:
            self.log_error(fl_ctx, f"{site}: {e}")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        started = time.perf_counter()
        result = self._train_locally(objective, site, round_number, abort_signal, dp_step)
        if result.aborted:
            self.log_info(fl_ctx, f"{site}: round {round_number} aborted")
            return make_reply(ReturnCode.TASK_ABORTED)
        seconds = time.perf_counter() - started
        terms = result.mean_terms
        if not all(np.isfinite(v) for v in terms.values()):
            self.log_error(
                fl_ctx,
                f"{site}: training diverged in round {round_number} (loss terms {terms}); lower lr={self.training.lr}",
            )
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        self.after_training(round_number, fl_ctx)
        self.save_local_model(round_number, fl_ctx)
        local_metrics = self.evaluate_locally(self._net, fl_ctx)
        metrics = {
            **{f"train_{k}": v for k, v in terms.items()},
            **global_metrics,
            **{f"local_model_{k}": v for k, v in local_metrics.items()},
            **({} if privacy is None else privacy.finish_round(round_number, dp_step)),
        }
        self.log_info(
            fl_ctx,
            f"{site}: round {round_number} trained {result.steps} steps in {seconds:.1f} s "
            f"({result.steps * self.training.batch_size / seconds:.0f} img/s); " + format_metrics(metrics),
        )
        if privacy is not None:
            metrics = without_training_figures(metrics)
        stream_metrics(self, metrics, round_number, fl_ctx)
        reply = self._exchange.reply(self._net, received, metrics, result.steps, self._num_samples, self._upload_meta)
        return FLModelUtils.to_shareable(reply)

    def _train_locally(
        self, objective, site: str, round_number: int, abort_signal: Signal, dp_step: Optional[DPSGD]
    ) -> TrainResult:
        """The round's local training on ``objective``; with DP-SGD by ``dp_step``, whose hooks then come off."""
        try:
            return train_local(
                self._net,
                round_batches(self._source, self.training.batch_size, self.data.seed, site, round_number),
                objective,
                sgd(self._net, self.training.lr, self.training.momentum, self.training.weight_decay),
                self.training.local_epochs,
                self._torch_device,
                should_stop=lambda: abort_signal.triggered,
                after_step=self.after_step,
                before_epoch=self.before_epoch,
                amp=self.training.amp,
                step=dp_step,
            )
        finally:
            if dp_step is not None:
                dp_step.close()

    def site_privacy(self, fl_ctx: FLContext) -> Optional[SitePrivacy]:
        """This site's DP-SGD for the round, its ledger read from the job's state; None when DP-SGD is off."""
        if self.dp is None:
            return None
        steps_per_round = self.training.local_epochs * (self._num_samples // self.training.batch_size)
        store = self.job_state(LEDGER_STATE, fl_ctx)
        site = fl_ctx.get_identity_name()
        return SitePrivacy(self.dp, store, site, self._num_samples, self.training.batch_size, steps_per_round)

    def received_params(self, received: FLModel) -> Dict[str, Any]:
        """The received weights, in the local network's shapes."""
        return self._exchange.received_params(received, self._net)

    @property
    def network(self) -> nn.Module:
        """The site's network (the job's ``model``, on the site's device once the job has started)."""
        return self._net

    # ---- the method: its round object ----------------------------------------------------------------------

    def make_round(self, fl_ctx: FLContext):
        """The method's round object for this site (see :mod:`nvflare_moon.core.rounds`); FedAvg's here."""
        return FedAvgRound()

    def make_objective(self, round_number: int, fl_ctx: FLContext, meta: Optional[Dict[str, Any]] = None):
        """Start the round (the global weights are in the local model; ``meta`` came with them): its objective.

        Raises:
            ValueError: the method refuses the round (the reason says why).
        """
        self._round = self.make_round(fl_ctx)
        return self._round.start(round_number, meta or {})

    def before_epoch(self, epoch: int) -> None:
        self._round.before_epoch(epoch)

    def after_step(self) -> None:
        self._round.after_step()

    def after_training(self, round_number: int, fl_ctx: FLContext) -> None:
        """The round's training succeeded: the method saves its state and says what to send beside the weights."""
        self._upload_meta = self._round.finish()

    def save_local_model(self, round_number: int, fl_ctx: FLContext) -> None:
        """Persist the trained local model for ``submit_model``, unless the method's state already holds it."""
        if self._round.keeps_local_model:
            return
        state = {name: t.detach().cpu().clone() for name, t in self._net.state_dict().items()}
        self.state_store(LOCAL_MODEL_STATE, fl_ctx).save(round_number, {"model": state})

    def load_local_model(self, fl_ctx: FLContext) -> Optional[Tuple[int, Dict[str, torch.Tensor]]]:
        """``(round, state dict)`` of the last local model this site trained in the job, or None.

        Raises:
            StateUnusable: see :meth:`SiteStateStore.load`.
        """
        method = self.make_round(fl_ctx)
        if method.keeps_local_model:
            return method.uploads.last_upload()
        record = self.job_state(LOCAL_MODEL_STATE, fl_ctx).load()
        return None if record is None else (record["round"], record["payload"]["model"])

    def state_store(self, name: str, fl_ctx: FLContext, job_id: Optional[str] = None) -> SiteStateStore:
        """This site's store ``name`` in the job's run folder (default: this job's); see :class:`SiteStates`."""
        return self._states.store(name, fl_ctx, job_id)

    def job_state(self, name: str, fl_ctx: FLContext) -> ContinuedStateStore:
        """This job's store ``name`` which, in a continuation job, falls back on the failed job's."""
        return self._states.continued(name, fl_ctx)


def refusal_reply(task: Shareable, setup_error: Optional[str], fl_ctx: FLContext) -> Shareable:
    """The answer of a site that could not set up, or whose server refused the job: an error carrying the
    reason, which the server logs and NVFlare's controller turns into a failed job."""
    refused = task.get_header(JOB_REFUSED_HEADER)
    error = f"the server refused the job: {refused}" if refused else setup_error
    error = error or f"{fl_ctx.get_identity_name()} cannot train: training was not set up"
    return make_reply(ReturnCode.EXECUTION_EXCEPTION, headers={ReservedHeaderKey.ERROR: error})


def stream_metrics(component: Executor, metrics: Dict[str, float], round_number: int, fl_ctx: FLContext) -> None:
    """Fire NVFlare's analytics event for every figure, so that the receivers ``add_experiment_tracking`` sets up
    (TensorBoard, MLflow, W&B) record them; the recipes' ``ConvertToFedEvent`` forwards them to the server."""
    for name, value in metrics.items():
        dxo = create_analytic_dxo(name, float(value), AnalyticsDataType.SCALAR, global_step=int(round_number))
        send_analytic_dxo(component, dxo, fl_ctx)
