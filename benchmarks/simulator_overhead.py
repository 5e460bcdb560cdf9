"""NVFlare's overhead on a short MOON job: simulator wall time against the pure training time inside it.

    NVFLARE_MOON_DATA=/path/with/cifar-10-batches-py python benchmarks/simulator_overhead.py [-n 10 -t 4]

It exports ``jobs/moon_cifar10`` with 2 local epochs and 3 rounds, runs ``nvflare simulator -n N -t T`` and times it.
The pure training time is the same work (every site, every round, same batches) done in this one process with the
same number of threads in total, sequentially: what the job would cost without NVFlare, process starts, transfers or
evaluation. Their ratio is the overhead factor.

    python benchmarks/simulator_overhead.py --compare-threads 10,4,2 --epochs 10 --rounds 3

instead runs the same job once per ``-t`` and prints the seconds per round of each (rounds after the first, from the
times the server logs in ``global_metrics.jsonl``, so that start-up is left out) and its ratio to the fastest.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

from nvflare_moon.benchmark.runner import RecordHeader
from nvflare_moon.core.files import write_json_atomic
from nvflare_moon.core.objectives import MoonObjective
from nvflare_moon.core.training import frozen_copy, sgd, train_local
from nvflare_moon.data import TensorBatchLoader, load_dataset, site_train_arrays, train_transform
from nvflare_moon.models import Network
from nvflare_moon.recipes import MoonRecipe

TRAINED = re.compile(r"trained (\d+) steps in ([\d.]+) s")


def run_simulator(job_root: str, n: int, t: int, workspace: str) -> tuple:
    cmd = [
        sys.executable,
        "-m",
        "nvflare.private.fed.app.simulator.simulator",
        os.path.join(job_root, "moon_cifar10"),
        "-w",
        workspace,
        "-n",
        str(n),
        "-t",
        str(t),
    ]
    started = time.perf_counter()
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True).stdout
    return time.perf_counter() - started, out


def pure_training_seconds(n: int, rounds: int, epochs: int, threads: int) -> float:
    """Every site's local MOON training for every round, back to back in this process."""
    torch.set_num_threads(threads)
    splits = load_dataset("cifar10")
    net = Network(seed=0)
    previous = {}
    started = time.perf_counter()
    for r in range(rounds):
        global_state = {k: v.clone() for k, v in net.state_dict().items()}
        for i in range(n):
            site = f"site-{i + 1}"
            local = Network(seed=0)
            local.load_state_dict(global_state)
            shard = site_train_arrays(splits, site, n)
            batches = TensorBatchLoader(shard, 64, train_transform("cifar10"), True, True, seed=r * 1000 + i)
            prev = [previous[site]] if site in previous else []
            objective = MoonObjective(frozen_copy(local), prev, mu=5.0, temperature=0.5)
            train_local(local, batches, objective, sgd(local, 0.01, 0.9, 1e-5), epochs, torch.device("cpu"))
            previous[site] = frozen_copy(local)
        net = local  # the aggregate's cost is negligible; any model keeps the next round's shapes
    return time.perf_counter() - started


def round_times(workspace: str) -> list:
    """When the server evaluated each round's aggregate (``global_metrics.jsonl``)."""
    with open(os.path.join(workspace, "server", "simulate_job", "global_metrics.jsonl")) as f:
        return [json.loads(line)["time"] for line in f]


def seconds_per_round(workspace: str) -> float:
    """Mean time between the server's evaluations after round 0 (round 0 also carries the start-up)."""
    times = round_times(workspace)
    if len(times) < 2:
        raise SystemExit("--compare-threads needs --rounds 2 or more")
    return (times[-1] - times[0]) / (len(times) - 1)


STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - .*?- (.*)$")
PICKED = re.compile(r"Simulate Run client: (\S+) ")
SENT = "Sending task train to"
EVENTS = (  # what a site's log line marks, and the text that marks it
    ("started", "ClientTaskWorker started to run"),
    ("ready", "training samples ("),
    ("task", "got task assignment"),
    ("trained", " trained "),
    ("finished", "Finished one task run"),
)
PHASES = ("waiting for a task", "start", "set-up", "task fetch", "training", "upload", "empty starts", "idle")


