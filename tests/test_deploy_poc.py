"""NVFlare's POC mode on loopback: the poc/ scripts, jobs through the FLARE API, and the faults a federation meets.

One POC (a server and two sites, on a free port) serves the whole module: poc/prepare.py and poc/start.py bring it
up, poc/stop.py takes it down. Four tiny MOON jobs run on it at the same time, so every one is also a job running
beside others on the same sites:

- ``moon_a``: submitted, awaited and downloaded by ``poc/run_job.py`` (FLARE API);
- ``moon_killed``: site-1's job process is SIGKILLed during round 2 (0-based); NVFlare fails the job, and its
  continuation (``submit.continue_job``) runs the rounds left with every site's state;
- ``moon_script_poc``: MOON inside a Client API script (``client_api_script.py``, :class:`MoonScriptRecipe`): each
  site's previous model is the one it sent the round before, kept in the job's run folder on the site;
- ``moon_spoiled``: site-2 sends a NaN, a missing-key and a wrong-shape update in rounds 0-2 (the malformed ones
  before site-1's honest ones), and both sites a NaN one in round 3 (a test-only executor shipped in the job's
  ``custom/``; Inf is covered by test_bad_updates.py).

The last test then SIGKILLs the server during a fourth job; the POC's restart loop brings the server back.
"""

import json
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import torch

from nvflare_moon.core.state import SiteStateStore
from nvflare_moon.ops import submit
from nvflare_moon.ops.continuation import last_global_model
from nvflare_moon.recipes import MoonScriptRecipe

from .conftest import REPO
from .federation import (
    SITES,
    Poc,
    connect,
    export_tiny_moon,
    kill,
    pids_of,
    run_script,
    running_poc,
    saved_state,
    wait_until,
)
from .test_client_api_e2e import SCRIPT, script_module

pytestmark = pytest.mark.deploy
ROUNDS = 3
KILLED_ROUNDS = 4  # the kill lands in round 2, so that round 3 is left for the continuation even if round 2 finished
SPOIL_PLAN = {"site-2": ["nan", "missing_key", "wrong_shape", "nan"], "site-1": [None, None, None, "nan"]}
SPOIL_REASONS = ["holds NaN or Inf", "keys differ", "has shape"]  # what the server says of site-2 in rounds 0-2
HOLD_ROUNDS = [1, 2]  # rounds in which site-1 holds its honest reply until site-2's malformed one has arrived
WORKER = "nvflare.private.fed.app.client.worker_process"
JOB_TIMEOUT = 240


@pytest.fixture(scope="module")
def poc(tmp_path_factory):
    yield from running_poc(tmp_path_factory.mktemp("poc"))


def spoiling_job(job_dir: Path) -> Path:
    """Replace the job's MOON executor by the test-only SpoilingMoonExecutor, shipped in the job's custom/."""
    config = job_dir / "app" / "config" / "config_fed_client.json"
    client = json.loads(config.read_text())
    executor = client["executors"][0]["executor"]
    executor["path"] = "bad_update_executor.SpoilingMoonExecutor"
    executor["args"].update(
        spoil_plan=SPOIL_PLAN, hold_site="site-1", hold_until_site="site-2", hold_rounds=HOLD_ROUNDS
    )
    config.write_text(json.dumps(client, indent=2))
    shutil.copy(Path(__file__).parent / "bad_update_executor.py", job_dir / "app" / "custom")
    return job_dir


def kill_job_process_after_round(poc: Poc, job_id: str, site: str, round_number: int) -> dict:
    """SIGKILL ``site``'s process of the job as soon as it saved ``round_number``: it dies during the next round."""
    state = wait_until(
        lambda: (s := saved_state(poc.site(site), job_id)) and s["round"] >= round_number and s,
        JOB_TIMEOUT,
        f"{site} to save round {round_number} of job {job_id}",
        interval=0.1,
    )
    (pid,) = pids_of(WORKER, job_id, site)
    kill([pid])
    return state


