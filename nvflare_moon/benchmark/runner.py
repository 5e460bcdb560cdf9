"""Run a protocol: every run as a subprocess, watched (progress, peak memory) and recorded atomically as
``<out>/runs/<run_id>.json``. A run whose record is complete is skipped, so the same command resumes after an
interruption. A simulator run that was interrupted continues from its last aggregated round: its state is saved into
``work/<run_id>/resume_point/`` (:mod:`nvflare_moon.ops.continuation`) and the continuation runs from there; SOLO is redone.

Layout of the output folder::

    runs/<run_id>.json      one record per finished run (shared by every protocol written here)
    logs/<run_id>.log       the run's whole output
    work/<run_id>/          the exported job, the simulator workspace and the resume point of an interrupted run
                            (removed after success, unless keep_work)
    <protocol>/summary.md   tables, plots (PNG) and the per-round CSV of the protocol's finished runs
"""

import datetime
import glob
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import psutil

from ..core.files import write_json_atomic
from ..ops.resume_point import POINT_FILE, ResumePoint, load_resume_point, save_resume_point, workspace_checkpoint
from .methods import METHODS, Launch, variant_label
from .niceness import autogroup, share_niceness
from .process_watch import PeakMemoryWatcher
from .progress import Progress
from .protocols import Protocol, RunSpec
from .summary import write_summary

RECORD_FORMAT = 1
COMPLETE = "complete"


class RunFailed(RuntimeError):
    """A run's command failed, timed out or left incomplete results; the message says where its log is."""


class FinishedRunDiffers(ValueError):
    """The output folder already holds this run id, finished with other settings."""


def record_path(out_dir: str, spec: RunSpec) -> str:
    return os.path.join(out_dir, "runs", f"{spec.run_id}.json")


