"""SCAFFOLD's client (option II), speaking NVFlare's SCAFFOLD message format.

It reads the global control c from ``meta["scaffold_c_global"]`` and returns Δc_i in ``meta["scaffold_c_diff"]``, as
NVFlare's ``Scaffold`` controller and ``PTScaffoldHelper`` clients do, so it runs with that controller or with
:class:`~nvflare_moon.server.ScaffoldAggregator` under the FedAvg controller. Unlike NVFlare's clients, it keeps the
site's control c_i in a job-scoped state file: NVFlare keeps it in memory, where it silently restarts from zero
whenever the client process is restarted (the simulator with ``-t < -n``, a production client restart).
"""

from typing import Any, Dict, List, Optional, Tuple

from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.app_constant import AlgorithmConstants

from ..core.scaffold import ScaffoldRound, controls_before, controls_payload
from ..core.state import StateUnusable
from .fedavg import FedAvgExecutor


class ScaffoldExecutor(FedAvgExecutor):
    """SCAFFOLD: CE, with the control correction ``w ← w − lr·(c − c_i)`` after every optimizer step.

    All :class:`FedAvgExecutor` arguments apply; the objective is FedAvg's CE. The server must send the global
    control from round 1 on (:class:`~nvflare_moon.recipes.ScaffoldRecipe` does); in round 0 it starts at zero.
    """

    STATE_NAME = "scaffold_state"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._round: Optional[ScaffoldRound] = None
        self._delta: Dict[str, Any] = {}
        self._history: List[Tuple[int, dict]] = []  # (round, c_i after it) of the rounds before this one

    def on_receive(self, received: FLModel, fl_ctx: FLContext) -> None:
        round_number = received.current_round or 0
        global_control = (received.meta or {}).get(AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL)
        if global_control is None and round_number > 0:
            raise ValueError(
                f"round {round_number}: the server sent no SCAFFOLD global control "
                f"(meta[{AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL!r}]); run this executor with ScaffoldRecipe "
                "(ScaffoldAggregator) or NVFlare's Scaffold controller"
            )
        self._history = self._load_history(round_number, fl_ctx)
        local_control = self._history[-1][1] if self._history else None
        if local_control is None:
            self.log_info(fl_ctx, f"round {round_number}: no stored SCAFFOLD control for this site, c_i starts at 0")
        self._round = ScaffoldRound(self._net, self.lr, global_control, local_control)

    def after_step(self) -> None:
        self._round.after_step()

    def after_training(self, round_number: int, fl_ctx: FLContext) -> None:
        self._delta = self._round.finish()
        payload = controls_payload(self._history, round_number, self._round.local_control)
        self.state_store(self.STATE_NAME, fl_ctx).save(round_number, payload)

    def extra_meta(self) -> Dict[str, Any]:
        return {AlgorithmConstants.SCAFFOLD_CTRL_DIFF: self._delta}

    def _load_history(self, round_number: int, fl_ctx: FLContext) -> List[Tuple[int, dict]]:
        """The stored (round, c_i after it) of rounds before ``round_number``; empty (with a warning when a file exists
        but cannot be used; it is then set aside) if there are none."""
        try:
            record = self.load_state(self.STATE_NAME, fl_ctx)
        except StateUnusable as e:
            self.log_warning(fl_ctx, f"{e}; this site's SCAFFOLD control restarts from 0")
            return []
        if record is None:
            return []
        try:
            return controls_before(record["payload"], round_number, self._net)
        except ValueError as e:
            unusable = self.state_store(self.STATE_NAME, fl_ctx).set_aside("other-network", str(e))
            self.log_warning(fl_ctx, f"{unusable}; this site's SCAFFOLD control restarts from 0")
            return []
