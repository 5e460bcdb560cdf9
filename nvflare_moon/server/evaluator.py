"""The server's record of every round: the global model's test accuracy (the papers' figure), how the sites' own
metrics spread across sites, and the best global model by a key metric."""

import json
import math
import os
import time
from typing import Dict, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
from nvflare.apis.dxo import MetaKey, from_shareable
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType
from torch.utils.data import DataLoader, Dataset
from torch.utils.tensorboard import SummaryWriter

from ..core.aggregation import normalized_weights
from ..core.clinical_metrics import CLINICAL_FIGURES
from ..core.runtime import resolve_device, resolve_num_threads
from ..core.site_metrics import site_spread, weighted_metric_means
from ..core.training import clinical_evaluation, evaluate
from ..core.validation import check_choice, check_flag, check_module, check_number
from ..core.weights import load_numpy_state
from ..data import DATASETS, TensorBatchLoader, load_dataset, test_transform
from ..models import check_num_classes

METRICS_FILENAME = "global_metrics.jsonl"
# the sites' local metrics whose spread across sites is recorded (see FedAvgExecutor): the received global model's,
# and their own trained model's; the clinical ones where the sites report them (clinical_metrics=True)
LOCAL_FIGURES = {
    "accuracy": "local accuracy of the global model",
    "local_model_accuracy": "local accuracy of the local models",
    "auroc": "local AUROC of the global model",
    "sensitivity": "local sensitivity of the global model",
    "specificity": "local specificity of the global model",
}
KEY_METRIC_MODES = ("max", "min")


