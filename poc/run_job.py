"""Step 3: run a job on the running POC as its admin: submit, wait, download the results, and show where the global
model, ``global_metrics.jsonl`` and the TensorBoard events are (FLARE API, through ``python -m nvflare_moon.ops.submit``).

    python poc/run_job.py jobs/moon_cifar10 --workspace /tmp/nvflare/poc --out results/ [--timeout 86400]
    python poc/run_job.py --resume FAILED_JOB_ID --workspace /tmp/nvflare/poc --out results/

Idempotent: running it again with the same job folder waits for, or just downloads, the job submitted the first time;
``--resubmit`` runs the folder once more. A job that did not complete is reported with the error lines of its logs,
and one lost to a server restart is reported as such. ``--resume`` continues a job that failed part-way (a site's
process died) from the round after the last one aggregated, with every site's state (``nvflare_moon.ops.continuation``). The same
by hand, with NVFlare's CLI:

    nvflare job submit -j jobs/moon_cifar10      # prints the job id
    nvflare job wait <job_id>
    nvflare job download <job_id> -o results/
"""

import argparse
import os
import sys

from nvflare_moon.ops import submit

from poc_workspace import PocWorkspace, add_workspace_arg, fail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job_dir", nargs="?", help="a job folder, e.g. jobs/moon_cifar10")
    parser.add_argument("--resume", metavar="JOB_ID", help="instead of a job folder: continue this failed job")
    add_workspace_arg(parser)
    parser.add_argument("-o", "--out", default="results", help="download into OUT/<job_id> (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=24 * 3600, help="seconds to wait for the job")
    parser.add_argument("--resubmit", action="store_true", help="submit again even if this folder ran already")
    args = parser.parse_args()
    ws = PocWorkspace(args.workspace)
    if ws.project() is None or not ws.live_pids():
        fail(f"no POC is running in {ws.root}; run python poc/prepare.py and python poc/start.py first")
    options = ["--startup-kit", ws.admin_kit(), "--download", args.out, "--timeout", str(args.timeout)]
    if args.resume:
        what = ["--resume", args.resume, "--work-dir", os.path.join(args.out, "continued_jobs")]
    else:
        what = [args.job_dir] if args.job_dir else []
    status = submit.main([*what, *options, *(["--resubmit"] if args.resubmit else [])])
    if status == 0:
        print(f"Finally: python poc/stop.py -w {ws.root}")
    return status


if __name__ == "__main__":
    sys.exit(main())
