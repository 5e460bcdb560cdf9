"""Does FedSiam-DA's dual aggregation narrow the spread of accuracy across sites? A short side-by-side run.

    NVFLARE_MOON_DATA=/path/with/cifar-10-batches-py python benchmarks/site_spread.py [--sites 5 --rounds 5] \
        [--json site_spread.json]

It runs FedAvg and FedSiam-DA (and any other recipe named with ``--methods``) on CIFAR-10 with the same partition,
seed and settings in the simulator, every site in its own process (``-t = -n``), and prints, for every round, how the
sites' local accuracy of the global model they received spreads (``spread`` in ``global_metrics.jsonl``: weighted
mean, worst site, std across sites), with the global test accuracy. Short runs are indicative only: run the
benchmark's protocols for figures to publish. ``--json PATH`` also writes a record: the command, date, commit, machine
load, the settings (each recipe's μ among them) and every round's ``global_metrics.jsonl`` line of each method.
"""

import argparse
import json
import os
import tempfile

from nvflare.recipe import SimEnv

from nvflare_moon.benchmark.runner import RecordHeader
from nvflare_moon.core.files import write_json_atomic
from nvflare_moon.recipes import FedAvgBaselineRecipe, FedSiamDARecipe, MoonRecipe

RECIPES = {"fedavg": FedAvgBaselineRecipe, "fedsiam_da": FedSiamDARecipe, "moon": MoonRecipe}


def make_recipe(method: str, args):
    return RECIPES[method](
        name=method,
        min_clients=args.sites,
        num_rounds=args.rounds,
        dataset="cifar10",
        beta=args.beta,
        local_epochs=args.local_epochs,
        seed=args.seed,
        device="cpu",
    )


def run(recipe, method: str, args, root: str) -> list:
    recipe.execute(SimEnv(num_clients=args.sites, num_threads=args.sites, workspace_root=root))
    path = os.path.join(root, method, "server", "simulate_job", "global_metrics.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["fedavg", "fedsiam_da"], choices=sorted(RECIPES))
    parser.add_argument("--sites", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--beta", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write a record to this file: the command, date, commit and every round")
    args = parser.parse_args()
    header = RecordHeader("benchmarks/site_spread.py")
    root = tempfile.mkdtemp(prefix="site_spread_")
    recipes = {method: make_recipe(method, args) for method in args.methods}
    rounds = {method: run(recipe, method, args, root) for method, recipe in recipes.items()}
    print("| method | round | test acc. % | local acc. of the global model: mean % | worst site % | std % |")
    print("|---|---|---|---|---|---|")
    for method, method_rounds in rounds.items():
        for r in method_rounds:
            s = r["spread"]["accuracy"]
            print(
                f"| {method} | {r['round']} | {100 * r['test_accuracy']:.2f} | {100 * s['mean']:.2f} | "
                f"{100 * s['worst']:.2f} ({s['worst_site']}) | {100 * s['std']:.2f} |"
            )
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        mus = {method: recipe.mu for method, recipe in recipes.items() if hasattr(recipe, "mu")}  # each default's
        write_json_atomic(args.json, {**header.fields(), "settings": {**settings, "mu": mus}, "rounds": rounds})


if __name__ == "__main__":
    main()
