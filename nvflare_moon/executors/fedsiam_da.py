"""FedSiam-DA's client: Siamese local training against a trainable copy of the global model and a history model.

The objective and the working global copy live in :class:`~nvflare_moon.core.objectives.FedSiamDAObjective`; this executor
builds it every round, steps the working copy after every optimizer step, takes the epoch history snapshot, and keeps
the previous upload in a job-scoped state file so that a restarted client process (``-t < -n``) still has it.
"""

from nvflare.apis.fl_context import FLContext

from ..core.objectives import HISTORY_BRANCHES, HISTORY_CHOICES, FedSiamDAObjective
from ..core.training import sgd
from ..validation import check_choice, check_number
from .fedavg import FedAvgExecutor
from .previous_uploads import PreviousUploadsExecutor


class FedSiamDAExecutor(PreviousUploadsExecutor):
    """FedSiam-DA: ``CE + μ·[½·D(p_g, z_l) + ½·D(p_l, z_g) + cos(b_l, sg(z_h))]``, b_l = z_l or p_l; all
    :class:`FedAvgExecutor` arguments apply. The model needs the SimSiam predictor (``Network(predictor_hidden_dim=64)``).

    Args:
        mu: μ ≥ 0 (not published; default 0.01, the best of a sweep on CIFAR-10: docs/fedssc_fedsiam.md).
        history: the frozen history model z_h comes from: ``"epoch"`` (default) the local model at the end of the
            previous local epoch, in the first epoch the previous round's upload; ``"round"`` the previous round's
            upload throughout, as in MOON. Without a previous upload the history term is dropped.
        history_branch: what the history term compares with z_h: ``"projection"`` (default) z_l, or ``"predictor"``
            p_l = predictor(z_l) (see :class:`~nvflare_moon.core.objectives.FedSiamDAObjective`).
    """

    STATE_NAME = "fedsiam_da_state"
    _always_serialize_args = FedAvgExecutor._always_serialize_args + ("mu", "history", "history_branch")

    def __init__(self, *args, mu: float = 0.01, history: str = "epoch", history_branch: str = "projection", **kwargs):
        super().__init__(*args, **kwargs)
        check_number("mu", mu, low=0)
        check_choice("history", history, HISTORY_CHOICES)
        check_choice("history_branch", history_branch, HISTORY_BRANCHES)
        if getattr(self.model, "predictor", None) is None:
            raise ValueError(
                "model has no SimSiam predictor: build it with predictor_hidden_dim=64, "
                "e.g. nvflare_moon.models.Network(predictor_hidden_dim=64) (FedSiamDARecipe does)"
            )
        if self.batch_size < 2:
            raise ValueError(
                f"batch_size must be >= 2 for FedSiam-DA (the predictor's BatchNorm), got {self.batch_size}"
            )
        self.mu = mu
        self.history = history
        self.history_branch = history_branch
        self._objective = None

    def make_objective(self, round_number: int, fl_ctx: FLContext) -> FedSiamDAObjective:
        without = "the history term" + (" in the first epoch" if self.history == "epoch" else "")
        previous = self.load_previous_uploads(round_number, fl_ctx, without=without)
        if not previous:
            site = fl_ctx.get_identity_name()
            self.log_info(fl_ctx, f"{site}: round {round_number}: no previous upload yet, training without {without}")
        self._objective = FedSiamDAObjective(
            self._net,
            previous[-1] if previous else None,
            self.mu,
            make_optimizer=lambda model: sgd(model, self.lr, self.momentum, self.weight_decay),
            history=self.history,
            history_branch=self.history_branch,
        )
        return self._objective

    def before_epoch(self, epoch: int) -> None:
        self._objective.start_epoch(epoch)

    def after_step(self) -> None:
        self._objective.step_working_global()

    def after_training(self, round_number: int, fl_ctx: FLContext) -> None:
        super().after_training(round_number, fl_ctx)
        self._objective = None  # the working global copy is discarded with the round