class GlobalModelEvaluator(FLComponent):
    """Evaluate every round's aggregate on the server, summarise the sites' local metrics, keep the best model.

    After each aggregation it logs, writes to TensorBoard (``<run dir>/tb_events/global``) and appends as one JSON
    line to ``<run dir>/global_metrics.jsonl``:

    - the global test accuracy and loss (``test_accuracy``, ``test_loss``), where the server has test data;
    - ``spread``: for each local figure the sites report (``accuracy``: the global model they received this round, on
      their local test data, before training; ``local_model_accuracy``: their trained model), the weighted mean, the
      worst and best site and the standard deviation across sites (:func:`~nvflare_moon.core.site_metrics.site_spread`);
    - the sites' mean training metrics, and aggregate meta under keys starting with ``site_`` (``site_metrics``: every
      site's metrics; per-site scalars such as FedSiam-DA's ``site_dual_weights`` also go to TensorBoard);
    - ``best_model``: the key metric, its best value so far and the round whose aggregate it belongs to (-1: the
      initial model).

    The key metric is ``test_accuracy`` where the server evaluates, else the weighted mean of the sites' ``accuracy``;
    ``key_metric`` names another figure (``"auroc"``: the server's ``test_auroc`` where it evaluates, else the sites'
    weighted mean ``auroc``). The sites' figures are measured on the model they received, the aggregate of the round
    before. Whenever it improves,
    the component fires NVFlare's ``GLOBAL_BEST_MODEL_AVAILABLE`` once the measured model is the run's global model, so
    the persistor saves it as ``best_FL_global_model.pt``. ``test_accuracy`` and ``test_loss`` are also added to the
    aggregate's metrics, so that the controller's ``stop_cond`` can read them.

    Args:
        model: the same network as the clients'.
        dataset: a dataset name (its test split is used), a ``torch.utils.data.Dataset`` of the test data, or None
            where the server holds no data (no server evaluation).
        data_root, download: as for the executors.
        batch_size: evaluation batch size.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ...
        num_threads: torch CPU threads for the server process; None keeps torch's default.
        key_metric: the figure that picks the best model (without its ``test_`` prefix): ``"accuracy"``,
            ``"loss"``, or with ``clinical_metrics`` ``"auroc"``, ``"sensitivity"``, ``"specificity"``,
            ``"balanced_accuracy"``, ``"f1"``. None: ``accuracy``.
        key_metric_mode: ``"max"`` (higher is better) or ``"min"`` (a loss); None: ``"min"`` for ``loss``, else
            ``"max"`` (NVFlare's ``key_metric`` / ``negate_key_metric`` pair, by name).
        clinical_metrics: the server's evaluation also reports the clinical figures (``test_auroc``, ...) and the
            confusion matrix (``test_confusion``, in the JSON line).
    """

    announces_best_model = True  # fire GLOBAL_BEST_MODEL_AVAILABLE, so that the persistor saves the best model

    def __init__(
        self,
        model: nn.Module,
        dataset: Union[str, Dataset, None] = "cifar10",
        data_root: Optional[str] = None,
        download: bool = True,
        batch_size: int = 500,
        device: str = "auto",
        num_threads: Optional[int] = None,
        key_metric: Optional[str] = None,
        key_metric_mode: Optional[str] = None,
        clinical_metrics: bool = False,
    ):
        super().__init__()
        check_flag("clinical_metrics", clinical_metrics)
        check_key_metric(key_metric, key_metric_mode, clinical_metrics)
        check_module("model", model)
        if isinstance(dataset, str):
            check_choice("dataset", dataset, DATASETS)
        elif dataset is not None and not isinstance(dataset, Dataset):
            raise ValueError(f"dataset must be a dataset name, a torch Dataset or None, got {type(dataset).__name__}")
        check_number("batch_size", batch_size, low=1, integer=True)
        resolve_device(device)
        self.model = model
        self.dataset = dataset
        self.data_root = data_root
        self.download = download
        self.batch_size = batch_size
        self.device = device
        self.num_threads = num_threads
        self.key_metric = key_metric
        self.key_metric_mode = key_metric_mode
        self.clinical_metrics = clinical_metrics
        self._key = key_metric or "accuracy"
        self._higher_is_better = (key_metric_mode or ("min" if self._key == "loss" else "max")) == "max"
        self._batches = None
        self._writer: Optional[SummaryWriter] = None
        self._metrics_path = ""
        self._best_value = -math.inf
        self._best_model_round: Optional[int] = None
        self._best_pending = False  # the round's aggregate is the best: announce it once it is the global model

    def handle_event(self, event_type: str, fl_ctx: FLContext):
        if event_type == EventType.START_RUN:
            try:
                self._setup(fl_ctx)
            except Exception as e:
                self.log_error(fl_ctx, f"cannot set up global evaluation: {e}")
                self.system_panic(f"server: {e}", fl_ctx)
        elif event_type == AppEventType.AFTER_AGGREGATION and self._writer is not None:
            self._evaluate_round(fl_ctx)
        elif event_type == AppEventType.AFTER_SHAREABLE_TO_LEARNABLE and self._best_pending:
            self._best_pending = False
            self.fire_event(AppEventType.GLOBAL_BEST_MODEL_AVAILABLE, fl_ctx)
        elif event_type == EventType.END_RUN and self._writer is not None:
            self._writer.close()

    def _setup(self, fl_ctx: FLContext) -> None:
        torch.set_num_threads(resolve_num_threads(self.num_threads))
        self._torch_device = resolve_device(self.device)
        if isinstance(self.dataset, str):
            splits = load_dataset(self.dataset, self.data_root, self.download)
            check_num_classes(self.model, splits.num_classes, self.dataset)
            self._batches = TensorBatchLoader(
                splits.test, self.batch_size, test_transform(self.dataset), shuffle=False, drop_last=False
            )
        elif self.dataset is not None:
            self._batches = DataLoader(self.dataset, batch_size=self.batch_size, shuffle=False)
        self.model.to(self._torch_device)
        run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
        self._writer = SummaryWriter(os.path.join(run_dir, "tb_events", "global"))
        self._metrics_path = os.path.join(run_dir, METRICS_FILENAME)

    def round_aggregate(self, fl_ctx: FLContext) -> FLModel:
        """The round's aggregate as an ``FLModel`` (weights, the sites' mean metrics, their metrics in the meta):
        what our aggregators return to NVFlare's ``FedAvg`` controller."""
        return fl_ctx.get_prop(AppConstants.AGGREGATION_RESULT)

    def _evaluate_round(self, fl_ctx: FLContext) -> None:
        aggregate = self.round_aggregate(fl_ctx)
        round_number = int(fl_ctx.get_prop(AppConstants.CURRENT_ROUND, 0))
        meta = aggregate.meta or {}
        record = {"round": round_number, "time": time.time()}
        summary = [f"round {round_number}:"]
        if self._batches is not None:
            started = time.perf_counter()
            load_numpy_state(self.model, aggregate.params)
            if self.clinical_metrics:
                test, clinical = clinical_evaluation(self.model, self._batches, self._torch_device)
                record["test_confusion"] = clinical.confusion
            else:
                test = evaluate(self.model, self._batches, self._torch_device)
            test = {f"test_{name}": value for name, value in test.items()}
            record.update(test)
            record["eval_seconds"] = time.perf_counter() - started
            summary.append(f"global test accuracy {test['test_accuracy']:.4f}, loss {test['test_loss']:.4f};")
        record["train"] = dict(aggregate.metrics or {})
        record["spread"] = self._spread(meta)
        for name, spread in record["spread"].items():
            summary.append(
                f"{LOCAL_FIGURES[name]}: mean {spread['mean']:.4f}, worst {spread['worst']:.4f} "
                f"({spread['worst_site']}), best {spread['best']:.4f} ({spread['best_site']}), std {spread['std']:.4f};"
            )
        record["best_model"] = self._update_best(record, round_number, fl_ctx)
        record.update({k: v for k, v in meta.items() if k.startswith("site_")})
        self.log_info(fl_ctx, " ".join(summary).rstrip(";"))
        if self._batches is not None:  # for the controller's stop_cond
            aggregate.metrics = {**record["train"], **test}
        self._write(record, round_number)

    def _spread(self, meta: dict) -> Dict[str, dict]:
        """How each local figure spreads across the sites that report it, weighted by their aggregation weights."""
        site_metrics, weights = meta.get("site_metrics", {}), meta.get("site_weights", {})
        result = {}
        for name in LOCAL_FIGURES:
            spread = site_spread({s: m[name] for s, m in site_metrics.items() if name in m}, weights)
            if spread is not None:
                result[name] = spread.as_dict()
        return result

    def _update_best(self, record: dict, round_number: int, fl_ctx: FLContext) -> Optional[dict]:
        """Track the key metric; when it improves, have the persistor save the measured model as the best one."""
        if self._batches is not None and f"test_{self._key}" in record:
            key, value, model_round = f"test_{self._key}", record[f"test_{self._key}"], round_number
        elif self._key in record["spread"] or self._key in record["train"]:  # the sites' weighted mean
            key = self._key
            value = record["spread"][key]["mean"] if key in record["spread"] else record["train"][key]
            model_round = round_number - 1  # the sites measured the model they received: last round's aggregate
        else:
            return None
        better = value > self._best_value if self._higher_is_better else value < self._best_value
        if self._best_model_round is None or better:
            self._best_value, self._best_model_round = value, model_round
            self.log_info(fl_ctx, f"new best global model (round {model_round} aggregate): {key} {value:.4f}")
            if self.announces_best_model and model_round == round_number:
                self._best_pending = True  # this aggregate becomes the global model after the aggregation
            elif self.announces_best_model:
                self.fire_event(AppEventType.GLOBAL_BEST_MODEL_AVAILABLE, fl_ctx)  # it is the global model now
        return {"key_metric": key, "value": value, "best_value": self._best_value, "round": self._best_model_round}

    def _write(self, record: dict, round_number: int) -> None:
        if "test_accuracy" in record:
            self._writer.add_scalar("test/accuracy", record["test_accuracy"], round_number)
            self._writer.add_scalar("test/loss", record["test_loss"], round_number)
        for name, value in record["train"].items():
            self._writer.add_scalar(f"train/{name}", value, round_number)
        for name, spread in record["spread"].items():
            for stat in ("mean", "worst", "best", "std"):
                self._writer.add_scalar(f"local/{name}/{stat}", spread[stat], round_number)
        for site, metrics in record.get("site_metrics", {}).items():
            for name, value in metrics.items():
                self._writer.add_scalar(f"sites/{site}/{name}", value, round_number)
        for key, per_site in record.items():  # per-site scalars: site_weights, FedSiam-DA's site_dual_weights, ...
            if key.startswith("site_") and isinstance(per_site, dict):
                for site, value in per_site.items():
                    if isinstance(value, (int, float, np.number)):
                        self._writer.add_scalar(f"{key}/{site}", value, round_number)
        self._writer.flush()
        with open(self._metrics_path, "a") as f:
            f.write(json.dumps(record, default=_to_builtin) + "\n")


