"""What travels in ``FLModel.meta`` between the Client API recipes (:mod:`nvflare_moon.recipes`) and the
helpers (:mod:`nvflare_moon.client`). Every value is numpy or plain Python (a torch tensor there crashes the server).
The settings are written and read by their dataclasses (:class:`~nvflare_moon.core.moon.MoonSettings`,
:class:`~nvflare_moon.core.fedssc.FedSSCSettings`, :class:`~nvflare_moon.core.fedsiam_da.FedSiamDASettings`): each
key is the prefix plus the field's name.

Server → site, with every training model (the recipe's controller stamps them in):

======================================  ===========  ==================================================
key                                     method       value
======================================  ===========  ==================================================
``moon_mu``                             MOON, FedSSC μ (FedSSC: μ_moon), float ≥ 0
``moon_temperature``                    MOON, FedSSC τ, float > 0
``moon_num_previous_models``            MOON, FedSSC m, int ≥ 1
``moon_mu_off_rounds``                  MOON, FedSSC cold start: μ = 0 in the first K rounds, int ≥ 0 (absent: 0)
``moon_mu_ramp_rounds``                 MOON, FedSSC cold start: then μ rises over R rounds, int ≥ 0 (absent: 0)
``moon_representation_loss``            MOON, FedSSC ``"contrastive"``, ``"l2"`` or ``"l2_squared"`` (absent: contrastive)
``moon_feature_noise_std``              MOON, FedSSC σ of the noise before the projection head, float ≥ 0 (absent: 0)
``moon_light_history``                  MOON, FedSSC keep only the previous projection heads, bool (absent: False)
``fedssc_mu_glob``                      FedSSC       μ_glob, float ≥ 0
``fedssc_min_class_count``              FedSSC       classes seen fewer times are not uploaded, int ≥ 1
``fedssc_prototype_clip_norm``          FedSSC       L2 clip of uploaded means, float > 0 or None
``fedssc_prototype_noise_std``          FedSSC       σ of the Gaussian noise on uploaded means, float ≥ 0
``prototypes``, ``prototype_available`` FedSSC       the shared [K, D] prototypes and [K] mask (round ≥ 1)
``prototype_sources``                   FedSSC       [K] each prototype's site (``exclude_own_prototype``)
``alternate_prototypes``                FedSSC       [K, D] another site's, for the source (``exclude_own_prototype``)
``alternate_available``                 FedSSC       [K] mask of the alternates (``exclude_own_prototype``)
``fedsiam_da_mu``                       FedSiam-DA   μ, float ≥ 0
``fedsiam_da_history``                  FedSiam-DA   ``"epoch"`` or ``"round"``
``fedsiam_da_history_branch``           FedSiam-DA   ``"projection"`` or ``"predictor"``
======================================  ===========  ==================================================

Site → server, with the trained weights: ``num_samples`` (the FedAvg weight n_k, every method) and, for FedSSC,
``class_means`` [K, D] float32 and ``class_counts`` [K] int64.
"""

from ..core.aggregation import NUM_SAMPLES  # noqa: F401 (re-exported)
from ..core.prototypes import (  # noqa: F401 (re-exported)
    ALTERNATE_AVAILABLE,
    ALTERNATE_PROTOTYPES,
    CLASS_COUNTS,
    CLASS_MEANS,
    PROTOTYPE_AVAILABLE,
    PROTOTYPE_SOURCES,
    PROTOTYPES,
)

MOON_MU = "moon_mu"
MOON_TEMPERATURE = "moon_temperature"
MOON_NUM_PREVIOUS_MODELS = "moon_num_previous_models"
MOON_MU_OFF_ROUNDS = "moon_mu_off_rounds"
MOON_MU_RAMP_ROUNDS = "moon_mu_ramp_rounds"
MOON_REPRESENTATION_LOSS = "moon_representation_loss"
MOON_FEATURE_NOISE_STD = "moon_feature_noise_std"
MOON_LIGHT_HISTORY = "moon_light_history"
FEDSSC_MU_GLOB = "fedssc_mu_glob"
FEDSSC_MIN_CLASS_COUNT = "fedssc_min_class_count"
FEDSSC_PROTOTYPE_CLIP_NORM = "fedssc_prototype_clip_norm"
FEDSSC_PROTOTYPE_NOISE_STD = "fedssc_prototype_noise_std"
FEDSIAM_DA_MU = "fedsiam_da_mu"
FEDSIAM_DA_HISTORY = "fedsiam_da_history"
FEDSIAM_DA_HISTORY_BRANCH = "fedsiam_da_history_branch"
