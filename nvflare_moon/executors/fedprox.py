"""FedProx's client (Li et al., MLSys 2020): FedAvg's local training plus the proximal term (μ/2)·‖w − w_glob‖².

μ follows NVFlare's FedProx convention: the server decides it and sends it with every model as
``meta["fedprox_mu"]`` (NVFlare's ``FedAvg`` controller with ``fedprox_mu=...``, as
:class:`~nvflare_moon.recipes.FedProxRecipe` sets up), so one job setting reaches every site.
"""

from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.utils.fedprox_utils import get_fedprox_mu

from ..core.objectives import FedProxObjective
from ..core.training import frozen_copy
from .fedavg import FedAvgExecutor


class FedProxExecutor(FedAvgExecutor):
    """FedProx: ``CE + (μ/2)·Σ‖w − w_glob‖²`` with μ from the server; all :class:`FedAvgExecutor` arguments apply."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._mu = 0.0

    def on_receive(self, received: FLModel, fl_ctx: FLContext) -> None:
        try:
            self._mu = get_fedprox_mu(received)
        except ValueError as e:
            raise ValueError(f"{e} Run this executor with FedProxRecipe (NVFlare's FedAvg with fedprox_mu).") from e

    def make_objective(self, round_number: int, fl_ctx: FLContext) -> FedProxObjective:
        return FedProxObjective(self._net, frozen_copy(self._net), self._mu)
