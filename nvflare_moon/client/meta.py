"""What travels in ``FLModel.meta`` between the Client API recipes (:mod:`nvflare_moon.client_api_recipes`) and the
helpers (:mod:`nvflare_moon.client`). Every value is numpy or plain Python (a torch tensor there crashes the server).

Server → site, with every training model (the recipe's controller stamps them in):

======================================  ===========  ==================================================
key                                     method       value
======================================  ===========  ==================================================
``moon_mu``                             MOON, FedSSC μ (FedSSC: μ_moon), float ≥ 0
``moon_temperature``                    MOON, FedSSC τ, float > 0
``moon_num_previous_models``            MOON, FedSSC m, int ≥ 1
``moon_mu_off_rounds``                  MOON, FedSSC cold start: μ = 0 in the first K rounds, int ≥ 0 (absent: 0)
``moon_mu_ramp_rounds``                 MOON, FedSSC cold start: then μ rises over R rounds, int ≥ 0 (absent: 0)
``fedssc_mu_glob``                      FedSSC       μ_glob, float ≥ 0
``fedssc_min_class_count``              FedSSC       classes seen fewer times are not uploaded, int ≥ 1
``fedssc_prototype_clip_norm``          FedSSC       L2 clip of uploaded means, float > 0 or None
``fedssc_prototype_noise_std``          FedSSC       σ of the Gaussian noise on uploaded means, float ≥ 0
``prototypes``, ``prototype_available`` FedSSC       the shared [K, D] prototypes and [K] mask (round ≥ 1)
``fedsiam_da_mu``                       FedSiam-DA   μ, float ≥ 0
``fedsiam_da_history``                  FedSiam-DA   ``"epoch"`` or ``"round"``
``fedsiam_da_history_branch``           FedSiam-DA   ``"projection"`` or ``"predictor"``
======================================  ===========  ==================================================

Site → server, with the trained weights: ``num_samples`` (the FedAvg weight n_k, every method) and, for FedSSC,
``class_means`` [K, D] float32 and ``class_counts`` [K] int64.
"""

import math
from typing import Any, Mapping

from ..core.prototypes import CLASS_COUNTS, CLASS_MEANS, PROTOTYPE_AVAILABLE, PROTOTYPES  # noqa: F401 (re-exported)

NUM_SAMPLES = "num_samples"

MOON_MU = "moon_mu"
MOON_TEMPERATURE = "moon_temperature"
MOON_NUM_PREVIOUS_MODELS = "moon_num_previous_models"
MOON_MU_OFF_ROUNDS = "moon_mu_off_rounds"
MOON_MU_RAMP_ROUNDS = "moon_mu_ramp_rounds"
FEDSSC_MU_GLOB = "fedssc_mu_glob"
FEDSSC_MIN_CLASS_COUNT = "fedssc_min_class_count"
FEDSSC_PROTOTYPE_CLIP_NORM = "fedssc_prototype_clip_norm"
FEDSSC_PROTOTYPE_NOISE_STD = "fedssc_prototype_noise_std"
FEDSIAM_DA_MU = "fedsiam_da_mu"
FEDSIAM_DA_HISTORY = "fedsiam_da_history"
FEDSIAM_DA_HISTORY_BRANCH = "fedsiam_da_history_branch"


def read_setting(
    meta: Mapping[str, Any],
    key: str,
    recipe: str,
    *,
    low: float = None,
    low_inclusive: bool = True,
    integer: bool = False,
    optional: bool = False,
) -> Any:
    """``meta[key]``, checked. Raises ValueError, naming the key and the recipe that sends it, when it is missing
    (unless ``optional``: then None) or out of range."""
    if key not in meta or (optional and meta[key] is None):
        if optional:
            return None
        raise ValueError(
            f"the received model's meta has no {key!r}: run this script with {recipe}, which sends the method's "
            "settings with every training model"
        )
    value = meta[key]
    if hasattr(value, "item"):  # a numpy scalar
        value = value.item()
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if (
        isinstance(value, bool)
        or not ok
        or not math.isfinite(value)
        or (low is not None and (value < low or (value == low and not low_inclusive)))
    ):
        raise ValueError(f"the received meta[{key!r}] = {value!r} is not a valid setting (sent by {recipe})")
    return value
