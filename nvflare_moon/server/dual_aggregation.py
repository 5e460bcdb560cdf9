"""FedSiam-DA's server: dual aggregation (:mod:`nvflare_moon.core.dual_aggregation`) as an aggregator for NVFlare's
FedAvg controller."""

from typing import List, Optional

import numpy as np
from nvflare.app_common.abstract.fl_model import FLModel

from ..core.aggregation import Params
from ..core.dual_aggregation import VECTORS, DualAggregation, dual_aggregate
from ..core.validation import check_choice, check_number
from .aggregators import WeightedFedAvgAggregator

DUAL_WEIGHTS = "site_dual_weights"  # ξ_k per site; "site_" keys reach TensorBoard and global_metrics.jsonl
DUAL_COSINES = "site_dual_cosines"  # cos(vec(w_k), vec(w_f0)) per site, before clamping


class DualAggregator(WeightedFedAvgAggregator):
    """Weighted FedAvg w_f0, then w_f = Σ_k ξ_k·w_k with ξ_k ∝ cos(vec(w_k), vec(w_f0)); integer buffers from w_f0.

    Every round's ξ_k and cosines are logged and put in the aggregate's meta (``site_dual_weights``,
    ``site_dual_cosines``), from where the global evaluator writes them to TensorBoard and ``global_metrics.jsonl``.
    A non-positive cosine is clamped to ``cosine_floor`` with a warning naming the site.

    Args:
        cosine_floor: ε > 0, the weight numerator of a site whose cosine is ≤ 0.
        cosine_vector: what vec(w) holds: ``"state"`` (default) every float entry of the state dict, BatchNorm running
            statistics included; ``"parameters"`` without them (see :mod:`nvflare_moon.core.dual_aggregation`).
        allow_partial_updates: as for :class:`WeightedFedAvgAggregator` (a withheld entry counts as the global's).
    """

    _always_serialize_args = ("cosine_floor", "cosine_vector")  # visible in job configs

    def __init__(self, cosine_floor: float = 1e-6, cosine_vector: str = "state", allow_partial_updates: bool = False):
        super().__init__(allow_partial_updates=allow_partial_updates)
        check_number("cosine_floor", cosine_floor, low=0, low_inclusive=False)
        check_choice("cosine_vector", cosine_vector, VECTORS)
        self.cosine_floor = cosine_floor
        self.cosine_vector = cosine_vector
        self._dual: Optional[DualAggregation] = None

    def combine(self, models: List[Params], weights: np.ndarray) -> Params:
        self._dual = dual_aggregate(models, weights, self.cosine_floor, self.cosine_vector)
        return self._dual.params

    def aggregate_model(self) -> FLModel:
        sites = sorted(self._updates)  # the order in which the base class hands the models to combine()
        result = super().aggregate_model()
        dual, round_number = self._dual, self._round()
        for site, cosine in zip(np.array(sites)[dual.clamped], dual.cosines[dual.clamped]):
            self.warning(
                f"round {round_number}: the model of {site} has cosine {cosine:.4g} with the FedAvg model; "
                f"its dual-aggregation weight is clamped to ε={self.cosine_floor}"
            )
        result.meta[DUAL_WEIGHTS] = {s: float(x) for s, x in zip(sites, dual.xi)}
        result.meta[DUAL_COSINES] = {s: float(c) for s, c in zip(sites, dual.cosines)}
        self.info(
            f"round {round_number}: dual aggregation ξ "
            + ", ".join(f"{s} {x:.4f} (cos {c:.4f})" for s, x, c in zip(sites, dual.xi, dual.cosines))
        )
        return result