def load_finished(path: str, spec: RunSpec) -> Optional[Dict]:
    """The complete record at ``path`` for ``spec``; None if there is none (absent, unreadable or incomplete: the run
    is redone). Raises :class:`FinishedRunDiffers` if it is complete but was made with other settings, or, where the
    record holds its job's digest (records since 2026-12-02), if this code would export another job for it: a recipe
    default changed since."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("status") != COMPLETE:
        return None
    expected = json.loads(json.dumps(spec.fingerprint()))
    if record.get("spec") != expected:
        raise FinishedRunDiffers(
            f"{path} is a finished run with other settings ({record.get('spec')}, now {expected}); "
            "write to another --out folder, or delete the file to redo it"
        )
    if record.get("job_digest") is not None and record["job_digest"] != METHODS[spec.variant.method].job_digest(spec):
        raise FinishedRunDiffers(
            f"{path} is a finished run of another job than this code exports for {spec.run_id} (a default of its "
            "recipe has changed since); write to another --out folder, or delete the file to redo it"
        )
    return record


def environment() -> Dict[str, str]:
    """Where and with what the runs are made: date, commit, versions, CPU, memory and GPU, and how this process is
    scheduled."""
    import nvflare
    import torch

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    commit = "unknown"
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout
        if head.returncode == 0:
            commit = head.stdout.strip() + ("+uncommitted changes" if dirty.strip() else "")
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "machine": f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
        f"{memory_gib:.0f} GiB, {gpu}; Python {platform.python_version()}, torch {torch.__version__}, "
        f"nvflare {nvflare.__version__}",
        "scheduling": f"nice {os.nice(0)}, {autogroup() or 'no autogroup'}",  # what shares the CPUs with a measurement, and how
    }


class RecordHeader:
    """The opening of a benchmark script's record: the command that made it, where and when it started (the commit as
    it was then), and the 1-minute load average before and after, since the measurements share the CPUs with whatever
    else runs. Create it before measuring; ``fields()`` gives the header once done."""

    def __init__(self, script: str):
        self.command = shlex.join(["python", script] + sys.argv[1:])
        self.environment = environment()
        self.load_before = os.getloadavg()[0]

    def fields(self) -> Dict:
        load = {"before": self.load_before, "after": os.getloadavg()[0]}
        return {"command": self.command, **self.environment, "load_average_1min": load}


def _end_process_tree(watcher: PeakMemoryWatcher, root: subprocess.Popen) -> None:
    """Stop the run's command and everything it started (simulator workers run in sessions of their own, so a
    process-group signal would miss them); only processes the watcher saw under ``root`` are touched."""
    processes = watcher.live_processes()
    for process in processes:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(processes, timeout=10)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    root.wait()


def run_folder(out_dir: str, spec: RunSpec) -> str:
    return os.path.join(out_dir, "work", spec.run_id)


def resume_point(
    out_dir: str, spec: RunSpec, resume_from: Optional[str] = None, log: Callable[[str], None] = print
) -> Optional[ResumePoint]:
    """Where an interrupted simulator run of ``spec`` goes on: its workspace's state, saved (or brought forward) into
    ``work/<run_id>/resume_point/``, or the point ``resume_from/<run_id>`` when that is further; None: from round 0.

    Raises:
        RunFailed: the workspace has an aggregated round that cannot be saved; the message says why.
    """
    run_dir = run_folder(out_dir, spec)
    point_dir = os.path.join(run_dir, "resume_point")
    workspace = os.path.join(run_dir, "workspace")
    if os.path.exists(workspace_checkpoint(workspace)):
        jobs = glob.glob(os.path.join(run_dir, "job", "*", "meta.json"))
        try:
            save_resume_point(workspace, point_dir, os.path.dirname(jobs[0]) if len(jobs) == 1 else None, log=log)
        except ValueError as e:
            raise RunFailed(f"{spec.run_id}: cannot save the state of its interrupted run: {e}") from e
    local = load_resume_point(point_dir) if os.path.exists(os.path.join(point_dir, POINT_FILE)) else None
    given = os.path.join(resume_from, spec.run_id) if resume_from else None
    if given and os.path.exists(os.path.join(given, POINT_FILE)):
        other = load_resume_point(given)
        if local is None or other.last_round > local.last_round:
            shutil.rmtree(point_dir, ignore_errors=True)
            shutil.copytree(given, point_dir)
            local = load_resume_point(point_dir)
    return local


def execute_run(
    spec: RunSpec,
    out_dir: str,
    data_root: Optional[str],
    progress: Progress,
    run_timeout: Optional[float] = None,
    keep_work: bool = False,
    resume_from: Optional[str] = None,
) -> Dict:
    """Run ``spec`` and return its complete record; raises :class:`RunFailed`. A simulator run that was interrupted
    continues from its resume point (see :func:`resume_point`); other runs start from scratch. The run's work folder
    (exported job, simulator workspace, resume point) is removed after a success unless ``keep_work``."""
    method = METHODS[spec.variant.method]
    run_dir = run_folder(out_dir, spec)
    log_path = os.path.join(out_dir, "logs", f"{spec.run_id}.log")
    point = resume_point(out_dir, spec, resume_from, progress.log) if method.resumable else None
    _prepare_folders(run_dir, log_path, fresh=point is None)
    try:
        launch = method.launch(spec, run_dir, data_root, point)
    except ValueError as e:
        raise RunFailed(f"{spec.run_id}: {e}") from e
    if point is not None:
        progress.log(f"{spec.run_id}: continuing after round {point.last_round} from {point.path}")
    progress.start_run(spec.run_id, launch.units, launch.unit_name)
    made_with = environment()  # the commit whose code the run's processes load now, not the one at its end
    started, clock = time.time(), time.perf_counter()
    outcome = "FAILED"
    try:
        returncode, wall, peak_rss_mb = _run_watched(
            launch, run_dir, log_path, point is not None, progress, run_timeout, clock
        )
        results = _collect_results(spec, launch, returncode, started, log_path, run_timeout)
        outcome = "done"
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the run's state is kept and the same command resumes it
        outcome = "interrupted"
        raise
    finally:
        progress.end_run(outcome)
    if not keep_work:
        shutil.rmtree(run_dir, ignore_errors=True)
    return _record(spec, launch, point, started, wall, peak_rss_mb, results, made_with)


def _prepare_folders(run_dir: str, log_path: str, fresh: bool) -> None:
    """Make the run's work folder (emptied first if ``fresh``: the run starts from round 0) and its log's folder."""
    if fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir, exist_ok=True)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)


def _run_watched(
    launch: Launch,
    run_dir: str,
    log_path: str,
    append_log: bool,
    progress: Progress,
    run_timeout: Optional[float],
    clock: float,
) -> Tuple[Optional[int], float, Dict]:
    """Run the launch's command to its end, its output into ``log_path``; returns its exit code (None: timed out),
    its wall seconds since ``clock`` (a ``perf_counter`` value) and its peak memory report. Whatever it left running
    is ended."""
    with open(log_path, "a" if append_log else "w") as log:
        log.write(" ".join(launch.command) + "\n")
        command = subprocess.Popen(
            launch.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=run_dir,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            start_new_session=True,
        )
        reader = threading.Thread(target=_follow, args=(command.stdout, log, launch, progress), daemon=True)
        reader.start()
        with PeakMemoryWatcher(command.pid, visit=share_niceness) as watcher:
            try:
                returncode = command.wait(timeout=run_timeout)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                wall = time.perf_counter() - clock
                # Normally nothing is left. After a timeout or Ctrl-C everything is, and a process left over
                # would also hold the output pipe open.
                _end_process_tree(watcher, command)
                reader.join(timeout=30)
    return returncode, wall, watcher.report()


def _collect_results(
    spec: RunSpec,
    launch: Launch,
    returncode: Optional[int],
    started: float,
    log_path: str,
    run_timeout: Optional[float],
) -> Dict:
    """The results of the run's command, which ended with ``returncode``; raises :class:`RunFailed` if it timed out,
    failed or left incomplete results."""
    if returncode is None:
        raise RunFailed(f"{spec.run_id} timed out after {run_timeout:.0f} s; its output is in {log_path}")
    if returncode != 0:
        raise RunFailed(
            f"{spec.run_id} failed (exit code {returncode}); its output is in {log_path}:\n" + _tail(log_path)
        )
    try:
        return launch.collect(started)
    except ValueError as e:
        raise RunFailed(f"{spec.run_id}: {e}; its output is in {log_path}") from e


def _record(
    spec: RunSpec,
    launch: Launch,
    point: Optional[ResumePoint],
    started: float,
    wall: float,
    peak_rss_mb: Dict,
    results: Dict,
    made_with: Dict,
) -> Dict:
    """The complete record of a finished run of ``spec``; ``made_with`` is :func:`environment` at its start."""
    return {
        "format": RECORD_FORMAT,
        "status": COMPLETE,
        "run_id": spec.run_id,
        "variant": spec.variant.name,
        "method": spec.variant.method,
        "label": variant_label(spec.variant),
        "seed": spec.seed,
        "beta": spec.beta,
        "continued_after_round": None if point is None else point.last_round,
        "spec": spec.fingerprint(),
        "job_digest": METHODS[spec.variant.method].job_digest(spec),
        "command": launch.command,
        "started": started,
        "wall_seconds": wall,
        "peak_rss_mb": peak_rss_mb,
        "environment": made_with,
        **results,
    }


def _follow(stream, log, launch, progress: Progress) -> None:
    """Copy the command's output to its log and report every progress line."""
    for line in stream:
        log.write(line)
        match = launch.progress.search(line)
        if match:
            progress.unit_done(float(match.group("accuracy")))


