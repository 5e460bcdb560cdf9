"""Put the plugin on a participant's ``class_allow_list``, so that jobs without ``custom/`` (``byoc=False``) run there.

NVFlare 2.8+ builds a job without ``custom/`` only from classes on the participant's ``class_allow_list``
(``local/resources.json``); the default list has NVFlare's own classes only, and refuses ours with
``ComponentNotAuthorized ... not in allow_list``. :func:`allow_plugin` adds ``"nvflare_moon."`` (every class of the
pip-installed plugin) and, on the server, NVFlare's ``PTFileModelPersistor``, which our recipes use and the default
list lacks. Our recipes do it for the simulator's workspace when a ``byoc=False`` recipe is executed in ``SimEnv``,
as each site's IT would have done:

    python -m nvflare_moon.ops.allow_list <startup kit> [<startup kit> ...]   # a site's or the server's, once
    python -m nvflare_moon.ops.allow_list --simulator <the -w folder>          # before `nvflare simulator JOB -w ...`

(``deploy/allow_plugin.py`` runs the same.) The first edit of a kit copies NVFlare's ``resources.json.default`` to
``resources.json``; the change takes effect with the next job, without a restart. The simulator keeps its ``-w``
folder's ``local/`` between runs, so a workspace needs it once.
"""

import argparse
import json
import os
import sys
from typing import List, Optional

from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

from ..core.files import write_json_atomic

PLUGIN_PREFIX = "nvflare_moon."
SERVER_ONLY = ["nvflare.app_opt.pt.file_model_persistor.PTFileModelPersistor"]
RESOURCES = (
    "resources.json"  # the file a participant owns; NVFlare's resources.json.default is rewritten on provisioning
)


def allow_plugin(local_dir: str, server: bool) -> List[str]:
    """Add the entries a participant needs to ``local_dir/resources.json`` (made from ``resources.json.default``, or
    from NVFlare's default list where neither exists); returns the entries added. Idempotent; the file is replaced
    whole, so a participant reading it meanwhile sees the old list or the new one."""
    target = os.path.join(local_dir, RESOURCES)
    source = target if os.path.isfile(target) else f"{target}.default"
    resources = {"format_version": 2}
    if os.path.isfile(source):
        with open(source) as f:
            resources = json.load(f)
    allowed = resources.setdefault("class_allow_list", list(DEFAULT_CLASS_ALLOW_LIST))
    added = [entry for entry in [PLUGIN_PREFIX] + (SERVER_ONLY if server else []) if entry not in allowed]
    if "*" in allowed or not added:
        return []
    allowed.extend(added)
    write_json_atomic(target, resources, indent=4)
    return added


def allow_kit(kit: str) -> List[str]:
    """:func:`allow_plugin` for a startup kit (the server's when it holds ``startup/fed_server.json``)."""
    local = os.path.join(kit, "local")
    if not any(os.path.isfile(os.path.join(local, name)) for name in (RESOURCES, f"{RESOURCES}.default")):
        raise FileNotFoundError(f"{kit} is not a site or server startup kit: no {local}/{RESOURCES}(.default)")
    return allow_plugin(local, server=os.path.isfile(os.path.join(kit, "startup", "fed_server.json")))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "folders",
        nargs="+",
        help="startup kits of the server and the sites (or, with --simulator, simulator workspaces)",
    )
    parser.add_argument("--simulator", action="store_true", help="the folders are `nvflare simulator -w` workspaces")
    args = parser.parse_args(argv)
    for folder in args.folders:
        added = allow_plugin(os.path.join(folder, "local"), server=True) if args.simulator else allow_kit(folder)
        target = os.path.join(folder, "local", RESOURCES)
        print(f"{target}: added {added}" if added else f"{target}: already allows the plugin")
    return 0


if __name__ == "__main__":
    sys.exit(main())
