"""FedSiam-DA's settings and one FedSiam-DA round on a site, shared by
:class:`~nvflare_moon.executors.FedSiamDAExecutor` and :class:`~nvflare_moon.client.PTFedSiamDAHelper`.

A round: :meth:`FedSiamDARound.start` loads the site's previous upload as the history model and builds
:class:`~.objectives.FedSiamDAObjective` with its trainable working copy of the received global model;
:meth:`~FedSiamDARound.before_epoch` takes the epoch history snapshot; :meth:`~FedSiamDARound.after_step` steps the
working copy after every optimizer step; :meth:`~FedSiamDARound.finish` stores the upload (the next round's history
model) and discards the working copy.
"""

import dataclasses
import logging
from typing import Any, Callable, Dict, Mapping, Optional

import torch
import torch.nn as nn

from .objectives import HISTORY_BRANCHES, HISTORY_CHOICES, FedSiamDAObjective, predictor_of, projection_of
from .previous_uploads import StoredUploads
from .settings import settings_from_meta, settings_to_meta
from .validation import check_choice, check_number

logger = logging.getLogger(__name__)

FEDSIAM_DA_META_PREFIX = "fedsiam_da_"


@dataclasses.dataclass(frozen=True)
class FedSiamDASettings:
    """FedSiam-DA's settings, checked.

    Args:
        mu: μ ≥ 0 (not published; default 0.01, the best of a sweep on CIFAR-10: docs/fedssc_fedsiam.md).
        history: the frozen history model z_h: ``"epoch"`` the local model at the end of the previous local epoch (in
            the first epoch the previous round's upload); ``"round"`` the previous round's upload throughout.
        history_branch: what the history term compares with z_h: ``"projection"`` z_l, or ``"predictor"`` p_l.
    """

    # what an exported job shows even where it equals the default: the papers' settings
    _always_serialize_args = ("mu", "history", "history_branch")

    mu: float = 0.01
    history: str = "epoch"
    history_branch: str = "projection"

    def __post_init__(self):
        check_number("mu", self.mu, low=0)
        check_choice("history", self.history, HISTORY_CHOICES)
        check_choice("history_branch", self.history_branch, HISTORY_BRANCHES)

    def to_meta(self) -> Dict[str, Any]:
        """The settings as ``FLModel.meta`` entries: ``fedsiam_da_mu``, ..."""
        return settings_to_meta(self, FEDSIAM_DA_META_PREFIX)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], recipe: str = "FedSiamDAScriptRecipe") -> "FedSiamDASettings":
        """The settings a recipe sent in ``meta`` (see :func:`~.settings.settings_from_meta`)."""
        required = ("mu", "history", "history_branch")
        return settings_from_meta(cls, meta, FEDSIAM_DA_META_PREFIX, required, recipe)


class FedSiamDARound:
    """One FedSiam-DA round on one site.

    Args:
        settings: the method's settings.
        network: the local network with its SimSiam predictor, holding the round's global weights at :meth:`start`.
        uploads: the site's stored uploads (the previous one is the history model).
        site: the site's name, for logs.
        make_optimizer: builds the working copy's optimizer like the local one, ``(model) -> optimizer``.
        representation: z of a model on a batch (default: a ProjectionModel's projection).
        predictor: p of a model's z (default: ``model.predictor(z)``).
    """

    keeps_local_model = True

    def __init__(
        self,
        settings: FedSiamDASettings,
        network: nn.Module,
        uploads: StoredUploads,
        site: str,
        make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
        representation=projection_of,
        predictor=predictor_of,
    ):
        self.settings = settings
        self.network = network
        self.uploads = uploads
        self.site = site
        self.make_optimizer = make_optimizer
        self.representation = representation
        self.predictor = predictor
        self.objective: Optional[FedSiamDAObjective] = None

    def start(self, round_number: int, meta: Optional[Mapping[str, Any]] = None) -> FedSiamDAObjective:
        """The round's objective; ``meta`` is not read (FedSiam-DA needs nothing from the server beside the weights)."""
        settings = self.settings
        without = "the history term" + (" in the first epoch" if settings.history == "epoch" else "")
        previous = self.uploads.start(round_number, self.network, 1, without=without)
        if not previous:
            logger.info(f"{self.site}: round {round_number}: no previous upload yet, training without {without}")
        self.objective = FedSiamDAObjective(
            self.network,
            previous[-1] if previous else None,
            settings.mu,
            make_optimizer=self.make_optimizer,
            history=settings.history,
            history_branch=settings.history_branch,
            representation=self.representation,
            predictor=self.predictor,
        )
        return self.objective

    def before_epoch(self, epoch: int) -> None:
        self.objective.start_epoch(epoch)

    def after_step(self) -> None:
        self.objective.step_working_global()

    def finish(self) -> Dict[str, Any]:
        """Store this round's model as the upload and discard the working global copy; nothing to send beside it."""
        self.uploads.save(self.network)
        self.objective = None
        return {}
