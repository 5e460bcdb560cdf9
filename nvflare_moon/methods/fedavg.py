"""FedAvg (McMahan et al., AISTATS 2017) on the MOON network, the papers' baseline: CE, no state."""

from ..executors import FedAvgExecutor
from ..recipes import FedAvgBaselineRecipe
from . import Method

METHOD = Method(
    name="fedavg",
    label="FedAvg",
    paper="McMahan et al., AISTATS 2017",
    recipe=FedAvgBaselineRecipe,
    executor=FedAvgExecutor,
    jobs={
        "fedavg_cifar10": lambda: FedAvgBaselineRecipe(name="fedavg_cifar10"),
        "fedavg_cifar100": lambda: FedAvgBaselineRecipe(name="fedavg_cifar100", dataset="cifar100", arch="resnet50"),
    },
    benchmark={"fedavg": ("FedAvg", {})},
)
