"""SCAFFOLD's client (option II), speaking NVFlare's SCAFFOLD message format.

The round is :class:`~nvflare_moon.core.scaffold.PersistentScaffoldRound`, the object
:class:`~nvflare_moon.client.PTPersistentScaffoldHelper` runs in a Client API script: it reads the global control c
from ``meta["scaffold_c_global"]`` and returns Δc_i in ``meta["scaffold_c_diff"]``, as NVFlare's ``Scaffold``
controller and ``PTScaffoldHelper`` clients do, so it runs with that controller or with
:class:`~nvflare_moon.server.ScaffoldAggregator` under the FedAvg controller. Unlike NVFlare's clients, it keeps the
site's control c_i in a job-scoped state file.
"""

from nvflare.apis.fl_context import FLContext

from ..core.scaffold import PersistentScaffoldRound
from .fedavg import FedAvgExecutor


class ScaffoldExecutor(FedAvgExecutor):
    """SCAFFOLD: CE, with the control correction ``w ← w − lr·(c − c_i)`` after every optimizer step.

    All :class:`FedAvgExecutor` arguments apply; the objective is FedAvg's CE. The server must send the global
    control from round 1 on (:class:`~nvflare_moon.recipes.ScaffoldRecipe` does); in round 0 it starts at zero.
    """

    STATE_NAME = "scaffold_state"

    def make_round(self, fl_ctx: FLContext) -> PersistentScaffoldRound:
        return PersistentScaffoldRound(self.job_state(self.STATE_NAME, fl_ctx), self._net, self.training.lr)
