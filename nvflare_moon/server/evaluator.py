"""The metric the papers report: the global model's top-1 accuracy on the full test set, once per round."""

import json
import os
import time
from typing import Optional, Union

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.tensorboard import SummaryWriter

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType

from ..core.training import evaluate
from ..core.weights import load_numpy_state
from ..data import DATASETS, TensorBatchLoader, load_dataset, test_transform
from ..models import check_num_classes
from ..runtime import resolve_device, resolve_num_threads
from ..validation import check_choice, check_number

METRICS_FILENAME = "global_metrics.jsonl"


class GlobalModelEvaluator(FLComponent):
    """Evaluate every round's aggregate on the server and record it.

    After each aggregation it logs the global test accuracy and loss, writes them with the sites' mean training
    metrics to TensorBoard (``<run dir>/tb_events/global``) and appends one JSON line per round to
    ``<run dir>/global_metrics.jsonl``. Aggregate meta under keys starting with ``site_`` goes into the JSON line, and
    the per-site scalars among it (``{site: number}``, e.g. FedSiam-DA's ``site_dual_weights``) into TensorBoard as
    ``<key>/<site>``.

    Args:
        model: the same network as the clients'.
        dataset: a dataset name (its test split is used) or a ``torch.utils.data.Dataset`` of the test data.
        data_root, download: as for the executors.
        batch_size: evaluation batch size.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ...
        num_threads: torch CPU threads for the server process; None keeps torch's default.
    """

    def __init__(
        self,
        model: nn.Module,
        dataset: Union[str, Dataset] = "cifar10",
        data_root: Optional[str] = None,
        download: bool = True,
        batch_size: int = 500,
        device: str = "auto",
        num_threads: Optional[int] = None,
    ):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be an nn.Module such as nvflare_moon.models.Network, got {model!r}")
        if isinstance(dataset, str):
            check_choice("dataset", dataset, DATASETS)
        check_number("batch_size", batch_size, low=1, integer=True)
        resolve_device(device)
        self.model = model
        self.dataset = dataset
        self.data_root = data_root
        self.download = download
        self.batch_size = batch_size
        self.device = device
        self.num_threads = num_threads
        self._batches = None
        self._writer: Optional[SummaryWriter] = None
        self._metrics_path = ""

    def handle_event(self, event_type: str, fl_ctx: FLContext):
        if event_type == EventType.START_RUN:
            try:
                self._setup(fl_ctx)
            except Exception as e:
                self.log_error(fl_ctx, f"cannot set up global evaluation: {e}")
                self.system_panic(f"server: {e}", fl_ctx)
        elif event_type == AppEventType.AFTER_AGGREGATION and self._batches is not None:
            self._evaluate_round(fl_ctx)
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
        else:
            self._batches = DataLoader(self.dataset, batch_size=self.batch_size, shuffle=False)
        self.model.to(self._torch_device)
        run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
        self._writer = SummaryWriter(os.path.join(run_dir, "tb_events", "global"))
        self._metrics_path = os.path.join(run_dir, METRICS_FILENAME)

    def _evaluate_round(self, fl_ctx: FLContext) -> None:
        aggregate = fl_ctx.get_prop(AppConstants.AGGREGATION_RESULT)
        round_number = int(fl_ctx.get_prop(AppConstants.CURRENT_ROUND, 0))
        started = time.perf_counter()
        load_numpy_state(self.model, aggregate.params)
        test = evaluate(self.model, self._batches, self._torch_device)
        record = {
            "round": round_number,
            "time": time.time(),
            "test_accuracy": test["accuracy"],
            "test_loss": test["loss"],
            "eval_seconds": time.perf_counter() - started,
            "train": aggregate.metrics or {},
            **{k: v for k, v in (aggregate.meta or {}).items() if k.startswith("site_")},
        }
        self.log_info(
            fl_ctx, f"round {round_number}: global test accuracy {test['accuracy']:.4f}, loss {test['loss']:.4f}"
        )
        self._writer.add_scalar("test/accuracy", test["accuracy"], round_number)
        self._writer.add_scalar("test/loss", test["loss"], round_number)
        for name, value in record["train"].items():
            self._writer.add_scalar(f"train/{name}", value, round_number)
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


def _to_builtin(value):
    return value.tolist() if isinstance(value, (np.ndarray, np.generic)) else str(value)
