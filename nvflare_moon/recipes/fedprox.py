"""FedProx's recipe."""

from dataclasses import dataclass
from typing import Any, Dict

from nvflare.apis.executor import Executor
from nvflare.app_common.app_constant import AlgorithmConstants

from ..core.validation import check_number
from ..executors import FedProxExecutor
from .fedavg import FedAvgBaselineRecipe


@dataclass(eq=False, kw_only=True)
class FedProxRecipe(FedAvgBaselineRecipe):
    """FedProx (Li et al., MLSys 2020): FedAvg plus the proximal term (μ/2)·‖w − w_glob‖².

    The FedAvg controller sends μ with every model (NVFlare's ``fedprox_mu`` convention), or under encryption
    :class:`TrainTaskSettings` beside NVFlare's ``ScatterAndGather``; :class:`FedProxExecutor` reads it.

    Args:
        mu: μ > 0 (the MOON paper's best: 0.01 for CIFAR-10, 0.001 for CIFAR-100 and Tiny-ImageNet).
        and every :class:`FedAvgBaselineRecipe` argument.
    """

    name: str = "fedprox_cifar10"
    mu: float = 0.01

    def __post_init__(self):
        check_number("mu", self.mu, low=0, low_inclusive=False)
        super().__post_init__()

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        return FedProxExecutor(**common_args)

    def controller_args(self) -> Dict[str, Any]:
        return {"fedprox_mu": self.mu}

    def task_meta(self) -> Dict[str, Any]:
        return {AlgorithmConstants.FEDPROX_MU: self.mu}
