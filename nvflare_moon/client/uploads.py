"""The previous uploads of a Client API script, kept in its job-scoped state folder between rounds.

A wrapper of :class:`~nvflare_moon.core.previous_uploads.PreviousUploads` (the FIFO and its round filter, shared with
the executors) that finds the state folder (:mod:`.state`), logs what it loads, sets unusable files aside, and notices
when the script trained a round but never called the save step: beside the uploads it records the last round the
script started, and the next round warns when that round's model is missing.
"""

import logging
from typing import List, Optional

import torch.nn as nn

from ..core.previous_uploads import PreviousUploads
from ..core.state import SiteStateStore, StateUnusable
from .state import script_state_store

logger = logging.getLogger(__name__)


class ScriptUploads:
    """One site's stored uploads for one job, for a helper named ``helper`` whose save call is ``save_call``.

    Args:
        name: the state file's stem, e.g. ``"moon_state"``.
        job_id, site: whose state it is (checked on load).
        state_dir: see :func:`~nvflare_moon.client.state.state_folder`.
        save_call: how the script saves, named in the warning when it forgot to, e.g.
            ``"PTMoonHelper.save_local_model()"``.
    """

    def __init__(self, name: str, job_id: str, site: str, state_dir: Optional[str], save_call: str):
        self.store: SiteStateStore = script_state_store(name, job_id, site, state_dir)
        self.started: SiteStateStore = script_state_store(f"{name}_started", job_id, site, state_dir)
        self.save_call = save_call
        self.site = site
        self.previous = PreviousUploads()
        self.round_number: Optional[int] = None

    def start_round(self, round_number: int, network: nn.Module, keep: int, without: str) -> List[nn.Module]:
        """Frozen copies of the last ``keep`` uploads before ``round_number``; none, with a warning saying that the
        round trains ``without`` the term that needs them, if the stored file is unusable."""
        where = f"{self.site}: round {round_number}"
        self.previous = PreviousUploads(keep)
        self.round_number = round_number
        try:
            record = self.store.load()
            unsaved = self._unsaved_round(record, round_number)
            if unsaved is not None:
                logger.warning(
                    f"{where}: this script trained round {unsaved} but saved no model for it; call "
                    f"{self.save_call} after training in every round, or the next rounds lose the previous model"
                )
            try:
                ignored = self.previous.restore(record, round_number, network)
            except StateUnusable as e:
                raise self.store.set_aside("other-network", str(e)) from e
        except StateUnusable as e:
            logger.warning(f"{where}: {e}; training this round without {without}")
            return []
        finally:
            self.started.save(round_number, {})
        if ignored:
            logger.info(f"{where}: ignoring the stored uploads of rounds {ignored}, not before it")
        models = self.previous.models(network)
        rounds = [r for r, _ in self.previous.uploads[-keep:]]
        logger.info(f"{where}: previous local models from rounds {rounds}" if models else f"{where}: no previous model")
        return models

    def save(self, network: nn.Module) -> None:
        """Store ``network`` as this round's upload."""
        if self.round_number is None:
            raise RuntimeError(f"{self.save_call} was called before start_round()")
        self.store.save(self.round_number, self.previous.payload_after(self.round_number, network))

    def _unsaved_round(self, record: Optional[dict], round_number: int) -> Optional[int]:
        """The last round this site started before ``round_number`` if no model of it was saved, else None."""
        try:
            started = self.started.load()
        except StateUnusable as e:
            logger.warning(str(e))
            return None
        if started is None or started["round"] >= round_number:
            return None
        saved = (record or {}).get("payload", {}).get("rounds") or []
        return None if started["round"] in saved else started["round"]
