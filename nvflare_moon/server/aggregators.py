"""Aggregators for NVFlare's ``FedAvg`` controller (``ModelAggregator``: accept one site's result at a time)."""

from typing import Dict, List, NamedTuple

import numpy as np
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.abstract.model import ModelLearnableKey
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.app_constant import AppConstants

from ..core.aggregation import NUM_SAMPLES, full_update, normalized_weights, update_problem, weighted_average
from ..core.site_metrics import weighted_metric_means
from ..core.validation import check_flag


class SiteUpdate(NamedTuple):
    num_samples: float
    params: Dict[str, np.ndarray]
    metrics: Dict[str, float]


class WeightedFedAvgAggregator(ModelAggregator):
    """Weighted FedAvg over the sites that answered: ``w = Σ_k (n_k / Σ_j n_j)·w_k``, n_k the site's sample count.

    Updates with NaN/Inf, or whose keys or shapes differ from the round's global model, are rejected with a warning
    naming the site; the round goes on with the others (the controller fails the round if none is left). The result's
    ``metrics`` are the weighted means of the sites' metrics, each over the sites that report it (a site without local
    test data sends no local accuracy), and its ``meta`` holds each site's metrics and weight for logging.

    What NVFlare's task-result filters make of an update is accepted as follows (``docs/deployment.md``, "Privacy
    and bandwidth"): dequantized weights are plain weights; a weight difference (``params_type`` DIFF, what the
    executors send for ``PercentilePrivacy`` and ``SVTPrivacy``) is added to the round's global model before the
    checks' last step and the averaging; an update that lacks keys (``ExcludeVars``) is accepted only with
    ``allow_partial_updates``, its missing entries counting as unchanged (the global model's value).

    Args:
        allow_partial_updates: accept updates that lack some of the global model's keys.
    """

    def __init__(self, allow_partial_updates: bool = False):
        super().__init__()
        check_flag("allow_partial_updates", allow_partial_updates)
        self.allow_partial_updates = allow_partial_updates
        self._updates: Dict[str, SiteUpdate] = {}

    def accept_model(self, model: FLModel) -> bool:
        meta = model.meta or {}
        site = meta.get("client_name", "unknown site")
        num_samples = meta.get(NUM_SAMPLES)
        params = model.params or {}
        global_params = self._global_params()
        reference = global_params if global_params is not None else self._first_update_params()
        is_diff = model.params_type == ParamsType.DIFF
        problem = update_problem(params, reference, self.allow_partial_updates)
        if problem is not None and reference is not None and set(params) < set(reference):
            problem += "; sites that withhold layers on purpose (ExcludeVars) need allow_partial_updates=True"
        if problem is None and global_params is None and (is_diff or self.allow_partial_updates):
            problem = "a weight difference or a partial update needs the round's global model, which is not available"
        if problem is None and not (isinstance(num_samples, (int, float, np.number)) and 0 < num_samples < np.inf):
            problem = f"meta[{NUM_SAMPLES!r}] must be a positive number, got {num_samples!r}"
        if problem is None and (is_diff or set(params) != set(global_params or params)):
            params = full_update(params, global_params, is_diff)
            problem = update_problem(params, global_params)  # global + difference can overflow to Inf
        if problem is not None:
            self.warning(f"rejected the update of {site} in round {self._round()}: {problem}")
            return False
        metrics = {k: float(v) for k, v in (model.metrics or {}).items() if isinstance(v, (int, float, np.number))}
        self._updates[site] = SiteUpdate(float(num_samples), params, metrics)
        return True

    def _global_params(self):
        """The round's global model's weights, which NVFlare's controllers keep in the run context, or None (a bare
        aggregator)."""
        global_model = self.initial_model()
        if global_model is not None and global_model.get(ModelLearnableKey.WEIGHTS):
            return global_model[ModelLearnableKey.WEIGHTS]
        return None

    def _first_update_params(self):
        """Without a global model, what every update must match in keys and shapes: the first accepted this round."""
        return next(iter(self._updates.values())).params if self._updates else None

    def initial_model(self):
        """The job's initial model (a ``ModelLearnable``: weights and meta) as the controller loaded it, or None."""
        global_model = self.fl_ctx.get_prop(AppConstants.GLOBAL_MODEL) if self.fl_ctx else None
        if global_model is None and self.fl_ctx is not None and self.fl_ctx.get_engine() is not None:
            with self.fl_ctx.get_engine().new_context() as ctx:
                global_model = ctx.get_prop(AppConstants.GLOBAL_MODEL)
        return global_model

    def aggregate_model(self) -> FLModel:
        if self._run_aborted():
            # NVFlare's FedAvg looks at the abort signal only while a task stands: a site's failed reply that ends
            # the round's last task (and panics the job) would otherwise be followed by an aggregate of the others
            raise RuntimeError(f"round {self._round()}: not aggregated, the job is ending; see the errors above")
        if not self._updates:
            raise RuntimeError(f"round {self._round()}: no valid update to aggregate; see the warnings above")
        sites = sorted(self._updates)
        weights = normalized_weights([self._updates[s].num_samples for s in sites])
        params = self.combine([self._updates[s].params for s in sites], weights)
        site_metrics = {s: self._updates[s].metrics for s in sites}
        self.info(f"round {self._round()}: aggregated {len(sites)} sites, weights {dict(zip(sites, weights.round(4)))}")
        result = FLModel(
            params=params,
            params_type=ParamsType.FULL,
            metrics=weighted_metric_means(site_metrics, dict(zip(sites, weights))),
            meta={"site_metrics": site_metrics, "site_weights": {s: float(w) for s, w in zip(sites, weights)}},
        )
        self.reset_stats()
        return result

    def combine(self, models: List[Dict[str, np.ndarray]], weights: np.ndarray) -> Dict[str, np.ndarray]:
        """The aggregate of the accepted models; other aggregators change only this."""
        return weighted_average(models, weights)

    def reset_stats(self):
        self._updates = {}

    def _run_aborted(self) -> bool:
        """Whether the job is ending (a panic triggers the run's abort signal, which the run's context carries)."""
        signal = self.fl_ctx.get_run_abort_signal() if self.fl_ctx else None
        return bool(signal is not None and signal.triggered)

    def _round(self):
        return self.fl_ctx.get_prop(AppConstants.CURRENT_ROUND) if self.fl_ctx else None
