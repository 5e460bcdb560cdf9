"""The party's previous uploads, kept between rounds: MOON's negatives and FedSiam-DA's history model.

The local models the party uploaded are kept in a job-scoped state file, each with its round, reloaded at the start
of every round and replaced at the end, so the method is the same algorithm whether the client process lives for the
whole job or is restarted for every task (NVFlare's simulator with ``-t < -n``). A party that was not sampled in a
round keeps its older uploads.

Round r uses the last ``uploads_to_keep()`` uploads from rounds before r. One more is kept, because a round can run
twice at a site: when a job is continued after a failure (:mod:`nvflare_moon.resume`), a site may have trained and
saved the round that the server never aggregated, and that upload must not serve as its own previous model.
"""

from typing import List, Tuple

import torch.nn as nn

from nvflare.apis.fl_context import FLContext

from ..core.state import HISTORY_NEEDED, HISTORY_ROUNDS, StateUnusable, tensor_signature
from ..core.training import frozen_copy
from .fedavg import FedAvgExecutor


class PreviousUploadsExecutor(FedAvgExecutor):
    """:class:`FedAvgExecutor` plus the persisted FIFO of this party's previous uploads; all its arguments apply.

    Subclasses set ``STATE_NAME`` (the state file's stem), call :meth:`load_previous_uploads` in ``make_objective`` and
    may override :meth:`uploads_to_keep`.
    """

    STATE_NAME = "previous_uploads"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._previous: List[Tuple[int, dict]] = []  # (round, state dict) of the uploads before this round

    def uploads_to_keep(self) -> int:
        return 1

    def load_previous_uploads(self, round_number: int, fl_ctx: FLContext, without: str) -> List[nn.Module]:
        """Frozen copies of the last ``uploads_to_keep()`` uploads from rounds before ``round_number``, oldest first;
        none, with a warning saying that the round trains ``without`` (the term that needs them), if the file is
        unusable or does not fit the model."""
        self._previous = self._load_previous(round_number, fl_ctx, without)
        models = []
        for _, state in self._previous[-self.uploads_to_keep() :]:
            previous = frozen_copy(self._net)
            previous.load_state_dict(state)
            models.append(previous)
        return models

    def after_training(self, round_number: int, fl_ctx: FLContext) -> None:
        uploaded = {name: t.detach().cpu().clone() for name, t in self._net.state_dict().items()}
        keep = (self._previous + [(round_number, uploaded)])[-(self.uploads_to_keep() + 1) :]
        payload = {
            HISTORY_ROUNDS: [r for r, _ in keep],
            "previous_models": [state for _, state in keep],
            HISTORY_NEEDED: self.uploads_to_keep(),
        }
        self.state_store(self.STATE_NAME, fl_ctx).save(round_number, payload)

    def _load_previous(self, round_number: int, fl_ctx: FLContext, without: str) -> List[Tuple[int, dict]]:
        try:
            record = self.load_state(self.STATE_NAME, fl_ctx)
        except StateUnusable as e:
            self.log_warning(fl_ctx, f"{e}; training this round without {without}")
            return []
        if record is None:
            return []
        states, rounds = record["payload"].get("previous_models"), record["payload"].get(HISTORY_ROUNDS)
        expected = tensor_signature(self._net.state_dict())
        if (
            not isinstance(states, list)
            or not isinstance(rounds, list)
            or len(rounds) != len(states)
            or any(tensor_signature(s) != expected for s in states)
        ):
            self.log_warning(
                fl_ctx,
                f"stored previous models (round {record['round']}) do not match this job's network or lack their "
                f"rounds; training this round without {without}",
            )
            return []
        earlier = [(r, s) for r, s in zip(rounds, states) if r < round_number]
        if len(earlier) < len(states):
            later = sorted(r for r in rounds if r >= round_number)
            self.log_info(fl_ctx, f"round {round_number}: ignoring the stored uploads of rounds {later}, not before it")
        return earlier
