"""A site's state in a job that continues a failed one (:mod:`nvflare_moon.ops.continuation`).

Until the new job has saved a record of its own, it reads the failed job's and copies it into its own run folder, so
that a continuation of the continuation finds it too, and two jobs never write to the same file.
"""

import logging
from typing import Any, Dict, List, Optional

from .state import SiteStateStore, StateUnusable

logger = logging.getLogger(__name__)


class ContinuedStateStore:
    """A :class:`SiteStateStore` (``own``) that falls back on the store of the job it continues (``continued``).

    Args:
        own: this job's store.
        continued: the failed job's store for the same state and site; None for a job that continues none.
    """

    def __init__(self, own: SiteStateStore, continued: Optional[SiteStateStore] = None):
        self.own = own
        self.continued = continued
        self.site = own.site
        self.name = own.name

    def load(self) -> Optional[Dict[str, Any]]:
        """This job's record, else the continued job's (then saved as this job's), else None.

        Raises:
            StateUnusable: see :meth:`SiteStateStore.load`.
        """
        record = self.own.load()
        if record is not None or self.continued is None:
            return record
        record = self.continued.load()
        if record is None:
            logger.warning(f"{self.site} has no {self.name} state from job {self.continued.job_id}")
            return None
        self.own.save(record["round"], record["payload"])
        logger.info(
            f"{self.site}: continuing job {self.continued.job_id}: took its {self.name} state, saved in round "
            f"{record['round']}"
        )
        return record

    def save(self, round_number: int, payload: Dict[str, Any]) -> None:
        self.own.save(round_number, payload)

    def set_aside(self, reason: str, detail: str) -> StateUnusable:
        return self.own.set_aside(reason, detail)

    def set_aside_files(self) -> List[str]:
        return self.own.set_aside_files()