def _stamped_lines(path: str):
    with open(path, errors="replace") as f:
        for line in f:
            found = STAMP.match(line)
            if found:
                stamp = time.mktime(time.strptime(found.group(1)[:19], "%Y-%m-%d %H:%M:%S"))
                yield stamp + int(found.group(1)[20:]) / 1000, found.group(2)


def site_phases(log: str, picks: list, sent: list, window: tuple) -> tuple:
    """One site's thread seconds by phase (PHASES but idle) over the tasks it got within ``window``, and its count
    of tasks and of empty starts (workers that ended without a task)."""
    totals, counts = dict.fromkeys(PHASES[:-1], 0.0), {"tasks": 0, "empty starts": 0}

    def count_if_empty(worker):
        if worker and not worker["tasks"] and window[0] < worker["started"] <= window[1]:
            totals["empty starts"] += worker["last"] - worker["picked"]
            counts["empty starts"] += 1

    worker = None
    for stamp, text in _stamped_lines(log):
        event = next((name for name, marker in EVENTS if marker in text), None)
        if event == "started":
            count_if_empty(worker)
            picked = max((p for p in picks if p <= stamp), default=stamp)
            worker = {"picked": picked, "started": stamp, "tasks": 0, "last": stamp}
        if worker is None:
            continue
        worker["last"] = stamp
        if event in ("ready", "trained", "finished"):
            worker[event] = stamp
        elif event == "task":
            first, worker["tasks"], worker["task"] = worker["tasks"] == 0, worker["tasks"] + 1, stamp
            if not window[0] < stamp <= window[1]:
                continue
            counts["tasks"] += 1
            if first:  # a new worker: it waited for the task, started, set up, fetched
                available = max([worker["picked"]] + [t for t in sent if t <= worker["started"]])
                since = worker["picked"]
                totals["start"] += worker["started"] - available
                totals["set-up"] += worker["ready"] - worker["started"]
                fetched_from = worker["ready"]
            else:  # a kept worker (-t == -n): it waited for the task since its last one, then fetched it
                available = max([worker["finished"]] + [t for t in sent if t <= stamp])
                since = worker["finished"]
                fetched_from = available
            totals["waiting for a task"] += available - since
            totals["task fetch"] += stamp - fetched_from
        if event == "trained" and "task" in worker and window[0] < worker["task"] <= window[1]:
            totals["training"] += stamp - worker["task"]
        if event == "finished" and "trained" in worker and window[0] < worker.get("task", 0) <= window[1]:
            totals["upload"] += stamp - worker["trained"]
    count_if_empty(worker)
    return totals, counts


def split_rounds(workspace: str, n: int, t: int) -> dict:
    """Thread seconds per round after round 0, by phase, from the logs' timestamps (see PHASES).

    A thread that picked a site (NVFlare's runner logs the pick) before the server sent the round's task is
    ``waiting for a task`` until then (our scheduling waits; NVFlare's starts a worker that finds none), as is a kept
    worker between its tasks (``-t == -n``). ``start`` runs from then to a new worker's first line: the previous
    worker's exit, the thread's sleep, the new process and NVFlare's imports. ``set-up`` runs to the executor's first
    line: NVFlare's client set-up (with its 0.5 s sleep), the job's imports (torch), our data and model. ``empty
    starts`` are whole workers that found no task. ``idle`` is the rest of the ``t`` threads' time."""
    times = round_times(workspace)
    picks, sent = {}, []
    for stamp, text in _stamped_lines(os.path.join(workspace, "server", "log.txt")):
        found = PICKED.search(text)
        if found:
            picks.setdefault(found.group(1), []).append(stamp)
        elif SENT in text:
            sent.append(stamp)
    totals, counts = dict.fromkeys(PHASES, 0.0), {"tasks": 0, "empty starts": 0}
    for site in (f"site-{i + 1}" for i in range(n)):
        log = os.path.join(workspace, site, "log.txt")
        site_totals, site_counts = site_phases(log, picks.get(site, []), sent, (times[0], times[-1]))
        for phase, seconds in site_totals.items():
            totals[phase] += seconds
        for name, count in site_counts.items():
            counts[name] += count
    rounds = len(times) - 1
    per_round = {phase: seconds / rounds for phase, seconds in totals.items()}
    per_round["idle"] = max(0.0, t * (times[-1] - times[0]) / rounds - sum(per_round.values()))
    return {"thread_seconds_per_round": per_round, "per_round": {k: v / rounds for k, v in counts.items()}}


