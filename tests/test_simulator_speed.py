"""The simulator's speed-ups at ``-t < -n``: workers forked from a zygote (nvflare_moon/sim/workers.py) and sites
started only when the server waits on them (nvflare_moon/sim/schedule.py). They must change nothing but time."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from nvflare_moon.benchmark.process_watch import process_role
from nvflare_moon.recipes import MoonRecipe
from nvflare_moon.sim import schedule as simulator_schedule
from nvflare_moon.sim import workers as simulator_workers
from nvflare_moon.sim.schedule import site_has_open_task, site_waited_on_first
from nvflare_moon.sim.workers import Zygote, _SubprocessWithZygote

from .conftest import TINY_TRAINING, export_and_run, kill_workers

PROBE = "tests.zygote_probe"


@pytest.fixture(scope="module")
def zygote():
    zygote = Zygote()
    yield zygote
    zygote.process.kill()
    zygote.process.wait()


def test_a_forked_worker_runs_its_command_with_its_environment_and_exit_code(zygote, tmp_path):
    report, custom = tmp_path / "report.json", tmp_path / "custom"
    env = {"PROBE_VARIABLE": "site-2", "PYTHONPATH": str(custom), "PATH": "/usr/bin"}
    worker = zygote.start_worker([sys.executable, "-m", PROBE, str(report), "3"], env)
    assert worker.wait(timeout=60) == 3
    assert worker.poll() == 3
    seen = json.loads(report.read_text())
    assert seen["torch_already_imported"]  # the point of the zygote
    assert seen["dynamo_already_imported"]  # what the first optimizer would import
    assert seen["probe_variable"] == "site-2"
    assert str(custom) in seen["sys_path"]  # the job's custom folder, from PYTHONPATH
    assert seen["argv"] == [str(report), "3"]
    assert seen["own_session"]  # as NVFlare's preexec_fn=os.setsid


def test_the_zygotes_module_imports_no_nvflare():
    """NVFlare's modules hold import-time state that forked workers must not share (a worker's second upload is then
    never answered); the zygote refuses to fork with them loaded, so its module must not import them."""
    probe = "import sys, nvflare_moon.sim.workers; print(sorted(m for m in sys.modules if m.startswith('nvflare.')))"
    printed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert printed.stdout.strip() == "[]"


def test_a_forked_worker_can_be_terminated_and_waited_for(zygote, tmp_path):
    worker = zygote.start_worker([sys.executable, "-m", PROBE, str(tmp_path / "r.json"), "0", "60"], {})
    assert worker.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        worker.wait(timeout=0.2)
    worker.terminate()
    assert worker.wait(timeout=30) == -signal.SIGTERM


def test_a_forked_worker_is_seen_as_its_site_by_the_tools_that_watch_workers(monkeypatch, tmp_path):
    workspace = tmp_path / "ws"
    monkeypatch.setattr(sys, "argv", ["nvflare", "simulator", "jobs/moon", "-w", str(workspace), "-n", "3", "-t", "2"])
    zygote = Zygote()  # its command line holds the simulator's, as in a run
    argv = [sys.executable, "-m", PROBE, str(tmp_path / "r.json"), "0", "60", "-o", str(workspace / "site-2")]
    worker = zygote.start_worker(argv + ["--client", "site-2"], {})
    process = psutil.Process(worker.pid)
    try:
        deadline = time.monotonic() + 30
        while process_role(process.cmdline()) != ("client", "site-2"):
            assert time.monotonic() < deadline, process.cmdline()
            time.sleep(0.05)
        assert worker.pid in kill_workers(workspace)  # the tests' clean-up finds it (and the zygote) by the workspace
        assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    finally:
        worker.kill()
        zygote.process.kill()
        zygote.process.wait()


def test_the_runner_starts_workers_from_the_zygote_and_anything_else_as_usual(monkeypatch, tmp_path):
    monkeypatch.setattr(simulator_workers, "WORKER_MODULE", PROBE)
    stand_in = _SubprocessWithZygote()
    try:
        worker = stand_in.Popen([sys.executable, "-m", PROBE, str(tmp_path / "r.json"), "0"], shell=False, env={})
        assert isinstance(worker, simulator_workers.ForkedWorker) and worker.wait(timeout=60) == 0
        other = stand_in.Popen([sys.executable, "-c", "pass"])
        assert isinstance(other, subprocess.Popen) and other.wait(timeout=60) == 0
        stand_in.zygote().process.kill()
        stand_in.zygote().process.wait()
        fallback = stand_in.Popen([sys.executable, "-m", PROBE, str(tmp_path / "r2.json"), "5"], env={})
        assert isinstance(fallback, subprocess.Popen) and fallback.wait(timeout=60) == 5  # the zygote is gone
    finally:
        stand_in.zygote().process.kill()


def standing_task(targets, answered=(), sent=()):
    received = {site: SimpleNamespace(result_received_time=1.0) for site in answered}
    received.update({site: SimpleNamespace(result_received_time=None) for site in sent})
    return SimpleNamespace(completion_status=None, targets=list(targets), last_client_task_map=received)


def test_a_site_has_an_open_task_until_its_result_is_received(monkeypatch):
    communicators = []
    monkeypatch.setattr(simulator_schedule, "_communicators", communicators)
    assert site_has_open_task("site-1") is None  # no controller runs: unknown, so NVFlare's pick stands
    communicators.append(
        SimpleNamespace(_tasks=[standing_task(["site-1", "site-2", "site-3"], ["site-1"], ["site-2"])])
    )
    assert site_has_open_task("site-1") is False  # answered
    assert site_has_open_task("site-2") is True  # sent, no result yet (a resend)
    assert site_has_open_task("site-3") is True  # not sent yet
    assert site_has_open_task("site-4") is False  # not a target
    communicators[0]._tasks.append(standing_task([]))  # no targets: any site
    assert site_has_open_task("site-4") is True
    communicators[0]._tasks[1].completion_status = "ok"
    assert site_has_open_task("site-4") is False


def test_the_pick_skips_sites_the_server_does_not_wait_on(monkeypatch):
    monkeypatch.setattr(simulator_schedule, "_communicators", [SimpleNamespace(_tasks=[standing_task(["b", "c"])])])
    a, b, c = (SimpleNamespace(client_name=name, simulate_running=False) for name in "abc")
    assert site_waited_on_first([a, b, c], a) is b
    b.simulate_running = True
    assert site_waited_on_first([a, b, c], a) is c
    c.simulate_running = True
    assert site_waited_on_first([a, b, c], a) is a  # none free with a task: NVFlare's pick stands
    assert site_waited_on_first([a, b, c], b) is b


def workers_in(site_log: str) -> list:
    """The lines of each worker process in a site's log, one list per worker."""
    workers = []
    for line in site_log.splitlines():
        if "ClientTaskWorker started to run" in line:
            workers.append([])
        elif workers:
            workers[-1].append(line)
    return workers


