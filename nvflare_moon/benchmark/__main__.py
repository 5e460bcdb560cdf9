"""``python -m nvflare_moon.benchmark``: the benchmark's runs (:mod:`.cli`), or ``verify-docs`` (:mod:`.verify_docs`),
which checks the docs' figures against the committed records and imports neither torch nor NVFlare."""

import sys

if sys.argv[1:2] == ["verify-docs"]:
    from .verify_docs import main

    sys.exit(main(sys.argv[2:]))

from .cli import main  # noqa: E402  (after the dispatch, so that verify-docs does not import torch)

sys.exit(main())
