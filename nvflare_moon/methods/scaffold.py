"""SCAFFOLD (Karimireddy et al., ICML 2020), option II, with the site's control c_i persisted between rounds."""

from ..client import PTPersistentScaffoldHelper
from ..executors import ScaffoldExecutor
from ..recipes import ScaffoldRecipe, ScaffoldScriptRecipe
from . import Method

METHOD = Method(
    name="scaffold",
    label="SCAFFOLD",
    paper="Karimireddy et al., ICML 2020",
    recipe=ScaffoldRecipe,
    executor=ScaffoldExecutor,
    helper=PTPersistentScaffoldHelper,
    script_recipe=ScaffoldScriptRecipe,
    jobs={"scaffold_cifar10": lambda: ScaffoldRecipe(name="scaffold_cifar10")},
    benchmark={
        "scaffold": ("SCAFFOLD", {}),
        # the one SCAFFOLD setting the MOON paper leaves unstated: NIID-Bench's --rho defaults to 0 (issue 40)
        "scaffold_momentum0": ("SCAFFOLD, momentum 0", {"momentum": 0.0}),
    },
)
