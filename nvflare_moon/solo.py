"""SOLO, the MOON paper's lower baseline: every site trains alone on its own shard, with no federation.

    python -m nvflare_moon.solo --dataset cifar10 --num-sites 10 --epochs 300 --output solo_cifar10.json

SOLO has nothing to exchange, so it is a plain script rather than an NVFlare job: there is no server, no global model
and no round. It reuses exactly what the federated jobs use (the same partition of the training set into sites, the
same network and initial weights, the same batched augmentation, loss, optimiser settings and evaluation), so its
figures compare with theirs. Each site's model is trained for ``epochs`` epochs with one SGD optimiser (there are no
rounds to restart it at), then evaluated on the full test set. The report is every site's test accuracy and their
mean ± standard deviation (population std, ``ddof=0``).

The JSON report is rewritten after every site; running the same command again resumes after the last finished site.
"""

import argparse
import json
import os
import time
import zlib
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

from .core.files import write_json_atomic
from .core.objectives import CrossEntropyObjective
from .core.runtime import resolve_device
from .core.training import Batch, TrainResult, evaluate, sgd, train_local
from .core.validation import check_choice, check_number
from .data import (
    DATASETS,
    NUM_CLASSES,
    PARTITION_METHODS,
    DatasetSplits,
    ImageArrays,
    TensorBatchLoader,
    load_dataset,
    site_train_arrays,
    test_transform,
    train_transform,
)
from .models import BACKBONES, Network

EVAL_BATCH_SIZE = 500


def train_solo_site(
    model: nn.Module,
    batches: Iterable[Batch],
    epochs: int,
    lr: float,
    momentum: float,
    weight_decay: float,
    device: torch.device,
    log: Optional[Callable[[str], None]] = None,
) -> TrainResult:
    """One site's SOLO training: CE with one SGD optimiser for all ``epochs``."""
    return train_local(
        model, batches, CrossEntropyObjective(), sgd(model, lr, momentum, weight_decay), epochs, device, log=log
    )


def run_solo(
    dataset: str = "cifar10",
    num_sites: int = 10,
    epochs: int = 300,
    arch: str = "simple_cnn",
    out_dim: int = 256,
    partition: str = "dirichlet",
    beta: float = 0.5,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 0.01,
    momentum: float = 0.9,
    weight_decay: float = 1e-5,
    data_root: Optional[str] = None,
    download: bool = True,
    device: str = "auto",
    sites: Optional[Sequence[str]] = None,
    output: Optional[str] = None,
    log: Callable[[str], None] = print,
) -> Dict:
    """Train every site (or ``sites``) alone and return the report (see the module docstring).

    The arguments mean what they mean for the federated jobs (:class:`~nvflare_moon.recipes.FedAvgBaselineRecipe`);
    ``output`` is the JSON report, also used to resume.
    """
    settings = dict(
        dataset=dataset,
        num_sites=num_sites,
        epochs=epochs,
        arch=arch,
        out_dim=out_dim,
        partition=partition,
        beta=beta,
        seed=seed,
        batch_size=batch_size,
        lr=lr,
        momentum=momentum,
        weight_decay=weight_decay,
    )
    _check_settings(settings)
    sites = _chosen_sites(sites, num_sites)
    torch_device = resolve_device(device)
    results = _finished_sites(output, settings, log)
    splits = load_dataset(dataset, data_root, download)
    _train_missing_sites(sites, results, splits, settings, torch_device, output, log)
    report = _report(settings, {s: results[s] for s in sites})
    log(
        f"SOLO {dataset}, {len(sites)} sites, {epochs} epochs: test accuracy "
        f"{report['mean_test_accuracy']:.4f} ± {report['std_test_accuracy']:.4f} (mean ± std over sites)"
    )
    return report


def _check_settings(settings: Dict) -> None:
    """Raise ValueError, naming the setting, for the first setting out of its range."""
    check_choice("dataset", settings["dataset"], DATASETS)
    check_choice("arch", settings["arch"], BACKBONES)
    check_choice("partition", settings["partition"], PARTITION_METHODS)
    for name in ("num_sites", "epochs", "batch_size"):
        check_number(name, settings[name], low=1, integer=True)
    check_number("beta", settings["beta"], low=0, low_inclusive=False)
    check_number("seed", settings["seed"], low=0, integer=True)
    check_number("lr", settings["lr"], low=0, low_inclusive=False)
    check_number("momentum", settings["momentum"], low=0)
    check_number("weight_decay", settings["weight_decay"], low=0)


def _chosen_sites(sites: Optional[Sequence[str]], num_sites: int) -> List[str]:
    """``sites`` as a list (default: site-1 … site-N); raises ValueError for a site that is not among them."""
    all_sites = [f"site-{k}" for k in range(1, num_sites + 1)]
    chosen = list(all_sites if sites is None else sites)
    unknown = sorted(set(chosen) - set(all_sites))
    if unknown:
        raise ValueError(f"sites {unknown} are not among site-1 ... site-{num_sites}")
    return chosen


def _train_missing_sites(
    sites: List[str],
    results: Dict[str, Dict],
    splits: DatasetSplits,
    settings: Dict,
    device: torch.device,
    output: Optional[str],
    log: Callable[[str], None],
) -> None:
    """Train and test each of ``sites`` not yet in ``results``, adding its figures to ``results`` and rewriting the
    report in ``output`` (if given) after each site."""
    test_batches = TensorBatchLoader(
        splits.test, EVAL_BATCH_SIZE, test_transform(settings["dataset"]), shuffle=False, drop_last=False
    )
    for site in sites:
        if site in results:
            log(f"{site}: already in {output}, test accuracy {results[site]['test_accuracy']:.4f}")
            continue
        results[site] = _train_and_test_site(site, splits, test_batches, settings, device, log)
        if output:
            write_json_atomic(output, _report(settings, results))


