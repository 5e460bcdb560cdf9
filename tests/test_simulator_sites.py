"""The guard against NVFlare 2.9's simulator site-name race (nvflare_moon/sim/sites.py)."""

import json
import logging
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from nvflare.apis.fl_constant import FLContextKey
from nvflare.private.fed.app.simulator.simulator_runner import SimulatorClientRunner

from nvflare_moon.executors.site_identity import check_site_identity
from nvflare_moon.sim.sites import _releasing_unused_claims, keep_simulator_site_names_apart

keep_simulator_site_names_apart()  # as the job's SimulatorFixes does in the simulator's server process


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


OPT_IN = """
from nvflare.private.fed.app.simulator import simulator_runner
runner = simulator_runner.SimulatorClientRunner
untouched = (runner.do_one_task, runner.get_next_run_client, runner.__dict__.get("_create_connection"),
             simulator_runner.subprocess, simulator_runner.time)
import nvflare_moon, nvflare_moon.server, nvflare_moon.executors, nvflare_moon.client, nvflare_moon.sim
print(untouched == (runner.do_one_task, runner.get_next_run_client, runner.__dict__.get("_create_connection"),
                    simulator_runner.subprocess, simulator_runner.time))
import nvflare_moon.sim.fixes
print(nvflare_moon.sim.fixes.SimulatorFixes().applied)
print(runner.do_one_task is untouched[0], isinstance(runner.__dict__["build_ctx"], property))
"""


def test_nothing_is_patched_on_import_and_the_jobs_component_switches_the_fixes_on():
    printed = subprocess.run([sys.executable, "-c", OPT_IN], capture_output=True, text=True, check=True)
    assert printed.stdout.split("\n")[:3] == [
        "True",  # importing the plugin's packages left NVFlare's simulator as it is
        "{'site_names': True, 'schedule_sites': True, 'warm_workers': True}",
        "False True",
    ]


def test_every_recipe_puts_the_fixes_in_the_servers_config(tmp_path):
    from nvflare_moon.recipes import DataCheckRecipe, MoonRecipe

    data_check = DataCheckRecipe(dataset="image_folder", site_data={"class_names": ["a", "b"]}, min_clients=2)
    for name, recipe in (("m", MoonRecipe(name="m")), ("data_check", data_check)):
        recipe.export(str(tmp_path))
        config = json.loads((tmp_path / name / "app" / "config" / "config_fed_server.json").read_text())
        assert {"id": "simulator_fixes", "path": "nvflare_moon.sim.fixes.SimulatorFixes", "args": {}} in config[
            "components"
        ]
