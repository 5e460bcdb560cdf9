"""Client executors: thin NVFlare wiring over :mod:`nvflare_moon.core.training`."""

from .fedavg import FedAvgExecutor
from .fedprox import FedProxExecutor
from .fedsiam_da import FedSiamDAExecutor
from .fedssc import FedSSCExecutor
from .moon import MoonExecutor
from .scaffold import ScaffoldExecutor

__all__ = [
    "FedAvgExecutor",
    "MoonExecutor",
    "FedProxExecutor",
    "ScaffoldExecutor",
    "FedSSCExecutor",
    "FedSiamDAExecutor",
]
