"""The reproduction benchmark (``python -m nvflare_moon.benchmark``): one real tiny run through NVFlare's simulator
checked against what it logged, resuming, stopping a run's whole process tree, and the derived tables' math on
hand-made inputs."""

import contextlib
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from nvflare_moon.benchmark import cli, runner
from nvflare_moon.benchmark.methods import METHODS, CommandMethod, SimulatorMethod
from nvflare_moon.benchmark.niceness import share_niceness
from nvflare_moon.benchmark.progress import Progress, estimate_remaining
from nvflare_moon.benchmark.protocols import PROTOCOLS, Protocol, RunSpec, Settings, Variant, customised
from nvflare_moon.benchmark.published import published
from nvflare_moon.benchmark.summary import write_summary
from nvflare_moon.benchmark.tables import (
    beta_sweep_rows,
    final_accuracy_rows,
    group_runs,
    local_figure_rows,
    mean_curve,
    mean_std,
    per_run_rows,
    percent,
    rounds_to_target,
    rounds_to_target_rows,
    speedup,
    unpaired_groups,
)
from nvflare_moon.core.files import write_json_atomic
from nvflare_moon.ops.resume_point import save_resume_point, workspace_checkpoint
from nvflare_moon.recipes import MoonRecipe

from .conftest import REPO, aggregated_round

SMOKE_ARGS = [
    "--protocol",
    "quick",
    "--methods",
    "fedavg",
    "--dataset",
    "synthetic",
    "--rounds",
    "2",
    "--sites",
    "2",
    "--local-epochs",
    "1",
    "--seeds",
    "0",
    "--lr",
    "0.05",
    "--batch-size",
    "32",
]
RUN_ID = "fedavg-beta0.5-seed0"


def run_cli(argv):
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = cli.main(argv)
    return code, output.getvalue()


# ---- a real run ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("benchmark")
    code, output = run_cli(SMOKE_ARGS + ["--out", str(out), "--keep-work"])
    logged_path = out / "work" / RUN_ID / "workspace" / "server" / "simulate_job" / "global_metrics.jsonl"
    logged = [json.loads(line) for line in logged_path.read_text().splitlines()] if logged_path.exists() else []
    return out, code, output, logged


@pytest.mark.e2e
def test_record_holds_exactly_what_the_run_logged(real_run):
    out, code, output, logged = real_run
    assert code == 0, output
    record = json.loads((out / "runs" / f"{RUN_ID}.json").read_text())
    assert record["status"] == "complete" and record["spec"]["settings"]["dataset"] == "synthetic"
    assert re.fullmatch(r"[0-9a-f]{64}", record["job_digest"])  # the same command reusing it checks it (below)
    assert [r["round"] for r in logged] == [0, 1]
    previous = record["started"]
    for got, want in zip(record["rounds"], logged, strict=True):
        assert {k: v for k, v in got.items() if k != "round_seconds"} == want  # every logged value, unchanged
        assert got["round_seconds"] == pytest.approx(want["time"] - previous)
        previous = want["time"]
    assert record["final_accuracy"] == logged[-1]["test_accuracy"]
    assert record["wall_seconds"] >= logged[-1]["time"] - record["started"]
    clients = record["peak_rss_mb"]["clients"]
    assert sorted(clients) == ["site-1", "site-2"] and all(mb > 50 for mb in clients.values())


