"""Run the Client API example with a recipe in NVFlare's simulator.

    python job.py --method moon --dataset synthetic --rounds 2 --sites 2 --threads 1 --workspace /tmp/ws
    python job.py --method fedavg ...              # the plain script (client.py) with NVFlare's FedAvgRecipe

``--threads`` below ``--sites`` makes NVFlare restart the script for every task; the helpers keep the previous models
in the job's run folder, so the algorithm is the same. ``--external-process`` runs the script as a subprocess.
Each site prints its round's mean loss terms (``contrastive``, ``prototype_contrastive``, ``siamese``, ``history``).
"""

import argparse
import os
import sys

from nvflare.app_opt.pt.recipes.fedavg import FedAvgRecipe
from nvflare.recipe import SimEnv

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvflare_moon.recipes import FedSiamDAScriptRecipe, FedSSCScriptRecipe, MoonScriptRecipe  # noqa: E402

from net import Net  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="moon", choices=["moon", "fedssc", "fedsiam_da", "fedavg"])
    parser.add_argument("--dataset", default="cifar10", choices=["cifar10", "synthetic"])
    parser.add_argument("--data_root", default="/tmp/nvflare/data")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sites", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="simulator workers (-t); default: --sites")
    parser.add_argument("--workspace", default="/tmp/nvflare/client_api")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--external-process", action="store_true", help="run the script as a subprocess")
    args = parser.parse_args()

    train_args = (
        f"--dataset {args.dataset} --data_root {args.data_root} --num_sites {args.sites} --epochs {args.epochs} "
        f"--seed {args.seed}"
    )
    common = dict(
        min_clients=args.sites,
        num_rounds=args.rounds,
        train_args=train_args,
        launch_external_process=args.external_process,
        command=f"{sys.executable} -u",  # the scripts import nvflare_moon: run them with this Python
    )
    if args.method == "moon":
        recipe = MoonScriptRecipe(
            name="moon_client_api",
            model=Net(),
            train_script=os.path.join(HERE, "client_moon.py"),
            mu=5.0,
            temperature=0.5,
            **common,
        )
    elif args.method == "fedssc":
        recipe = FedSSCScriptRecipe(
            name="fedssc_client_api",
            model=Net(),
            train_script=os.path.join(HERE, "client_fedssc.py"),
            num_classes=10,
            prototype_dim=84,
            mu=5.0,
            mu_glob=1.0,
            min_class_count=2,
            seed=args.seed,
            **common,
        )
    elif args.method == "fedsiam_da":
        recipe = FedSiamDAScriptRecipe(
            name="fedsiam_da_client_api",
            model=Net(with_predictor=True),
            train_script=os.path.join(HERE, "client_fedsiam_da.py"),
            mu=1.0,
            **common,
        )
    else:
        recipe = FedAvgRecipe(
            name="fedavg_client_api", model=Net(), train_script=os.path.join(HERE, "client.py"), **common
        )

    env = SimEnv(num_clients=args.sites, num_threads=args.threads or args.sites, workspace_root=args.workspace)
    run = recipe.execute(env)  # raises when the simulation fails, so a failed job exits non-zero
    print(f"job status: {run.get_status()}; results in {run.get_result()}")


if __name__ == "__main__":
    main()
