"""The recipes' privacy and bandwidth options: NVFlare's quantization and privacy filters wired into a job, and the
refusal of a combination that a method cannot support (``docs/deployment.md``, "Privacy and bandwidth").

* ``quantization``: NVFlare's ``ModelQuantizer`` (:mod:`nvflare_moon.filters.quantization`: integer entries pass) on what leaves the server and the sites, ``ModelDequantizer`` on what
  arrives, for every task. Only the weights are quantized; what travels in the meta (FedSSC's prototypes, SCAFFOLD's
  controls) and everything a site keeps stays in full precision.
* ``privacy_filters``: NVFlare's ``PercentilePrivacy``, ``SVTPrivacy`` and ``ExcludeVars`` on the sites' train
  results, in the order given and before the quantizer. The first two are made for weight differences, so with them
  the executors send w_local − w_global; with ``ExcludeVars`` the aggregator accepts updates that lack the excluded
  entries (:class:`~nvflare_moon.server.WeightedFedAvgAggregator`).
"""

from typing import Dict, List, Optional, Sequence

from nvflare.apis.filter import Filter
from nvflare.app_common.filters import ExcludeVars, PercentilePrivacy, SVTPrivacy
from nvflare.app_opt.pt.quantization.constant import QUANTIZATION_TYPE
from nvflare.recipe.spec import Recipe

from ..core.validation import check_optional_choice

QUANTIZATION_CHOICES = tuple(q.lower() for q in QUANTIZATION_TYPE)
PRIVACY_FILTERS = (PercentilePrivacy, SVTPrivacy, ExcludeVars)
DIFF_FILTERS = (PercentilePrivacy, SVTPrivacy)  # they threshold and clip |Δw|: full weights would be destroyed

# why a method cannot take an option: option -> reason, per method (the recipes' ``option_limits``)
SCAFFOLD_LIMITS = {
    "privacy_filters": (
        "SCAFFOLD's control difference Δc_i = (w_global − w_local)/(K·lr) − c travels in the update's meta, which "
        "the filters do not touch, so the site's whole update would still reach the server unfiltered"
    ),
}


def check_quantization(quantization: Optional[str]) -> None:
    """Raise ValueError unless ``quantization`` is None or one of NVFlare's types whose filters import here."""
    check_optional_choice(
        "quantization",
        quantization,
        QUANTIZATION_CHOICES,
        module="nvflare.app_opt.pt.quantization.quantizer",
        needs="NVFlare's quantization filters, which need bitsandbytes (pip install 'nvflare-moon[compression]')",
    )


def check_privacy_filters(privacy_filters: Optional[Sequence[Filter]]) -> List[Filter]:
    """The filters as a list; ValueError for anything but NVFlare's PercentilePrivacy, SVTPrivacy and ExcludeVars,
    whose effect on an update our aggregators know."""
    filters = list(privacy_filters or [])
    for f in filters:
        if not isinstance(f, PRIVACY_FILTERS):
            raise ValueError(
                "privacy_filters takes instances of NVFlare's "
                f"{', '.join(c.__name__ for c in PRIVACY_FILTERS)}, got {f!r}; add other filters with "
                "recipe.add_client_output_filter and make sure the aggregator accepts what they send"
            )
        if isinstance(f, ExcludeVars) and not isinstance(f.exclude_vars, list):
            # ExcludeVars compiles a string to a regex at construction, which the job exporter cannot write back
            raise ValueError(
                "privacy_filters: give ExcludeVars a list of entry names (e.g. [n for n in model.state_dict() if "
                f"n.startswith('l3')]), got {f.exclude_vars!r}"
            )
    return filters


def refuse_unsupported(method: str, options: Dict[str, object], limits: Dict[str, str]) -> None:
    """ValueError naming the option and the method when an option that is set (not None, not empty) is in
    ``limits``."""
    for option, value in options.items():
        if value not in (None, [], ()) and option in limits:
            shown = [type(v).__name__ for v in value] if isinstance(value, (list, tuple)) else repr(value)
            raise ValueError(f"{option}={shown} cannot be used with {method}: {limits[option]}")


def sends_weight_diff(privacy_filters: Sequence[Filter]) -> bool:
    return any(isinstance(f, DIFF_FILTERS) for f in privacy_filters)


def withholds_entries(privacy_filters: Sequence[Filter]) -> bool:
    return any(isinstance(f, ExcludeVars) for f in privacy_filters)


def add_update_filters(
    recipe: Recipe,
    quantization: Optional[str],
    privacy_filters: Sequence[Filter],
    train_task: str,
    other_tasks: Sequence[str],
) -> None:
    """Add the privacy filters to the sites' ``train_task`` results, then the quantization filters on both sides of
    ``train_task`` and ``other_tasks`` (validation, cross-site evaluation's model submission).

    NVFlare looks filters up by exact task name, and a task may be in one filter chain per direction only: hence one
    chain for the train task and one for the others, each with its own quantizer.
    """
    for f in privacy_filters:
        recipe.add_client_output_filter(f, tasks=[train_task])
    if quantization is None:
        return
    from .quantization import FloatModelDequantizer, FloatModelQuantizer

    for tasks in ([train_task], list(other_tasks)):
        recipe.add_server_output_filter(FloatModelQuantizer(quantization_type=quantization), tasks=tasks)
        recipe.add_client_input_filter(FloatModelDequantizer(), tasks=tasks)
        recipe.add_client_output_filter(FloatModelQuantizer(quantization_type=quantization), tasks=tasks)
        recipe.add_server_input_filter(FloatModelDequantizer(), tasks=tasks)
