"""FedSiam-DA: a SimSiam-style contrast with the global model, and the server's dual aggregation."""

from ..client import PTFedSiamDAHelper
from ..core.fedsiam_da import FedSiamDASettings
from ..executors import FedSiamDAExecutor
from ..recipes import FedSiamDARecipe, FedSiamDAScriptRecipe
from . import Method

METHOD = Method(
    name="fedsiam_da",
    label="FedSiam-DA",
    paper="FedSiam-DA: Dual-aggregated Federated Learning via Siamese Network under Non-IID Data",
    recipe=FedSiamDARecipe,
    executor=FedSiamDAExecutor,
    helper=PTFedSiamDAHelper,
    script_recipe=FedSiamDAScriptRecipe,
    settings=FedSiamDASettings,
    jobs={"fedsiam_da_cifar10": lambda: FedSiamDARecipe(name="fedsiam_da_cifar10", mu=0.01, history="epoch")},
    benchmark={"fedsiam_da": ("FedSiam-DA", {})},
)