@pytest.mark.e2e
def test_summary_shows_the_logged_values(real_run):
    out, _, _, logged = real_run
    summary = (out / "quick" / "summary.md").read_text()
    final = percent(logged[-1]["test_accuracy"])
    assert f"| FedAvg | 0.5 | 0 | {final} | — |" in summary  # Table 1; no published number for synthetic data
    best = max(logged, key=lambda r: r["test_accuracy"])
    round_1_seconds = logged[1]["time"] - logged[0]["time"]
    assert re.search(
        rf"\| {RUN_ID} \| {final} \| {percent(best['test_accuracy'])} \(round {best['round']}\) \| \d+ \| "
        rf"{round_1_seconds:.1f} \|",
        summary,
    )
    csv_rows = (out / "quick" / "accuracy_per_round.csv").read_text().splitlines()[1:]
    assert [float(row.split(",")[2]) for row in csv_rows] == [r["test_accuracy"] for r in logged]
    for png in ("accuracy_vs_rounds.png", "rounds_to_target.png", "partition_beta0.5.png"):
        assert (out / "quick" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"({png})" in summary


@pytest.mark.e2e
def test_progress_names_the_run_round_and_accuracy(real_run):
    _, _, output, logged = real_run
    for r in logged:
        assert f"{RUN_ID}: round {r['round'] + 1}/2, test accuracy {100 * r['test_accuracy']:.2f}%" in output
    assert "ETA run" in output


@pytest.mark.e2e
def test_the_same_command_again_starts_no_run(real_run, monkeypatch):
    out, _, _, _ = real_run
    monkeypatch.setattr(runner, "execute_run", lambda *a, **k: pytest.fail("a finished run was started again"))
    code, output = run_cli(SMOKE_ARGS + ["--out", str(out)])
    assert code == 0 and "1 already finished" in output and "0 to run" in output


@pytest.mark.e2e
def test_a_run_stopped_saved_and_resumed_elsewhere_ends_as_the_uninterrupted_run(real_run, tmp_path, orphans):
    """The paper runs' path over several sittings: SIGTERM once round 0 is aggregated, ``--save-progress`` into a
    folder (what gets committed), then ``--resume-from`` it in a fresh output folder. Batches are seeded by
    (seed, site, round), so the continued run must repeat the uninterrupted one exactly."""
    first, saved, second = tmp_path / "first", tmp_path / "saved", tmp_path / "second"
    driver = subprocess.Popen(
        [sys.executable, "-m", "nvflare_moon.benchmark", *SMOKE_ARGS, "--out", str(first)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while aggregated_round(first / "work" / RUN_ID / "workspace") != 0:
        assert driver.poll() is None and time.monotonic() < deadline, "round 0 was not aggregated"
        time.sleep(0.05)
    orphans.extend(p.pid for p in psutil.Process(driver.pid).children(recursive=True))
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=60) == 128 + signal.SIGTERM, driver.stdout.read()
    assert all(gone(pid) for pid in orphans)

    code, output = run_cli(SMOKE_ARGS + ["--out", str(first), "--save-progress", str(saved)])
    assert code == 1 and f"{RUN_ID}: saved its state after round 0" in output
    code, output = run_cli(SMOKE_ARGS + ["--out", str(second), "--resume-from", str(saved), "--keep-work"])
    assert code == 0, output
    assert f"{RUN_ID}: continuing after round 0" in output

    _, _, _, uninterrupted = real_run
    record = json.loads((second / "runs" / f"{RUN_ID}.json").read_text())
    assert record["continued_after_round"] == 0
    assert [(r["round"], r["test_accuracy"], r["test_loss"]) for r in record["rounds"]] == [
        (r["round"], r["test_accuracy"], r["test_loss"]) for r in uninterrupted
    ]

    # the continuation's own point, saved twice (as a later --save-progress or --resume-from into this --out does):
    # the second save finds it already holds the workspace's last round, though the run continued from round 0
    workspace, point_dir = second / "work" / RUN_ID / "workspace", second / "work" / RUN_ID / "resume_point"
    saved_once = save_resume_point(str(workspace), str(point_dir), log=lambda _: None)
    assert saved_once.last_round == 1 and [m["round"] for m in saved_once.metrics()] == [0, 1]
    assert save_resume_point(str(workspace), str(point_dir), log=lambda _: None).info == saved_once.info
    # a run redone in the same workspace to the same round is another run: its point is not taken as saved already
    checkpoint = torch.load(workspace_checkpoint(str(workspace)), weights_only=False)
    first = next(iter(checkpoint["model"]))
    checkpoint["model"][first] = checkpoint["model"][first] + 1
    torch.save(checkpoint, workspace_checkpoint(str(workspace)))
    with pytest.raises(ValueError, match="does not hold that resume point"):
        save_resume_point(str(workspace), str(point_dir), log=lambda _: None)


# ---- resuming, with a stand-in for the run itself -----------------------------------------------------------------


def smoke_protocol(rounds=3) -> Protocol:
    return customised(PROTOCOLS["heterogeneity"], dataset="synthetic", rounds=rounds, num_sites=2)  # 2 methods × 3 β


@pytest.fixture
def fake_runs(monkeypatch):
    """Replace the simulator run by an instant fake record; returns the run ids started, in order."""
    started = []

    def fake_execute_run(spec, out_dir, data_root, progress, run_timeout=None, keep_work=False, resume_from=None):
        started.append(spec.run_id)
        return fake_record(spec, [0.1 * (r + 1) for r in range(spec.settings.rounds)])

    monkeypatch.setattr(runner, "execute_run", fake_execute_run)
    monkeypatch.setattr(runner, "write_summary", lambda *a, **k: "summary.md")
    return started


def test_resume_redoes_only_missing_or_unreadable_runs(tmp_path, fake_runs):
    protocol = smoke_protocol()
    all_ids = [s.run_id for s in protocol.runs()]
    assert runner.run_protocol(protocol, str(tmp_path), log=lambda _: None) == 0
    assert fake_runs == all_ids and len(all_ids) == 6
    fake_runs.clear()
    runner.run_protocol(protocol, str(tmp_path), log=lambda _: None)
    assert fake_runs == []
    (tmp_path / "runs" / "moon-beta5-seed0.json").unlink()
    truncated = tmp_path / "runs" / "fedavg-beta0.1-seed0.json"
    truncated.write_text(truncated.read_text()[:50])  # as if the machine died mid-write without the atomic rename
    runner.run_protocol(protocol, str(tmp_path), log=lambda _: None)
    assert fake_runs == ["fedavg-beta0.1-seed0", "moon-beta5-seed0"]


def test_an_interrupted_protocol_resumes_at_the_interrupted_run(tmp_path, fake_runs, monkeypatch):
    protocol = smoke_protocol()
    all_ids = [s.run_id for s in protocol.runs()]
    finishing = runner.execute_run

    def interrupted_at_the_third(spec, *args, **kwargs):
        if len(fake_runs) == 2:
            fake_runs.append(spec.run_id)
            raise KeyboardInterrupt
        return finishing(spec, *args, **kwargs)

    monkeypatch.setattr(runner, "execute_run", interrupted_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        runner.run_protocol(protocol, str(tmp_path), log=lambda _: None)
    assert sorted(p.stem for p in (tmp_path / "runs").glob("*.json")) == sorted(all_ids[:2])
    fake_runs.clear()
    monkeypatch.setattr(runner, "execute_run", finishing)
    runner.run_protocol(protocol, str(tmp_path), log=lambda _: None)
    assert fake_runs == all_ids[2:]


def test_a_finished_run_made_with_other_settings_is_refused_before_anything_runs(tmp_path, fake_runs):
    runner.run_protocol(smoke_protocol(rounds=3), str(tmp_path), log=lambda _: None)
    fake_runs.clear()
    with pytest.raises(runner.FinishedRunDiffers, match="another --out"):
        runner.run_protocol(smoke_protocol(rounds=4), str(tmp_path), log=lambda _: None)
    assert fake_runs == []


def test_a_finished_run_is_refused_once_its_recipes_default_has_changed(tmp_path, monkeypatch):
    """The fingerprint holds the protocol's settings, not the recipe's defaults (FedSiam-DA's μ went from 1 to 0.01):
    the record's job digest catches a finished run that the same command would no longer produce."""
    spec = RunSpec(Variant("moon"), 0, 0.5, Settings(dataset="synthetic", rounds=2, num_sites=2))
    path = tmp_path / "runs" / f"{spec.run_id}.json"
    write_json_atomic(str(path), {**fake_record(spec, [0.1, 0.2]), "job_digest": METHODS["moon"].job_digest(spec)})
    assert runner.load_finished(str(path), spec)["final_accuracy"] == 0.2

    monkeypatch.setitem(METHODS, "moon", SimulatorMethod("MOON", MoonRecipe, {"temperature": 0.7}))
    with pytest.raises(runner.FinishedRunDiffers, match="a default of its recipe has changed"):
        runner.load_finished(str(path), spec)
    write_json_atomic(str(path), fake_record(spec, [0.1, 0.2]))  # a record from before digests: kept
    assert runner.load_finished(str(path), spec)["final_accuracy"] == 0.2


def test_methods_must_be_registered(tmp_path):
    with pytest.raises(ValueError, match="unknown method"):
        runner.run_protocol(smoke_protocol(), str(tmp_path), methods=["fedavgg"], log=lambda _: None)


# ---- a command method: progress, report, and a timeout that ends the whole tree -----------------------------------

SCRIPT = r"""
import json, os, subprocess, sys, time
orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print("orphan", orphan.pid, flush=True)
for k in (1, 2):
    print(f"site-{k}: test accuracy 0.{k}", flush=True)
json.dump({"accuracy": 0.15}, open(sys.argv[1], "w"))
deadline = time.monotonic() + float(sys.argv[2])
while not os.path.exists(sys.argv[3]) and time.monotonic() < deadline:  # until the test releases it
    time.sleep(0.05)
"""


def command_method(sleep_seconds: float, release: str) -> CommandMethod:
    return CommandMethod(
        "stand-in",
        lambda spec, report, data_root: [sys.executable, "-c", SCRIPT, report, str(sleep_seconds), release],
        lambda report, spec: {"rounds": [], "final_accuracy": json.load(open(report))["accuracy"]},
        re.compile(r"site-\d+: test accuracy (?P<accuracy>[\d.]+)"),
        lambda spec: 2,
        "site",
    )


def command_spec(monkeypatch, sleep_seconds, release):
    monkeypatch.setitem(METHODS, "stand_in", command_method(sleep_seconds, str(release)))
    return Protocol("t", "", Settings(), (Variant("stand_in"),)).runs()[0]


def orphan_pid(out, spec):
    """The PID of the process the stand-in started in a session of its own, once it has said so."""
    log = out / "logs" / f"{spec.run_id}.log"
    found = re.search(r"orphan (\d+)", log.read_text()) if log.exists() else None
    return int(found.group(1)) if found else None


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def orphans():
    """PIDs of the stand-ins' orphans; any still running at the end (a failed test) is killed."""
    pids = []
    yield pids
    for pid in pids:
        if pid is not None and not gone(pid):
            psutil.Process(pid).kill()


def test_a_command_method_is_recorded_with_its_progress(tmp_path, monkeypatch, orphans):
    release = tmp_path / "release"
    spec = command_spec(monkeypatch, sleep_seconds=120, release=release)
    visits = set()

    class ReleasingWatcher(runner.PeakMemoryWatcher):
        """Lets the stand-in finish once the watcher has seen its orphan, however slowly the machine runs (the
        run's log is only written out at the end, so the watcher's own view tells)."""

        def poll(self):
            super().poll()
            visits.add(self.visit)
            if len(self.report()["processes"]) == 2:  # the stand-in and the only process it starts
                release.touch()

    monkeypatch.setattr(runner, "PeakMemoryWatcher", ReleasingWatcher)
    lines = []
    record = runner.execute_run(spec, str(tmp_path), None, Progress(1, lines.append))
    orphans.append(orphan_pid(tmp_path, spec))
    assert record["final_accuracy"] == 0.15 and record["status"] == "complete"
    assert any("site 2/2, test accuracy 20.00%" in line for line in lines)
    assert gone(orphans[0])  # what the command left running is ended too
    assert visits == {share_niceness}  # every process of the run is kept as nice as the runner


NICENESS = """
import os, subprocess, sys, psutil
from nvflare_moon.benchmark.niceness import share_niceness
niceness = os.nice(7)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
share_niceness(psutil.Process(child.pid))
print(niceness, open(f"/proc/{child.pid}/autogroup").read().split()[-1])
child.kill()
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="no autogroup scheduling on this machine")
def test_a_niced_runner_gives_its_niceness_to_a_session_its_run_starts():
    """A process in a session of its own (as the simulator starts its workers) gets the runner's nice value for its
    session's autogroup, which otherwise starts at 0 and competes with the foreground as an equal."""
    printed = subprocess.run([sys.executable, "-c", NICENESS], capture_output=True, text=True, check=True, timeout=120)
    niceness, session_niceness = printed.stdout.split()
    assert int(niceness) >= 7 and session_niceness == niceness


def test_a_run_past_its_timeout_is_failed_and_its_whole_process_tree_ended(tmp_path, monkeypatch, orphans):
    spec = command_spec(monkeypatch, sleep_seconds=120, release=tmp_path / "never")
    started = time.perf_counter()
    with pytest.raises(runner.RunFailed, match="timed out"):
        runner.execute_run(spec, str(tmp_path), None, Progress(1, lambda _: None), run_timeout=5)
    orphans.append(orphan_pid(tmp_path, spec))
    assert time.perf_counter() - started < 100  # not the command's 120 s
    assert orphans[0] is not None and gone(orphans[0])


DRIVER = r"""
import sys
from nvflare_moon.benchmark import cli, methods, protocols
from tests.test_benchmark import command_method
methods.METHODS["stand_in"] = command_method(120, sys.argv[2])
protocols.PROTOCOLS["t"] = protocols.Protocol("t", "", protocols.Settings(), (protocols.Variant("stand_in"),))
sys.exit(cli.main(["--protocol", "t", "--out", sys.argv[1]]))
"""


def test_sigterm_ends_the_run_in_progress_and_everything_it_started(tmp_path, orphans):
    """`kill` or a batch queue's time limit sends SIGTERM to the benchmark: it must not leave the run training."""
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path), str(tmp_path / "never")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    started = []
    while len(started) < 2 and time.monotonic() < deadline:  # the stand-in and the process it started
        started = psutil.Process(driver.pid).children(recursive=True)
        time.sleep(0.2)
    orphans.extend(p.pid for p in started)
    assert len(started) == 2, "the stand-in run did not start"
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=60) == 128 + signal.SIGTERM
    assert "run the same command again to resume" in driver.stderr.read()
    progress = driver.stdout.read()
    assert "stand_in-beta0.5-seed0: interrupted in" in progress and "FAILED" not in progress
    assert all(gone(pid) for pid in orphans)


# ---- the derived tables on hand-made inputs -----------------------------------------------------------------------


def fake_record(spec, curve):
    """A finished run's record, as the runner writes it, with the given accuracy per round."""
    return {
        "status": "complete",
        "run_id": spec.run_id,
        "variant": spec.variant.name,
        "method": spec.variant.method,
        "label": METHODS[spec.variant.method].label,
        "seed": spec.seed,
        "beta": spec.beta,
        "spec": spec.fingerprint(),
        "final_accuracy": curve[-1],
        "rounds": [{"round": r, "test_accuracy": a, "round_seconds": 1.0} for r, a in enumerate(curve)],
        "wall_seconds": 1.0,
        "peak_rss_mb": {"clients": {}, "other": 0.0},
        "environment": {"commit": "x"},
    }


def records(curves_by_method, beta=0.5):
    """One fake record per curve: ``{method: [seed 0's curve, seed 1's, ...]}``."""
    return [
        fake_record(RunSpec(Variant(method), seed, beta, Settings(rounds=4)), curve)
        for method, curves in curves_by_method.items()
        for seed, curve in enumerate(curves)
    ]


def test_rounds_to_target_and_speedup():
    assert rounds_to_target([0.1, 0.3, 0.5, 0.45, 0.6], 0.5) == 3  # the first round that reaches it
    assert rounds_to_target([0.6, 0.1], 0.5) == 1
    assert rounds_to_target([0.1, 0.4], 0.5) is None
    assert speedup(30, 12) == 2.5
    assert speedup(None, 3) is None and speedup(30, None) is None


def test_mean_and_std_over_seeds():
    mean, std = mean_std([0.6, 0.7, 0.8])
    assert mean == pytest.approx(0.7) and std == pytest.approx(0.1 * math.sqrt(2 / 3))  # population std
    assert mean_curve([[0.1, 0.3], [0.3, 0.5]]) == pytest.approx([0.2, 0.4])
    with pytest.raises(ValueError):
        mean_curve([[0.1], [0.1, 0.2]])


def test_table_2_counts_rounds_on_the_mean_curves_against_fedavgs_final_accuracy():
    groups = group_runs(
        records(
            {
                "fedavg": [
                    [0.20, 0.55, 0.50, 0.60],
                    [0.20, 0.55, 0.50, 0.50],
                ],  # finals 0.6, 0.5: target 0.55; the mean curve first reaches it at round 2 of 4
                "moon": [
                    [0.30, 0.52, 0.60, 0.65],
                    [0.30, 0.62, 0.60, 0.70],
                ],  # mean 0.57 at round 2
            }
        )
    )
    rows = rounds_to_target_rows(groups, "cifar10")
    assert rows == [  # paper's count: FedAvg's 4 rounds / MOON's 2; against FedAvg's first reach: 2 / 2
        ["FedAvg", "0.5", "0, 1", "55.00", "2 / 4", "2", "1.00×", "1.00×", "1×"],
        ["MOON", "0.5", "0, 1", "55.00", "2 / 4", "2", "2.00×", "1.00×", "3.7×"],
    ]
    table_1 = final_accuracy_rows(groups, "cifar10")
    assert table_1[0] == ["FedAvg", "0.5", "0, 1", "55.00 ± 5.00", "66.3"]
    assert table_1[1] == ["MOON", "0.5", "0, 1", "67.50 ± 2.50", "69.1"]
    assert final_accuracy_rows(groups, "synthetic")[1][-1] == "—"  # published numbers only for their dataset


def test_a_method_that_never_reaches_the_target_has_no_speedup():
    groups = group_runs(records({"fedavg": [[0.2, 0.4, 0.5, 0.6]], "scaffold": [[0.1, 0.2, 0.3, 0.4]]}))
    assert rounds_to_target_rows(groups, "cifar10")[1][4:8] == ["not reached / 4", "4", "—", "—"]


def test_table_1_shows_the_papers_baselines_as_issue_26_quotes_them():
    groups = group_runs(records({"fedprox": [[0.5]], "scaffold": [[0.5]]}))
    assert [row[-1] for row in final_accuracy_rows(groups, "cifar10")] == ["66.9", "66.6"]
    assert "issue 26" in published("scaffold", "cifar10", "top1", 0.5).where


def test_a_method_run_at_fewer_seeds_is_measured_against_fedavg_at_its_own_seeds():
    fedavg = [[0.2, 0.4, 0.6, 0.7], [0.2, 0.5, 0.5, 0.5]]  # finals 0.7 and 0.5; both seeds' target 0.6

    def run(method, seed, beta=0.5, accuracies=(0.3, 0.5, 0.6, 0.6)):
        return fake_record(RunSpec(Variant(method), seed, beta, Settings(rounds=4)), list(accuracies))

    groups = group_runs(
        records({"fedavg": fedavg})
        + [
            run("scaffold", 1),
            run("fedprox", 2),  # FedAvg has no seed 2 at β 0.5 ...
            run("fedavg", 2, beta=0.1),  # ... only at β 0.1
            run("moon", 1),
            run("moon", 2),  # seeds 1 and 2: not paired on seed 1 alone
            run("solo", 1),
        ]
    )
    groups[("solo", 0.5)][0]["rounds"] = []  # SOLO has no rounds
    rows = {row[0]: row for row in rounds_to_target_rows(groups, "cifar10") if row[1] == "0.5"}
    # seed 1's FedAvg ends at 0.5, which it first reaches at round 2; SCAFFOLD at seed 1 reaches it at round 2 too
    # (against both seeds' 0.6 it would need 3 rounds)
    assert rows["SCAFFOLD"][2:8] == ["1", "50.00", "2 / 4", "2", "2.00×", "1.00×"]
    assert rows["FedAvg"][2:6] == ["0, 1", "60.00", "4 / 4", "4"]  # its mean curve: 0.2, 0.45, 0.55, 0.6
    assert set(rows) == {"FedAvg", "SCAFFOLD"}
    assert unpaired_groups(groups) == ["FedProx (β = 0.5, seed 2)", "MOON (β = 0.5, seeds 1, 2)"]


def test_a_continued_runs_time_per_round_leaves_out_the_time_between_sittings():
    record = records({"moon": [[0.1, 0.2, 0.3, 0.4, 0.5]]})[0]
    seconds = [float("nan"), 100.0, 7000.0, 110.0, 90.0]  # sitting 1 started unrecorded; sitting 2 began at round 2
    for r, s in zip(record["rounds"], seconds):
        r["round_seconds"] = s
    record["continued_after_round"] = 1
    row = per_run_rows([record])[0]
    assert row[3:6] == ["1 (last sitting)", "105.0", "—"]  # median of 100, 7000, 110, 90; round 0's time unknown


def test_solo_shows_its_spread_over_sites():
    solo = records({"solo": [[0.4]]})[0]
    solo.update(rounds=[], final_accuracy=0.4, final_accuracy_std_over_sites=0.05)
    assert final_accuracy_rows(group_runs([solo]), "cifar10")[0][3] == "40.00 ± 5.00 (over sites)"


def test_local_figures_table_reads_the_last_rounds_spread_and_skips_older_runs():
    runs = records({"fedavg": [[0.3, 0.5], [0.3, 0.5]], "moon": [[0.4, 0.6]]})
    for run, (mean, worst, std, personal) in zip(runs[:2], [(0.5, 0.2, 0.1, 0.7), (0.6, 0.4, 0.05, 0.8)]):
        run["rounds"][-1]["spread"] = {
            "accuracy": {"mean": mean, "worst": worst, "std": std},
            "local_model_accuracy": {"mean": personal, "worst": 0.0, "std": 0.0},
        }
    assert local_figure_rows(group_runs(runs)) == [
        ["FedAvg", "0.5", "0, 1", "55.00 ± 5.00", "30.00 ± 10.00", "7.50 ± 2.50", "75.00 ± 5.00"]
    ]  # MOON's run predates the local figures


def test_beta_sweep_has_a_column_per_beta():
    runs = records({"fedavg": [[0.3]], "moon": [[0.4]]}, beta=0.1) + records({"fedavg": [[0.6]]}, beta=5.0)
    headers, rows = beta_sweep_rows(group_runs(runs))
    assert headers == ["method", "β = 0.1", "β = 5"]
    assert rows == [["FedAvg", "30.00", "60.00"], ["MOON", "40.00", "—"]]


def test_eta_extrapolates_the_current_run_and_the_finished_runs():
    assert estimate_remaining(30, 3, 10, 2, [200.0]) == pytest.approx((70, 70 + 2 * 200))
    assert estimate_remaining(30, 3, 10, 2, []) == pytest.approx((70, 70 + 2 * 100))
    assert estimate_remaining(5, 0, 10, 1, []) == (None, None)


def test_protocols_hold_the_documented_runs():
    quick = PROTOCOLS["quick"]
    assert (quick.settings.dataset, quick.settings.num_sites, quick.betas) == ("cifar10", 10, (0.5,))
    seeds = {m: sorted(s.seed for s in quick.runs([m])) for m in ("moon", "fedavg", "fedprox")}
    assert seeds == {"moon": [0, 1, 2], "fedavg": [0, 1, 2], "fedprox": [0]}
    assert {s.beta for s in PROTOCOLS["heterogeneity"].runs()} == {0.1, 0.5, 5.0}
    assert [s.run_id for s in PROTOCOLS["ablation"].runs(["moon_l2"])] == [
        "moon_l2-mu0.1-beta0.5-seed0",
        "moon_l2-mu1-beta0.5-seed0",
        "moon_l2-mu5-beta0.5-seed0",
    ]
    paper = PROTOCOLS["paper"].settings
    assert (paper.local_epochs, paper.rounds, paper.device, paper.solo_epochs_per_site) == (10, 100, "auto", 300)
    with pytest.raises(ValueError, match="rounds"):
        customised(quick, rounds=0)


def test_extra_seeds_name_a_method_or_one_variant():
    best, other = Variant("fedsiam_da", (("mu", 0.01),)), Variant("fedsiam_da", (("mu", 0.1),))
    settings = Settings(rounds=1)
    by_variant = Protocol("p", "", settings, (best, other), extra_seeds=((best.name, (1, 2)),))
    assert [s.run_id for s in by_variant.runs()] == [
        "fedsiam_da-mu0.01-beta0.5-seed0",
        "fedsiam_da-mu0.01-beta0.5-seed1",
        "fedsiam_da-mu0.01-beta0.5-seed2",
        "fedsiam_da-mu0.1-beta0.5-seed0",
    ]
    by_method = Protocol("p", "", settings, (best, other), extra_seeds=(("fedsiam_da", (1,)),))
    assert [s.seed for s in by_method.runs()] == [0, 1, 0, 1]
    options = {(s.variant.name, s.seed) for s in PROTOCOLS["fedsiam_da_options"].runs()}
    assert {("fedsiam_da-mu0.01-history_branchprojection", seed) for seed in (0, 1, 2)} <= options
    assert ("fedsiam_da-mu0.03-history_branchprojection", 0) in options


def test_practical_protocol_reuses_quicks_runs_and_sets_each_option(tmp_path):
    quick = {spec.run_id: spec.fingerprint() for spec in PROTOCOLS["quick"].runs()}
    practical = PROTOCOLS["practical"].runs()
    shared = [spec for spec in practical if spec.variant.method in ("moon", "fedavg")]
    assert sorted(spec.run_id for spec in shared) == sorted(r for r in quick if r.split("-")[0] in ("moon", "fedavg"))
    assert all(spec.fingerprint() == quick[spec.run_id] for spec in shared)  # the same runs: done once, not redone
    seeds = {}
    for spec in practical:
        seeds.setdefault(spec.variant.name, []).append(spec.seed)
    assert seeds == {
        "fedavg": [0, 1, 2],
        "moon": [0, 1, 2],
        "moon_cold_start-mu_off_rounds3": [0, 1, 2],
        "moon_cold_start-mu_off_rounds5": [0, 1, 2],
        "moon_feature_noise-feature_noise_std0.1": [0],
        "moon_feature_noise-feature_noise_std0.5": [0],
        "moon_light_history": [0],
    }
    expected_args = {
        "moon_cold_start": ("mu_off_rounds", 3),
        "moon_feature_noise": ("feature_noise_std", 0.5),
        "moon_light_history": ("light_history", True),
    }
    for spec in practical[-2:] + [s for s in practical if s.variant.method == "moon_cold_start"][:1]:
        METHODS[spec.variant.method].launch(spec, str(tmp_path / spec.run_id), None)
        (config,) = (tmp_path / spec.run_id / "job").glob("*/app/config/config_fed_client.json")
        args = json.loads(config.read_text())["executors"][0]["executor"]["args"]
        name, value = expected_args[spec.variant.method]
        assert args["settings"]["args"][name] == value


def test_privacy_bandwidth_protocol_puts_each_filter_on_the_sites_train_results(tmp_path):
    expected = {
        "fedavg-quantizationfloat16": ["FloatModelQuantizer"],
        "moon-quantizationfloat16": ["FloatModelQuantizer"],
        "moon_percentile_privacy": ["PercentilePrivacy"],
        "moon_svt_privacy": ["SVTPrivacy"],
        "moon_exclude_vars": ["ExcludeVars"],
    }
    filters = {}
    for spec in PROTOCOLS["privacy_bandwidth"].runs():
        METHODS[spec.variant.method].launch(spec, str(tmp_path / spec.run_id), None)
        (config,) = (tmp_path / spec.run_id / "job").glob("*/app/config/config_fed_client.json")
        result_filters = json.loads(config.read_text())["task_result_filters"]
        paths = [f["path"] for chain in result_filters for f in chain["filters"]]
        filters[spec.variant.name] = sorted({path.rsplit(".", 1)[1] for path in paths})
        if spec.variant.method == "moon_exclude_vars":
            assert result_filters[0]["filters"][0]["args"]["exclude_vars"] == ["l2.weight", "l2.bias"]
    assert filters == expected


def test_the_summary_of_interrupted_runs_shows_how_far_each_got(tmp_path):
    protocol = PROTOCOLS["paper"]
    specs = protocol.runs(["moon", "fedavg"])
    so_far = {specs[0].run_id: [0.1118, 0.1422, 0.3455], specs[1].run_id: [0.1118, 0.2969]}
    path = write_summary(str(tmp_path), protocol, [], specs, "cmd", runner.environment(), in_progress=so_far)
    summary = open(path).read()
    assert f"- In progress: {specs[0].run_id}, 3 of 100 rounds done, test accuracy 34.55% after round 2." in summary
    assert f"- In progress: {specs[1].run_id}, 2 of 100 rounds done, test accuracy 29.69% after round 1." in summary
    assert (tmp_path / "accuracy_so_far.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "(accuracy_so_far.png)" in summary


# Not privacy_bandwidth: NVFlare writes a filter chain's tasks in a set's order (job_config/base_app_config.py), which
# changes from one process to the next, so a job with filters has no stable digest to compare.
@pytest.mark.parametrize("protocol, methods, seeds", [("paper", "moon,fedavg,fedprox,scaffold,solo", "0,1,2")])
def test_the_committed_records_are_summarised_again_without_the_dataset(tmp_path, protocol, methods, seeds):
    """Every finished record under docs/results/<protocol>/runs still matches the job this code exports (its digest),
    and the summary is rewritten from the records alone: without CIFAR-10 only the partition plot is left out."""
    records = REPO / "docs" / "results" / protocol / "runs"
    runs = {f"{m}-beta0.5-seed{s}" for m in methods.split(",") for s in seeds.split(",")}
    finished = len(runs & {path.stem for path in records.glob("*.json")})  # the runs still to come are missing
    shutil.copytree(records, tmp_path / "runs")
    arguments = ["--methods", methods, "--seeds", seeds]
    command = [sys.executable, "-m", "nvflare_moon.benchmark", "--protocol", protocol, *arguments, "--summary-only"]
    env = dict(os.environ, NVFLARE_MOON_DATA=str(tmp_path / "no_data"))
    done = subprocess.run([*command, "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == (0 if finished == len(runs) else 1), done.stdout + done.stderr
    assert f"{finished} already finished" in done.stdout and "another job" not in done.stdout + done.stderr
    summary = (tmp_path / protocol / "summary.md").read_text()
    assert "(The partition plot at β = 0.5 is left out: cifar10 was not found; give --data-root.)" in summary
    committed = (REPO / "docs" / "results" / protocol / "summary.md").read_text()
    table = summary[summary.index("## Final top-1 accuracy") : summary.index("## Plots")]
    assert table in committed  # the committed page is what the benchmark writes from these records
