"""A site's algorithm state between rounds (MOON's previous models, SCAFFOLD's control variate, ...).

The NVFlare simulator runs every client task in a new process when it has fewer workers than clients, and production
clients restart, so state that lives only in memory is silently lost. :class:`SiteStateStore` keeps it in one file in
the job's run directory of the site's workspace: never shared between jobs, written atomically (a crash mid-write
leaves the previous file intact), and checked on load. A file that cannot be used is reported and set aside, never
deleted, and the caller carries on as if there were no state.
"""

import logging
import os
import time
from typing import Any, Dict, Mapping, Optional

import torch

FORMAT_VERSION = 1


class StateUnusable(Exception):
    """The state file exists but cannot be used; the message says why."""


def tensor_signature(state_dict: Mapping[str, torch.Tensor]) -> Dict[str, tuple]:
    """Names, shapes and dtypes of a state dict: what a stored model must match to be loaded."""
    return {name: (tuple(t.shape), str(t.dtype)) for name, t in state_dict.items()}


class SiteStateStore:
    """Atomic, validated persistence of one site's state for one job.

    Args:
        directory: a job-scoped folder, e.g. NVFlare's ``workspace.get_run_dir(job_id)``.
        name: the file's stem, e.g. ``"moon_state"``.
        site: the site name, stored and checked so that a copied file is not used by another site.
        job_id: the job id, stored and checked likewise.
    """

    def __init__(self, directory: str, name: str, site: str, job_id: str):
        self.directory = directory
        self.path = os.path.join(directory, f"{name}.pt")
        self.site = site
        self.job_id = job_id
        self.logger = logging.getLogger(self.__class__.__name__)

    def save(self, round_number: int, payload: Dict[str, Any]) -> None:
        """Write ``payload`` for ``round_number``; the old file stays valid until the new one is complete."""
        os.makedirs(self.directory, exist_ok=True)
        record = {
            "format_version": FORMAT_VERSION,
            "site": self.site,
            "job_id": self.job_id,
            "round": int(round_number),
            "payload": payload,
        }
        tmp = f"{self.path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            torch.save(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def load(self) -> Optional[Dict[str, Any]]:
        """The stored record (``round`` and ``payload``), or None if there is none.

        Raises:
            StateUnusable: the file is corrupt or belongs to another site, job or format. The file has been renamed
                aside (``*.unusable-<time>``) so that it is kept for inspection and the next save starts clean.
        """
        if not os.path.exists(self.path):
            return None
        try:
            record = torch.load(self.path, map_location="cpu", weights_only=True)
            self._check(record)
        except Exception as e:
            aside = f"{self.path}.unusable-{time.strftime('%Y%m%d-%H%M%S')}"
            os.replace(self.path, aside)
            raise StateUnusable(f"state file {self.path} cannot be used ({e}); kept as {aside}") from e
        return record

    def _check(self, record: Any) -> None:
        if not isinstance(record, dict) or record.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"not a format-{FORMAT_VERSION} state record")
        for key, expected in (("site", self.site), ("job_id", self.job_id)):
            if record.get(key) != expected:
                raise ValueError(f"it belongs to {key} {record.get(key)!r}, not {expected!r}")
        if not isinstance(record.get("round"), int) or not isinstance(record.get("payload"), dict):
            raise ValueError("round or payload missing")


# A round-stamped history payload: ``rounds`` plus lists of the same length, one entry per round the site trained
# (MOON's ``previous_models``, SCAFFOLD's ``local_controls``), and ``needed``: how many of the latest entries before a
# round that round reads. One more than needed is kept, for a round that is run twice (a continued job).
HISTORY_ROUNDS = "rounds"
HISTORY_NEEDED = "needed"


def history_before(payload: Mapping[str, Any], round_number: int) -> Dict[str, Any]:
    """``payload`` cut to what round ``round_number`` reads: the entries of earlier rounds, the last ``needed`` of them
    (all earlier ones without ``needed``). A payload without ``rounds`` is returned unchanged.

    Example: ``{"rounds": [3, 4], "previous_models": [m3, m4], "needed": 1}`` before round 4 is
    ``{"rounds": [3], "previous_models": [m3], "needed": 1}``.
    """
    rounds = payload.get(HISTORY_ROUNDS)
    if not isinstance(rounds, list):
        return dict(payload)
    keep = [i for i, r in enumerate(rounds) if r < round_number]
    needed = payload.get(HISTORY_NEEDED)
    if isinstance(needed, int) and needed >= 0:
        keep = keep[len(keep) - needed :] if needed else []
    return {
        key: [value[i] for i in keep] if isinstance(value, list) and len(value) == len(rounds) else value
        for key, value in payload.items()
    }
