"""Peak memory (RSS) of one client process per method, with the simple-CNN and with ResNet-50.

    python benchmarks/memory.py [--data-root DIR] [--methods fedavg,fedprox,scaffold,moon,solo]
                                [--archs simple_cnn,resnet50] [--steps 2] [--repeats 1] [--json memory.json]

Every (method, network) pair runs in a fresh Python process, which reports its own peak resident set size
(``getrusage(RUSAGE_SELF).ru_maxrss``) at the end. A federated method runs its real executor class (the one the jobs
use) for two rounds in that process, so that everything a client holds is counted: the whole dataset as uint8
tensors, the network, gradients and momentum, and per method the frozen global model (MOON, FedProx, SCAFFOLD), the
previous local model and its stored copy (MOON, from round 1 on), the control variates (SCAFFOLD) and the reply's
numpy copy of the weights. Two rounds are needed because MOON holds its previous model only from round 1 on. SOLO
trains the same way without NVFlare and evaluates one test batch of 500 (its evaluation peak). Memory does not
depend on how many batches run, so each round is ``--steps`` batches of 64 (a shard of ``steps × 64`` images, iid).

The simple-CNN runs on CIFAR-10 and ResNet-50 on CIFAR-100, as in the paper. Where a dataset is not under
``--data-root``, a random stand-in of the same size and layout is written to a temporary folder: memory depends on
the sizes, not the pixels.

``--repeats N`` measures every pair N times (each time in a fresh process, the pairs in turn); the table shows the
median of the repeats. ``--json PATH`` also writes a record: the command line, the date, the commit, the machine and
its load average, every repeat, and per pair the median, the lowest and the highest peak.
"""

import argparse
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

METHODS = ("fedavg", "fedprox", "scaffold", "moon", "solo")
ARCH_DATASET = {"simple_cnn": "cifar10", "resnet50": "cifar100"}
BATCH = 64
FEDPROX_MU = 0.01


def rss_mb() -> float:
    """Current resident set size of this process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


# ---- the measured process ------------------------------------------------------------------------------------------


def client_context(site: str, run_dir: str):
    """The part of NVFlare's client runtime an executor touches: its site name, the job id and the run folder."""
    from nvflare.apis.fl_constant import ReservedKey
    from nvflare.apis.fl_context import FLContext

    class Workspace:
        def get_run_dir(self, job_id):
            return os.path.join(run_dir, job_id)

    class Engine:
        def get_workspace(self):
            return Workspace()

        def fire_event(self, event_type, fl_ctx):
            """The executors' analytics events (the local figures of a train reply): no receiver here."""

    fl_ctx = FLContext()
    fl_ctx.set_prop(ReservedKey.IDENTITY_NAME, site, private=False)
    fl_ctx.set_prop(ReservedKey.RUN_NUM, "memory_benchmark", private=False)
    fl_ctx.set_prop(ReservedKey.ENGINE, Engine(), private=False)
    return fl_ctx


def measure_federated(method: str, arch: str, dataset: str, data_root: str, num_sites: int, run_dir: str) -> dict:
    from nvflare.apis.event_type import EventType
    from nvflare.apis.fl_constant import ReturnCode
    from nvflare.apis.signal import Signal
    from nvflare.app_common.abstract.fl_model import FLModel
    from nvflare.app_common.app_constant import AlgorithmConstants
    from nvflare.app_common.utils.fl_model_utils import FLModelUtils

    from nvflare_moon.core.scaffold import apply_control_deltas
    from nvflare_moon.core.weights import state_dict_to_numpy
    from nvflare_moon.data import NUM_CLASSES
    from nvflare_moon.executors import FedAvgExecutor, FedProxExecutor, MoonExecutor, ScaffoldExecutor
    from nvflare_moon.models import Network

    after_imports = rss_mb()
    executor_class = {
        "fedavg": FedAvgExecutor,
        "fedprox": FedProxExecutor,
        "scaffold": ScaffoldExecutor,
        "moon": MoonExecutor,
    }[method]
    network = Network(arch=arch, num_classes=NUM_CLASSES[dataset])
    executor = executor_class(
        model=network,
        dataset=dataset,
        data_root=data_root,
        download=False,
        num_sites=num_sites,
        partition="iid",
        local_epochs=1,
        batch_size=BATCH,
        device="cpu",
        num_threads=None,
    )
    fl_ctx = client_context("site-1", run_dir)
    executor.handle_event(EventType.START_RUN, fl_ctx)
    after_setup = rss_mb()
    params = state_dict_to_numpy(Network(arch=arch, num_classes=NUM_CLASSES[dataset]))
    meta = {AlgorithmConstants.FEDPROX_MU: FEDPROX_MU} if method == "fedprox" else {}
    for round_number in range(2):
        task = FLModelUtils.to_shareable(FLModel(params=params, current_round=round_number, meta=dict(meta)))
        reply = executor.execute("train", task, fl_ctx, Signal())
        if reply.get_return_code() != ReturnCode.OK:
            raise RuntimeError(f"{method} round {round_number} failed: {reply.get_return_code()}")
        result = FLModelUtils.from_shareable(reply)
        params = result.params
        if method == "scaffold":  # what the server sends back: c = Σ Δc_i / N
            delta = result.meta[AlgorithmConstants.SCAFFOLD_CTRL_DIFF]
            meta[AlgorithmConstants.SCAFFOLD_CTRL_GLOBAL] = apply_control_deltas({}, [delta], num_sites)
    return {"rss_after_imports_mb": after_imports, "rss_after_setup_mb": after_setup}


