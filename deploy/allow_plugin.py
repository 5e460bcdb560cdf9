"""Let a locked-down site run nvflare-moon jobs that have no ``custom/`` folder: add the plugin to the site's
``class_allow_list`` in ``local/resources.json``.

    python deploy/allow_plugin.py <startup kit> [<startup kit> ...]
    # e.g. python deploy/allow_plugin.py workspace/moon_hospitals/prod_00/hospital-1

The same as ``python -m nvflare_moon.ops.allow_list``: see :mod:`nvflare_moon.ops.allow_list`.
"""

import sys

from nvflare_moon.ops.allow_list import main

if __name__ == "__main__":
    sys.exit(main())