@pytest.fixture(scope="module")
def outcomes(poc):
    jobs = poc.root / "jobs"
    job_a = export_tiny_moon(jobs, "moon_a", ROUNDS)
    MoonScriptRecipe(
        name="moon_script_poc",
        model=script_module().TinyNet(),
        min_clients=len(SITES),
        num_rounds=ROUNDS,
        train_script=str(SCRIPT),
        train_args=f"--records {poc.root / 'script_records.jsonl'}",
        mu=2.0,
    ).export(str(jobs / "script"))
    paths = {
        "script": jobs / "script" / "moon_script_poc",
        "killed": export_tiny_moon(jobs, "moon_killed", KILLED_ROUNDS),
        "spoiled": spoiling_job(export_tiny_moon(jobs, "moon_spoiled", len(SPOIL_PLAN["site-2"]))),
    }
    run_a = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "poc" / "run_job.py"),
            str(job_a),
            "-w",
            poc.ws.root,
            "-o",
            str(poc.root / "results"),
            "--timeout",
            str(JOB_TIMEOUT),
        ],
        env=poc.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        session = connect(poc.admin_kit, 60)
        try:
            ids = {name: session.submit_job(str(path)) for name, path in paths.items()}
            state_at_kill = kill_job_process_after_round(poc, ids["killed"], "site-1", 1)
            metas = {name: submit.wait_for_job(session, job_id, JOB_TIMEOUT) for name, job_id in ids.items()}
            continued = submit.continue_job(
                session, ids["killed"], str(poc.root / "continued"), JOB_TIMEOUT, str(poc.root / "results")
            )
            spoiled = session.download_job_result(ids["spoiled"], str(poc.root / "results"))
            spoiled_reasons = submit.failure_reasons(session, ids["spoiled"])
            output_a, _ = run_a.communicate(timeout=JOB_TIMEOUT)
            (ids["a"],) = {line.split()[1].rstrip(":") for line in output_a.splitlines() if line.startswith("job ")}
            metas["a"] = session.get_job_meta(ids["a"])
        finally:
            session.close()
    finally:
        if run_a.poll() is None:
            run_a.kill()
    return dict(
        ids=ids,
        metas=metas,
        run_a=run_a,
        output_a=output_a,
        results_a=submit.JobResults(str(poc.root / "results" / ids["a"])),
        spoiled=submit.JobResults(spoiled),
        state_at_kill=state_at_kill,
        spoiled_reasons=spoiled_reasons,
        continued=continued,
    )


def site_state(poc: Poc, site: str, job_id: str) -> dict:
    """The site's MOON state for the job, loaded and validated (site, job) by the plugin's own store."""
    return SiteStateStore(str(poc.site(site) / job_id / "nvflare_moon"), "moon_state", site, job_id).load()


def _span(meta: dict):
    """When the job ran, from its meta: ``start_time`` (ISO) and ``duration`` ("H:MM:SS.ffffff")."""
    start = datetime.fromisoformat(meta["start_time"])
    hours, minutes, seconds = meta["duration"].split(":")
    return start, start + timedelta(hours=int(hours), minutes=int(minutes), seconds=float(seconds))


def state_stamps(poc: Poc, job_id: str) -> dict:
    """Site -> (modification time, round) of its state file for the job: any new training would change them."""
    stamps = {}
    for site in SITES:
        path = poc.site(site) / job_id / "nvflare_moon" / "moon_state.pt"
        if path.exists():
            stamps[site] = (path.stat().st_mtime_ns, saved_state(poc.site(site), job_id)["round"])
    return stamps


def test_poc_scripts_leave_a_running_poc_alone(poc):
    again = run_script("poc/prepare.py", "-n", "2", "-p", str(poc.ws.port()), "-w", poc.ws.root, env=poc.env)
    assert again.returncode == 1 and "stop it first" in again.stdout  # never recreated under a running POC
    again = run_script("poc/start.py", "-w", poc.ws.root, env=poc.env)
    assert again.returncode == 0 and "already running" in again.stdout, again.stdout


