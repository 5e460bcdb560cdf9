"""Submit a job to a running federation (POC or production) with NVFlare's FLARE API, wait for it, fetch its results.

    python -m nvflare_moon.ops.submit jobs/moon_cifar10 --startup-kit /path/to/admin@org.example --download results/
    python -m nvflare_moon.ops.submit --resume FAILED_JOB_ID --startup-kit /path/to/admin@org.example --download results/

The same as ``nvflare job submit -j DIR``, ``nvflare job wait ID`` and ``nvflare job download ID -o OUT``, plus five
things NVFlare leaves to the user:

- submitting is idempotent: the job goes in with a submit token made from the folder's content, for which NVFlare
  returns the job already submitted (``--resubmit`` submits the folder anew);
- a job that did not complete is reported with the error lines of its logs (a class refused by a site's
  ``class_allow_list``, a missing dataset, ...), so the reason is visible without logging into a site;
- a job lost to a server restart is reported: NVFlare 2.9 neither resumes such a job nor marks it failed, its status
  stays ``RUNNING`` for ever (see ``docs/deployment.md``);
- the downloaded global model, ``global_metrics.jsonl`` and TensorBoard events are located and checked;
- a job that failed part-way (a site's job process died) is continued with ``--resume``: from the round after the
  last one aggregated, with every site's state (:mod:`nvflare_moon.ops.continuation`).
"""

import argparse
import json
import os
import re
import shutil
import sys
import time
from datetime import datetime
from typing import Dict, List, Optional

from nvflare.apis.utils.job_submit_token import canonical_job_content_hash
from nvflare.fuel.flare_api.api_spec import NoConnection
from nvflare.fuel.flare_api.flare_api import Session, new_secure_session

COMPLETED = "FINISHED:COMPLETED"
_UNFINISHED = ("SUBMITTED", "DISPATCHED", "RUNNING")
_RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")  # an NVFlare log line starts with its time
_TRACEBACK_END = re.compile(r"^\w+(\.\w+)*(Error|Exception|NotAuthorized): ")  # "module.SomeError: message"
_ERROR_LOG_COMPONENT = "ERRORLOG_"
_ALLOW_LIST_HINT = (
    'A job without custom/ may only use classes on every site\'s class_allow_list: add "nvflare_moon." to it in '
    "local/resources.json of the server and the sites, or submit the job with custom/ (export it with byoc=True) as a "
    "user with the byoc right; see docs/deployment.md."
)


class JobFailed(RuntimeError):
    """The job ended with a status other than ``FINISHED:COMPLETED``; the message holds the error lines of its logs."""

    def __init__(self, job_id: str, status: str, reasons: List[str]):
        self.job_id = job_id
        self.status = status
        self.reasons = reasons
        detail = "\n".join(f"  {line}" for line in reasons) or "  (no error lines in the job's logs)"
        if any("not in allow_list" in line for line in reasons):
            detail += f"\n{_ALLOW_LIST_HINT}"
        super().__init__(f"job {job_id} ended {status}:\n{detail}")


class JobLost(RuntimeError):
    """The server restarted while the job ran; NVFlare 2.9 will never finish it."""


class JobResults:
    """A downloaded job result (``<dest>/<job_id>``) and where our server components wrote into it."""

    def __init__(self, root: str):
        from ..server.evaluator import METRICS_FILENAME  # here, not above: it loads torch, and submitting needs none

        self.root = root
        server_run_dir = os.path.join(root, "workspace")
        self.global_model = os.path.join(server_run_dir, "app_server", "FL_global_model.pt")
        self.metrics_file = os.path.join(server_run_dir, METRICS_FILENAME)
        self.tb_events = os.path.join(server_run_dir, "tb_events")
        self.data_summary = os.path.join(server_run_dir, "data_summary.json")  # a data check's only result

    def is_data_check(self) -> bool:
        return os.path.isfile(self.data_summary)

    def check(self) -> "JobResults":
        if self.is_data_check():
            return self
        missing = [p for p in (self.global_model, self.metrics_file, self.tb_events) if not os.path.exists(p)]
        if missing:
            raise FileNotFoundError(f"the downloaded result {self.root} lacks {missing}")
        return self

    def metrics(self) -> List[dict]:
        """One record per round, as written by :class:`~nvflare_moon.server.GlobalModelEvaluator`."""
        with open(self.metrics_file) as f:
            return [json.loads(line) for line in f if line.strip()]


def open_session(startup_kit: str, username: Optional[str] = None, timeout: float = 30.0) -> Session:
    """A FLARE API session from an admin startup kit; the user name defaults to the kit's folder name (as NVFlare
    provisions it)."""
    startup_kit = os.path.abspath(os.path.expanduser(startup_kit))
    if not os.path.isfile(os.path.join(startup_kit, "startup", "fed_admin.json")):
        raise ValueError(f"{startup_kit} is not an admin startup kit (no startup/fed_admin.json)")
    return new_secure_session(username or os.path.basename(startup_kit), startup_kit, timeout=timeout)