def site_workers(run, site: str) -> list:
    return workers_in((run.workspace / site / "log.txt").read_text())


def started_for_nothing(worker: list) -> bool:
    """A worker that neither got a task nor ended the run."""
    return not any("got task assignment" in line or "END_RUN" in line for line in worker)


def empty_starts(run, sites) -> int:
    return sum(started_for_nothing(worker) for site in sites for worker in site_workers(run, site))


def answered_site_picks(run) -> int:
    """How often the simulator picked a site to run while the open round already held that site's result."""
    answered, picks = set(), 0
    for line in (run.workspace / "server" / "log.txt").read_text().splitlines():
        if result := re.search(r"got result from client (\S+)", line):
            answered.add(result.group(1))
        elif re.search(r"round \d+: aggregated", line):
            answered.clear()
        elif pick := re.search(r"Simulate Run client: (\S+)", line):
            picks += pick.group(1) in answered
    return picks


# One site's log in NVFlare's format (from a real run, shortened): a worker that trained, one that found no task and
# ended (the kind the scheduling removes), and one that ran the END_RUN sequence.
SITE_LOG = """\
2026-12-04 22:50:23,803 - ClientTaskWorker - INFO - ClientTaskWorker started to run
2026-12-04 22:50:25,884 - ClientRunner - INFO - [identity=site-1, run=simulate_job] - got task assignment: name=train
2026-12-04 22:50:29,366 - ClientTaskWorker - INFO - ClientTaskWorker started to run
2026-12-04 22:50:31,586 - ClientRunner - INFO - [identity=site-1, run=simulate_job] - client runner started
2026-12-04 22:50:31,586 - ClientTaskWorker - INFO - Initialize ClientRunner for client: site-1
2026-12-04 22:50:57,102 - ClientTaskWorker - INFO - ClientTaskWorker started to run
2026-12-04 22:50:59,350 - ClientRunner - INFO - [identity=site-1, run=simulate_job] - ABOUT_TO_END_RUN fired
"""


