"""Client executors: thin NVFlare wiring over :mod:`nvflare_moon.training`."""

from .fedavg import FedAvgExecutor
from .moon import MoonExecutor

__all__ = ["FedAvgExecutor", "MoonExecutor"]
