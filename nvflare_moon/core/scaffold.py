"""SCAFFOLD's control variates (Karimireddy et al., ICML 2020, option II), on NVFlare's ``PTScaffoldHelper``.

Client, one round, with c the global control and c_i the site's own (both over the trainable parameters):

    after every optimizer step:   w ← w − lr·(c − c_i)
    at the end of the round:      c_i⁺ = c_i − c + (w_glob − w_i) / (steps·lr),   Δc_i = c_i⁺ − c_i

Server, over the sites S that trained this round, N the number of sites:

    c ← c + Σ_{i∈S} Δc_i / N

so that c stays the mean of all N sites' controls, whether or not every site takes part in a round.
Nothing here knows about NVFlare's runtime. :class:`PersistentScaffoldRound` keeps c_i in the site's state store
between rounds, for :class:`~nvflare_moon.executors.ScaffoldExecutor` and
:class:`~nvflare_moon.client.PTPersistentScaffoldHelper` alike.
"""

import logging
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
from nvflare.app_common.app_constant import AlgorithmConstants
from nvflare.app_opt.pt.scaffold import PTScaffoldHelper

from .history import HISTORY_NEEDED, HISTORY_ROUNDS
from .objectives import CrossEntropyObjective
from .state import StateUnusable, tensor_signature
from .training import frozen_copy

logger = logging.getLogger(__name__)

Controls = Dict[str, torch.Tensor]


def trainable_signature(model: nn.Module) -> Dict[str, tuple]:
    """Names, shapes and dtypes of the trainable parameters: what a stored control must match."""
    return tensor_signature({name: p for name, p in model.named_parameters() if p.requires_grad})


class ScaffoldRound:
    """One round of SCAFFOLD on a site; build it after the global weights are loaded into ``model``.

    Args:
        model: the local model, holding the round's global weights.
        lr: the optimizer's learning rate.
        global_control: c as sent by the server (numpy or torch, by parameter name); None means zeros
            (round 0, before the server has aggregated anything).
        local_control: this site's c_i from its previous round; None means zeros (first participation).

    Raises:
        ValueError: a control does not match the model's trainable parameters.
    """

    def __init__(
        self,
        model: nn.Module,
        lr: float,
        global_control: Optional[Mapping] = None,
        local_control: Optional[Mapping] = None,
    ):
        self.model = model
        self.lr = lr
        self.helper = PTScaffoldHelper()
        self.helper.init(model)
        try:
            if global_control is not None:
                self.helper.load_global_controls(global_control)
        except RuntimeError as e:
            raise ValueError(f"the server's SCAFFOLD control does not fit this model: {e}") from e
        if local_control is not None:
            expected = trainable_signature(model)
            got = tensor_signature({k: torch.as_tensor(v) for k, v in local_control.items()})
            if got != expected:
                raise ValueError("the site's SCAFFOLD control does not match the model's trainable parameters")
            self.helper.c_local.load_state_dict({k: torch.as_tensor(v).cpu() for k, v in local_control.items()})
        self.global_model = frozen_copy(model)
        self._c_global, self._c_local = self.helper.get_params()

    def after_step(self) -> None:
        """The correction after every optimizer step: w ← w − lr·(c − c_i)."""
        self.helper.model_update(self.model, self.lr, self._c_global, self._c_local)

    @property
    def steps(self) -> int:
        return self.helper.cnt

    def finish(self) -> Dict[str, np.ndarray]:
        """Update c_i from the round's training and return Δc_i (numpy, for ``FLModel.meta``)."""
        self.helper.terms_update(self.model, self.lr, self._c_global, self._c_local, self.global_model)
        return self.helper.get_delta_controls()

    @property
    def local_control(self) -> Controls:
        """c_i (after :meth:`finish`: c_i⁺), as CPU tensors; the helper's own (no copy: for ResNet-50 each is 113 MB),
        so read or save them, do not modify them."""
        return self.helper.c_local.state_dict()


def controls_before(payload: Mapping[str, Any], round_number: int, model: nn.Module) -> List[Tuple[int, Controls]]:
    """The stored ``(round, c_i after it)`` of the rounds before ``round_number``, oldest first, from a payload of
    :func:`controls_payload`.

    Raises:
        ValueError: the payload holds no round-stamped controls that match ``model``'s trainable parameters.
    """
    rounds, controls = payload.get(HISTORY_ROUNDS), payload.get("local_controls")
    expected = trainable_signature(model)
    if (
        not isinstance(rounds, list)
        or not isinstance(controls, list)
        or len(rounds) != len(controls)
        or any(not isinstance(c, dict) or tensor_signature(c) != expected for c in controls)
    ):
        raise ValueError("its SCAFFOLD controls do not match this job's network (its trainable parameters)")
    return [(r, c) for r, c in zip(rounds, controls) if r < round_number]