def test_run_job_script_runs_a_moon_job_with_the_flare_api_and_downloads_its_results(outcomes):
    assert outcomes["run_a"].returncode == 0, outcomes["output_a"]
    assert outcomes["metas"]["a"]["status"] == submit.COMPLETED
    results = outcomes["results_a"].check()
    assert f"metrics:          {results.metrics_file}" in outcomes["output_a"]
    metrics = results.metrics()
    assert [m["round"] for m in metrics] == list(range(ROUNDS))
    assert all(set(m["site_weights"]) == set(SITES) for m in metrics)
    assert list(Path(results.tb_events, "global").glob("events.out.tfevents.*"))
    assert "model" in torch.load(results.global_model, weights_only=False)


def test_a_client_api_moon_job_keeps_each_sites_previous_model_in_its_run_folder(poc, outcomes):
    assert outcomes["metas"]["script"]["status"] == submit.COMPLETED
    records = [json.loads(line) for line in (poc.root / "script_records.jsonl").read_text().splitlines()]
    by_site = {site: {r["round"]: r for r in records if r["site"] == site} for site in SITES}
    for site, rounds in by_site.items():
        assert sorted(rounds) == list(range(ROUNDS)) and rounds[0]["previous"] == []
        for r in range(1, ROUNDS):
            assert rounds[r]["previous"] == [rounds[r - 1]["sent"]], (site, r)
            assert rounds[r]["contrastive"] > 1e-3 and abs(rounds[r]["contrastive"] - np.log(2)) > 1e-3
        assert (poc.site(site) / outcomes["ids"]["script"] / "nvflare_moon" / "moon_state.pt").is_file()


def test_jobs_running_at_once_keep_separate_moon_states(poc, outcomes):
    metas = outcomes["metas"]
    (start_a, end_a), (start_s, end_s) = [_span(metas[name]) for name in ("a", "spoiled")]
    assert start_a < end_s and start_s < end_a, "the jobs did not run at the same time"
    uploads = {}
    for site in SITES:
        state_a = site_state(poc, site, outcomes["ids"]["a"])
        assert state_a["round"] == ROUNDS - 1
        uploads[site] = state_a["payload"]["previous_models"][-1]
        assert site_state(poc, site, outcomes["ids"]["spoiled"])["round"] == len(SPOIL_PLAN["site-2"]) - 1
    # job a's final global model is the weighted average of ITS sites' last uploads, untouched by the other jobs
    weights = outcomes["results_a"].metrics()[-1]["site_weights"]
    saved = torch.load(outcomes["results_a"].global_model, weights_only=False)["model"]
    for key, value in saved.items():
        expected = sum(weights[s] * uploads[s][key].double().numpy() for s in SITES)
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_a_site_killed_mid_job_fails_the_job_and_its_continuation_completes_with_the_site_state(poc, outcomes):
    """NVFlare 2.9 restarts neither the process nor the job: the site's parent reports the death and the server fails
    the whole job at once. The site's MOON state stays as saved before the kill. The job's continuation runs the rounds
    left from the last global model, and the killed site's first continued round trains with that saved state."""
    failed = outcomes["ids"]["killed"]
    assert outcomes["metas"]["killed"]["status"] == "FINISHED:EXECUTION_EXCEPTION"
    server_log = (poc.site("server") / "log.txt").read_text()
    assert f"Failing job {failed} due to reported failure from site-1" in server_log
    record = site_state(poc, "site-1", failed)
    assert record["round"] == outcomes["state_at_kill"]["round"] == 1
    for name, value in outcomes["state_at_kill"]["payload"]["previous_models"][-1].items():
        assert torch.equal(record["payload"]["previous_models"][-1][name], value)
    assert outcomes["metas"]["a"]["status"] == submit.COMPLETED  # the other jobs on site-1 were not disturbed

    continued = outcomes["continued"]  # it completed: continue_job raises otherwise
    continued_id = Path(continued.root).name
    _, last_aggregated = last_global_model(str(poc.root / "continued" / failed))
    assert last_aggregated in (0, 1)  # whether site-1's round-1 reply got out before the kill is a race
    metrics = continued.metrics()
    assert [m["round"] for m in metrics] == list(range(last_aggregated + 1, KILLED_ROUNDS))
    for site in SITES:  # MOON's term is dropped only when a site has no previous model
        assert metrics[0]["site_metrics"][site]["train_contrastive"] > 0
    site_log = (poc.site("site-1") / continued_id / "log.txt").read_text()
    assert f"continuing job {failed}: took its moon_state state, saved in round 1" in site_log
    if last_aggregated == 0:  # round 1 runs again: its own earlier upload is not its previous model
        assert "round 1: ignoring the stored uploads of rounds [1]" in site_log
    final = site_state(poc, "site-1", continued_id)
    assert final["round"] == KILLED_ROUNDS - 1 and final["payload"]["rounds"] == [KILLED_ROUNDS - 2, KILLED_ROUNDS - 1]
    assert site_state(poc, "site-1", failed)["round"] == 1  # the failed job's own state is left as it was


