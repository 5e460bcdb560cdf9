"""A site's algorithm state between rounds (MOON's previous models, SCAFFOLD's control variate, ...).

The NVFlare simulator runs every client task in a new process when it has fewer workers than clients, and production
clients restart, so state that lives only in memory is silently lost. :class:`SiteStateStore` keeps it in one file in
the job's run directory of the site's workspace: never shared between jobs, written atomically (a crash mid-write
leaves the previous file intact), and checked on load. A file that cannot be used is reported (site, path, why) and set
aside under a name that says why, never deleted or overwritten, and the caller carries on as if there were no state.
"""

import glob
import logging
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from .files import write_atomic

FORMAT_VERSION = 1
# a site's state folder in its run folder of the job, for executors and Client API scripts alike:
# <workspace>/<site>/<job_id>/nvflare_moon/<name>.pt
STATE_FOLDER = "nvflare_moon"


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
        self.name = name
        self.path = os.path.join(directory, f"{name}.pt")
        self.site = site
        self.job_id = job_id
        self.logger = logging.getLogger(self.__class__.__name__)

    def save(self, round_number: int, payload: Dict[str, Any]) -> None:
        """Write ``payload`` for ``round_number``; the old file stays valid until the new one is complete."""
        record = {
            "format_version": FORMAT_VERSION,
            "site": self.site,
            "job_id": self.job_id,
            "name": self.name,
            "round": int(round_number),
            "payload": payload,
        }
        write_atomic(self.path, lambda f: torch.save(record, f), binary=True)

    def load(self) -> Optional[Dict[str, Any]]:
        """The stored record (``round`` and ``payload``), or None if there is none.

        Raises:
            StateUnusable: the file is corrupt or belongs to another site, job, state (method) or format. It has been
                set aside (:meth:`set_aside`), so that it is kept for inspection and the next save starts clean.
        """
        if not os.path.exists(self.path):
            return None
        try:
            record = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise self.set_aside("corrupt", f"torch cannot read it: {e}") from e
        problem = self._problem(record)
        if problem is not None:
            raise self.set_aside(*problem)
        return record

    def set_aside(self, reason: str, detail: str) -> StateUnusable:
        """Rename the file to ``<name>.pt.unusable-<reason>-<time>`` (never over another file) and return the error
        to raise or report: it names the site, the file, why, and where the file is kept.

        Args:
            reason: a word or two for the file name: ``corrupt``, ``other-site``, ``other-network``, ...
            detail: the reason in a sentence.
        """
        stem = f"{self.path}.unusable-{reason}-{time.strftime('%Y%m%d-%H%M%S')}"
        aside, copy = stem, 1
        while os.path.exists(aside):
            copy += 1
            aside = f"{stem}-{copy}"
        os.rename(self.path, aside)
        return StateUnusable(f"{self.site}: state file {self.path} cannot be used ({detail}); kept as {aside}")

    def set_aside_files(self) -> List[str]:
        """The copies of this state's file that :meth:`set_aside` kept, oldest name first."""
        return sorted(glob.glob(glob.escape(self.path) + ".unusable-*"))

    def _problem(self, record: Any) -> Optional[Tuple[str, str]]:
        """``(reason, detail)`` when ``record`` cannot be used here, else None."""
        if not isinstance(record, dict) or record.get("format_version") != FORMAT_VERSION:
            return "other-format", f"not a format-{FORMAT_VERSION} state record"
        for key, expected, reason in (("site", self.site, "other-site"), ("job_id", self.job_id, "other-job")):
            if record.get(key) != expected:
                return reason, f"it belongs to {key} {record.get(key)!r}, not {expected!r}"
        if record.get("name", self.name) != self.name:  # records saved before the name was stored have none
            return "other-method", f"it holds {record['name']!r} state, not {self.name!r}"
        if not isinstance(record.get("round"), int) or not isinstance(record.get("payload"), dict):
            return "corrupt", "round or payload missing"
        return None
