"""The guard against NVFlare 2.9's simulator site-name race (nvflare_moon/simulator_sites.py)."""

import threading
from types import SimpleNamespace

import pytest
from nvflare.apis.fl_constant import FLContextKey
from nvflare.private.fed.app.simulator.simulator_runner import SimulatorClientRunner

import nvflare_moon.server  # noqa: F401  (importing it applies the guard, as in the simulator's server process)
from nvflare_moon.simulator_sites import check_site_identity, keep_simulator_site_names_apart


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
