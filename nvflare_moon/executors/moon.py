"""MOON's client (Li, He and Song, CVPR 2021): FedAvg's local training plus the model-contrastive term.

The party's previous local models (a FIFO of the last ``num_previous_models`` uploads) are kept in a job-scoped state
file (see :mod:`.previous_uploads`), so MOON is the same algorithm whether the client process lives for the whole job
or is restarted for every task (NVFlare's simulator with ``-t < -n``).
"""

from nvflare.apis.fl_context import FLContext

from ..core.objectives import CrossEntropyObjective, MoonObjective, RepresentationL2Objective
from ..core.training import frozen_copy
from ..validation import check_choice, check_number
from .fedavg import FedAvgExecutor
from .previous_uploads import PreviousUploadsExecutor


REPRESENTATION_LOSSES = ("contrastive", "l2", "l2_squared")


class MoonExecutor(PreviousUploadsExecutor):
    """MOON: ``CE + μ·ℓ_con(z, z_glob, z_prev)``; all :class:`FedAvgExecutor` arguments apply.

    Args:
        mu: weight μ ≥ 0 of the contrastive term (paper: 5 for CIFAR-10, 1 for CIFAR-100 and Tiny-ImageNet).
        temperature: τ > 0 (paper: 0.5).
        num_previous_models: m ≥ 1, how many previous local models serve as negatives (paper: 1).
        representation_loss: ``"contrastive"`` (MOON) or the paper's ablation (Table 5), an ℓ2 pull of z towards
            z_glob with the same μ and no previous model: ``"l2"`` (μ·mean‖z − z_glob‖₂) or ``"l2_squared"``
            (μ·mean‖z − z_glob‖₂²); see :class:`~nvflare_moon.core.objectives.RepresentationL2Objective`.
    """

    STATE_NAME = "moon_state"
    _always_serialize_args = FedAvgExecutor._always_serialize_args + ("mu", "temperature", "num_previous_models")

    def __init__(
        self, *args, mu: float = 5.0, temperature: float = 0.5, num_previous_models: int = 1,
        representation_loss: str = "contrastive", **kwargs,
    ):  # fmt: skip
        super().__init__(*args, **kwargs)
        check_choice("representation_loss", representation_loss, REPRESENTATION_LOSSES)
        check_number("mu", mu, low=0)
        check_number("temperature", temperature, low=0, low_inclusive=False)
        check_number("num_previous_models", num_previous_models, low=1, integer=True)
        self.mu = mu
        self.temperature = temperature
        self.num_previous_models = num_previous_models
        self.representation_loss = representation_loss

    def uploads_to_keep(self) -> int:
        return self.num_previous_models

    def make_objective(self, round_number: int, fl_ctx: FLContext) -> CrossEntropyObjective:
        if self.representation_loss != "contrastive":
            squared = self.representation_loss == "l2_squared"
            return RepresentationL2Objective(frozen_copy(self._net), self.mu, squared=squared)
        previous_models = self.load_previous_uploads(round_number, fl_ctx, without="the contrastive term")
        if not previous_models:
            self.log_info(fl_ctx, f"round {round_number}: no previous local model yet, the contrastive term is dropped")
        return MoonObjective(frozen_copy(self._net), previous_models, self.mu, self.temperature)
