"""Recipes in NVFlare 2.9's style: one object describes a whole job, which runs in an ``ExecEnv`` or is exported.

    recipe = MoonRecipe(min_clients=10, num_rounds=100, data_root="/data")
    recipe.execute(SimEnv(num_clients=10, num_threads=4))      # or: recipe.export("jobs/moon_cifar10")

Every recipe builds the same server (NVFlare's ``FedAvg`` controller, or :class:`SampledFedAvg` with
``sample_fraction < 1``, with our weighted aggregator, a ``PTFileModelPersistor`` and the once-per-round
:class:`GlobalModelEvaluator`) and differs in the client executor and, for SCAFFOLD, FedProx and FedSSC, in what the
server sends beside the model (FedSiam-DA also changes how the aggregator combines the models).
The committed folders in ``jobs/`` are exported from these recipes (``python -m nvflare_moon.ops.export_jobs``).

Every recipe is a PyTorch recipe to NVFlare's helpers (``framework``, and the persistor's id in ``_job.comp_ids``),
its executors answer ``validate`` and ``submit_model``, and its clients forward analytics events to the server, so::

    add_cross_site_evaluation(recipe)             # nvflare.recipe.utils: every site's row for every model
    add_experiment_tracking(recipe, "mlflow")     # the sites' metrics, streamed through NVFlare

One module per method (``moon.py`` holds :class:`MoonRecipe`, :class:`MoonScriptRecipe` and :data:`MOON_MU`); the
Client API recipes are the ``*ScriptRecipe`` classes.
"""

from .data_check import DATA_CHECK_PER_SITE_KEYS, DataCheckRecipe
from .fedavg import PER_SITE_KEYS, FedAvgBaselineRecipe
from .fedprox import FedProxRecipe
from .fedsiam_da import FedSiamDARecipe, FedSiamDAScriptRecipe
from .fedssc import FedSSCRecipe, FedSSCScriptRecipe
from .moon import MOON_MU, MoonRecipe, MoonScriptRecipe
from .scaffold import ScaffoldRecipe, ScaffoldScriptRecipe
from .script import ClientAPIRecipe

__all__ = [
    "MOON_MU",
    "PER_SITE_KEYS",
    "DATA_CHECK_PER_SITE_KEYS",
    "FedAvgBaselineRecipe",
    "MoonRecipe",
    "FedProxRecipe",
    "ScaffoldRecipe",
    "FedSSCRecipe",
    "FedSiamDARecipe",
    "ClientAPIRecipe",
    "MoonScriptRecipe",
    "FedSSCScriptRecipe",
    "FedSiamDAScriptRecipe",
    "ScaffoldScriptRecipe",
    "DataCheckRecipe",
]
