"""FedSSC's settings and one FedSSC round on a site (MOON plus the InfoNCE against shared class prototypes), shared
by :class:`~nvflare_moon.executors.FedSSCExecutor` and :class:`~nvflare_moon.client.PTFedSSCHelper`.

A round: :meth:`FedSSCRound.start` reads the prototypes and their availability mask that came with the global model
(none in round 0: the prototype term is dropped and the loss is exactly MOON's) and returns
``CE + μ_moon·ℓ_moon + μ_glob·ℓ_glob`` (:class:`~.objectives.FedSSCObjective`), which keeps the per-class mean
projection over the training forward passes of the last local epoch; :meth:`FedSSCRound.finish` stores MOON's upload
and returns the class means and counts to send (:func:`~.prototypes.prepare_upload`: classes with fewer than
``min_class_count`` samples withheld, optional clipping and Gaussian noise).
"""

import dataclasses
import logging
from typing import Any, Dict, Mapping, Optional

import numpy as np
import torch

from .moon import MoonRound
from .objectives import FedSSCObjective
from .prototypes import CLASS_COUNTS, CLASS_MEANS, PROTOTYPES, prepare_upload, read_shared_prototypes
from .settings import settings_from_meta, settings_to_meta
from .validation import check_number

logger = logging.getLogger(__name__)

FEDSSC_META_PREFIX = "fedssc_"


@dataclasses.dataclass(frozen=True)
class FedSSCSettings:
    """FedSSC's own settings, beside MOON's (:class:`~.moon.MoonSettings`: μ_moon is its ``mu``, τ its
    ``temperature``, which the prototype term uses too).

    Args:
        mu_glob: μ_glob ≥ 0, the weight of the prototype term (paper: 1).
        min_class_count: classes seen fewer times in the last local epoch are not uploaded (mean and count sent as 0).
        prototype_clip_norm: when set (> 0), each uploaded mean is scaled to L2 norm ≤ this value before the noise.
        prototype_noise_std: σ ≥ 0 of the Gaussian noise added to every entry of each uploaded mean (0: off).
    """

    # what an exported job shows even where it equals the default: the papers' settings
    _always_serialize_args = ("mu_glob", "min_class_count", "prototype_clip_norm", "prototype_noise_std")

    mu_glob: float = 1.0
    min_class_count: int = 10
    prototype_clip_norm: Optional[float] = None
    prototype_noise_std: float = 0.0

    def __post_init__(self):
        check_number("mu_glob", self.mu_glob, low=0)
        check_number("min_class_count", self.min_class_count, low=1, integer=True)
        if self.prototype_clip_norm is not None:
            check_number("prototype_clip_norm", self.prototype_clip_norm, low=0, low_inclusive=False)
        check_number("prototype_noise_std", self.prototype_noise_std, low=0)

    def to_meta(self) -> Dict[str, Any]:
        """The settings as ``FLModel.meta`` entries: ``fedssc_mu_glob``, ..."""
        return settings_to_meta(self, FEDSSC_META_PREFIX)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], recipe: str = "FedSSCScriptRecipe") -> "FedSSCSettings":
        """The settings a recipe sent in ``meta`` (see :func:`~.settings.settings_from_meta`)."""
        return settings_from_meta(cls, meta, FEDSSC_META_PREFIX, ("mu_glob", "min_class_count"), recipe)


class FedSSCRound:
    """One FedSSC round on one site: a :class:`~.moon.MoonRound` plus the shared prototypes and the class means.

    Args:
        moon: the round's MOON part.
        settings: FedSSC's own settings.
        num_classes: K.
        prototype_dim: D, the size of z that the prototypes must have; None: whatever the server sent.
        last_epoch: the epoch (0-based) from which the class means are recorded, the paper's last local epoch; None:
            from the round's start, until :meth:`record_class_means` restarts them.
    """

    def __init__(
        self,
        moon: MoonRound,
        settings: FedSSCSettings,
        num_classes: int,
        prototype_dim: Optional[int] = None,
        last_epoch: Optional[int] = None,
    ):
        self.moon = moon
        self.settings = settings
        self.num_classes = num_classes
        self.prototype_dim = prototype_dim
        self.last_epoch = last_epoch
        self.objective: Optional[FedSSCObjective] = None
        self.round_number: Optional[int] = None

    @property
    def keeps_local_model(self) -> bool:
        return self.moon.keeps_local_model

    @property
    def uploads(self):
        """MOON's stored uploads, which hold the trained model when :attr:`keeps_local_model`."""
        return self.moon.uploads

    def start(self, round_number: int, meta: Optional[Mapping[str, Any]] = None) -> FedSSCObjective:
        """The round's objective, with the prototypes the server sent in ``meta`` (none: MOON's)."""
        self.round_number = round_number
        shared = self._shared_prototypes(round_number, meta or {})
        prototypes = available = None
        if shared is not None:
            device = next(self.moon.network.parameters()).device
            prototypes, available = (torch.as_tensor(a, device=device) for a in shared)
            self.prototype_dim = prototypes.shape[1]
        temperature = self.moon.settings.temperature
        moon = self.moon.start(round_number)
        self.objective = FedSSCObjective(
            moon, prototypes, available, self.settings.mu_glob, temperature, self.num_classes
        )
        if self.last_epoch is None:
            self.objective.record_class_means()
        return self.objective

    def _shared_prototypes(self, round_number: int, meta: Mapping[str, Any]):
        where = f"{self.moon.site}: round {round_number}"
        try:
            dim = self.prototype_dim
            if dim is None:
                dim = np.shape(meta[PROTOTYPES])[-1] if PROTOTYPES in meta else 0
            shared = read_shared_prototypes(meta, self.num_classes, dim, self.moon.site)
        except (ValueError, IndexError) as e:
            logger.warning(f"{where}: {e}; training this round without the prototype term")
            return None
        if shared is None:
            logger.info(f"{where}: no shared prototypes yet, the prototype term is dropped")
        else:
            logger.info(f"{where}: received prototypes for {int(shared[1].sum())} of {self.num_classes} classes")
        return shared

    def record_class_means(self) -> None:
        """Restart the per-class means from now on."""
        self.objective.record_class_means()

    def before_epoch(self, epoch: int) -> None:
        if epoch == self.last_epoch:
            self.objective.record_class_means()

    def after_step(self) -> None:
        """FedSSC does nothing between steps."""

    def class_upload(self) -> Dict[str, np.ndarray]:
        """The class means and counts to send (classes below ``min_class_count`` withheld, clipped and noised)."""
        if self.objective.class_means is None or self.objective.class_means.empty:
            raise RuntimeError("no batch went through FedSSC's loss this round: no class means to send")
        settings = self.settings
        means, counts = prepare_upload(
            *self.objective.class_means.result(),
            settings.min_class_count,
            settings.prototype_clip_norm,
            settings.prototype_noise_std,
        )
        logger.info(
            f"{self.moon.site}: round {self.round_number}: uploading the mean projection of {int((counts > 0).sum())} classes "
            f"(counts {counts.tolist()})"
        )
        return {CLASS_MEANS: means, CLASS_COUNTS: counts}

    def finish(self) -> Dict[str, Any]:
        """Store MOON's upload; the class means and counts to send beside the weights."""
        return {**self.moon.finish(), **self.class_upload()}
