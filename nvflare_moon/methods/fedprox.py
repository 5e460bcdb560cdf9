"""FedProx (Li et al., MLSys 2020): CE + (μ/2)·‖w − w_glob‖², μ from the server (NVFlare's ``fedprox_mu``)."""

from ..executors import FedProxExecutor
from ..recipes import FedProxRecipe
from . import Method

METHOD = Method(
    name="fedprox",
    label="FedProx",
    paper="Li et al., MLSys 2020",
    recipe=FedProxRecipe,
    executor=FedProxExecutor,
    jobs={"fedprox_cifar10": lambda: FedProxRecipe(name="fedprox_cifar10", mu=0.01)},
    benchmark={"fedprox": ("FedProx", {})},
)
