"""NVFlare 2.9's simulator: at ``-t < -n`` start a site only when the server waits on it, and connect to a started
worker as soon as it listens; at any ``-t``, shorten the waits NVFlare fixes.

The idle costs (read in ``simulator_runner.py``, ``simulator_worker.py`` and ``server_runner.py``; measured by
``benchmarks/simulator_overhead.py --compare-threads``):

- **Empty starts.** A thread picks the next site round-robin without asking whether the server has a task for it; a
  site that already answered this round costs a whole worker start, three empty task fetches and their sleeps, for
  nothing. While the server's controller runs, :func:`schedule_simulator_sites` makes a thread pick a site that one of
  the controller's standing tasks still waits on, and, when there is none yet (the server is aggregating), wait for
  one in the thread instead of starting a worker. Outside a controller (between workflows, at the end of the run,
  where the sites must still hear END_RUN) and after ``MAX_WAIT`` seconds, it picks as NVFlare does.
- **Fixed sleeps.** The runner connects to a new worker right after starting it, and retries once a second; the first
  try almost always comes too early, so every task waits about a second. Each thread sleeps a second before every
  task, and each worker half a second before it syncs with the server. Here each of these lasts 20 ms (the worker's,
  in workers forked by :mod:`nvflare_moon.sim.workers`, which calls :func:`shorten_worker_sync_sleep`).
- **Waits the server asks for.** After every task the server tells the site to come back in ``task_request_interval``
  (2 s by default), which a worker sleeps before it asks for the next round's task, however soon that is ready. The
  simulator's server asks for POLL instead (the worker's own 0.5 s between fetches that the server answers with "try
  again" still bounds its polling). It is recognised by its engine: NVFlare imports its simulator in every process, so
  a real server's job process runs this code too, and keeps 2 s. At its end the process that ran the simulator's server
  sleeps 3 s "to let pending activities finish" before its clean-up; every site and the server app have ended by then,
  so here it goes straight to the clean-up.

``NVFLARE_MOON_SCHEDULE_SITES=0`` turns all of it off.
"""

import functools
import os
import sys
import threading
import time
import weakref
from multiprocessing.connection import Client
from typing import Optional

RUNNER_MODULE = "nvflare.private.fed.app.simulator.simulator_runner"
SWITCH = "NVFLARE_MOON_SCHEDULE_SITES"
MAX_WAIT = 30.0  # seconds a thread waits for a task before it picks as NVFlare does
POLL = 0.02
WORKER_START_TIMEOUT = 600.0  # seconds the runner waits for a new worker to listen (NVFlare: 60)

_simulator_server_built = threading.Event()  # this process runs the simulator's server (see _asking_back_sooner)
_communicators = weakref.WeakSet()  # the server's running task communicators (one per running workflow)


def site_has_open_task(site: str) -> Optional[bool]:
    """Whether a standing task of a running controller still waits on ``site``; None when no controller runs."""
    communicators = list(_communicators)
    if not communicators:
        return None
    for communicator in communicators:
        for task in list(communicator._tasks):
            if task.completion_status is not None or (task.targets and site not in task.targets):
                continue
            sent = task.last_client_task_map.get(site)
            if sent is None or sent.result_received_time is None:
                return True
    return False


def _tracking(method, add: bool):
    @functools.wraps(method)
    def track(self, fl_ctx):
        (_communicators.add if add else _communicators.discard)(self)
        return method(self, fl_ctx)

    return track


def site_waited_on_first(clients, picked):
    """``picked`` (NVFlare's round-robin pick), or the first free site in ``clients`` that the running controller
    still waits on when it does not wait on ``picked``."""
    if site_has_open_task(picked.client_name) is not False:
        return picked
    free = (c for c in clients if not c.simulate_running and c is not picked)
    return next((c for c in free if site_has_open_task(c.client_name)), picked)


def _waiting_for_a_task(do_one_task):
    """Before a worker starts for a site that the running controller does not wait on, wait (up to MAX_WAIT) until
    it does, or hand the thread to another free site that it does wait on (as NVFlare's runner hands it on after a
    task: returned as the next site to run)."""

    @functools.wraps(do_one_task)
    def do_one_task_when_waited_on(self, client, num_of_threads, gpu, lock, *args, **kwargs):
        waited = 0.0
        while num_of_threads < len(self.federated_clients) and waited < MAX_WAIT:
            if site_has_open_task(client.client_name) is not False:
                break
            with lock:
                ready = site_waited_on_first(self.federated_clients, client)
                if ready is not client:
                    ready.simulate_running = True
                    return False, ready, None
            time.sleep(POLL)
            waited += POLL
        return do_one_task(self, client, num_of_threads, gpu, lock, *args, **kwargs)

    return do_one_task_when_waited_on


