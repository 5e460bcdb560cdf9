"""FedSSC's server: weighted FedAvg of the weights plus the class-prototype draw (:mod:`nvflare_moon.core.prototypes`), as
an aggregator for NVFlare's FedAvg controller.

The FedAvg controller replaces the global model's meta with the aggregate's, so the prototypes chosen here reach every
site with the next global model.
"""

from typing import Dict, Tuple

import numpy as np
from nvflare.app_common.abstract.fl_model import FLModel

from ..core.prototypes import CLASS_COUNTS, CLASS_MEANS, select_prototypes, usable_class_means
from ..core.validation import check_flag, check_number
from .aggregators import WeightedFedAvgAggregator

PROTOTYPE_CLASSES = "site_prototype_classes"  # per site, how many classes' prototypes were drawn from it


class PrototypeSharingAggregator(WeightedFedAvgAggregator):
    """Weighted FedAvg, then for every class one prototype drawn from the sites that have enough samples of it.

    For class c the eligible sites are those that sent a finite mean with count ≥ ``min_class_count``; one of them is
    drawn uniformly at random with ``numpy.random.default_rng([seed, round])``, so the draw is reproducible and does
    not depend on the order in which updates arrive. The aggregate's meta gets the K×D float32 ``prototypes``, the K
    bool ``prototype_available`` mask and, for the metrics, ``site_prototype_classes``. Prototypes with NaN/Inf or a
    wrong shape are refused with a warning naming the site; the site's weights are still aggregated.

    Args:
        num_classes: K.
        prototype_dim: D, the size of the projection z (the network's ``out_dim``).
        min_class_count: a site is eligible for a class when it saw at least this many of its samples (paper: 10).
        seed: seed of the draw.
        exclude_own_prototype: a site never gets its own class mean back: the server also draws an alternate from
            another eligible site and sends the drawn sites' names, and the drawn site uses the alternate
            (see :mod:`nvflare_moon.core.prototypes`). Default False: one draw for all, as in the paper's algorithm.
        allow_partial_updates: as for :class:`WeightedFedAvgAggregator`.
    """

    _always_serialize_args = (
        "num_classes",
        "prototype_dim",
        "min_class_count",
        "seed",
        "exclude_own_prototype",
    )

    def __init__(
        self,
        num_classes: int,
        prototype_dim: int = 256,
        min_class_count: int = 10,
        seed: int = 0,
        exclude_own_prototype: bool = False,
        allow_partial_updates: bool = False,
    ):
        super().__init__(allow_partial_updates=allow_partial_updates)
        check_number("num_classes", num_classes, low=1, integer=True)
        check_number("prototype_dim", prototype_dim, low=1, integer=True)
        check_number("min_class_count", min_class_count, low=1, integer=True)
        check_number("seed", seed, low=0, integer=True)
        check_flag("exclude_own_prototype", exclude_own_prototype)
        self.num_classes = num_classes
        self.prototype_dim = prototype_dim
        self.min_class_count = min_class_count
        self.seed = seed
        self.exclude_own_prototype = exclude_own_prototype
        self._class_means: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}

    def accept_model(self, model: FLModel) -> bool:
        if not super().accept_model(model):
            return False
        meta = model.meta or {}
        site = meta.get("client_name", "unknown site")
        if CLASS_MEANS not in meta:
            self.warning(f"round {self._round()}: {site} sent no class means (is it a FedSSC client?)")
            return True
        means, counts, problems = usable_class_means(
            meta[CLASS_MEANS], meta.get(CLASS_COUNTS), self.num_classes, self.prototype_dim
        )
        for problem in problems:
            self.warning(f"round {self._round()}: refused prototypes of {site}: {problem}")
        self._class_means[site] = (means, counts)
        return True

    def aggregate_model(self) -> FLModel:
        uploads = dict(self._class_means)  # the base class resets the round's state
        round_number = int(self._round() or 0)
        result = super().aggregate_model()
        shared = select_prototypes(
            uploads,
            self.num_classes,
            self.prototype_dim,
            self.min_class_count,
            np.random.default_rng([self.seed, round_number]),
            self.exclude_own_prototype,
        )
        result.meta.update(shared.meta())
        result.meta[PROTOTYPE_CLASSES] = {
            site: sum(source == site for source in shared.sources.values()) for site in result.meta["site_weights"]
        }
        self.info(
            f"round {round_number}: shared prototypes for {int(shared.available.sum())} of {self.num_classes} classes "
            f"(class: source site) {shared.sources}"
        )
        return result

    def reset_stats(self):
        super().reset_stats()
        self._class_means = {}
