"""SCAFFOLD for a Client API script with the site's control c_i persisted between rounds.

NVFlare's ``PTScaffoldHelper`` keeps c_i in memory, so it silently restarts from zero whenever NVFlare restarts the
script (every task with ``-t < -n``). This helper runs the executor's round (:class:`~nvflare_moon.core.scaffold.PersistentScaffoldRound`,
on ``PTScaffoldHelper``) and keeps c_i in the job's run folder (:mod:`nvflare_moon.client.state`).

    scaffold = PTPersistentScaffoldHelper(model)
    ...
        scaffold.start_round(input_model, lr)                    # c from the meta, c_i from the run folder
        ... optimizer.step(); scaffold.step()                     # w ← w − lr·(c − c_i)
        meta = {"num_samples": n, **scaffold.finish()}            # c_i⁺ saved; Δc_i to send

c_i is saved round-stamped, with the c_i each round started from beside it, as the executor does: a continued job
that runs a saved round again starts it from the same c_i.
"""

from typing import Dict, Optional

import numpy as np
import torch.nn as nn

from ..core.scaffold import PersistentScaffoldRound
from ..core.validation import check_module
from .common import check_received_weights, site_identity
from .state import script_state_store


class PTPersistentScaffoldHelper:
    """SCAFFOLD (option II) for a Client API script, speaking NVFlare's format (``meta["scaffold_c_global"]`` in,
    ``meta["scaffold_c_diff"]`` out); run with :class:`~nvflare_moon.recipes.ScaffoldScriptRecipe`.

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
        check_module("model", model)
        self.model = model
        self.state_dir = state_dir
        self.job_id = job_id
        self.site = site
        self.round: Optional[PersistentScaffoldRound] = None
        self._store = None

    def start_round(self, input_model, lr: float) -> None:
        """Begin a round on ``input_model`` (whose weights ``model`` holds) with the optimizer's learning rate ``lr``."""
        check_received_weights(self.model, input_model.params, type(self).__name__)
        if self._store is None:
            job_id, site = site_identity(self.job_id, self.site, type(self).__name__)
            self._store = script_state_store(self.STATE_NAME, job_id, site, self.state_dir)
        self.round = PersistentScaffoldRound(self._store, self.model, lr, recipe="ScaffoldScriptRecipe")
        self.round.start(input_model.current_round or 0, input_model.meta)

    def step(self) -> None:
        """The control correction; call right after every ``optimizer.step()``."""
        self._started().after_step()

    def finish(self) -> Dict[str, Dict[str, np.ndarray]]:
        """Update and save c_i; the meta entry with Δc_i to send beside the weights."""
        return self._started().finish()

    def _started(self) -> PersistentScaffoldRound:
        if self.round is None:
            raise RuntimeError(
                "call PTPersistentScaffoldHelper.start_round(input_model, lr) at the start of every round"
            )
        return self.round
