"""SCAFFOLD's recipes: executors (:class:`ScaffoldRecipe`) and a Client API script (:class:`ScaffoldScriptRecipe`)."""

from dataclasses import dataclass
from typing import Any, Dict

from nvflare.apis.executor import Executor
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator

from ..executors import ScaffoldExecutor
from ..filters.encryption import WHY_NOT_ENCRYPTED
from ..filters.privacy import SCAFFOLD_LIMITS
from ..server import ScaffoldAggregator
from .fedavg import FedAvgBaselineRecipe
from .script import ClientAPIRecipe


@dataclass(eq=False, kw_only=True)
class ScaffoldRecipe(FedAvgBaselineRecipe):
    """SCAFFOLD (Karimireddy et al., ICML 2020, option II) with the sites' controls persisted between rounds.

    The server is the FedAvg controller with :class:`ScaffoldAggregator` (weighted FedAvg of the weights, and
    ``c ← c + Σ Δc_i / N``); the clients run :class:`ScaffoldExecutor`. Takes every :class:`FedAvgBaselineRecipe`
    argument but ``privacy_filters``.
    """

    option_limits = {**SCAFFOLD_LIMITS, "encryption": WHY_NOT_ENCRYPTED["scaffold"]}

    name: str = "scaffold_cifar10"

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        return ScaffoldExecutor(**common_args)

    def make_aggregator(self) -> ModelAggregator:
        return ScaffoldAggregator(num_sites=self.num_sites)


class ScaffoldScriptRecipe(ClientAPIRecipe):
    """SCAFFOLD for a Client API script that uses :class:`~nvflare_moon.client.PTPersistentScaffoldHelper` (c_i
    persisted between rounds): weighted FedAvg of the weights and ``c ← c + Σ Δc_i / N`` on the server
    (:class:`~nvflare_moon.server.ScaffoldAggregator`), N = ``min_clients``.

    Args:
        **kwargs: as for :class:`MoonScriptRecipe`.
    """

    def __init__(self, *, name: str = "scaffold_script", **kwargs):
        self.num_sites = kwargs.get("min_clients")  # the aggregator is built before FedAvgRecipe stores min_clients
        super().__init__(name=name, **kwargs)

    def make_aggregator(self) -> ModelAggregator:
        return ScaffoldAggregator(num_sites=self.num_sites)

    def client_settings(self) -> Dict[str, Any]:
        return {}