def _tail(path: str, lines: int = 30) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def run_protocol(
    protocol: Protocol,
    out_dir: str,
    methods: Optional[Sequence[str]] = None,
    data_root: Optional[str] = None,
    command: str = "",
    run_timeout: Optional[float] = None,
    summary_only: bool = False,
    keep_work: bool = False,
    log: Callable[[str], None] = print,
    resume_from: Optional[str] = None,
    save_progress: Optional[str] = None,
) -> int:
    """Run the protocol's runs that are not finished yet (none with ``summary_only``), then write its summary.

    ``resume_from``: a folder of resume points by run id (as ``save_progress`` writes them), where runs continue from
    when they are further than this output folder's own. ``save_progress``: run nothing; save the resume point of every
    interrupted run into ``save_progress/<run_id>/`` (small enough to commit), then write the summary.

    Returns 0 if every run is finished, 1 otherwise. Raises ValueError for a method that is not registered and
    :class:`FinishedRunDiffers` before starting anything if a finished run does not match.
    """
    specs = _protocol_runs(protocol, methods)
    finished = _finished_records(out_dir, specs)
    if save_progress:
        _save_progress(out_dir, specs, finished, resume_from, save_progress, log)
    todo = [] if summary_only or save_progress else [s for s in specs if s.run_id not in finished]
    log(
        f"protocol {protocol.name}: {len(specs)} runs, {len(finished)} already finished in {out_dir}, "
        f"{len(todo)} to run"
    )
    progress = Progress(len(todo), log)
    for spec in todo:
        try:
            record = execute_run(spec, out_dir, data_root, progress, run_timeout, keep_work, resume_from)
        except RunFailed as e:
            log(str(e))
            continue
        write_json_atomic(record_path(out_dir, spec), record)
        finished[spec.run_id] = record
    return _summarise(protocol, out_dir, specs, finished, command, data_root, log)