def measure_solo(arch: str, dataset: str, data_root: str, num_sites: int) -> dict:
    import itertools

    import torch

    from nvflare_moon.core.training import evaluate
    from nvflare_moon.data import (
        NUM_CLASSES,
        TensorBatchLoader,
        load_dataset,
        site_train_arrays,
        test_transform,
        train_transform,
    )
    from nvflare_moon.models import Network
    from nvflare_moon.solo import EVAL_BATCH_SIZE, train_solo_site

    after_imports = rss_mb()
    splits = load_dataset(dataset, data_root, download=False)
    shard = site_train_arrays(splits, "site-1", num_sites, "iid")
    batches = TensorBatchLoader(shard, BATCH, train_transform(dataset), shuffle=True, drop_last=True, seed=0)
    model = Network(arch=arch, num_classes=NUM_CLASSES[dataset])
    after_setup = rss_mb()
    cpu = torch.device("cpu")
    train_solo_site(model, batches, 2, 0.01, 0.9, 1e-5, cpu)
    test = TensorBatchLoader(splits.test, EVAL_BATCH_SIZE, test_transform(dataset), shuffle=False, drop_last=False)
    evaluate(model, itertools.islice(test, 1), cpu)
    return {"rss_after_imports_mb": after_imports, "rss_after_setup_mb": after_setup}


def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    if args.method == "solo":
        figures = measure_solo(args.arch, args.dataset, args.data_root, args.num_sites)
    else:
        figures = measure_federated(args.method, args.arch, args.dataset, args.data_root, args.num_sites, args.run_dir)
    figures.update(peak_rss_mb=peak_rss_mb(), seconds=time.perf_counter() - started)
    print("RESULT " + json.dumps(figures))


# ---- the driver ----------------------------------------------------------------------------------------------------


def write_cifar_stand_in(dataset: str, root: str) -> None:
    """Random images in CIFAR's python-pickle layout, with the real split sizes and number of classes."""
    rng = np.random.default_rng(0)
    if dataset == "cifar10":
        folder, label_key, k = os.path.join(root, "cifar-10-batches-py"), "labels", 10
        files = {f"data_batch_{i}": 10000 for i in range(1, 6)} | {"test_batch": 10000}
        meta = ("batches.meta", {"label_names": [f"class_{i}" for i in range(k)]})
    else:
        folder, label_key, k = os.path.join(root, "cifar-100-python"), "fine_labels", 100
        files = {"train": 50000, "test": 10000}
        meta = ("meta", {"fine_label_names": [f"class_{i}" for i in range(k)]})
    os.makedirs(folder, exist_ok=True)
    for name, count in files.items():
        images = rng.integers(0, 256, (count, 3072), dtype=np.uint8)
        batch = {"data": images, label_key: rng.integers(0, k, count).tolist()}
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(batch, f)
    with open(os.path.join(folder, meta[0]), "wb") as f:
        pickle.dump(meta[1], f)


