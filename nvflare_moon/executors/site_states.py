"""Where a site keeps its state in a job: one store per name in the job's run folder on the site, never the working
directory, which POC jobs share; in a continuation job (``resume_from_job_id``, see
:mod:`nvflare_moon.ops.continuation`) falling back on the store of the failed job."""

import os
from typing import Optional

from nvflare.apis.fl_context import FLContext

from ..core.job_state import ContinuedStateStore
from ..core.state import STATE_FOLDER, SiteStateStore


class SiteStates:
    """A site's state stores.

    Args:
        resume_from_job_id: the id of the failed job this job continues, or None.
        resume_state_dir: where that job's state is, as ``<resume_state_dir>/<site>/<name>.pt``; None: in the site's
            run folder of that job (POC and production). An absolute folder, given with ``resume_from_job_id``. A
            continued simulator job sets it, because the simulator wipes its workspace at the start.
    """

    def __init__(self, resume_from_job_id: Optional[str], resume_state_dir: Optional[str]):
        if resume_from_job_id is not None and (not isinstance(resume_from_job_id, str) or not resume_from_job_id):
            raise ValueError(f"resume_from_job_id must be a job id or None, got {resume_from_job_id!r}")
        if resume_state_dir is not None and (resume_from_job_id is None or not os.path.isabs(resume_state_dir)):
            raise ValueError(
                f"resume_state_dir must be an absolute folder, given with resume_from_job_id; got {resume_state_dir!r}"
            )
        self.resume_from_job_id = resume_from_job_id
        self.resume_state_dir = resume_state_dir

    def store(self, name: str, fl_ctx: FLContext, job_id: Optional[str] = None) -> SiteStateStore:
        """The store ``name`` of this site in the run folder of the job ``job_id`` (default: this one)."""
        job_id = job_id or fl_ctx.get_job_id()
        run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(job_id)
        return SiteStateStore(os.path.join(run_dir, STATE_FOLDER), name, fl_ctx.get_identity_name(), job_id)

    def continued(self, name: str, fl_ctx: FLContext) -> ContinuedStateStore:
        """This job's store ``name``, falling back on the failed job's in a continuation job."""
        own = self.store(name, fl_ctx)
        if self.resume_from_job_id is None:
            return ContinuedStateStore(own)
        site = fl_ctx.get_identity_name()
        if self.resume_state_dir is not None:
            directory = os.path.join(self.resume_state_dir, site)
        else:
            run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(self.resume_from_job_id)
            directory = os.path.join(run_dir, STATE_FOLDER)
        return ContinuedStateStore(own, SiteStateStore(directory, name, site, self.resume_from_job_id))
