"""Recipes for Client API scripts that use the helpers of :mod:`nvflare_moon.client`, in NVFlare 2.9's style.

    recipe = MoonScriptRecipe(model=Net(), min_clients=2, num_rounds=20, train_script="client_moon.py", mu=5.0)
    run = recipe.execute(SimEnv(num_clients=2, num_threads=1))

Each is NVFlare's PyTorch :class:`~nvflare.app_opt.pt.recipes.fedavg.FedAvgRecipe`, so every one of its arguments keeps
working (``launch_external_process``, ``launch_once``, ``key_metric``, ``stop_cond``, ``patience``,
``set_per_site_config``, ``add_experiment_tracking``, ``add_cross_site_evaluation``, ...), with our server side: the
FedAvg controller (:class:`~nvflare_moon.server.SettingsFedAvg`) sends the method's settings with every training model
(a method's settings dataclass, e.g. :class:`~nvflare_moon.core.moon.MoonSettings`, in its ``to_meta`` form; keys in
:mod:`nvflare_moon.client.meta`), and the aggregator is ours: weighted FedAvg by the ``num_samples`` each site
sends, refusing bad updates (:class:`~nvflare_moon.server.WeightedFedAvgAggregator`), plus FedSSC's prototype sharing
(:class:`~nvflare_moon.server.PrototypeSharingAggregator`) or FedSiam-DA's dual aggregation
(:class:`~nvflare_moon.server.DualAggregator`). The ``aggregator`` argument is therefore not taken. Every one takes
``quantization`` (NVFlare's quantizer/dequantizer filters on both sides, as the recipes of :mod:`nvflare_moon.recipes`
do; see :mod:`nvflare_moon.privacy`).
They live in :mod:`nvflare_moon.recipes`, one module per method, beside the executors' recipes; this module keeps
their import path.
"""

from .recipes import (  # noqa: F401 (re-exported)
    ClientAPIRecipe,
    FedSiamDAScriptRecipe,
    FedSSCScriptRecipe,
    MoonScriptRecipe,
    ScaffoldScriptRecipe,
)