def resolve_dataset(dataset: str, data_root: str, scratch: str) -> tuple:
    """(data_root, whether it is a random stand-in) for ``dataset``."""
    from nvflare_moon.data import DatasetNotFoundError, load_dataset

    try:
        load_dataset(dataset, data_root, download=False)
        return data_root, False
    except DatasetNotFoundError:
        write_cifar_stand_in(dataset, scratch)
        return scratch, True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default=None, help="folder with the CIFAR folders (default: $NVFLARE_MOON_DATA)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--archs", default=",".join(ARCH_DATASET))
    parser.add_argument("--steps", type=int, default=2, help="batches per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="measure every (method, network) pair this many times")
    parser.add_argument(
        "--json", help="also write a record to this file: the command, date, commit, machine load and the figures"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--arch", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--num-sites", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    from nvflare_moon.benchmark.runner import RecordHeader  # here: the children measure imports
    from nvflare_moon.core.files import write_json_atomic

    archs, methods = args.archs.split(","), args.methods.split(",")
    header = RecordHeader("benchmarks/memory.py")
    started = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix="nvflare_moon_memory_")
    rows = []
    try:
        data = {}  # arch -> (data root, whether it is a random stand-in)
        for arch in archs:
            data[arch] = resolve_dataset(ARCH_DATASET[arch], args.data_root, os.path.join(scratch, "data"))
        for repeat in range(1, args.repeats + 1):
            for arch in archs:
                dataset = ARCH_DATASET[arch]
                data_root, stand_in = data[arch]
                num_train = 50000  # CIFAR-10 and CIFAR-100 alike
                num_sites = num_train // (args.steps * BATCH)
                for method in methods:
                    run_dir = tempfile.mkdtemp(dir=scratch)
                    cmd = [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--child",
                        "--method",
                        method,
                        "--arch",
                        arch,
                        "--dataset",
                        dataset,
                        "--num-sites",
                        str(num_sites),
                        "--run-dir",
                        run_dir,
                        "--threads",
                        str(args.threads),
                    ] + (["--data-root", data_root] if data_root else [])
                    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                    if done.returncode != 0 or not lines:
                        raise RuntimeError(f"{method}/{arch} failed:\n{done.stdout[-3000:]}")
                    row = dict(
                        method=method,
                        arch=arch,
                        dataset=dataset + (" (random stand-in)" if stand_in else ""),
                        repeat=repeat,
                    )
                    row.update(json.loads(lines[-1][len("RESULT ") :]))
                    rows.append(row)
                    print(
                        f"repeat {repeat}: {method:<9}{arch:<11} peak {row['peak_rss_mb']:7.0f} MB "
                        f"({row['seconds']:.0f} s)",
                        flush=True,
                    )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def per_pair(key: str) -> dict:
        """arch -> method -> the repeats' values of ``key``, in order."""
        return {a: {m: [r[key] for r in rows if (r["arch"], r["method"]) == (a, m)] for m in methods} for a in archs}

    peaks, imports, setups = per_pair("peak_rss_mb"), per_pair("rss_after_imports_mb"), per_pair("rss_after_setup_mb")
    median = {a: {m: float(np.median(v)) for m, v in by.items()} for a, by in peaks.items()}

    print(f"\nPeak RSS per client process, batch {BATCH}, {args.threads} threads, median of {args.repeats} repeat(s)")
    print(
        "(MiB; 'imports' = torch, NVFlare; 'setup' = imports + whole dataset + network, and torchvision for ResNet-50)"
    )
    print(
        f"{'method':<10}{'network':<12}{'dataset':<30}{'imports':>9}{'setup':>9}{'peak':>9}{'vs FedAvg':>11}"
        f"{'repeats':>24}"
    )
    for a in archs:
        dataset = ARCH_DATASET[a] + (" (random stand-in)" if data[a][1] else "")
        for m in methods:
            ratio = f"{median[a][m] / median[a]['fedavg']:.2f}x" if "fedavg" in methods else "-"
            each = " ".join(f"{p:.0f}" for p in peaks[a][m])
            print(
                f"{m:<10}{a:<12}{dataset:<30}{np.median(imports[a][m]):>9.0f}{np.median(setups[a][m]):>9.0f}"
                f"{median[a][m]:>9.0f}{ratio:>11}{each:>24}"
            )
    if args.json:
        record = {
            **header.fields(),
            "seconds": time.perf_counter() - started,
            "batch_size": BATCH,
            "threads": args.threads,
            "steps": args.steps,
            "repeats": args.repeats,
            "datasets": {a: ARCH_DATASET[a] + (" (random stand-in)" if data[a][1] else "") for a in archs},
            "peak_rss_mb": median,
            "peak_rss_mb_min": {a: {m: min(v) for m, v in by.items()} for a, by in peaks.items()},
            "peak_rss_mb_max": {a: {m: max(v) for m, v in by.items()} for a, by in peaks.items()},
            "rss_after_imports_mb": {a: {m: float(np.median(v)) for m, v in by.items()} for a, by in imports.items()},
            "rss_after_setup_mb": {a: {m: float(np.median(v)) for m, v in by.items()} for a, by in setups.items()},
            "peak_rss_mb_per_repeat": peaks,
            "rows": rows,
        }
        write_json_atomic(args.json, record)


if __name__ == "__main__":
    main()
