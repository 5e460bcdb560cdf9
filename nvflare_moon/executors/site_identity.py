"""A site's check of its own name in NVFlare's simulator, whose worker start can mix two sites up (see
:mod:`nvflare_moon.sim.sites`); nothing is checked in POC or production."""

import os

from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext


def check_site_identity(fl_ctx: FLContext) -> None:
    """In the simulator, raise ``RuntimeError`` unless this site's name is its workspace folder's name.

    Outside the simulator (POC, production) a site's folder may have any name, so nothing is checked.
    """
    if not fl_ctx.get_prop(FLContextKey.SIMULATE_MODE, False):
        return
    site = fl_ctx.get_identity_name()
    folder = os.path.basename(os.path.normpath(fl_ctx.get_engine().get_workspace().get_root_dir()))
    if folder != site:
        raise RuntimeError(
            f"the simulator started the worker of {folder} as {site} (a race in NVFlare 2.9's simulator that makes "
            f"one site train twice and another never); run the job again, or with -t equal to -n and "
            f"nvflare_moon's SimulatorFixes server component (in every job our recipes export), which prevents it"
        )
