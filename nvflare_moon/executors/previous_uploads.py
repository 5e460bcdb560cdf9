"""The party's previous uploads, kept between rounds in a job-scoped state file: MOON's negatives and FedSiam-DA's
history model. The FIFO and its round filter live in :class:`~nvflare_moon.core.previous_uploads.PreviousUploads`;
this module wires it to the executor's state store and logs."""

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from nvflare.apis.fl_context import FLContext

from ..core.previous_uploads import PreviousUploads
from ..core.state import StateUnusable
from .fedavg import FedAvgExecutor


class PreviousUploadsExecutor(FedAvgExecutor):
    """:class:`FedAvgExecutor` plus the persisted FIFO of this party's previous uploads; all its arguments apply.

    Subclasses set ``STATE_NAME`` (the state file's stem), call :meth:`load_previous_uploads` in ``make_objective`` and
    may override :meth:`uploads_to_keep` and :meth:`history_network`.
    """

    STATE_NAME = "previous_uploads"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._previous = PreviousUploads()

    def uploads_to_keep(self) -> int:
        return 1

    def history_network(self) -> nn.Module:
        """The part of the local network that each upload keeps (default: all of it), sharing its tensors."""
        return self._net

    def load_previous_uploads(self, round_number: int, fl_ctx: FLContext, without: str) -> List[nn.Module]:
        """Frozen copies of :meth:`history_network` holding the last ``uploads_to_keep()`` uploads from rounds before
        ``round_number``, oldest first; none, with a warning saying that the round trains ``without`` (the term that
        needs them), if the file is unusable or does not fit (it is then set aside)."""
        self._previous = PreviousUploads(self.uploads_to_keep())
        kept = self.history_network()
        try:
            record = self.load_state(self.STATE_NAME, fl_ctx)
            try:
                ignored = self._previous.restore(record, round_number, kept)
            except StateUnusable as e:
                raise self.state_store(self.STATE_NAME, fl_ctx).set_aside("other-network", str(e)) from e
        except StateUnusable as e:
            self.log_warning(fl_ctx, f"{e}; training this round without {without}")
            return []
        if ignored:
            self.log_info(
                fl_ctx, f"round {round_number}: ignoring the stored uploads of rounds {ignored}, not before it"
            )
        return self._previous.models(kept)

    def after_training(self, round_number: int, fl_ctx: FLContext) -> None:
        payload = self._previous.payload_after(round_number, self.history_network())
        self.state_store(self.STATE_NAME, fl_ctx).save(round_number, payload)

    def save_local_model(self, round_number: int, fl_ctx: FLContext) -> None:
        """Nothing to write when the uploads keep the whole network: :meth:`after_training` has just stored this
        round's upload, the last local model. Otherwise the local model is stored as :class:`FedAvgExecutor` does."""
        if self.history_network() is not self._net:
            super().save_local_model(round_number, fl_ctx)

    def load_local_model(self, fl_ctx: FLContext) -> Optional[Tuple[int, Dict[str, torch.Tensor]]]:
        """The last stored upload, from the uploads' state file (where :meth:`save_local_model` put it otherwise)."""
        if self.history_network() is not self._net:
            return super().load_local_model(fl_ctx)
        record = self.load_state(self.STATE_NAME, fl_ctx)
        payload = {} if record is None else record["payload"]
        uploads, rounds = payload.get("previous_models"), payload.get("rounds")
        if not uploads or not rounds:
            return None
        return rounds[-1], uploads[-1]
