"""nvflare_moon.ops.submit without a federation: reading NVFlare's logs, the submit token, a job lost to a server
restart, locating the downloaded results. With a real federation: test_deploy_poc.py, test_deploy_provisioned.py."""

from types import SimpleNamespace

import pytest
from nvflare.fuel.flare_api.api_spec import NoConnection

from nvflare_moon.ops.submit import (
    JobFailed,
    JobLost,
    JobResults,
    _headline,
    continue_job,
    error_lines,
    job_lost_reason,
    submit_token,
    wait_for_job,
)

SITE_ERROR_LOG = """\
2026-11-29 20:27:41,520 - ClientRunner - INFO - [identity=site-1] - client runner started
2026-11-29 20:27:41,528 - MoonExecutor - ERROR - [identity=site-1] - cannot start training: dataset 'cifar10' not found. Looked in:
  /data/cifar-10-batches-py
Set data_root, or download=True.
2026-11-29 20:27:41,529 - JsonScanner - ERROR - Traceback (most recent call last):
  File "/x/json_scanner.py", line 99, in _do_scan
    node.processor.process_element(node)
nvflare.fuel.common.excepts.ComponentNotAuthorized: component not authorized: Component 'nvflare_moon.X' is not in allow_list

2026-11-29 20:27:42,000 - ClientRunner - INFO - [identity=site-1] - client is stopping
"""


def test_error_lines_keep_each_error_with_its_continuation_and_the_end_of_each_traceback():
    assert error_lines(SITE_ERROR_LOG) == [
        "2026-11-29 20:27:41,528 - MoonExecutor - ERROR - [identity=site-1] - cannot start training: dataset 'cifar10' "
        "not found. Looked in: /data/cifar-10-batches-py Set data_root, or download=True.",
        "nvflare.fuel.common.excepts.ComponentNotAuthorized: component not authorized: Component 'nvflare_moon.X' is "
        "not in allow_list",
    ]


def test_a_refusal_by_the_allow_list_comes_with_what_to_change():
    refused = JobFailed("j1", "FINISHED:ABNORMAL", ["server: " + error_lines(SITE_ERROR_LOG)[1]])
    assert "ended FINISHED:ABNORMAL" in str(refused) and 'add "nvflare_moon." to it' in str(refused)
    assert "allow_list" not in str(JobFailed("j2", "FINISHED:EXECUTION_EXCEPTION", ["site-1: boom"]))


def test_submit_token_follows_the_job_content(tmp_path):
    job = tmp_path / "moon_x"
    (job / "app" / "config").mkdir(parents=True)
    (job / "meta.json").write_text('{"name": "moon_x"}')
    first = submit_token(str(job))
    assert first.startswith("moon_x-") and submit_token(str(job)) == first
    (job / "meta.json").write_text('{"name": "moon_x", "min_clients": 3}')
    assert submit_token(str(job)) != first


class FakeSession:
    """What job_lost_reason asks the server: the running jobs and when the server started."""

    def __init__(self, running, server_start):
        self.info = SimpleNamespace(
            job_info=[SimpleNamespace(job_id=j) for j in running], server_info=SimpleNamespace(start_time=server_start)
        )

    def get_system_info(self):
        return self.info


JOB = {"job_id": "j1", "status": "RUNNING", "start_time": "2026-11-29T20:00:00+00:00"}
JOB_START = 1795982400.0  # 2026-11-29T20:00:00Z


def test_a_running_job_that_the_restarted_server_does_not_run_is_reported_lost():
    reason = job_lost_reason(FakeSession(running=[], server_start=JOB_START + 30), JOB)
    assert "job j1 was lost: the FL server restarted" in reason and "Submit the job again" in reason


@pytest.mark.parametrize(
    "job, running, server_start",
    [
        (JOB, ["j1"], JOB_START + 30),  # the server runs it
        (JOB, [], JOB_START - 30),  # the server started before the job: not a restart
        ({**JOB, "status": "FINISHED:COMPLETED"}, [], JOB_START + 30),
        ({"job_id": "j1", "status": "SUBMITTED"}, [], JOB_START + 30),  # not started yet
    ],
)
def test_a_job_is_not_reported_lost_otherwise(job, running, server_start):
    assert job_lost_reason(FakeSession(running, server_start), job) is None


class RestartingServer(FakeSession):
    """A server that is unreachable for two polls, then answers with the job's successive metas."""

    def __init__(self, metas, server_start):
        super().__init__(running=[], server_start=server_start)
        self.answers = [NoConnection("cannot connect to server"), NoConnection("cannot connect to server"), *metas]

    def get_job_meta(self, job_id):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_waiting_rides_out_an_unreachable_server_and_reports_the_job_lost_by_its_restart():
    with pytest.raises(JobLost, match="was lost: the FL server restarted"):
        wait_for_job(RestartingServer([JOB], server_start=JOB_START + 30), "j1", timeout=10, poll_interval=0)


def test_waiting_returns_the_meta_of_a_finished_job_after_the_server_was_unreachable():
    done = {**JOB, "status": "FINISHED:COMPLETED"}
    server = RestartingServer([done], server_start=JOB_START - 30)
    assert wait_for_job(server, "j1", timeout=10, poll_interval=0) == done


def test_waiting_for_an_unreachable_server_ends_at_the_timeout_saying_so():
    server = RestartingServer([], server_start=JOB_START)
    server.answers = [NoConnection("cannot connect to server")] * 1000
    with pytest.raises(TimeoutError, match="the server is unreachable"):
        wait_for_job(server, "j1", timeout=0.05, poll_interval=0.01)


def test_results_that_lack_a_file_are_reported(tmp_path):
    (tmp_path / "j1" / "workspace" / "tb_events").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="FL_global_model.pt"):
        JobResults(str(tmp_path / "j1")).check()


@pytest.mark.parametrize(
    "status, message",
    [("FINISHED:COMPLETED", "completed: there is nothing to continue"), ("RUNNING", "is RUNNING; continue it once")],
)
def test_only_an_ended_job_that_did_not_complete_can_be_continued(tmp_path, status, message):
    class JobSession:
        def get_job_meta(self, job_id):
            return {"job_id": job_id, "status": status}

        def download_job_result(self, job_id, dest):
            raise AssertionError("nothing is downloaded for a job that cannot be continued")

    with pytest.raises(ValueError, match=message):
        continue_job(JobSession(), "job-1", str(tmp_path), timeout=1)


def test_the_report_shows_the_key_metric_of_a_job_whose_server_does_not_evaluate():
    # server_evaluation=False and encrypted aggregation: no test_accuracy, the sites' weighted mean is the key metric
    assert _headline({"test_accuracy": 0.5}) == "test accuracy 0.5000"
    assert _headline({"best_model": {"key_metric": "accuracy", "value": 0.25}}) == "sites' mean accuracy 0.2500"
    assert _headline({"best_model": None}) == "no accuracy reported"