def job_lost_reason(session: Session, job_meta: dict) -> Optional[str]:
    """Why an unfinished job will never finish, or None: the server started after the job did and does not run it."""
    status = job_meta.get("status", "")
    started = job_meta.get("start_time")
    if status not in _UNFINISHED or not started:
        return None
    info = session.get_system_info()
    if job_meta["job_id"] in {job.job_id for job in info.job_info}:
        return None
    server_started = info.server_info.start_time
    if server_started is None or server_started <= datetime.fromisoformat(started).timestamp():
        return None
    return (
        f"job {job_meta['job_id']} was lost: the FL server restarted at "
        f"{datetime.fromtimestamp(server_started).isoformat(timespec='seconds')}, after the job started at {started}. "
        f"NVFlare 2.9 neither resumes a job after a server restart nor marks it failed (its status stays {status}); "
        "the sites have stopped it. Submit the job again: it starts from round 0 with fresh per-job site state."
    )


def wait_for_job(session: Session, job_id: str, timeout: float, poll_interval: float = 2.0) -> dict:
    """Wait until the job finishes and return its meta. A server that is unreachable for a while (restarting) is
    waited for: the session logs in again by itself once it is back.

    Raises:
        JobLost: the server restarted while the job ran.
        TimeoutError: still unfinished after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        unreachable = None
        try:
            meta = session.get_job_meta(job_id)
            if meta.get("status", "").startswith("FINISHED"):
                return meta
            lost = job_lost_reason(session, meta)
        except NoConnection as e:
            unreachable, lost = e, None
        if lost:
            raise JobLost(lost)
        if time.monotonic() > deadline:
            detail = f"; the server is unreachable ({unreachable})" if unreachable else ""
            raise TimeoutError(f"job {job_id} did not finish within {timeout:.0f} s{detail}")
        time.sleep(poll_interval)


def failure_reasons(session: Session, job_id: str, max_lines: int = 12) -> List[str]:
    """The error lines of the job's logs, ``"<site>: <line>"``, without repeats: the server's job log and the error
    logs that the sites stream to the server (``allow_log_streaming``, on by default)."""
    logs: Dict[str, str] = dict(session.get_job_logs(job_id, target="all").get("logs", {}))
    logs.update(_site_error_logs(session, job_id))
    seen, reasons = set(), []
    for site, text in sorted(logs.items()):
        for line in error_lines(text or ""):
            if line not in seen:
                seen.add(line)
                reasons.append(f"{site}: {line}")
    return reasons[-max_lines:]


def _headline(record: dict) -> str:
    """A round's accuracy for the report: the server's test accuracy, or (no server evaluation, encrypted
    aggregation) the key metric, the sites' weighted mean accuracy of the global model they received."""
    if "test_accuracy" in record:
        return f"test accuracy {record['test_accuracy']:.4f}"
    best = record.get("best_model")
    return f"sites' mean {best['key_metric']} {best['value']:.4f}" if best else "no accuracy reported"


def error_lines(log_text: str) -> List[str]:
    """The errors in an NVFlare log: each ERROR record, its continuation lines joined to it (but not a traceback's
    frames), and the last line of each traceback (``package.SomeError: message``)."""
    errors: List[str] = []
    extending = False  # whether the current line continues an ERROR record
    for line in (raw.strip() for raw in log_text.splitlines()):
        if _RECORD_START.match(line):
            extending = " - ERROR - " in line and not line.endswith("Traceback (most recent call last):")
            if extending:
                errors.append(line)
        elif _TRACEBACK_END.match(line):
            errors.append(line)
            extending = False
        elif extending and line:
            errors[-1] += f" {line}"
    return errors


def _site_error_logs(session: Session, job_id: str) -> Dict[str, str]:
    """Site -> its streamed error log of the job (NVFlare keeps them as job components ``ERRORLOG_<site>``)."""
    if not any(c.startswith(_ERROR_LOG_COMPONENT) for c in session.list_job_components(job_id)):
        return {}
    folder = session.download_job_components(job_id)
    logs = {}
    try:
        for parent, _, files in os.walk(folder):
            for name in files:
                if name.startswith(_ERROR_LOG_COMPONENT):
                    with open(os.path.join(parent, name), errors="replace") as f:
                        logs[name[len(_ERROR_LOG_COMPONENT) :]] = f.read()
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the download NVFlare just made in the admin's transfer folder
    return logs


def submit_token(job_dir: str) -> str:
    """The same token for the same job content: NVFlare answers a repeated token with the job it already has."""
    name = os.path.basename(os.path.normpath(job_dir))
    return f"{name}-{canonical_job_content_hash(os.path.abspath(job_dir)).split(':')[1][:24]}"