def test_bad_updates_are_rejected_naming_the_site_and_no_valid_update_fails_the_job(outcomes):
    results = outcomes["spoiled"]
    server_log = (Path(results.root) / "workspace" / "log.txt").read_text()
    for round_number, reason in enumerate(SPOIL_REASONS):
        assert any(
            f"rejected the update of site-2 in round {round_number}: " in line and reason in line
            for line in server_log.splitlines()
        ), (round_number, reason)
    for round_number in HOLD_ROUNDS:  # the malformed update came first, and still the honest one was accepted
        section = server_log.split(f"Round {round_number} started.")[1].split(f"Round {round_number + 1} started.")[0]
        assert section.index("got result from client site-2") < section.index("got result from client site-1")
    metrics = results.metrics()
    assert [m["round"] for m in metrics] == list(range(len(SPOIL_REASONS)))  # completed with site-1 alone
    assert all(m["site_weights"] == {"site-1": 1.0} for m in metrics)
    last = len(SPOIL_REASONS)
    assert f"rejected the update of site-1 in round {last}" in server_log
    assert outcomes["metas"]["spoiled"]["status"] == "FINISHED:EXECUTION_EXCEPTION"
    assert any(f"round {last}: no valid update to aggregate" in line for line in outcomes["spoiled_reasons"])


def test_a_server_restart_during_a_job_is_reported_and_nothing_restarts_from_round_0(poc, outcomes):
    """NVFlare 2.9: the restarted server runs no job; the sites abort theirs; the job's status stays RUNNING for ever.
    nvflare_moon.ops.submit, waiting across the restart, reports the job as lost, and no site trains it again."""
    job_dir = export_tiny_moon(poc.root / "jobs", "moon_server_crash", ROUNDS)
    session = connect(poc.admin_kit, 60)
    try:
        job_id = session.submit_job(str(job_dir))
        wait_until(lambda: saved_state(poc.site("site-1"), job_id), JOB_TIMEOUT, "site-1 to save round 0")
        server = Path(poc.ws.prod_dir()) / "server"
        kill([int((server / "pid.fl").read_text()), *pids_of("nvflare.private.fed.app.server.runner_process", job_id)])
        # the POC's restart loop (startup/sub_start.sh) brings the server back; the waiting session rides it out
        with pytest.raises(submit.JobLost, match="restarted .* neither resumes"):
            submit.wait_for_job(session, job_id, timeout=90, poll_interval=1)
        before = state_stamps(poc, job_id)
        wait_until(lambda: not pids_of(WORKER, job_id), 90, "the sites to stop the job the new server does not run")
        assert session.get_job_meta(job_id)["status"] == "RUNNING"  # what NVFlare itself keeps showing
    finally:
        session.close()
    assert state_stamps(poc, job_id) == before and before["site-1"][1] < ROUNDS - 1
