"""The guard against NVFlare 2.9's simulator site-name race (nvflare_moon/simulator_sites.py)."""

import logging
import threading
from types import SimpleNamespace

import pytest
from nvflare.apis.fl_constant import FLContextKey
from nvflare.private.fed.app.simulator.simulator_runner import SimulatorClientRunner

import nvflare_moon.server  # noqa: F401  (importing it applies the guard, as in the simulator's server process)
from nvflare_moon.simulator_sites import _releasing_unused_claims, check_site_identity, keep_simulator_site_names_apart


def test_each_simulator_thread_writes_its_own_site_name():
    assert keep_simulator_site_names_apart()
    runner = SimulatorClientRunner.__new__(SimulatorClientRunner)
    runner.build_ctx = {"client_name": None, "workspace": "/ws"}
    both_written = threading.Barrier(2)
    seen = {}

    def start_worker(site):  # what do_one_task does: write the name, then (later) send build_ctx to the worker
        runner.build_ctx["client_name"] = site
        both_written.wait()
        seen[site] = dict(runner.build_ctx)

    threads = [threading.Thread(target=start_worker, args=(site,)) for site in ("site-1", "site-2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {site: {"client_name": site, "workspace": "/ws"} for site in ("site-1", "site-2")}


def runner_with_sites(count: int) -> SimulatorClientRunner:
    runner = SimulatorClientRunner.__new__(SimulatorClientRunner)
    runner.federated_clients = [
        SimpleNamespace(client_name=f"site-{k}", simulate_running=False) for k in range(1, count + 1)
    ]
    runner.run_client_index = -1
    runner.logger = logging.getLogger("test")
    return runner


def test_a_site_picked_by_one_thread_cannot_be_picked_by_another():
    # NVFlare marks a picked site as running only later, outside its lock: two threads could both pick site-2
    runner = runner_with_sites(3)
    runner.federated_clients[0].simulate_running = True  # site-1 is being run
    first, second = runner.get_next_run_client(gpu=None), runner.get_next_run_client(gpu=None)
    assert (first.client_name, second.client_name) == ("site-2", "site-3")
    assert first.simulate_running and second.simulate_running


@pytest.mark.parametrize("stop_run, keeps_claim", [(False, True), (True, False)], ids=["goes_on", "stops"])
def test_a_claim_is_released_unless_the_thread_runs_that_site_next(stop_run, keeps_claim):
    runner = runner_with_sites(3)
    current = runner.federated_clients[0]
    current.simulate_running = True

    def task_then_pick_next(self, client):  # what do_one_task does after a task: pick the next site, under the lock
        return stop_run, self.get_next_run_client(gpu=None), None

    _, picked, _ = _releasing_unused_claims(task_then_pick_next)(runner, current)
    assert picked.client_name == "site-2" and picked.simulate_running is keeps_claim
    assert current.simulate_running  # the caller (run_client_thread) releases the site it ran


class _FakeContext:
    def __init__(self, identity, root, simulate=True):
        self._identity, self._root, self._simulate = identity, root, simulate

    def get_prop(self, key, default=None):
        return self._simulate if key == FLContextKey.SIMULATE_MODE else default

    def get_identity_name(self):
        return self._identity

    def get_engine(self):
        return SimpleNamespace(get_workspace=lambda: SimpleNamespace(get_root_dir=lambda: self._root))


def test_a_worker_started_under_another_sites_name_fails_its_setup():
    check_site_identity(_FakeContext("site-2", "/ws/site-2/"))
    with pytest.raises(RuntimeError, match="worker of site-2 as site-4"):
        check_site_identity(_FakeContext("site-4", "/ws/site-2"))


def test_outside_the_simulator_a_sites_folder_may_have_any_name():
    check_site_identity(_FakeContext("hospital-a", "/opt/flare/startup-kit", simulate=False))
