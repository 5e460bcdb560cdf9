"""Helpers for unit tests of the executors' NVFlare wiring without the simulator: a site's FLContext (workspace and
identity only), a tiny network and in-memory data, and one task sent and answered as NVFlare would."""

from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn as nn
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import ReservedKey, ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.utils.fl_model_utils import FLModelUtils
from torch.utils.data import TensorDataset

from nvflare_moon.core.weights import state_dict_to_numpy
from nvflare_moon.models import ProjectionModel

NUM_CLASSES = 3
PROJECTION_DIM = 4


def site_context(run_dir: Path, site: str = "site-1", job: str = "job-1") -> FLContext:
    """What the executors read from NVFlare's context: the site's name, the job id and the job's run folder."""
    ctx = FLContext()
    workspace = SimpleNamespace(get_run_dir=lambda job_id: str(run_dir / job_id), get_root_dir=lambda: str(run_dir))
    engine = SimpleNamespace(get_workspace=lambda: workspace, fire_event=lambda event, ctx: None)
    for key, value in ((ReservedKey.ENGINE, engine), (ReservedKey.RUN_NUM, job), (ReservedKey.IDENTITY_NAME, site)):
        ctx.set_prop(key, value, private=True, sticky=False)
    return ctx


def tiny_net(seed: int = 0) -> ProjectionModel:
    """A 3-class network on 3x2x2 inputs with a 4-dimensional projection."""
    torch.manual_seed(seed)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(12, 6))
    return ProjectionModel(backbone, feat_dim=6, num_classes=NUM_CLASSES, out_dim=PROJECTION_DIM)


def tiny_dataset(labels, seed: int = 1) -> TensorDataset:
    """Random 3x2x2 inputs with the given labels."""
    labels = torch.as_tensor(labels, dtype=torch.int64)
    x = torch.randn(len(labels), 3, 2, 2, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, labels)


def started(executor, ctx: FLContext):
    """The executor after NVFlare's START_RUN event (its set-up)."""
    executor.handle_event(EventType.START_RUN, ctx)
    return executor


def train_task(params: dict, round_number: int, meta: dict = None):
    """The server's train task: the global weights of ``round_number`` and what it sends beside them."""
    model = FLModel(params=params, params_type=ParamsType.FULL, current_round=round_number, meta=meta or {})
    return FLModelUtils.to_shareable(model)


def run_task(
    executor,
    ctx: FLContext,
    params: dict,
    round_number: int = 0,
    meta: dict = None,
    task_name: str = AppConstants.TASK_TRAIN,
    abort_signal: Signal = None,
):
    """Send one task; returns ``(return code, FLModel reply or None)``."""
    reply = executor.execute(task_name, train_task(params, round_number, meta), ctx, abort_signal or Signal())
    code = reply.get_return_code()
    return code, (FLModelUtils.from_shareable(reply) if code == ReturnCode.OK else None)


def global_weights(seed: int = 0) -> dict:
    """A global model's weights, as numpy, the way the server sends them."""
    return state_dict_to_numpy(tiny_net(seed))
