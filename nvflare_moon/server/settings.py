"""NVFlare's FedAvg controller that sends a method's settings with every training model, as NVFlare's own
``fedprox_mu`` travels to FedProx scripts: how the Client API recipes (:mod:`nvflare_moon.client_api_recipes`) give
the sites' helpers μ, τ, m and the rest."""

from typing import Any, Dict, Optional

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
            task_name=task_name, data=data, targets=targets, min_responses=min_responses, timeout=timeout,
            callback=callback,
        )  # fmt: skip
