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

from ..methods import paper_jobs

# job folder name -> the recipe with the papers' settings for it, as each method registers them (nvflare_moon.methods)
JOBS: Dict[str, Callable[[], Recipe]] = paper_jobs()


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
