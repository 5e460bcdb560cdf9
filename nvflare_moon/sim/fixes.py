"""The one switch for the simulator's fixes (:mod:`nvflare_moon.sim`): a function, and a server component that calls
it when the job's server app is built, before any site starts."""

from typing import Dict, List

from nvflare.apis.fl_component import FLComponent

from ..core.validation import check_flag
from .schedule import schedule_simulator_sites
from .sites import keep_simulator_site_names_apart
from .workers import start_simulator_workers_warm

COMPONENT_ID = "simulator_fixes"


def with_simulator_fixes(components: List[dict]) -> List[dict]:
    """A server config's ``components`` with this component first, as the recipes export it (a job exported before
    the fixes became a component, 2026-12-06, gets them so)."""
    return [{"id": COMPONENT_ID, "path": f"{__name__}.SimulatorFixes", "args": {}}] + without_simulator_fixes(
        components
    )


def without_simulator_fixes(components: List[dict]) -> List[dict]:
    """A server config's ``components`` without this one: what the job computes, which the fixes do not change."""
    return [c for c in components if c.get("id") != COMPONENT_ID]


def enable_simulator_fixes(schedule_sites: bool = True, warm_workers: bool = True) -> Dict[str, bool]:
    """Apply the fixes to NVFlare's simulator in this process; which ones now hold (False where the simulator's runner
    is not imported, or ``NVFLARE_MOON_SCHEDULE_SITES=0`` / ``NVFLARE_MOON_WARM_WORKERS=0`` turn a part off).
    Idempotent. The site-name guard always applies: without it a job can train on the wrong sites and exit 0.
    The site pick's claim comes before the schedule's wait (see :func:`.schedule.schedule_simulator_sites`)."""
    return {
        "site_names": keep_simulator_site_names_apart(),
        "schedule_sites": schedule_sites and schedule_simulator_sites(),
        "warm_workers": warm_workers and start_simulator_workers_warm(),
    }


class SimulatorFixes(FLComponent):
    """Server component: NVFlare's simulator with :func:`enable_simulator_fixes`, for this job.

    Args:
        schedule_sites: start a site only when the server waits on it, with NVFlare's fixed waits shortened.
        warm_workers: fork the sites' workers from a process that has imported torch.
    """

    def __init__(self, schedule_sites: bool = True, warm_workers: bool = True):
        super().__init__()
        check_flag("schedule_sites", schedule_sites)
        check_flag("warm_workers", warm_workers)
        self.schedule_sites = schedule_sites
        self.warm_workers = warm_workers
        # now, while the server app is built: the runner's threads start the sites right after
        self.applied = enable_simulator_fixes(schedule_sites, warm_workers)