class SiteMetricsRecorder(GlobalModelEvaluator):
    """The round record of a server that cannot read the aggregate: encrypted aggregation (the recipes'
    ``encryption="ckks"``), where NVFlare's ``ScatterAndGather`` runs its HE aggregator on ciphertexts.

    The sites' own metrics still travel in the clear in each update's meta (their metrics, ``num_samples``), so this
    component collects them as the aggregator accepts each update and writes the same ``global_metrics.jsonl`` line,
    TensorBoard scalars and best-model tracking as :class:`GlobalModelEvaluator` without server data: the key metric
    is the ``num_samples``-weighted mean of the sites' ``accuracy`` of the global model they received.

    The best round is recorded but not announced: NVFlare's persistor would save the run's global model, a dict of
    live CKKS vectors, without the HE serialize filter, and fail.

    Args:
        model: the same network as the clients' (never evaluated here; kept for the job's shape).
    """

    announces_best_model = False

    def __init__(self, model: nn.Module):
        super().__init__(model=model, dataset=None)
        self._site_metrics: Dict[str, Tuple[float, Dict[str, float]]] = {}  # site -> (num_samples, metrics)

    def handle_event(self, event_type: str, fl_ctx: FLContext):
        if event_type == AppEventType.AFTER_CONTRIBUTION_ACCEPT and fl_ctx.get_prop(AppConstants.AGGREGATION_ACCEPTED):
            self._note_contribution(fl_ctx)
        super().handle_event(event_type, fl_ctx)

    def _note_contribution(self, fl_ctx: FLContext) -> None:
        site = fl_ctx.get_peer_context().get_identity_name()
        meta = from_shareable(fl_ctx.get_prop(AppConstants.TRAINING_RESULT)).meta
        metrics = meta.get(MetaKey.INITIAL_METRICS) or {}
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float, np.number))}
        self._site_metrics[site] = (float(meta.get("num_samples", 1.0)), scalars)

    def round_aggregate(self, fl_ctx: FLContext) -> FLModel:
        sites = sorted(self._site_metrics)
        counts = [self._site_metrics[s][0] for s in sites]
        weights = dict(zip(sites, normalized_weights(counts).tolist())) if sites else {}
        site_metrics = {s: self._site_metrics[s][1] for s in sites}
        self._site_metrics = {}
        return FLModel(
            params={},
            metrics=weighted_metric_means(site_metrics, weights),
            meta={"site_metrics": site_metrics, "site_weights": weights},
        )


def check_key_metric(key_metric: Optional[str], key_metric_mode: Optional[str], clinical_metrics: bool) -> None:
    """Raise ValueError, naming the argument, for a key metric that the run does not report."""
    known = ("accuracy", "loss") + (CLINICAL_FIGURES if clinical_metrics else ())
    if key_metric in CLINICAL_FIGURES and not clinical_metrics:
        raise ValueError(f"key_metric={key_metric!r} is a clinical figure: set clinical_metrics=True to report it")
    if key_metric is not None:
        check_choice("key_metric", key_metric, known)
    if key_metric_mode is not None:
        check_choice("key_metric_mode", key_metric_mode, KEY_METRIC_MODES)


def _to_builtin(value):
    return value.tolist() if isinstance(value, (np.ndarray, np.generic)) else str(value)
