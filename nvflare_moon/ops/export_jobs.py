"""Write the committed job folders in ``jobs/`` from the recipes, so that the two cannot drift apart.

    python -m nvflare_moon.ops.export_jobs [DEST]        # DEST defaults to ./jobs

A test exports into a temporary folder and compares it with ``jobs/`` file by file.
"""

import argparse
import os
import shutil
import tempfile
from typing import Callable, Dict

from nvflare.recipe.spec import Recipe

from ..recipes import FedAvgBaselineRecipe, FedProxRecipe, FedSiamDARecipe, FedSSCRecipe, MoonRecipe, ScaffoldRecipe

# job folder name -> the recipe with the papers' settings for it
JOBS: Dict[str, Callable[[], Recipe]] = {
    "moon_cifar10": lambda: MoonRecipe(name="moon_cifar10"),
    "fedavg_cifar10": lambda: FedAvgBaselineRecipe(name="fedavg_cifar10"),
    "fedprox_cifar10": lambda: FedProxRecipe(name="fedprox_cifar10", mu=0.01),
    "scaffold_cifar10": lambda: ScaffoldRecipe(name="scaffold_cifar10"),
    "fedssc_cifar10": lambda: FedSSCRecipe(name="fedssc_cifar10", mu=5.0, mu_glob=1.0, temperature=0.5),
    "fedsiam_da_cifar10": lambda: FedSiamDARecipe(name="fedsiam_da_cifar10", mu=0.01, history="epoch"),
    "moon_cifar100": lambda: MoonRecipe(name="moon_cifar100", dataset="cifar100", arch="resnet50", mu=1.0),
    "fedavg_cifar100": lambda: FedAvgBaselineRecipe(name="fedavg_cifar100", dataset="cifar100", arch="resnet50"),
    "moon_tinyimagenet": lambda: MoonRecipe(
        name="moon_tinyimagenet", dataset="tinyimagenet", arch="resnet50", mu=1.0, num_rounds=20
    ),
    # the paper's scalability settings (CIFAR-100, μ = 10): 50 sites, all trained; 100 sites, 20% sampled per round
    "moon_cifar100_50sites": lambda: MoonRecipe(
        name="moon_cifar100_50sites", dataset="cifar100", arch="resnet50", mu=10.0, min_clients=50, num_rounds=200
    ),
    "moon_cifar100_100sites_sampled": lambda: MoonRecipe(
        name="moon_cifar100_100sites_sampled",
        dataset="cifar100",
        arch="resnet50",
        mu=10.0,
        min_clients=100,
        sample_fraction=0.2,
        num_rounds=500,
    ),
}


def export_all(dest: str) -> None:
    """Export every job in :data:`JOBS` to ``dest/<name>``, replacing what is there."""
    os.makedirs(dest, exist_ok=True)
    for name, make_recipe in JOBS.items():
        with tempfile.TemporaryDirectory() as scratch:
            make_recipe().export(scratch)
            target = os.path.join(dest, name)
            shutil.rmtree(target, ignore_errors=True)
            shutil.move(os.path.join(scratch, name), target)
        print(f"exported {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", nargs="?", default="jobs", help="folder to write the job folders into")
    export_all(parser.parse_args().dest)


if __name__ == "__main__":
    main()
