"""Local-training throughput per method, through the real data path, measured side by side in one process.

    python benchmarks/throughput.py [--data-root DIR] [--threads 2] [--steps 60] [--repeats 3] [--device cuda]
                                    [--arch simple_cnn|resnet50] [--methods fedavg,moon,moon_light_history]

For every method it times full optimizer steps (batched uint8 augmentation, forwards, backward, SGD) on site-1's
CIFAR-10 shard with the simple-CNN (or ResNet-50) and batch 64, and prints images/s and the cost relative to a FedAvg
step. The methods run interleaved, ``--repeats`` times, and the best round of each is kept, so that a noisy neighbour on the
machine does not bias one method. ``--synthetic-input`` skips data loading to show its share.

A MOON step is 3 forwards + 1 backward against FedAvg's 1 + 1: with a backward worth about two forwards, the floor
of the cost ratio is 5/3 ≈ 1.67; with the light history (previous projection heads only) it is 2 + 1 forwards of
which one is only a head, a floor near 4/3. FedSSC adds only a K×D prototype product to MOON; FedSiam-DA trains a
second model (the working global copy) and runs a history model: 2 + 1 forwards and 2 backwards, a floor of 7/3 ≈ 2.33. FedProx
and SCAFFOLD add per-step parameter arithmetic. SOLO's step is FedAvg's.
"""

import argparse
import itertools
import time
from typing import Callable, Dict, Tuple

import torch

from nvflare_moon.benchmark.runner import RecordHeader
from nvflare_moon.core.files import write_json_atomic
from nvflare_moon.core.objectives import (
    CrossEntropyObjective,
    FedProxObjective,
    FedSiamDAObjective,
    FedSSCObjective,
    LightHistoryMoonObjective,
    MoonObjective,
)
from nvflare_moon.core.runtime import resolve_device
from nvflare_moon.core.scaffold import ScaffoldRound
from nvflare_moon.core.training import frozen_copy, sgd, train_local
from nvflare_moon.data import TensorBatchLoader, load_dataset, site_train_arrays, train_transform
from nvflare_moon.models import Network, ProjectionHead

BATCH = 64


def fedavg_step(net: torch.nn.Module):
    return CrossEntropyObjective(), None


def fedprox_step(net: torch.nn.Module):
    return FedProxObjective(net, frozen_copy(net), mu=0.01), None


def scaffold_step(net: torch.nn.Module):
    return CrossEntropyObjective(), ScaffoldRound(net, lr=0.01).after_step


def device_of(net: torch.nn.Module) -> torch.device:
    return next(net.parameters()).device


def moon_step(net: torch.nn.Module):
    previous = frozen_copy(Network(seed=1, arch=net.arch).to(device_of(net)))
    return MoonObjective(frozen_copy(net), [previous], mu=5.0, temperature=0.5), None


def moon_light_history_step(net: torch.nn.Module):
    previous_head = frozen_copy(ProjectionHead(Network(seed=1, arch=net.arch).to(device_of(net))))
    return LightHistoryMoonObjective(frozen_copy(net), [previous_head], mu=5.0, temperature=0.5), None


def fedssc_step(net: torch.nn.Module):
    moon, _ = moon_step(net)
    objective = FedSSCObjective(
        moon,
        torch.randn(10, 256, device=device_of(net)),
        torch.ones(10, dtype=torch.bool, device=device_of(net)),
        mu_glob=1.0,
        temperature=0.5,
        num_classes=10,
    )
    objective.record_class_means()  # the last local epoch's per-class means, FedSSC's most expensive epoch
    return objective, None


def fedsiam_da_step(net: torch.nn.Module):
    history = frozen_copy(Network(seed=1, predictor_hidden_dim=64).to(device_of(net)))
    make_optimizer = lambda model: sgd(model, 0.01, 0.9, 1e-5)  # noqa: E731
    objective = FedSiamDAObjective(net, history, mu=1.0, make_optimizer=make_optimizer, history="epoch")
    return objective, objective.step_working_global


