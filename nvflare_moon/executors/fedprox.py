"""FedProx's client (Li et al., MLSys 2020): FedAvg's local training plus the proximal term (μ/2)·‖w − w_glob‖².

μ follows NVFlare's FedProx convention: the server decides it and sends it with every model as
``meta["fedprox_mu"]`` (NVFlare's ``FedAvg`` controller with ``fedprox_mu=...``, as
:class:`~nvflare_moon.recipes.FedProxRecipe` sets up), so one job setting reaches every site. The round is
:class:`~nvflare_moon.core.rounds.FedProxRound`.
"""

from nvflare.apis.fl_context import FLContext

from ..core.rounds import FedProxRound
from .fedavg import FedAvgExecutor


class FedProxExecutor(FedAvgExecutor):
    """FedProx: ``CE + (μ/2)·Σ‖w − w_glob‖²`` with μ from the server; all :class:`FedAvgExecutor` arguments apply."""

    def make_round(self, fl_ctx: FLContext) -> FedProxRound:
        return FedProxRound(self._net)
