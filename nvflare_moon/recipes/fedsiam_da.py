"""FedSiam-DA's recipes: executors (:class:`FedSiamDARecipe`) and a Client API script
(:class:`FedSiamDAScriptRecipe`)."""

from dataclasses import dataclass
from typing import Any, Dict

from nvflare.apis.executor import Executor
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator

from ..core.dual_aggregation import VECTORS
from ..core.fedsiam_da import FedSiamDASettings
from ..core.settings import keep_settings
from ..core.validation import check_choice, check_number
from ..executors import FedSiamDAExecutor
from ..filters.encryption import WHY_NOT_ENCRYPTED
from ..server import DualAggregator
from .fedavg import FedAvgBaselineRecipe
from .script import ClientAPIRecipe


@dataclass(eq=False, kw_only=True)
class FedSiamDARecipe(FedAvgBaselineRecipe):
    """FedSiam-DA: Siamese local training (:class:`FedSiamDAExecutor`) on the network with a SimSiam predictor, and
    dual aggregation on the server (:class:`DualAggregator`).

    Args:
        mu: weight μ of the Siamese and history terms (not published; default 0.01, the best of the sweep in
            docs/fedssc_fedsiam.md: 1 does not learn, 0.1 and 0.01 are level with FedAvg after 10 quick rounds).
        history: ``"epoch"`` (default: the previous local epoch's model) or ``"round"`` (the previous round's upload).
        history_branch: what the history term compares with the history model's z_h: ``"projection"`` (default, z_l)
            or ``"predictor"`` (p_l).
        predictor_hidden_dim: the predictor's hidden size (256→64→256 by default).
        cosine_floor: ε that a non-positive cosine is clamped to in the dual aggregation.
        cosine_vector: vec(w) of the dual aggregation's cosine: ``"state"`` (default, BatchNorm running statistics
            included) or ``"parameters"`` (without them).
        and every :class:`FedAvgBaselineRecipe` argument.
    """

    option_limits = {"encryption": WHY_NOT_ENCRYPTED["fedsiam_da"]}

    name: str = "fedsiam_da_cifar10"
    mu: float = FedSiamDASettings.mu
    history: str = FedSiamDASettings.history
    history_branch: str = FedSiamDASettings.history_branch
    predictor_hidden_dim: int = 64
    cosine_floor: float = 1e-6
    cosine_vector: str = "state"

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        settings = FedSiamDASettings(mu=self.mu, history=self.history, history_branch=self.history_branch)
        return FedSiamDAExecutor(**common_args, settings=settings)

    def make_aggregator(self) -> ModelAggregator:
        return DualAggregator(
            cosine_floor=self.cosine_floor,
            cosine_vector=self.cosine_vector,
            allow_partial_updates=self.allow_partial_updates,
        )

    def extra_network_args(self) -> Dict[str, Any]:
        return {"predictor_hidden_dim": self.predictor_hidden_dim}


class FedSiamDAScriptRecipe(ClientAPIRecipe):
    """FedSiam-DA for a Client API script that uses :class:`~nvflare_moon.client.PTFedSiamDAHelper`, with the dual
    aggregation on the server.

    Args:
        mu: μ of the Siamese and history terms (not published; default 0.01, the best of a sweep on CIFAR-10, see
            docs/fedssc_fedsiam.md).
        history: ``"epoch"`` (the previous local epoch's model) or ``"round"`` (the previous round's upload).
        history_branch: ``"projection"`` (the history term reads z) or ``"predictor"`` (it reads p = predictor(z)).
        cosine_floor: ε that a non-positive cosine is clamped to in the dual aggregation.
        cosine_vector: vec(w) of the dual aggregation's cosine: ``"state"`` (BatchNorm running statistics included)
            or ``"parameters"``.
        **kwargs: as for :class:`MoonScriptRecipe`.
    """

    def __init__(
        self,
        *,
        name: str = "fedsiam_da_script",
        mu: float = FedSiamDASettings.mu,
        history: str = FedSiamDASettings.history,
        history_branch: str = FedSiamDASettings.history_branch,
        cosine_floor: float = 1e-6,
        cosine_vector: str = "state",
        **kwargs,
    ):
        self.fedsiam_da_settings = keep_settings(
            self, FedSiamDASettings(mu=mu, history=history, history_branch=history_branch)
        )
        check_number("cosine_floor", cosine_floor, low=0, low_inclusive=False)
        check_choice("cosine_vector", cosine_vector, VECTORS)
        self.cosine_floor = cosine_floor
        self.cosine_vector = cosine_vector
        super().__init__(name=name, **kwargs)

    def make_aggregator(self) -> ModelAggregator:
        return DualAggregator(cosine_floor=self.cosine_floor, cosine_vector=self.cosine_vector)

    def client_settings(self) -> Dict[str, Any]:
        return self.fedsiam_da_settings.to_meta()
