"""A method's settings sent with every training model, as NVFlare's own ``fedprox_mu`` travels to FedProx scripts:
by NVFlare's FedAvg controller (:class:`SettingsFedAvg`, how the Client API recipes of
:mod:`nvflare_moon.recipes` give the sites' helpers μ, τ, m and the rest), or beside any workflow
(:class:`TrainTaskSettings`, for NVFlare's ``ScatterAndGather`` under encrypted aggregation)."""

from typing import Any, Dict, Optional

from nvflare.apis.dxo import from_shareable
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType
from nvflare.app_common.workflows.fedavg import FedAvg


class SettingsFedAvg(FedAvg):
    """:class:`~nvflare.app_common.workflows.fedavg.FedAvg` (every argument applies) that puts ``client_settings``
    into the meta of every model it sends, beside what the aggregator left there (FedSSC's prototypes).

    Args:
        client_settings: meta key → plain value (numbers, strings, None).
    """

    def __init__(self, *args, client_settings: Optional[Dict[str, Any]] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.client_settings = dict(client_settings or {})

    def send_model(self, task_name="train", data=None, targets=None, min_responses=None, timeout=0, callback=None):
        if data is not None:
            data.meta = {**(data.meta or {}), **self.client_settings}
        super().send_model(
            task_name=task_name,
            data=data,
            targets=targets,
            min_responses=min_responses,
            timeout=timeout,
            callback=callback,
        )


class TrainTaskSettings(FLComponent):
    """Put ``client_settings`` into the meta of the model of every train task, whatever workflow sends it (NVFlare's
    ``ScatterAndGather`` sends none): how FedProx's μ reaches the sites under encrypted aggregation. The meta is not
    encrypted, and the model's data is left as it is.

    Args:
        client_settings: meta key → plain value (numbers, strings, None).
    """

    def __init__(self, client_settings: Dict[str, Any]):
        super().__init__()
        if not isinstance(client_settings, dict) or not client_settings:
            raise ValueError(f"client_settings must be a non-empty dict of meta keys, got {client_settings!r}")
        self.client_settings = dict(client_settings)

    def handle_event(self, event_type: str, fl_ctx: FLContext):
        if event_type == AppEventType.BEFORE_TRAIN_TASK:
            task = fl_ctx.get_prop(AppConstants.TRAIN_SHAREABLE)
            dxo = from_shareable(task)
            dxo.meta.update(self.client_settings)
            dxo.update_shareable(task)