def test_a_worker_that_got_no_task_and_ran_no_end_run_counts_as_started_for_nothing():
    assert [started_for_nothing(worker) for worker in workers_in(SITE_LOG)] == [False, True, False]


@pytest.mark.e2e
def test_sped_up_simulator_gives_nvflares_results_without_empty_starts(tmp_path, monkeypatch):
    """-n 3 -t 2: the round-robin picks sites that have already answered the open round. NVFlare starts their workers
    at once, which find no task when the round outlasts their three fetch tries (often, not always, at this size); ours
    starts them only when the server waits on them, forks its workers, and every figure of the run is the same."""
    recipe = MoonRecipe(min_clients=3, num_rounds=3, **TINY_TRAINING)
    ours = export_and_run(recipe, tmp_path, n=3, t=2, tag="_ours")
    monkeypatch.setenv("NVFLARE_MOON_SCHEDULE_SITES", "0")
    monkeypatch.setenv("NVFLARE_MOON_WARM_WORKERS", "0")
    nvflare = export_and_run(recipe, tmp_path, n=3, t=2, tag="_nvflare")
    for run in (ours, nvflare):
        assert run.returncode == 0, run.output[-3000:]
        assert run.leftover_workers == []
    assert "site workers are forked from a process with torch imported" in ours.output
    assert "site workers are forked" not in nvflare.output
    sites = ["site-1", "site-2", "site-3"]
    assert answered_site_picks(ours) > 0 and answered_site_picks(nvflare) > 0  # the case the scheduling is for
    assert empty_starts(ours, sites) == 0
    timing = {"time", "eval_seconds"}
    without_time = [
        [{k: v for k, v in m.items() if k not in timing} for m in run.global_metrics()] for run in (ours, nvflare)
    ]
    assert len(without_time[0]) == 3 and without_time[0] == without_time[1]
    # after each task the server asks the site back in 20 ms, not NVFlare's 2 s (task_request_interval)
    for run, interval in ((ours, "0.02"), (nvflare, "2")):
        finished = [
            line for site in sites for w in site_workers(run, site) for line in w if "Finished one task" in line
        ]
        assert len(finished) == 9 and all(
            line.endswith(f"interval: {interval} task_processed: True") for line in finished
        )


SHORTER_SLEEP = """
import time
from nvflare_moon.sim.schedule import shorten_worker_sync_sleep
from nvflare.private.fed.client import client_runner
print(shorten_worker_sync_sleep())

def init_run():  # the name of the function whose sleep is shortened
    client_runner.time.sleep(0.5)

def elsewhere():
    client_runner.time.sleep(0.5)

for sleeper in (init_run, elsewhere):
    started = time.monotonic()
    sleeper()
    print(time.monotonic() - started)
"""


