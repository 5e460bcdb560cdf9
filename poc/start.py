"""Step 2: start the prepared POC (the server and every site, each as its own processes) with ``nvflare poc start``.

    python poc/start.py --workspace /tmp/nvflare/poc [--timeout 60]

Idempotent: a running POC is left alone. The sites run this interpreter, so they import the nvflare_moon installed
here, and they inherit this environment: set ``NVFLARE_MOON_DATA`` before starting to choose their data folder.
"""

import argparse
import importlib.util
import os
import sys

from poc_workspace import PocWorkspace, add_workspace_arg, fail, nvflare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workspace_arg(parser)
    parser.add_argument("--timeout", type=int, default=60, help="seconds to wait for the server and all sites")
    args = parser.parse_args()
    ws = PocWorkspace(args.workspace)
    if ws.project() is None:
        fail(f"{ws.root} is not a prepared POC workspace; run python poc/prepare.py -w {ws.root} first")
    check_plugin_importable()
    live = ws.live_pids()
    if live:
        print(f"the POC in {ws.root} is already running ({', '.join(live)}); nothing to do")
    else:
        print(f"starting the server and {', '.join(ws.sites())} (nvflare poc start) ...", flush=True)
        if nvflare(["poc", "start", "--timeout", str(args.timeout)], ws).returncode != 0:
            fail(f"nvflare poc start failed; see {ws.prod_dir()}/<participant>/poc_console.log")
    print(
        f"data folder of the sites: {os.environ.get('NVFLARE_MOON_DATA') or '~/.cache/nvflare_moon/data'} "
        "($NVFLARE_MOON_DATA, or data_root in the job)"
    )
    print(f"Next: python poc/run_job.py jobs/moon_cifar10 -w {ws.root} --out results/")


def check_plugin_importable() -> None:
    if importlib.util.find_spec("nvflare_moon") is None:
        fail(
            f"{sys.executable} cannot import nvflare_moon, so the sites could not either; "
            "pip install nvflare-moon (or pip install -e . in the repository) first"
        )


if __name__ == "__main__":
    sys.exit(main())
