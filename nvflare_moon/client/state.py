"""Where a Client API script keeps its state between rounds: a folder of this job's run folder on the site.

NVFlare gives a Client API script no place for state, and restarts the script for every task when the simulator has
fewer workers than clients (``-t < -n``), in-process and as an external process alike. The run folder
``<site workspace>/<job id>`` is job-scoped: the script finds it from its working directory, which is the site's
workspace root in-process (the run folder is ``./<job id>``) and the app folder ``<run folder>/app_<site>`` with an
external process (the run folder is an ancestor named after the job). The state goes to ``<run folder>/nvflare_moon``,
where the executors keep theirs. An explicit ``state_dir`` wins: the state then goes to
``<state_dir>/<job id>/<site>``, so that two jobs or two sites never share a file. The site's workspace root, which
every job on the site shares, is never used.
"""

import os
from typing import Optional

from ..core.state import STATE_FOLDER, SiteStateStore


class StateFolderNotFound(RuntimeError):
    """No job-scoped folder for the script's state; the message says what to pass."""


def find_run_folder(job_id: str, cwd: Optional[str] = None) -> Optional[str]:
    """The run folder of ``job_id`` as seen from ``cwd`` (default: the working directory), or None.

    In-process the working directory is the site's workspace root and the run folder ``cwd/<job id>``; with an
    external process it is the app folder, below the run folder: the nearest ancestor named ``<job id>``.
    """
    cwd = os.path.abspath(cwd or os.getcwd())
    below = os.path.join(cwd, job_id)
    if os.path.isdir(below):
        return below
    folder = cwd
    while True:
        if os.path.basename(folder) == job_id:
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def state_folder(job_id: str, site: str, state_dir: Optional[str] = None, cwd: Optional[str] = None) -> str:
    """The job-scoped folder for ``site``'s state in job ``job_id``.

    Raises:
        StateFolderNotFound: no ``state_dir`` was given and no run folder of the job is found from ``cwd``.
    """
    if not job_id or not site:
        raise StateFolderNotFound(f"a job id and a site name are needed for the state folder, got {job_id!r}, {site!r}")
    if state_dir is not None:
        return os.path.join(os.path.abspath(os.path.expanduser(state_dir)), job_id, site)
    run_folder = find_run_folder(job_id, cwd)
    if run_folder is None:
        raise StateFolderNotFound(
            f"cannot find the run folder of job {job_id!r} from the working directory {os.path.abspath(cwd or '.')} "
            f"(expected ./{job_id} in-process or an ancestor folder named {job_id!r} in an external process); "
            "pass state_dir=<a folder that persists across rounds> to the helper: its state then goes to "
            f"<state_dir>/{job_id}/{site}"
        )
    return os.path.join(run_folder, STATE_FOLDER)


def script_state_store(
    name: str, job_id: str, site: str, state_dir: Optional[str] = None, cwd: Optional[str] = None
) -> SiteStateStore:
    """A :class:`SiteStateStore` for the state ``name`` of ``site`` in job ``job_id`` (see :func:`state_folder`)."""
    return SiteStateStore(state_folder(job_id, site, state_dir, cwd), name, site, job_id)