def controls_payload(earlier: List[Tuple[int, Controls]], round_number: int, control: Controls) -> Dict[str, Any]:
    """What a site saves after ``round_number``: c_i⁺ and, beside it, the c_i that the round started from, so that a
    continued job that runs this round again starts from the same c_i."""
    keep = (earlier + [(round_number, control)])[-2:]
    return {HISTORY_ROUNDS: [r for r, _ in keep], "local_controls": [c for _, c in keep], HISTORY_NEEDED: 1}


class PersistentScaffoldRound:
    """One SCAFFOLD round on one site in NVFlare's message format (``meta["scaffold_c_global"]`` in,
    ``meta["scaffold_c_diff"]`` out), with c_i read from and saved to the site's state store.

    NVFlare's clients keep c_i in memory, where it silently restarts from zero whenever the client process restarts
    (the simulator with ``-t < -n``, a production client restart). c_i is saved round-stamped, with the c_i the round
    started from beside it, so a continued job that runs a saved round again starts it from the same c_i.

    Args:
        store: the site's store for this state (see :class:`~.previous_uploads.StoredUploads`).
        network: the local network, holding the round's global weights at :meth:`start`.
        lr: the optimizer's learning rate.
        recipe: what sends the global control, named in the error when it is missing.
    """

    keeps_local_model = False

    def __init__(self, store, network: nn.Module, lr: float, recipe: str = "ScaffoldRecipe"):
        self.store = store
        self.network = network
        self.lr = lr
        self.recipe = recipe
        self.round: Optional[ScaffoldRound] = None
        self.round_number = 0
        self._history: List[Tuple[int, Controls]] = []  # (round, c_i after it) of the rounds before this one

    def start(self, round_number: int, meta: Optional[Mapping[str, Any]] = None) -> CrossEntropyObjective:
        """Build the round's :class:`ScaffoldRound` from the server's c and this site's stored c_i; the objective is
        FedAvg's CE.

        Raises:
            ValueError: a round after the first without the server's c, or a control that does not fit the network.
        """
        global_control = (meta or {}).get(AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL)
        if global_control is None and round_number > 0:
            raise ValueError(
                f"round {round_number}: the server sent no SCAFFOLD global control "
                f"(meta[{AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL!r}]); run with {self.recipe} "
                "(ScaffoldAggregator) or NVFlare's Scaffold controller"
            )
        self.round_number = round_number
        self._history = self._load_history()
        local_control = self._history[-1][1] if self._history else None
        self.round = ScaffoldRound(self.network, self.lr, global_control, local_control)
        return CrossEntropyObjective()

    def before_epoch(self, epoch: int) -> None:
        """SCAFFOLD does nothing between epochs."""

    def after_step(self) -> None:
        """The control correction w ← w − lr·(c − c_i); after every optimizer step."""
        self.round.after_step()

    def finish(self) -> Dict[str, Dict[str, np.ndarray]]:
        """Update and save c_i; the meta entry with Δc_i to send beside the weights."""
        delta = self.round.finish()
        self.store.save(self.round_number, controls_payload(self._history, self.round_number, self.local_control))
        return {AlgorithmConstants.SCAFFOLD_CTRL_DIFF: delta}

    @property
    def local_control(self) -> Controls:
        """c_i (after :meth:`finish`: c_i⁺), see :attr:`ScaffoldRound.local_control`."""
        return self.round.local_control

    def _load_history(self) -> List[Tuple[int, Controls]]:
        """The stored (round, c_i after it) of earlier rounds; empty, with a warning when a file exists but cannot be
        used (it is then set aside), if there are none."""
        where = f"{self.store.site}: round {self.round_number}"
        try:
            record = self.store.load()
            if record is None:
                logger.info(f"{where}: no stored SCAFFOLD control for this site, c_i starts at 0")
                return []
            try:
                return controls_before(record["payload"], self.round_number, self.network)
            except ValueError as e:
                raise self.store.set_aside("other-network", str(e)) from e
        except StateUnusable as e:
            logger.warning(f"{where}: {e}; this site's SCAFFOLD control restarts from 0")
            return []


def apply_control_deltas(
    global_control: Optional[Mapping[str, np.ndarray]], deltas: List[Mapping[str, np.ndarray]], num_sites: int
) -> Dict[str, np.ndarray]:
    """The server's update c + Σ_i Δc_i / N, as a new float32 dict (c absent: zeros)."""
    if num_sites < len(deltas):
        raise ValueError(f"num_sites={num_sites} is smaller than the {len(deltas)} sites that sent a control delta")
    names = set(global_control or {}).union(*(set(d) for d in deltas))
    updated = {}
    for name in sorted(names):
        total = np.asarray((global_control or {}).get(name, 0.0), dtype=np.float64)
        for delta in deltas:
            if name in delta:
                total = total + np.asarray(delta[name], dtype=np.float64) / num_sites
        updated[name] = total.astype(np.float32)
    return updated
