"""Client executors: thin NVFlare wiring over :mod:`nvflare_moon.core.training`."""

from .data_check import DataCheckExecutor
from .fedavg import FedAvgExecutor
from .fedprox import FedProxExecutor
from .fedsiam_da import FedSiamDAExecutor
from .fedssc import FedSSCExecutor
from .moon import MoonExecutor
from .scaffold import ScaffoldExecutor

__all__ = [
    "FedAvgExecutor",
    "DataCheckExecutor",
    "MoonExecutor",
    "FedProxExecutor",
    "ScaffoldExecutor",
    "FedSSCExecutor",
    "FedSiamDAExecutor",
]
