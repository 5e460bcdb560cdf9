"""FedBN (Li et al., ICLR 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization"), whole
in this module: the round, its executor, recipe and Client API helper, and its registration.

Every site keeps its own BatchNorm layers: after the global weights are loaded, the BatchNorm entries (affine weight
and bias, running mean and variance, batch count) that the site saved at the end of its last round replace the
received ones; everything else is FedAvg. It suits sites whose images differ in their features (scanners, stains,
protocols) more than in their labels. The sites still upload their BatchNorm entries, so the server's global model
(its evaluation, the model a new site starts from) holds their weighted mean; no site trains on it after its first
round. A network without BatchNorm layers (``arch="simple_cnn"``) is refused: FedBN would be FedAvg.

    recipe = FedBNRecipe(min_clients=2, arch="resnet18", dataset="image_folder", site_data={...})

In a Client API script::

    fedbn = PTFedBNHelper(model)
    input_model = flare.receive(); model.load_state_dict(...)
    fedbn.start_round(input_model)              # the site's own BatchNorm entries back into the model
    ... train ...
    fedbn.finish()                              # saved for the next round
"""

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

import torch.nn as nn
from nvflare.apis.fl_context import FLContext

from ..client.common import check_received_weights, site_identity
from ..client.state import script_state_store
from ..core.objectives import CrossEntropyObjective
from ..core.rounds import FedAvgRound
from ..core.validation import check_module
from ..executors import FedAvgExecutor
from ..recipes import FedAvgBaselineRecipe
from . import Method

STATE_NAME = "fedbn_state"
logger = logging.getLogger(__name__)


def batch_norm_entries(network: nn.Module) -> List[str]:
    """The state-dict names of every BatchNorm layer's entries in ``network`` (parameters and buffers), in order."""
    names = []
    for prefix, module in network.named_modules():
        if isinstance(module, nn.modules.batchnorm._NormBase):
            names += [f"{prefix}.{name}" if prefix else name for name in module.state_dict()]
    return names


def check_has_batch_norm(network: nn.Module) -> None:
    """Raise ValueError, naming the fix, when ``network`` has no BatchNorm layer."""
    if not batch_norm_entries(network):
        arch = getattr(network, "arch", type(network).__name__)
        raise ValueError(
            f"FedBN keeps each site's BatchNorm layers, and the network ({arch}) has none: choose an arch with "
            "BatchNorm (arch='resnet18', 'resnet50', 'densenet121', ...) or run FedAvg"
        )


class FedBNRound(FedAvgRound):
    """FedBN's round: CE on the global weights with the site's own BatchNorm entries.

    Args:
        network: the local network, holding the round's global weights at :meth:`start`.
        store: the site's state store (``load``, ``save``, ``set_aside``; see :mod:`nvflare_moon.core.state`).
        site: the site's name, for the log.
    """

    def __init__(self, network: nn.Module, store, site: str):
        check_has_batch_norm(network)
        self.network = network
        self.store = store
        self.site = site
        self.round_number: Optional[int] = None

    def start(self, round_number: int, meta: Optional[Mapping[str, Any]] = None) -> CrossEntropyObjective:
        record = self.store.load()
        if record is not None:
            own = record["payload"]["batch_norm"]
            expected = {name: self.network.state_dict()[name].shape for name in batch_norm_entries(self.network)}
            if {name: tensor.shape for name, tensor in own.items()} != expected:
                raise self.store.set_aside("other-network", "its BatchNorm entries do not match this network's")
            self.network.load_state_dict(own, strict=False)
            logger.info(
                f"{self.site}: round {round_number} starts from its own BatchNorm entries of round "
                f"{record['round']} ({len(own)} tensors)"
            )
        self.round_number = round_number
        return CrossEntropyObjective()

    def finish(self) -> Dict[str, Any]:
        state = self.network.state_dict()
        own = {name: state[name].detach().cpu().clone() for name in batch_norm_entries(self.network)}
        self.store.save(self.round_number, {"batch_norm": own})
        return {}


class FedBNExecutor(FedAvgExecutor):
    """FedBN: FedAvg with every site's own BatchNorm layers; all :class:`FedAvgExecutor` arguments apply."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        check_has_batch_norm(self.model)

    def make_round(self, fl_ctx: FLContext) -> FedBNRound:
        return FedBNRound(self._net, self.job_state(STATE_NAME, fl_ctx), fl_ctx.get_identity_name())


@dataclass(eq=False, kw_only=True)
class FedBNRecipe(FedAvgBaselineRecipe):
    """FedBN on the MOON network: every :class:`FedAvgBaselineRecipe` argument, with ``arch`` one that has BatchNorm
    (default ``"resnet18"``)."""

    name: str = "fedbn"
    arch: str = "resnet18"

    def make_executor(self, common_args: Dict[str, Any]) -> FedBNExecutor:
        return FedBNExecutor(**common_args)


class PTFedBNHelper:
    """FedBN for a Client API script: keeps the site's BatchNorm entries in the job's run folder between rounds.
    Any FedAvg job runs it (NVFlare's ``FedAvgRecipe``): the server side is FedAvg's.

    Args:
        model: the network being trained (with BatchNorm layers).
        state_dir, job_id, site: as for :class:`~nvflare_moon.client.PTMoonHelper`.
    """

    def __init__(
        self,
        model: nn.Module,
        state_dir: Optional[str] = None,
        job_id: Optional[str] = None,
        site: Optional[str] = None,
    ):
        check_module("model", model)
        check_has_batch_norm(model)
        self.model = model
        self.state_dir = state_dir
        self.job_id = job_id
        self.site = site
        self.round: Optional[FedBNRound] = None

    def start_round(self, input_model) -> None:
        """Begin a round on ``input_model``, whose weights ``model`` holds: the site's BatchNorm entries go back in."""
        check_received_weights(self.model, input_model.params, type(self).__name__)
        if self.round is None:
            job_id, site = site_identity(self.job_id, self.site, type(self).__name__)
            store = script_state_store(STATE_NAME, job_id, site, self.state_dir)
            self.round = FedBNRound(self.model, store, site)
        self.round.start(input_model.current_round or 0, input_model.meta)

    def finish(self) -> Dict[str, Any]:
        """Save the site's BatchNorm entries after training; nothing to send beside the weights."""
        if self.round is None or self.round.round_number is None:
            raise RuntimeError("call PTFedBNHelper.start_round(input_model) at the start of every round")
        return self.round.finish()


METHOD = Method(
    name="fedbn",
    label="FedBN",
    paper="Li et al., ICLR 2021",
    recipe=FedBNRecipe,
    executor=FedBNExecutor,
    helper=PTFedBNHelper,
    benchmark={"fedbn": ("FedBN", {})},
)