MODES = {  # the simulator as NVFlare ships it, and with nvflare_moon's scheduling and warm workers (the default)
    "nvflare": {"NVFLARE_MOON_SCHEDULE_SITES": "0", "NVFLARE_MOON_WARM_WORKERS": "0"},
    "ours": {"NVFLARE_MOON_SCHEDULE_SITES": "1", "NVFLARE_MOON_WARM_WORKERS": "1"},
}


def compare_threads(n: int, thread_counts: list, rounds: int, epochs: int, modes: list, record: str) -> None:
    """Run the same job once per mode and ``-t``, side by side, and print seconds per round, the ratio to the
    fastest ``-t`` of the mode and the split of the threads' time; with ``record``, write them as JSON."""
    header = RecordHeader("benchmarks/simulator_overhead.py")
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        MoonRecipe(num_rounds=rounds, local_epochs=epochs, min_clients=n).export(tmp)
        for t in thread_counts:
            for mode in modes:
                workspace = os.path.join(tmp, f"ws_{mode}_t{t}")
                os.environ.update(MODES[mode])
                run_simulator(tmp, n, t, workspace)
                measured[mode, t] = {"seconds_per_round": seconds_per_round(workspace), **split_rounds(workspace, n, t)}
                print(f"  {mode}, -n {n} -t {t}: {measured[mode, t]['seconds_per_round']:6.1f} s per round", flush=True)
    results = {mode: {f"t{t}": measured[mode, t] for t in thread_counts} for mode in modes}
    for mode in modes:
        fastest = min(run["seconds_per_round"] for run in results[mode].values())
        for run in results[mode].values():
            run["over_fastest"] = run["seconds_per_round"] / fastest
    print(f"nvflare simulator -n {n}, {rounds} rounds x {epochs} local epochs, {os.cpu_count()} cores")
    print("| simulator | -t | s per round | / fastest -t | tasks | empty starts | " + " | ".join(PHASES) + " |")
    print("|---" * (6 + len(PHASES)) + "|")
    for mode in modes:
        for t in thread_counts:
            run = results[mode][f"t{t}"]
            split = " | ".join(f"{run['thread_seconds_per_round'][phase]:.1f}" for phase in PHASES)
            print(
                f"| {mode} | {t} | {run['seconds_per_round']:.1f} | {run['over_fastest']:.2f} | "
                f"{run['per_round']['tasks']:.1f} | {run['per_round']['empty starts']:.1f} | {split} |"
            )
    if record:
        write_json_atomic(
            record,
            {
                **header.fields(),
                "n": n,
                "rounds": rounds,
                "epochs": epochs,
                "cores": os.cpu_count(),
                "results": results,
            },
        )
        print(f"record: {record}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("-t", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--compare-threads", help="e.g. 10,4,2: seconds per round for each -t instead")
    parser.add_argument("--modes", default="nvflare,ours", help="with --compare-threads: " + ", ".join(MODES))
    parser.add_argument("--record", default="", help="with --compare-threads: write the figures to this JSON file")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.compare_threads:
        threads = [int(t) for t in args.compare_threads.split(",")]
        compare_threads(args.n, threads, args.rounds, args.epochs, args.modes.split(","), args.record)
        return
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        MoonRecipe(num_rounds=args.rounds, local_epochs=args.epochs, min_clients=args.n).export(tmp)
        wall, log = run_simulator(tmp, args.n, args.t, os.path.join(tmp, "ws"))
    tasks = [(int(s), float(sec)) for s, sec in TRAINED.findall(log)]
    in_job = sum(sec for _, sec in tasks)
    pure = pure_training_seconds(args.n, args.rounds, args.epochs, threads=cores)
    print(
        f"nvflare simulator -n {args.n} -t {args.t}, {args.rounds} rounds x {args.epochs} local epochs, {cores} cores"
    )
    print(f"  simulator wall time:                  {wall:8.1f} s")
    print(
        f"  training time logged by the clients:  {in_job:8.1f} s over {len(tasks)} tasks (concurrent, {args.t} workers)"
    )
    print(f"  same training in one process:         {pure:8.1f} s")
    print(f"  overhead factor (wall / pure):        {wall / pure:8.2f}x")


if __name__ == "__main__":
    main()
