"""Step 1: prepare a POC workspace (one server, N sites and the admin users, all on this machine) with
``nvflare poc prepare``.

    python poc/prepare.py --sites 2 --workspace /tmp/nvflare/poc [--port 8002] [--he] [--force]

``--he`` adds NVFlare's HEBuilder (``nvflare poc prepare --he``): the server's kit gets ``server_context.tenseal``
(public), each site's ``client_context.tenseal`` (with the secret key), for jobs with ``encryption="ckks"``.

Idempotent: a workspace that already has these sites and this port is left alone (its job results too); one prepared
otherwise is recreated only with ``--force``. A running POC is never touched (stop it first: ``poc/stop.py``), nor a
folder that is not a POC workspace (NVFlare deletes the folder it prepares).
"""

import argparse
import os
import sys
import tempfile

import yaml

from poc_workspace import NVFLARE_DEFAULT_PORT, PocWorkspace, add_workspace_arg, fail, nvflare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workspace_arg(parser)
    parser.add_argument("-n", "--sites", type=int, default=2, help="number of sites, named site-1 ... (default 2)")
    parser.add_argument(
        "-p",
        "--port",
        type=int,
        default=NVFLARE_DEFAULT_PORT,
        help="the server's port on localhost, for the sites and the admin (default %(default)s)",
    )
    parser.add_argument("--he", action="store_true", help="provision the HE contexts for encrypted aggregation")
    parser.add_argument("--force", action="store_true", help="recreate the workspace even if it is already prepared")
    args = parser.parse_args()
    if args.sites < 1:
        fail(f"--sites must be at least 1, got {args.sites}")
    if not 0 < args.port < 65536:
        fail(f"--port must be a TCP port, got {args.port}")
    ws = PocWorkspace(args.workspace)
    wanted_sites = [f"site-{i + 1}" for i in range(args.sites)]

    if ws.live_pids():
        fail(
            f"a POC is running in {ws.root} ({', '.join(ws.live_pids())}); "
            f"stop it first: python poc/stop.py -w {ws.root}"
        )
    if os.path.isdir(ws.root) and os.listdir(ws.root) and ws.project() is None:
        fail(f"{ws.root} is not empty and not a POC workspace; NVFlare would delete it: choose a new folder")
    if ws.project() is None or args.force:
        prepare(ws, args.sites, args.port, args.he)
    elif ws.sites() != wanted_sites or ws.port() != args.port or ws.has_he() != args.he:
        fail(
            f"{ws.root} is prepared for {', '.join(ws.sites())} on port {ws.port()}{_he_note(ws.has_he())}; "
            "--force recreates it (deleting the job results in it)"
        )
    else:
        print(
            f"{ws.root} is already prepared with {', '.join(wanted_sites)} on port {args.port}{_he_note(args.he)}; "
            "nothing to do"
        )
    print(f"POC workspace: {ws.root}")
    print(f"  server:      localhost:{ws.port()}")
    print(f"  sites:       {', '.join(ws.sites())}")
    print(f"  admin kit:   {ws.admin_kit()}")
    print(f"Next: python poc/start.py -w {ws.root}")


def _he_note(he: bool) -> str:
    return " with HE contexts" if he else " without HE contexts"


def prepare(ws: PocWorkspace, num_sites: int, port: int, he: bool) -> None:
    """NVFlare's default POC project for ``num_sites`` sites (with its HE builder if ``he``); a second pass with its
    project file, which keeps that builder, sets the port."""
    print(f"preparing {ws.root} for {num_sites} sites (nvflare poc prepare) ...", flush=True)
    he_flag = ["--he"] if he else []
    if nvflare(["poc", "prepare", "-n", str(num_sites), *he_flag, "--force"], ws).returncode != 0:
        fail("nvflare poc prepare failed (see above)")
    if port == ws.port():
        return
    project = ws.project()
    for participant in project["participants"]:
        if participant["type"] == "server":
            participant["fed_learn_port"] = participant["admin_port"] = port
    # NVFlare refuses a project file inside the workspace it is about to recreate
    with tempfile.TemporaryDirectory() as scratch:
        project_file = os.path.join(scratch, "project.yml")
        with open(project_file, "w") as f:
            yaml.safe_dump(project, f, sort_keys=False)
        print(f"setting the server port to {port} (nvflare poc prepare -i) ...", flush=True)
        if nvflare(["poc", "prepare", "-i", project_file, "--force"], ws).returncode != 0:
            fail("nvflare poc prepare -i failed (see above)")


if __name__ == "__main__":
    sys.exit(main())
