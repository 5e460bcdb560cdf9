"""The party's previous uploads, kept between rounds: MOON's negatives and FedSiam-DA's history model.

The last ``uploads_to_keep()`` local models the party uploaded are kept in a job-scoped state file, reloaded at the
start of every round and replaced at the end, so the method is the same algorithm whether the client process lives for
the whole job or is restarted for every task (NVFlare's simulator with ``-t < -n``). A party that was not sampled in a
round keeps its older uploads.
"""

from typing import List

import torch.nn as nn

from nvflare.apis.fl_context import FLContext

from ..state import StateUnusable, tensor_signature
from ..training import frozen_copy
from .fedavg import FedAvgExecutor


class PreviousUploadsExecutor(FedAvgExecutor):
    """:class:`FedAvgExecutor` plus the persisted FIFO of this party's previous uploads; all its arguments apply.

    Subclasses set ``STATE_NAME`` (the state file's stem), call :meth:`load_previous_uploads` in ``make_objective`` and
    may override :meth:`uploads_to_keep`.
    """

    STATE_NAME = "previous_uploads"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._previous_states: List[dict] = []

    def uploads_to_keep(self) -> int:
        return 1

    def load_previous_uploads(self, fl_ctx: FLContext, without: str) -> List[nn.Module]:
        """Frozen copies of the stored previous uploads, oldest first; none, with a warning saying that the round
        trains ``without`` (the term that needs them), if the file is unusable or does not fit the model."""
        self._previous_states = self._load_previous_states(fl_ctx, without)
        models = []
        for state in self._previous_states:
            previous = frozen_copy(self._net)
            previous.load_state_dict(state)
            models.append(previous)
        return models

    def after_training(self, round_number: int, fl_ctx: FLContext) -> None:
        uploaded = {name: t.detach().cpu().clone() for name, t in self._net.state_dict().items()}
        keep = (self._previous_states + [uploaded])[-self.uploads_to_keep() :]
        self.state_store(self.STATE_NAME, fl_ctx).save(round_number, {"previous_models": keep})

    def _load_previous_states(self, fl_ctx: FLContext, without: str) -> List[dict]:
        try:
            record = self.state_store(self.STATE_NAME, fl_ctx).load()
        except StateUnusable as e:
            self.log_warning(fl_ctx, f"{e}; training this round without {without}")
            return []
        if record is None:
            return []
        states = record["payload"].get("previous_models", [])
        expected = tensor_signature(self._net.state_dict())
        if not isinstance(states, list) or any(tensor_signature(s) != expected for s in states):
            self.log_warning(
                fl_ctx,
                f"stored previous models (round {record['round']}) do not match this job's network; "
                f"training this round without {without}",
            )
            return []
        return states[-self.uploads_to_keep() :]
