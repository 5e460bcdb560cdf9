"""NVFlare's overhead on a short MOON job: simulator wall time against the pure training time inside it.

    NVFLARE_MOON_DATA=/path/with/cifar-10-batches-py python benchmarks/simulator_overhead.py [-n 10 -t 4]

It exports ``jobs/moon_cifar10`` with 2 local epochs and 3 rounds, runs ``nvflare simulator -n N -t T`` and times it.
The pure training time is the same work (every site, every round, same batches) done in this one process with the
same number of threads in total, sequentially: what the job would cost without NVFlare, process starts, transfers or
evaluation. Their ratio is the overhead factor.
"""

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("-t", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
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