@pytest.mark.parametrize("switch,shortened", [("1", True), ("0", False)])
def test_only_the_workers_sync_sleep_is_shortened(switch, shortened):
    env = {**os.environ, "NVFLARE_MOON_SCHEDULE_SITES": switch}
    printed = subprocess.run([sys.executable, "-c", SHORTER_SLEEP], env=env, capture_output=True, text=True, check=True)
    patched, in_init_run, elsewhere = printed.stdout.split()
    assert patched == str(shortened)
    # a sleep never ends early, and may end late on a busy machine: the shortened one is 20 ms, far below 0.5 s
    assert (float(in_init_run) < 0.25) if shortened else (float(in_init_run) >= 0.5)
    assert float(elsewhere) >= 0.5


SERVER_WAITS = """
import time
from nvflare.fuel.f3.mpm import MainProcessMonitor
from nvflare.private.fed.server.server_engine import ServerEngine
from nvflare.private.fed.server.server_runner import ServerRunner, ServerRunnerConfig
from nvflare.private.fed.simulator.simulator_server import SimulatorServerEngine
from nvflare_moon.sim.schedule import schedule_simulator_sites

def interval_asked_by_a_server_on(engine_class):
    class StandIn(engine_class):
        def __init__(self):
            pass

        def register_aux_message_handler(self, **kwargs):
            pass

    config = ServerRunnerConfig(60, 2, [], {}, {})
    ServerRunner(config, "job", StandIn())
    return config.task_request_interval

def seconds_to_shut_down():
    MainProcessMonitor.add_cleanup_cb(print, "cleaned up")
    started = time.monotonic()
    MainProcessMonitor._start_shutdown(2, 5)  # as a process running NVFlare calls it at its end (grace 2 s)
    return time.monotonic() - started

print(schedule_simulator_sites())
print(interval_asked_by_a_server_on(ServerEngine))  # a real federation's server
print(seconds_to_shut_down())
print(interval_asked_by_a_server_on(SimulatorServerEngine))
print(seconds_to_shut_down())
"""


@pytest.mark.parametrize("switch,shortened", [("1", True), ("0", False)])
def test_only_the_simulators_server_asks_sites_back_sooner_and_ends_without_grace_sleep(switch, shortened):
    env = {**os.environ, "NVFLARE_MOON_SCHEDULE_SITES": switch}
    printed = subprocess.run([sys.executable, "-c", SERVER_WAITS], env=env, capture_output=True, text=True, check=True)
    applied, real_interval, cleaned, real_end, simulator_interval, cleaned_too, simulator_end = printed.stdout.split(
        "\n"
    )[:7]
    assert applied == str(shortened) and cleaned == cleaned_too == "cleaned up"  # the clean-up itself always runs
    assert real_interval == "2" and float(real_end) >= 2  # NVFlare imports its simulator everywhere: a real server
    assert simulator_interval == ("0.02" if shortened else "2")
    assert (float(simulator_end) < 1) if shortened else (float(simulator_end) >= 2)


class FakeClock:
    """time for simulator_schedule: each look at the clock is 100 s later; sleeping takes no time."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        self.now += 100.0
        return self.now

    def sleep(self, seconds):
        pass


def test_the_runner_waits_for_a_slow_worker_far_beyond_nvflares_60_seconds(monkeypatch):
    clock, tries = FakeClock(), []

    def listener(address, late_by):
        tries.append(address)
        if len(tries) <= late_by:
            raise ConnectionRefusedError("not listening yet")
        return "connection"

    monkeypatch.setattr(simulator_schedule, "time", clock)
    # listening after about 500 s: NVFlare's runner, which asks for 60, gets the connection
    monkeypatch.setattr(simulator_schedule, "Client", lambda address: listener(address, late_by=4))
    assert simulator_schedule._connect_soon(None, 4321, timeout=60.0) == "connection"
    # never listening: given up after WORKER_START_TIMEOUT, with the port in the message
    tries.clear()
    monkeypatch.setattr(simulator_schedule, "Client", lambda address: listener(address, late_by=10**6))
    with pytest.raises(RuntimeError, match=r"no worker listens on port 4321 after 600.0 s"):
        simulator_schedule._connect_soon(None, 4321, timeout=60.0)
    assert 6 <= len(tries) <= 8 and tries[0] == ("localhost", 4321)
