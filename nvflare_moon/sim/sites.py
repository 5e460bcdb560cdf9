"""NVFlare 2.9's simulator can start a site's worker under another site's name, or two workers for one site; this
module prevents both and detects the first.

``SimulatorClientRunner.do_one_task`` runs in one thread per ``-t`` worker. Each thread writes the site it is about to
start into the runner's one shared ``build_ctx`` dict (``build_ctx["client_name"] = ...``) and then sends that dict to
the new worker process, which takes its identity from it. When another thread writes between the two, the worker for
site-2 starts as, say, site-4: site-4's task is trained twice, site-2's shard never, and the job exits 0. Seen here
with ``-t 10 -n 10`` (where the mix-up lasts the whole run) and with ``-t < -n``.

With ``-t < -n`` a thread that finishes a task picks the next site with ``get_next_run_client`` (under the runner's
lock), but marks it running only later, outside the lock; another thread can pick the same site meanwhile, and two
workers then run the site's task at once (seen here under load: the same task trained twice, one reply refused).

:func:`keep_simulator_site_names_apart` gives each thread its own copy of ``build_ctx``, and makes the pick claim the
site at once (released again if the thread does not go on to run it); the job's
:class:`nvflare_moon.sim.fixes.SimulatorFixes` component applies it inside a simulator, before any site starts.
:func:`nvflare_moon.executors.site_identity.check_site_identity` is the site's own check, for jobs without that
component: it fails the site's set-up when its name is not the one of the workspace folder the simulator made for it.
"""

import functools
import sys
import threading

from .schedule import site_waited_on_first

SIMULATOR_RUNNER_MODULE = "nvflare.private.fed.app.simulator.simulator_runner"


def _build_ctx_of_this_thread(runner) -> dict:
    per_thread = runner.__dict__["_build_ctx_per_thread"]
    if not hasattr(per_thread, "build_ctx"):
        per_thread.build_ctx = dict(runner.__dict__["_shared_build_ctx"])
    return per_thread.build_ctx


def _set_build_ctx(runner, build_ctx: dict) -> None:
    runner.__dict__["_shared_build_ctx"] = build_ctx
    runner.__dict__["_build_ctx_per_thread"] = threading.local()


_claims = threading.local()  # the sites this thread picked during its current task


def _claiming(get_next_run_client):
    @functools.wraps(get_next_run_client)
    def claim_next_run_client(self, gpu):
        client = site_waited_on_first(self.federated_clients, get_next_run_client(self, gpu))
        client.simulate_running = True  # still under the caller's lock: no other thread can pick it now
        getattr(_claims, "clients", []).append(client)
        return client

    return claim_next_run_client


def _releasing_unused_claims(do_one_task):
    @functools.wraps(do_one_task)
    def do_one_task_releasing(self, client, *args, **kwargs):
        _claims.clients = []
        outcome = (True, None, None)  # if the task raises: the thread stops
        try:
            outcome = do_one_task(self, client, *args, **kwargs)
            return outcome
        finally:
            stop_run, next_client, _ = outcome
            to_run = None if stop_run else next_client
            for other in _claims.clients:
                if other is not client and other is not to_run:
                    other.simulate_running = False  # picked, but this thread stops or runs another site
            _claims.clients = []

    return do_one_task_releasing


def keep_simulator_site_names_apart() -> bool:
    """Make ``SimulatorClientRunner.build_ctx`` a per-thread copy and its pick of the next site a claim, if the
    simulator's runner is imported in this process (``import nvflare`` imports it everywhere; it runs only in a
    simulator).

    Returns:
        whether the simulator's runner is patched (now or before); False when it is not imported.
    """
    runner_module = sys.modules.get(SIMULATOR_RUNNER_MODULE)
    if runner_module is None:
        return False
    runner_class = runner_module.SimulatorClientRunner
    if not isinstance(runner_class.__dict__.get("build_ctx"), property):
        runner_class.build_ctx = property(_build_ctx_of_this_thread, _set_build_ctx)
        runner_class.get_next_run_client = _claiming(runner_class.get_next_run_client)
        runner_class.do_one_task = _releasing_unused_claims(runner_class.do_one_task)
    return True
