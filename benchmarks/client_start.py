"""What one client process start costs, phase by phase: the part of a task that NVFlare's simulator repeats for every
task when it runs with fewer workers than sites (``-t < -n``).

    python benchmarks/client_start.py [--data-root DIR] [--repeats 3] [--json client_start.json]

Each repeat runs a fresh Python process that times, in CPU seconds of that process (``time.process_time``, so that a
busy machine does not inflate the figures), the phases of a MOON site's start in the order the simulator's worker runs
them: the interpreter, importing torch, importing NVFlare's client worker, importing the executor, reading the dataset
(mapped from its decoded copy after the first process, see ``nvflare_moon/data/decoded_cache.py``), cutting the site's
shard, building the network, and saving and loading the site's state file (a task does both). The best repeat of each
phase is printed; NVFlare's own connection and task exchange (waiting on the server, not CPU) are not included.
``--json PATH`` also writes a record: the command, date, commit, machine load, every repeat and the best of each phase.
"""

import argparse
import json
import subprocess
import sys

from nvflare_moon.benchmark.runner import RecordHeader
from nvflare_moon.core.files import write_json_atomic

PHASES = r"""
import json, os, sys, tempfile, time
figures = {"interpreter": time.process_time()}
def phase(name, started=[time.process_time()]):
    now = time.process_time()
    figures[name] = now - started[0]
    started[0] = now
import torch; phase("import torch")
import nvflare.private.fed.app.simulator.simulator_worker; phase("import NVFlare's client worker")
from nvflare_moon.executors import MoonExecutor; phase("import nvflare_moon's executor")
from nvflare_moon.data import load_dataset, site_train_arrays
splits = load_dataset("cifar10", sys.argv[1] or None); phase("read CIFAR-10")
shard = site_train_arrays(splits, "site-3", 10, "dirichlet", 0.5, 0); phase("cut the site's shard")
from nvflare_moon.models import Network
net = Network(seed=0); phase("build the network")
from nvflare_moon.core.previous_uploads import PreviousUploads
from nvflare_moon.core.state import SiteStateStore
store = SiteStateStore(tempfile.mkdtemp(), "moon_state", "site-3", "job")
store.save(0, PreviousUploads().payload_after(0, net))
PreviousUploads().restore(store.load(), 1, net); phase("save and load the site's state")
print(json.dumps(figures))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data-root", default="", help="folder with cifar-10-batches-py/ (default: $NVFLARE_MOON_DATA)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write a record to this file: the command, date, commit and the figures")
    args = parser.parse_args()
    header = RecordHeader("benchmarks/client_start.py")
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", PHASES, args.data_root], check=True, capture_output=True, text=True
            ).stdout
        )
        for _ in range(args.repeats)
    ]
    best = {name: min(run[name] for run in runs) for name in runs[0]}
    for name, seconds in best.items():
        print(f"{name:<34}{seconds:7.2f} s CPU")
    print(f"{'total':<34}{sum(best.values()):7.2f} s CPU")
    if args.json:
        record = {**header.fields(), "cpu_seconds_best": best, "cpu_seconds_per_repeat": runs}
        write_json_atomic(args.json, record)


if __name__ == "__main__":
    main()