# method -> (network arguments, a builder of (objective, after_step) for a network holding the round's global weights).
# SOLO's step is FedAvg's.
METHODS: Dict[str, Tuple[dict, Callable]] = {
    "fedavg": ({}, fedavg_step),
    "fedprox": ({}, fedprox_step),
    "scaffold": ({}, scaffold_step),
    "moon": ({}, moon_step),
    "moon_light_history": ({}, moon_light_history_step),
    "fedssc": ({}, fedssc_step),
    "fedsiam_da": ({"predictor_hidden_dim": 64}, fedsiam_da_step),
}


def time_method(
    network_args: dict, make_step, batches, steps: int, device: torch.device, arch: str, clock: Callable[[], float]
) -> float:
    """Images per second of ``clock`` over ``steps`` optimizer steps (after 5 warm-up steps)."""
    net = Network(seed=0, arch=arch, **network_args).to(device)
    objective, after_step = make_step(net)
    optimizer = sgd(net, 0.01, 0.9, 1e-5)
    train_local(net, itertools.islice(batches(), 5), objective, optimizer, 1, device, after_step=after_step)
    synchronize(device)
    started = clock()
    train_local(net, itertools.islice(batches(), steps), objective, optimizer, 1, device, after_step=after_step)
    synchronize(device)
    return steps * BATCH / (clock() - started)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that the clock measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data-root", default=None, help="folder with cifar-10-batches-py/ (default: $NVFLARE_MOON_DATA)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, auto (the data and its augmentation go there too)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--arch", default="simple_cnn", choices=["simple_cnn", "resnet50"])
    parser.add_argument(
        "--clock",
        default="wall",
        choices=list(CLOCKS),
        help="wall: images per second; cpu: per CPU-second of this process, for a busy machine",
    )
    parser.add_argument("--synthetic-input", action="store_true", help="random tensors instead of the data path")
    parser.add_argument(
        "--json", help="also write a record to this file: the command, date, commit, machine load and the figures"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)

    if args.synthetic_input:
        fixed = [
            (torch.randn(BATCH, 3, 32, 32, device=device), torch.randint(0, 10, (BATCH,), device=device))
            for _ in range(8)
        ]

        def batches():
            return itertools.cycle(fixed)

        source = "random tensors (no data loading)"
    else:
        shard = site_train_arrays(load_dataset("cifar10", args.data_root), "site-1", num_sites=10)
        loader = TensorBatchLoader(
            shard, BATCH, train_transform("cifar10"), shuffle=True, drop_last=True, seed=0, device=device
        )

        def batches():
            return itertools.chain.from_iterable(itertools.repeat(loader))

        source = f"CIFAR-10 site-1 shard ({len(shard)} images), batched uint8 augmentation"

    methods = args.methods.split(",")
    header = RecordHeader("benchmarks/throughput.py")
    repeats = {m: [] for m in methods}
    for _ in range(args.repeats):
        for m in methods:
            repeats[m].append(time_method(*METHODS[m], batches, args.steps, device, args.arch, CLOCKS[args.clock]))
    best = {m: max(figures) for m, figures in repeats.items()}

    print(f"{args.arch}, batch {BATCH}, {args.clock} clock, device {device}, {args.threads} threads, input: {source}")
    print(f"{'method':<20}{'img/s':>10}{'cost vs FedAvg':>16}")
    for m in methods:
        print(f"{m:<20}{best[m]:>10.0f}{best['fedavg'] / best[m]:>15.2f}x")
    if args.json:
        record = {
            **header.fields(),
            "arch": args.arch,
            "clock": args.clock,
            "device": str(device),
            "threads": args.threads,
            "steps": args.steps,
            "input": source,
            "images_per_second": best,
            "images_per_second_per_repeat": repeats,
        }
        write_json_atomic(args.json, record)


if __name__ == "__main__":
    main()
