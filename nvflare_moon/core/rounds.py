"""What a method adds to FedAvg's local round, as one object per round; FedAvg's and FedProx's own.

Every method's round object (:class:`FedAvgRound`, :class:`FedProxRound`, :class:`~.moon.MoonRound`,
:class:`~.fedssc.FedSSCRound`, :class:`~.fedsiam_da.FedSiamDARound`, :class:`~.scaffold.PersistentScaffoldRound`)
has the same five members, which the executors' training loop calls (:class:`~nvflare_moon.executors.FedAvgExecutor`)
and the Client API helpers wrap for a user's own loop:

- ``start(round_number, meta) -> objective``: once the global weights are in the network; ``meta`` is what the
  server sent beside them. Raises ValueError, with the reason, to refuse the round;
- ``before_epoch(epoch)`` and ``after_step()``: during training;
- ``finish() -> dict``: once training succeeded: saves the site's state and returns what to send in the reply's meta;
- ``keeps_local_model``: whether the state it saves holds the whole trained model (then no second copy is stored,
  and its ``uploads`` (:class:`~.previous_uploads.StoredUploads`) give that model back for cross-site evaluation).
"""

from typing import Any, Dict, Mapping, Optional

import torch.nn as nn
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.utils.fedprox_utils import get_fedprox_mu

from .objectives import CrossEntropyObjective, FedProxObjective
from .training import frozen_copy


class FedAvgRound:
    """FedAvg's round: CE, no state, nothing beside the weights."""

    keeps_local_model = False

    def start(self, round_number: int, meta: Optional[Mapping[str, Any]] = None) -> CrossEntropyObjective:
        return CrossEntropyObjective()

    def before_epoch(self, epoch: int) -> None:
        pass

    def after_step(self) -> None:
        pass

    def finish(self) -> Dict[str, Any]:
        return {}


class FedProxRound(FedAvgRound):
    """FedProx's round: CE + (μ/2)·‖w − w_glob‖², with μ from the server (NVFlare's ``meta["fedprox_mu"]``).

    Args:
        network: the local network, holding the round's global weights at :meth:`start`.
    """

    def __init__(self, network: nn.Module):
        self.network = network

    def start(self, round_number: int, meta: Optional[Mapping[str, Any]] = None) -> FedProxObjective:
        try:
            mu = get_fedprox_mu(FLModel(params={}, meta=dict(meta or {})))
        except ValueError as e:
            raise ValueError(f"{e} Run this executor with FedProxRecipe (NVFlare's FedAvg with fedprox_mu).") from e
        return FedProxObjective(self.network, frozen_copy(self.network), mu)
