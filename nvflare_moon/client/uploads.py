"""The previous uploads of a Client API script, kept in its job-scoped state folder between rounds.

:class:`~nvflare_moon.core.previous_uploads.StoredUploads` (what the executors use) on the script's state folder
(:mod:`.state`), plus one check that only a script needs: beside the uploads it records the last round the script
started, and the next round warns when the script trained that round but never called its save step.
"""

import logging
from typing import Any, List, Mapping, Optional

import torch.nn as nn

from ..core.previous_uploads import StoredUploads
from ..core.state import StateUnusable
from .state import script_state_store

logger = logging.getLogger(__name__)


class ScriptUploads(StoredUploads):
    """One site's stored uploads for one job, for a helper whose save call is ``save_call``.

    Args:
        name: the state file's stem, e.g. ``"moon_state"``.
        job_id, site: whose state it is (checked on load).
        state_dir: see :func:`~nvflare_moon.client.state.state_folder`.
        save_call: how the script saves, named in the warning when it forgot to, e.g.
            ``"PTMoonHelper.save_local_model()"``.
    """

    def __init__(self, name: str, job_id: str, site: str, state_dir: Optional[str], save_call: str):
        super().__init__(script_state_store(name, job_id, site, state_dir))
        self.started = script_state_store(f"{name}_started", job_id, site, state_dir)
        self.save_call = save_call
        self.site = site

    def start(self, round_number: int, network: nn.Module, keep: int, without: str) -> List[nn.Module]:
        try:
            return super().start(round_number, network, keep, without)
        finally:
            self.started.save(round_number, {})

    def save(self, network: nn.Module) -> None:
        if self.round_number is None:
            raise RuntimeError(f"{self.save_call} was called before start_round()")
        super().save(network)

    def loaded(self, record: Optional[Mapping[str, Any]], round_number: int) -> None:
        """Warn when the last round this site started before ``round_number`` saved no model."""
        try:
            started = self.started.load()
        except StateUnusable as e:
            logger.warning(str(e))
            return
        if started is None or started["round"] >= round_number:
            return
        saved = (record or {}).get("payload", {}).get("rounds") or []
        if started["round"] not in saved:
            logger.warning(
                f"{self.site}: round {round_number}: this script trained round {started['round']} but saved no model "
                f"for it; call {self.save_call} after training in every round, or the next rounds lose the previous "
                "model"
            )
