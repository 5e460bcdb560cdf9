"""SCAFFOLD for a Client API script with the site's control c_i persisted between rounds.

NVFlare's ``PTScaffoldHelper`` keeps c_i in memory, so it silently restarts from zero whenever NVFlare restarts the
script (every task with ``-t < -n``). This helper runs the same round (:class:`~nvflare_moon.core.scaffold.ScaffoldRound`,
on ``PTScaffoldHelper``) and keeps c_i in the job's run folder (:mod:`nvflare_moon.client.state`).

    scaffold = PTPersistentScaffoldHelper(model)
    ...
        scaffold.start_round(input_model, lr)                    # c from the meta, c_i from the run folder
        ... optimizer.step(); scaffold.step()                     # w ← w − lr·(c − c_i)
        meta = {"num_samples": n, **scaffold.finish()}            # c_i⁺ saved; Δc_i to send

c_i is saved round-stamped, with the c_i each round started from beside it, as the executor does: a continued job
that runs a saved round again starts it from the same c_i.
"""

import logging
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch.nn as nn
from nvflare.app_common.app_constant import AlgorithmConstants

from ..core.scaffold import Controls, ScaffoldRound, controls_before, controls_payload
from ..core.state import SiteStateStore, StateUnusable
from .common import check_received_weights, site_identity
from .state import script_state_store

logger = logging.getLogger(__name__)


class PTPersistentScaffoldHelper:
    """SCAFFOLD (option II) for a Client API script, speaking NVFlare's format (``meta["scaffold_c_global"]`` in,
    ``meta["scaffold_c_diff"]`` out); run with :class:`~nvflare_moon.client_api_recipes.ScaffoldScriptRecipe`.

    Args:
        model: the network being trained.
        state_dir, job_id, site: as for :class:`~nvflare_moon.client.PTMoonHelper`.
    """

    STATE_NAME = "scaffold_state"

    def __init__(
        self,
        model: nn.Module,
        state_dir: Optional[str] = None,
        job_id: Optional[str] = None,
        site: Optional[str] = None,
    ):
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
        self.model = model
        self.state_dir = state_dir
        self.job_id = job_id
        self.site = site
        self.round: Optional[ScaffoldRound] = None
        self._store: Optional[SiteStateStore] = None
        self._round_number = 0
        self._history: List[Tuple[int, Controls]] = []  # (round, c_i after it) of the rounds before this one

    def start_round(self, input_model, lr: float) -> None:
        """Begin a round on ``input_model`` (whose weights ``model`` holds) with the optimizer's learning rate ``lr``."""
        check_received_weights(self.model, input_model.params, type(self).__name__)
        if self._store is None:
            job_id, site = site_identity(self.job_id, self.site, type(self).__name__)
            self._store = script_state_store(self.STATE_NAME, job_id, site, self.state_dir)
        self._round_number = input_model.current_round or 0
        global_control = (input_model.meta or {}).get(AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL)
        if global_control is None and self._round_number > 0:
            raise ValueError(
                f"round {self._round_number}: the server sent no SCAFFOLD global control "
                f"(meta[{AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL!r}]); run with ScaffoldScriptRecipe"
            )
        self._history = self._load_history()
        local_control = self._history[-1][1] if self._history else None
        self.round = ScaffoldRound(self.model, lr, global_control, local_control)

    def step(self) -> None:
        """The control correction; call right after every ``optimizer.step()``."""
        self._started().after_step()

    def finish(self) -> Dict[str, Dict[str, np.ndarray]]:
        """Update and save c_i; the meta entry with Δc_i to send beside the weights."""
        delta = self._started().finish()
        self._store.save(
            self._round_number, controls_payload(self._history, self._round_number, self.round.local_control)
        )
        return {AlgorithmConstants.SCAFFOLD_CTRL_DIFF: delta}

    def _load_history(self) -> List[Tuple[int, Controls]]:
        where = f"{self._store.site}: round {self._round_number}"
        try:
            record = self._store.load()
            if record is None:
                logger.info(f"{where}: no stored SCAFFOLD control, c_i starts at 0")
                return []
            try:
                return controls_before(record["payload"], self._round_number, self.model)
            except ValueError as e:
                raise self._store.set_aside("other-network", str(e)) from e
        except StateUnusable as e:
            logger.warning(f"{where}: {e}; this site's SCAFFOLD control restarts from 0")
            return []

    def _started(self) -> ScaffoldRound:
        if self.round is None:
            raise RuntimeError(
                "call PTPersistentScaffoldHelper.start_round(input_model, lr) at the start of every round"
            )
        return self.round
