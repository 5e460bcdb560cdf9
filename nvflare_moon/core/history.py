"""Round-stamped history in a state payload, so that a round run twice reads what it read the first time.

A payload holds ``rounds`` plus lists of the same length, one entry per round the site trained (MOON's
``previous_models``, SCAFFOLD's ``local_controls``), and optionally ``needed``: how many of the latest entries before a
round that round reads. One more than needed is kept, for a round that is run twice (a continued job).
"""

from typing import Any, Dict, Mapping

HISTORY_ROUNDS = "rounds"
HISTORY_NEEDED = "needed"


def history_before(payload: Mapping[str, Any], round_number: int) -> Dict[str, Any]:
    """``payload`` cut to what round ``round_number`` reads: the entries of earlier rounds, the last ``needed`` of them
    (all earlier ones without ``needed``). A payload without ``rounds`` is returned unchanged.

    Example: ``{"rounds": [3, 4], "previous_models": [m3, m4], "needed": 1}`` before round 4 is
    ``{"rounds": [3], "previous_models": [m3], "needed": 1}``.
    """
    rounds = payload.get(HISTORY_ROUNDS)
    if not isinstance(rounds, list):
        return dict(payload)
    keep = [i for i, r in enumerate(rounds) if r < round_number]
    needed = payload.get(HISTORY_NEEDED)
    if isinstance(needed, int) and needed >= 0:
        keep = keep[len(keep) - needed :] if needed else []
    return {
        key: [value[i] for i in keep] if isinstance(value, list) and len(value) == len(rounds) else value
        for key, value in payload.items()
    }