def _summarise(
    protocol: Protocol,
    out_dir: str,
    specs: Sequence[RunSpec],
    finished: Dict[str, Dict],
    command: str,
    data_root: Optional[str],
    log: Callable[[str], None],
) -> int:
    """Write the protocol's summary of its finished runs; returns 0 if every run is finished, 1 otherwise."""
    records = [finished[s.run_id] for s in specs if s.run_id in finished]
    missing = [s for s in specs if s.run_id not in finished]
    in_progress = _accuracies_so_far(out_dir, missing)
    summary = write_summary(
        os.path.join(out_dir, protocol.name),
        protocol,
        records,
        missing,
        command,
        environment(),
        data_root,
        in_progress,
    )
    log(f"summary: {summary}" + (f"; {len(missing)} runs not finished" if missing else ""))
    return 1 if missing else 0


def _protocol_runs(protocol: Protocol, methods: Optional[Sequence[str]]) -> List[RunSpec]:
    """The protocol's runs of ``methods`` (None: all); raises ValueError for an unregistered method or no runs."""
    unknown = sorted(set(methods or ()) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; registered: {sorted(METHODS)}")
    specs = protocol.runs(methods)
    if not specs:
        raise ValueError(f"protocol {protocol.name!r} has no runs for methods {list(methods or [])}")
    return specs


def _finished_records(out_dir: str, specs: Sequence[RunSpec]) -> Dict[str, Dict]:
    """``{run_id: complete record}`` of the runs finished in ``out_dir``; see :func:`load_finished`."""
    finished: Dict[str, Dict] = {}
    for spec in specs:
        record = load_finished(record_path(out_dir, spec), spec)
        if record is not None:
            finished[spec.run_id] = record
    return finished


def _save_progress(
    out_dir: str,
    specs: Sequence[RunSpec],
    finished: Dict[str, Dict],
    resume_from: Optional[str],
    save_progress: str,
    log: Callable[[str], None],
) -> None:
    """Copy the resume point of every unfinished resumable run into ``save_progress/<run_id>/``."""
    for spec in specs:
        if spec.run_id not in finished and METHODS[spec.variant.method].resumable:
            try:
                point = resume_point(out_dir, spec, resume_from, log)
            except RunFailed as e:
                log(str(e))
                continue
            if point is not None:
                dest = os.path.join(save_progress, spec.run_id)
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(point.path, dest)
                log(
                    f"{spec.run_id}: saved its state after round {point.last_round} in {dest} "
                    f"({point.size_bytes()} bytes)"
                )


def _accuracies_so_far(out_dir: str, missing: Sequence[RunSpec]) -> Dict[str, List[float]]:
    """``{run_id: test accuracy of each round done}`` of the missing runs that have a resume point."""
    in_progress = {}
    for spec in missing:
        point_dir = os.path.join(run_folder(out_dir, spec), "resume_point")
        if os.path.exists(os.path.join(point_dir, POINT_FILE)):
            point = load_resume_point(point_dir)
            in_progress[spec.run_id] = [m["test_accuracy"] for m in point.metrics()]
    return in_progress