def _train_and_test_site(
    site: str,
    splits: DatasetSplits,
    test_batches: TensorBatchLoader,
    settings: Dict,
    device: torch.device,
    log: Callable[[str], None],
) -> Dict:
    """Train ``site``'s model alone on its shard; returns its figures for the report (test accuracy and loss, ...)."""
    shard, batches = _site_batches(site, splits, settings, device)
    model = Network(
        arch=settings["arch"],
        num_classes=NUM_CLASSES[settings["dataset"]],
        out_dim=settings["out_dim"],
        seed=settings["seed"],
    ).to(device)
    epochs = settings["epochs"]
    log(f"{site}: {len(shard)} training samples, {len(batches)} batches/epoch, {epochs} epochs on {device}")
    started = time.perf_counter()
    trained = train_solo_site(
        model,
        batches,
        epochs,
        lr=settings["lr"],
        momentum=settings["momentum"],
        weight_decay=settings["weight_decay"],
        device=device,
        log=lambda msg: log(f"{site}: {msg}"),
    )
    test = evaluate(model, test_batches, device)
    figures = {
        "test_accuracy": test["accuracy"],
        "test_loss": test["loss"],
        "train_loss": trained.mean_terms.get("loss", float("nan")),
        "num_samples": len(shard),
        "seconds": time.perf_counter() - started,
    }
    log(f"{site}: test accuracy {test['accuracy']:.4f}, loss {test['loss']:.4f}")
    return figures


def _site_batches(
    site: str, splits: DatasetSplits, settings: Dict, device: torch.device
) -> Tuple[ImageArrays, TensorBatchLoader]:
    """``site``'s training shard and its shuffled, augmented batches, seeded by (seed, site) so a site alone gives the
    same result; raises ValueError if the shard is smaller than one batch."""
    shard = site_train_arrays(
        splits, site, settings["num_sites"], settings["partition"], settings["beta"], settings["seed"]
    )
    batch_size = settings["batch_size"]
    if len(shard) < batch_size:
        raise ValueError(f"{site} has {len(shard)} samples, fewer than batch_size={batch_size}")
    batches = TensorBatchLoader(
        shard,
        batch_size,
        train_transform(settings["dataset"]),
        shuffle=True,
        drop_last=True,
        seed=zlib.crc32(f"{settings['seed']}/{site}/solo".encode()),
        device=device if device.type == "cuda" else None,
    )
    return shard, batches


def _report(settings: Dict, results: Dict[str, Dict]) -> Dict:
    accuracies = np.array([r["test_accuracy"] for r in results.values()], dtype=np.float64)
    return {
        "method": "solo",
        "settings": settings,
        "sites": results,
        "mean_test_accuracy": float(accuracies.mean()) if len(accuracies) else float("nan"),
        "std_test_accuracy": float(accuracies.std()) if len(accuracies) else float("nan"),
    }


def _finished_sites(output: Optional[str], settings: Dict, log: Callable[[str], None]) -> Dict[str, Dict]:
    """Sites already in ``output`` from a run with the same settings; a report from other settings is not reused."""
    if not output or not os.path.exists(output):
        return {}
    with open(output) as f:
        previous = json.load(f)
    if previous.get("settings") != settings:
        raise ValueError(
            f"{output} holds a SOLO report with other settings ({previous.get('settings')}); "
            "choose another --output or delete it"
        )
    return dict(previous.get("sites", {}))


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="cifar10", choices=DATASETS)
    parser.add_argument("--num-sites", type=int, default=10, help="sites the training set is split over")
    parser.add_argument("--epochs", type=int, default=300, help="local epochs per site (the paper: 300)")
    parser.add_argument(
        "--arch",
        default=None,
        choices=sorted(BACKBONES),
        help="default: simple_cnn for cifar10/synthetic, resnet50 otherwise",
    )
    parser.add_argument("--out-dim", type=int, default=256)
    parser.add_argument("--partition", default="dirichlet", choices=PARTITION_METHODS)
    parser.add_argument("--beta", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=1e-5)
    parser.add_argument("--data-root", default=None, help="default: $NVFLARE_MOON_DATA or ~/.cache/nvflare_moon/data")
    parser.add_argument("--no-download", action="store_true", help="fail instead of downloading a missing dataset")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--sites", default=None, help="comma-separated subset, e.g. site-1,site-3 (default: all)")
    parser.add_argument("--output", default=None, help="JSON report (default: solo_<dataset>.json); resumes from it")
    args = parser.parse_args(argv)
    if args.num_threads is not None:
        check_number("num_threads", args.num_threads, low=1, integer=True)
        torch.set_num_threads(args.num_threads)
    arch = args.arch or ("simple_cnn" if args.dataset in ("cifar10", "synthetic") else "resnet50")
    return run_solo(
        dataset=args.dataset,
        num_sites=args.num_sites,
        epochs=args.epochs,
        arch=arch,
        out_dim=args.out_dim,
        partition=args.partition,
        beta=args.beta,
        seed=args.seed,
        batch_size=args.batch_size,
        lr=args.lr,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        data_root=args.data_root,
        download=not args.no_download,
        device=args.device,
        sites=args.sites.split(",") if args.sites else None,
        output=args.output or f"solo_{args.dataset}.json",
    )


if __name__ == "__main__":
    main()
