"""FedSSC: MOON plus class prototypes that the server draws from the sites and sends back (the FedSSC paper)."""

from ..client import PTFedSSCHelper
from ..core.fedssc import FedSSCSettings
from ..executors import FedSSCExecutor
from ..recipes import FedSSCRecipe, FedSSCScriptRecipe
from . import Method

METHOD = Method(
    name="fedssc",
    label="FedSSC",
    paper="FedSSC: Shared Supervised-Contrastive Federated Learning",
    recipe=FedSSCRecipe,
    executor=FedSSCExecutor,
    helper=PTFedSSCHelper,
    script_recipe=FedSSCScriptRecipe,
    settings=FedSSCSettings,
    jobs={"fedssc_cifar10": lambda: FedSSCRecipe(name="fedssc_cifar10", mu=5.0, mu_glob=1.0, temperature=0.5)},
    benchmark={"fedssc": ("FedSSC", {})},
)
