"""SCAFFOLD's server side as an aggregator for NVFlare's FedAvg controller.

The model is the weighted FedAvg of :class:`WeightedFedAvgAggregator`; besides it, the aggregator keeps the global
control c and updates it with the sites' Δc_i (``meta["scaffold_c_diff"]``, NVFlare's SCAFFOLD format):
``c ← c + Σ_{i∈S} Δc_i / N`` (:func:`nvflare_moon.core.scaffold.apply_control_deltas`). The aggregate's meta carries c as
``meta["scaffold_c_global"]``; the FedAvg controller sends the aggregate's meta with the next model, so clients
receive it, and the persistor stores it in ``FL_global_model.pt`` (``meta_props``).

Unlike NVFlare's ``Scaffold`` controller (which averages Δc_i weighted by steps over the sampled sites), this follows
the SCAFFOLD paper and the NIID-Bench code: the sum over the sampled sites divided by the number of all sites, so c
stays the mean of every site's control under partial participation. It works with any FedAvg-based controller,
hence with :class:`SampledFedAvg` and the global evaluation.
"""

from typing import Dict, Optional

import numpy as np
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.abstract.model import ModelLearnableKey
from nvflare.app_common.app_constant import AlgorithmConstants

from ..core.scaffold import apply_control_deltas
from ..core.validation import check_number
from .aggregators import WeightedFedAvgAggregator


class ScaffoldAggregator(WeightedFedAvgAggregator):
    """Weighted FedAvg of the weights plus SCAFFOLD's global control update.

    Args:
        num_sites: N, the number of sites the control is averaged over; None takes the number of clients
            connected to the server.
    """

    def __init__(self, num_sites: Optional[int] = None):
        super().__init__()
        if num_sites is not None:
            check_number("num_sites", num_sites, low=1, integer=True)
        self.num_sites = num_sites
        self._global_control: Optional[Dict[str, np.ndarray]] = None  # None: not yet read from the initial model
        self._deltas: Dict[str, Dict[str, np.ndarray]] = {}

    def accept_model(self, model: FLModel) -> bool:
        meta = model.meta or {}
        site = meta.get("client_name", "unknown site")
        delta = meta.get(AlgorithmConstants.SCAFFOLD_CTRL_DIFF)
        problem = self._delta_problem(delta, model.params or {})
        if problem is not None:
            self.warning(f"rejected the update of {site} in round {self._round()}: {problem}")
            return False
        if not super().accept_model(model):
            return False
        self._deltas[site] = delta
        return True

    def aggregate_model(self) -> FLModel:
        deltas = [self._deltas[site] for site in sorted(self._deltas)]
        result = super().aggregate_model()
        num_sites = self.num_sites or len(self.fl_ctx.get_engine().get_clients())
        if self._global_control is None:
            self._global_control = self._initial_control()
        self._global_control = apply_control_deltas(self._global_control, deltas, num_sites)
        result.meta[AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL] = self._global_control
        self.info(f"round {self._round()}: SCAFFOLD control updated with {len(deltas)} of {num_sites} sites' deltas")
        return result

    def reset_stats(self):
        super().reset_stats()
        self._deltas = {}

    def _initial_control(self) -> Dict[str, np.ndarray]:
        """c as the initial model brought it (a continued job's checkpoint), else zeros (empty)."""
        meta = (self.initial_model() or {}).get(ModelLearnableKey.META) or {}
        control = meta.get(AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL)
        if control:
            self.info(f"round {self._round()}: continuing from the SCAFFOLD control in the initial model's meta")
        return dict(control or {})

    @staticmethod
    def _delta_problem(delta, params) -> Optional[str]:
        key = AlgorithmConstants.SCAFFOLD_CTRL_DIFF
        if not isinstance(delta, dict) or not delta:
            return f"meta[{key!r}] is missing or empty; is the client a SCAFFOLD client (ScaffoldExecutor)?"
        for name, value in delta.items():
            value = np.asarray(value)
            if name not in params or value.shape != np.shape(params[name]):
                return f"meta[{key!r}] entry {name!r} does not match a model parameter"
            if not np.all(np.isfinite(value)):
                return f"meta[{key!r}] entry {name!r} holds NaN or Inf"
        return None
