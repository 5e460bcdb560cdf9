"""``python -m nvflare_moon.resume --workspace WS``: continue a stopped simulator run from its last aggregated round,
with every site's state (:func:`nvflare_moon.ops.resume_point.main`). How a continuation is built, for the simulator
and for a federation: :mod:`nvflare_moon.ops.continuation`."""

import sys

from .ops.resume_point import main

if __name__ == "__main__":
    sys.exit(main())
