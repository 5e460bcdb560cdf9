"""Let a locked-down site run nvflare-moon jobs that have no ``custom/`` folder: add the plugin to the site's
``class_allow_list`` in ``local/resources.json``.

    python deploy/allow_plugin.py <startup kit> [<startup kit> ...]
    # e.g. python deploy/allow_plugin.py workspace/moon_hospitals/prod_00/hospital-1

NVFlare 2.8+ builds a job without ``custom/`` only from classes on each site's ``class_allow_list``; the default
list has NVFlare's own classes only. This adds ``"nvflare_moon."`` (every class of the pip-installed plugin) and, on
the server, NVFlare's ``PTFileModelPersistor``, which our recipes use and the default list lacks. The first edit copies
NVFlare's ``resources.json.default`` to ``resources.json`` (the file a site owns; the ``.default`` is rewritten on
re-provisioning). Idempotent; takes effect with the next job, without a restart.
"""

import argparse
import json
import os
import sys
from typing import List

from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

PLUGIN_PREFIX = "nvflare_moon."
SERVER_ONLY = ["nvflare.app_opt.pt.file_model_persistor.PTFileModelPersistor"]


def allow(kit: str) -> List[str]:
    """Add the entries this kit's participant needs; the entries that were added."""
    local = os.path.join(kit, "local")
    target = os.path.join(local, "resources.json")
    source = target if os.path.isfile(target) else os.path.join(local, "resources.json.default")
    if not os.path.isfile(source):
        raise FileNotFoundError(f"{kit} is not a site or server startup kit: no {source}")
    with open(source) as f:
        resources = json.load(f)
    allowed = resources.setdefault("class_allow_list", list(DEFAULT_CLASS_ALLOW_LIST))
    is_server = os.path.isfile(os.path.join(kit, "startup", "fed_server.json"))
    added = [entry for entry in [PLUGIN_PREFIX] + (SERVER_ONLY if is_server else []) if entry not in allowed]
    if "*" in allowed or not added:
        return []
    allowed.extend(added)
    tmp = f"{target}.tmp"
    with open(tmp, "w") as f:
        json.dump(resources, f, indent=4)
    os.replace(tmp, target)  # a site reading it meanwhile sees the old or the new list, never half a file
    return added


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kits", nargs="+", help="startup kit folders of the server and the sites")
    for kit in parser.parse_args(argv).kits:
        added = allow(kit)
        target = os.path.join(kit, "local", "resources.json")
        print(f"{target}: added {added}" if added else f"{target}: already allows the plugin")


if __name__ == "__main__":
    sys.exit(main())