def _connect_soon(self, open_port, timeout=60.0):
    """The runner's connection to a new worker's listener, tried every POLL seconds (NVFlare: every second), for at
    least WORKER_START_TIMEOUT: NVFlare gives up after its 60 s, and the site's thread then dies with the job waiting
    on the site for ever (seen with a worker that took longer to import on a loaded machine)."""
    timeout = max(timeout, WORKER_START_TIMEOUT)
    started = time.monotonic()
    while True:
        try:
            return Client(("localhost", open_port))
        except OSError:
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"no worker listens on port {open_port} after {timeout} s") from None
            time.sleep(POLL)


class _ShorterSleep:
    """Stands in for the ``time`` module of an NVFlare module: the fixed sleeps of the function ``caller`` last POLL;
    every other use is the real module's."""

    def __init__(self, caller: str):
        self.caller = caller

    def __getattr__(self, name):
        return getattr(time, name)

    def sleep(self, seconds):
        time.sleep(POLL if sys._getframe(1).f_code.co_name == self.caller else seconds)


def shorten_worker_sync_sleep() -> bool:
    """In a site's worker process: ``ClientRunner.init_run`` sleeps 0.5 s before each try to sync with the server
    (whose reply it then awaits for up to 2 s); make that sleep POLL. False when turned off."""
    if os.environ.get(SWITCH, "1") == "0":
        return False
    from nvflare.private.fed.client import client_runner

    client_runner.time = _ShorterSleep("init_run")
    return True


def _asking_back_sooner(init):
    """``ServerRunner.__init__`` that caps ``task_request_interval`` at POLL for the simulator's server, recognised by
    its engine: NVFlare imports its simulator in every process, so a real server's job process runs this code too, and
    its clients must keep polling every 2 s."""

    @functools.wraps(init)
    def init_asking_back_sooner(self, config, job_id, engine, *args, **kwargs):
        from nvflare.private.fed.simulator.simulator_server import SimulatorServerEngine

        if isinstance(engine, SimulatorServerEngine):
            config.task_request_interval = min(config.task_request_interval, POLL)
            _simulator_server_built.set()
        init(self, config, job_id, engine, *args, **kwargs)

    return init_asking_back_sooner


def _without_grace_sleep(start_shutdown):
    """``MainProcessMonitor._start_shutdown`` without its grace sleep in the process that ran the simulator's server;
    any other process keeps it."""

    @functools.wraps(start_shutdown)
    def start_shutdown_now(shutdown_grace_time, cleanup_grace_time):
        return start_shutdown(0 if _simulator_server_built.is_set() else shutdown_grace_time, cleanup_grace_time)

    return start_shutdown_now


def schedule_simulator_sites() -> bool:
    """Apply these changes to the simulator's classes in this process; False when its runner is not imported, when
    turned off by ``NVFLARE_MOON_SCHEDULE_SITES=0``, or when already applied. ``import nvflare`` imports the runner in
    every process, so a real server's process is patched too: the runner's own classes never run there, and the
    patches on shared classes act only for the simulator's server (its engine) or only record (the open tasks).

    The pick itself is :func:`nvflare_moon.sim.sites.keep_simulator_site_names_apart`'s, which asks
    :func:`site_waited_on_first`; apply that first, so that the wait here comes before its claim bookkeeping.
    """
    runner_module = sys.modules.get(RUNNER_MODULE)
    if runner_module is None or os.environ.get(SWITCH, "1") == "0":
        return False
    runner_class = runner_module.SimulatorClientRunner
    if runner_class.__dict__.get("_create_connection") is _connect_soon:
        return False
    from nvflare.apis.impl.wf_comm_server import WFCommServer
    from nvflare.fuel.f3.mpm import MainProcessMonitor
    from nvflare.private.fed.server.server_runner import ServerRunner

    ServerRunner.__init__ = _asking_back_sooner(ServerRunner.__init__)
    MainProcessMonitor._start_shutdown = _without_grace_sleep(MainProcessMonitor._start_shutdown)
    WFCommServer.initialize_run = _tracking(WFCommServer.initialize_run, add=True)
    WFCommServer.finalize_run = _tracking(WFCommServer.finalize_run, add=False)
    runner_class.do_one_task = _waiting_for_a_task(runner_class.do_one_task)
    runner_class._create_connection = _connect_soon
    runner_module.time = _ShorterSleep("run_client_thread")
    return True