def run_job(
    session: Session,
    job_dir: str,
    timeout: float,
    download_to: Optional[str] = None,
    resubmit: bool = False,
    poll_interval: float = 2.0,
) -> Optional[JobResults]:
    """Submit ``job_dir`` (once per content unless ``resubmit``), wait for it and, if ``download_to`` is given,
    download and check its results.

    Raises:
        JobFailed: the job ended with another status than ``FINISHED:COMPLETED``.
        JobLost, TimeoutError: see :func:`wait_for_job`.
    """
    if not os.path.isfile(os.path.join(job_dir, "meta.json")):
        raise ValueError(f"{job_dir} is not a job folder (no meta.json); the exported jobs are in jobs/")
    with open(os.path.join(job_dir, "meta.json")) as f:
        min_clients = json.load(f).get("min_clients", 1)
    connected = len(session.get_system_info().client_info)
    if connected < min_clients:
        print(
            f"note: the job needs {min_clients} sites and {connected} are connected; NVFlare starts it only once "
            "enough sites are",
            flush=True,
        )
    token = None if resubmit else submit_token(job_dir)
    job_id = session.submit_job(os.path.abspath(job_dir), submit_token=token)
    print(f"job {job_id}: {job_dir}" + ("" if resubmit else " (the same folder again gives this job back)"), flush=True)
    meta = wait_for_job(session, job_id, timeout, poll_interval)
    if meta["status"] != COMPLETED:
        raise JobFailed(job_id, meta["status"], failure_reasons(session, job_id))
    print(f"job {job_id} {COMPLETED} in {meta.get('duration', '?')}", flush=True)
    if download_to is None:
        return None
    shutil.rmtree(os.path.join(os.path.abspath(download_to), job_id), ignore_errors=True)  # a download of a rerun
    return JobResults(session.download_job_result(job_id, os.path.abspath(download_to))).check()


def continue_job(
    session: Session,
    failed_job_id: str,
    work_dir: str,
    timeout: float,
    download_to: Optional[str] = None,
    poll_interval: float = 2.0,
) -> Optional[JobResults]:
    """Continue a job that failed part-way (see :mod:`nvflare_moon.ops.continuation`): download its result into ``work_dir``,
    write the continuation job there, and run it as :func:`run_job` does (once: the same continuation again gives the
    job already submitted).

    Raises:
        ValueError: the job cannot be continued (still running, completed, NVFlare's Scaffold controller, nothing aggregated yet).
        JobFailed, JobLost, TimeoutError: see :func:`run_job`.
    """
    from .continuation import make_continuation_job  # here, not above: it loads torch, and submitting needs none

    status = session.get_job_meta(failed_job_id).get("status", "?")
    if status == COMPLETED:
        raise ValueError(f"job {failed_job_id} completed: there is nothing to continue")
    if status in _UNFINISHED:
        raise ValueError(f"job {failed_job_id} is {status}; continue it once it has ended (abort it if it is lost)")
    work_dir = os.path.abspath(work_dir)
    shutil.rmtree(os.path.join(work_dir, failed_job_id), ignore_errors=True)
    result = session.download_job_result(failed_job_id, work_dir)
    job_dir = make_continuation_job(result, failed_job_id, work_dir)
    print(f"job {failed_job_id} ended {status}; its continuation: {job_dir}", flush=True)
    return run_job(session, job_dir, timeout, download_to, poll_interval=poll_interval)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job_dir", nargs="?", help="job folder, e.g. jobs/moon_cifar10")
    parser.add_argument(
        "--resume",
        metavar="JOB_ID",
        help="instead of a job folder: continue this failed job from its last global model and every site's state",
    )
    parser.add_argument(
        "--work-dir",
        default="continued_jobs",
        help="with --resume: where the failed job's result and its continuation go (default %(default)s)",
    )
    parser.add_argument("--startup-kit", required=True, help="the submitting admin's startup kit folder")
    parser.add_argument("--user", help="admin user name (default: the startup kit's folder name)")
    parser.add_argument("--timeout", type=float, default=24 * 3600, help="seconds to wait for the job")
    parser.add_argument("--download", metavar="DIR", help="download the results into DIR/<job_id>")
    parser.add_argument("--resubmit", action="store_true", help="submit again even if this folder was submitted")
    args = parser.parse_args(argv)
    if (args.job_dir is None) == (args.resume is None):
        parser.error("give either a job folder or --resume JOB_ID")
    session = open_session(args.startup_kit, args.user)
    try:
        if args.resume:
            results = continue_job(session, args.resume, args.work_dir, args.timeout, args.download)
        else:
            results = run_job(session, args.job_dir, args.timeout, args.download, args.resubmit)
    except (JobFailed, JobLost, TimeoutError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        session.close()
    if results is not None and results.is_data_check():
        from ..data.site_report import format_table  # here: it loads torch, which a training job's report needs not

        with open(results.data_summary) as f:
            print(f"data summary:     {results.data_summary}\n{format_table(json.load(f))}")
    elif results is not None:
        from ..core.clinical_metrics import CLINICAL_FIGURES  # here: a data check's report needs not load scikit-learn

        last = results.metrics()[-1]
        print(f"global model:     {results.global_model}")
        print(f"metrics:          {results.metrics_file} (round {last['round']}: {_headline(last)})")
        for site, metrics in sorted(last.get("site_metrics", {}).items()):
            shown = sorted(k for k in metrics if "accuracy" in k or k in CLINICAL_FIGURES)
            print(f"  {site}: " + ", ".join(f"{k} {metrics[k]:.4f}" for k in shown))
        print(f"TensorBoard logs: {results.tb_events}  (tensorboard --logdir {results.tb_events})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
