"""FedProx's recipe."""

from typing import Any, Dict

from nvflare.apis.executor import Executor
from nvflare.app_common.app_constant import AlgorithmConstants

from ..executors import FedProxExecutor
from ..core.validation import check_number
from .fedavg import FedAvgBaselineRecipe


class FedProxRecipe(FedAvgBaselineRecipe):
    """FedProx (Li et al., MLSys 2020): FedAvg plus the proximal term (μ/2)·‖w − w_glob‖².

    The FedAvg controller sends μ with every model (NVFlare's ``fedprox_mu`` convention), or under encryption
    :class:`TrainTaskSettings` beside NVFlare's ``ScatterAndGather``; :class:`FedProxExecutor` reads it.

    Args:
        mu: μ > 0 (the MOON paper's best: 0.01 for CIFAR-10, 0.001 for CIFAR-100 and Tiny-ImageNet).
        **kwargs: every :class:`FedAvgBaselineRecipe` argument.
    """

    def __init__(self, *, name: str = "fedprox_cifar10", mu: float = 0.01, **kwargs):
        check_number("mu", mu, low=0, low_inclusive=False)
        self.mu = mu
        super().__init__(name=name, **kwargs)

    def make_executor(self, common_args: Dict[str, Any]) -> Executor:
        return FedProxExecutor(**common_args)

    def controller_args(self) -> Dict[str, Any]:
        return {"fedprox_mu": self.mu}

    def task_meta(self) -> Dict[str, Any]:
        return {AlgorithmConstants.FEDPROX_MU: self.mu}
