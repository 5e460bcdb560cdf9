"""Partial participation: which sites train in a round.

Each round, ``round(N·fraction)`` of the N sites are drawn uniformly at random without replacement. The draw is a
function of (seed, round) alone, so a job gives the same sites per round however often the server restarts, and the
same seed gives the same schedule in every run. The server then averages over the sampled sites only
(:func:`nvflare_moon.core.aggregation.normalized_weights` over the sites that answered).
"""

import re
from typing import List, Sequence

import numpy as np

from .validation import check_number


def natural_order(name: str) -> list:
    """Sort key that orders numbers by value: ``site-2`` before ``site-10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def check_sample_fraction(fraction: float) -> None:
    check_number("sample_fraction", fraction, low=0, low_inclusive=False)
    if fraction > 1:
        raise ValueError(f"sample_fraction must be <= 1, got {fraction!r}")


def sites_per_round(num_sites: int, fraction: float) -> int:
    """``round(N·fraction)``; raises ValueError, naming ``sample_fraction``, outside (0, 1] or when it is 0 sites."""
    check_sample_fraction(fraction)
    count = round(num_sites * fraction)
    if count < 1:
        raise ValueError(
            f"sample_fraction={fraction!r} of {num_sites} sites selects no site; use at least {1 / num_sites:.3g}"
        )
    return count


def sample_sites(sites: Sequence[str], fraction: float, seed: int, round_number: int) -> List[str]:
    """The sites that train in ``round_number``, in natural order (``site-2`` before ``site-10``).

    Args:
        sites: every site name, in any order (the draw depends on the names, not on the order given).
        fraction: share of the sites per round, in (0, 1].
        seed: the job's seed.
        round_number: the round, from 0.
    """
    ordered = sorted(sites, key=natural_order)
    count = sites_per_round(len(ordered), fraction)
    rng = np.random.default_rng([seed, round_number])
    chosen = rng.choice(len(ordered), size=count, replace=False)
    return [ordered[i] for i in sorted(chosen)]
