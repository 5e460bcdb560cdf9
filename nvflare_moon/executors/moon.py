"""MOON's client (Li, He and Song, CVPR 2021): FedAvg's local training plus the model-contrastive term.

The party's previous local models (a FIFO of the last ``num_previous_models`` uploads) are kept in a job-scoped state
file, reloaded at the start of every round and replaced at the end, so MOON is the same algorithm whether the client
process lives for the whole job or is restarted for every task (NVFlare's simulator with ``-t < -n``).
"""

from typing import List

from nvflare.apis.fl_context import FLContext

from ..state import StateUnusable, tensor_signature
from ..objectives import MoonObjective
from ..training import frozen_copy
from ..validation import check_number
from .fedavg import FedAvgExecutor


class MoonExecutor(FedAvgExecutor):
    """MOON: ``CE + μ·ℓ_con(z, z_glob, z_prev)``; all :class:`FedAvgExecutor` arguments apply.

    Args:
        mu: weight μ ≥ 0 of the contrastive term (paper: 5 for CIFAR-10, 1 for CIFAR-100 and Tiny-ImageNet).
        temperature: τ > 0 (paper: 0.5).
        num_previous_models: m ≥ 1, how many previous local models serve as negatives (paper: 1).
    """

    STATE_NAME = "moon_state"
    _always_serialize_args = FedAvgExecutor._always_serialize_args + ("mu", "temperature", "num_previous_models")

    def __init__(self, *args, mu: float = 5.0, temperature: float = 0.5, num_previous_models: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        check_number("mu", mu, low=0)
        check_number("temperature", temperature, low=0, low_inclusive=False)
        check_number("num_previous_models", num_previous_models, low=1, integer=True)
        self.mu = mu
        self.temperature = temperature
        self.num_previous_models = num_previous_models
        self._previous_states: List[dict] = []

    def make_objective(self, round_number: int, fl_ctx: FLContext) -> MoonObjective:
        self._previous_states = self._load_previous_states(fl_ctx)
        global_model = frozen_copy(self._net)
        previous_models = []
        for state in self._previous_states:
            previous = frozen_copy(self._net)
            previous.load_state_dict(state)
            previous_models.append(previous)
        if not previous_models:
            self.log_info(fl_ctx, f"round {round_number}: no previous local model yet, the contrastive term is dropped")
        return MoonObjective(global_model, previous_models, self.mu, self.temperature)

    def after_training(self, round_number: int, fl_ctx: FLContext) -> None:
        uploaded = {name: t.detach().cpu().clone() for name, t in self._net.state_dict().items()}
        keep = (self._previous_states + [uploaded])[-self.num_previous_models :]
        self.state_store(self.STATE_NAME, fl_ctx).save(round_number, {"previous_models": keep})

    def _load_previous_states(self, fl_ctx: FLContext) -> List[dict]:
        """The stored previous models, or none (with a warning) if the file is unusable or does not fit the model."""
        try:
            record = self.state_store(self.STATE_NAME, fl_ctx).load()
        except StateUnusable as e:
            self.log_warning(fl_ctx, f"{e}; training this round without the contrastive term")
            return []
        if record is None:
            return []
        states = record["payload"].get("previous_models", [])
        expected = tensor_signature(self._net.state_dict())
        if not isinstance(states, list) or any(tensor_signature(s) != expected for s in states):
            self.log_warning(
                fl_ctx,
                f"stored previous models (round {record['round']}) do not match this job's network; "
                "training this round without the contrastive term",
            )
            return []
        return states[-self.num_previous_models :]
