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

from nvflare_moon.data import TensorBatchLoader, load_dataset, site_train_arrays, train_transform
from nvflare_moon.models import Network
from nvflare_moon.core.objectives import MoonObjective
from nvflare_moon.recipes import MoonRecipe
from nvflare_moon.core.training import frozen_copy, sgd, train_local

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


def seconds_per_round(workspace: str) -> float:
    """Mean time between the server's evaluations after round 0 (round 0 also carries the start-up)."""
    with open(os.path.join(workspace, "server", "simulate_job", "global_metrics.jsonl")) as f:
        times = [json.loads(line)["time"] for line in f]
    if len(times) < 2:
        raise SystemExit("--compare-threads needs --rounds 2 or more")
    return (times[-1] - times[0]) / (len(times) - 1)


def compare_threads(n: int, thread_counts: list, rounds: int, epochs: int) -> None:
    """Run the same job once per ``-t`` and print its seconds per round beside the fastest."""
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        MoonRecipe(num_rounds=rounds, local_epochs=epochs, min_clients=n).export(tmp)
        for t in thread_counts:
            workspace = os.path.join(tmp, f"ws_t{t}")
            run_simulator(tmp, n, t, workspace)
            measured[t] = seconds_per_round(workspace)
            print(f"  -n {n} -t {t}: {measured[t]:6.1f} s per round", flush=True)
    fastest = min(measured.values())
    print(f"nvflare simulator -n {n}, {rounds} rounds x {epochs} local epochs, {os.cpu_count()} cores")
    print("| -t | s per round | / fastest |\n|---|---|---|")
    for t, seconds in measured.items():
        print(f"| {t} | {seconds:.1f} | {seconds / fastest:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("-t", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--compare-threads", help="e.g. 10,4,2: seconds per round for each -t instead")
    args = parser.parse_args()
    if args.compare_threads:
        compare_threads(args.n, [int(t) for t in args.compare_threads.split(",")], args.rounds, args.epochs)
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
