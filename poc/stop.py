"""Step 4: stop the POC (``nvflare poc stop``) and wait until its processes are gone. The workspace and the job
results stay; ``poc/prepare.py --force`` or ``nvflare poc clean`` removes them.

    python poc/stop.py --workspace /tmp/nvflare/poc

Idempotent: a stopped POC is left alone. When NVFlare's orderly shutdown fails (it does in 2.9 after the server
restarted during a job: it tries to abort a job the new server does not run), each participant is stopped locally
(``nvflare poc stop -p <participant>``), which needs no server.
"""

import argparse
import sys

from poc_workspace import PocWorkspace, add_workspace_arg, fail, nvflare

STOP_TIMEOUT = 60  # seconds for the processes to exit once asked; NVFlare's restart loops look every 5 s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workspace_arg(parser)
    args = parser.parse_args()
    ws = PocWorkspace(args.workspace)
    if not ws.live_pids():
        print(f"no POC is running in {ws.root}; nothing to do")
        return
    print(f"stopping the POC in {ws.root} (nvflare poc stop) ...", flush=True)
    if nvflare(["poc", "stop"], ws).returncode != 0:
        running = [name for name in ws.services() if name in ws.live_pids()]
        print(f"orderly shutdown failed; stopping {', '.join(running)} locally ...", flush=True)
        nvflare(["poc", "stop", *(arg for name in running for arg in ("-p", name))], ws)
    left = ws.wait_until_stopped(STOP_TIMEOUT)
    if left:
        fail(f"still running after {STOP_TIMEOUT} s: {left} (participant: pids); stop them with kill <pid>")
    print(f"POC stopped; the workspace {ws.root} is kept")


if __name__ == "__main__":
    sys.exit(main())
