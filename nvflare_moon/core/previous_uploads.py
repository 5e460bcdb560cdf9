"""A site's previous uploads, kept between rounds: MOON's negatives and FedSiam-DA's history model.

The local models the site uploaded are kept, each with its round, in a state record (see :mod:`.state`) that is
reloaded at the start of every round and replaced at the end, so the method is the same algorithm whether the client
process lives for the whole job or is restarted for every task (NVFlare's simulator with ``-t < -n``). A site that
was not sampled in a round keeps its older uploads.

Round r uses the last ``keep`` uploads from rounds before r. One more is stored, because a round can run twice at a
site: when a job is continued after a failure (:mod:`nvflare_moon.ops.continuation`), or when a Client API script is restarted
after saving, a site may have trained and saved the round that the server never aggregated, and that upload must not
serve as its own previous model.

:class:`PreviousUploads` is the FIFO; :class:`StoredUploads` reads and writes it through a site's state store, for the
round objects (:class:`~.moon.MoonRound`, :class:`~.fedsiam_da.FedSiamDARound`) that executors and Client API helpers
share.
"""

import logging
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn as nn

from .history import HISTORY_ROUNDS
from .state import StateUnusable, tensor_signature
from .training import frozen_copy
from .validation import check_number

Upload = Tuple[int, Dict[str, torch.Tensor]]  # (round, state dict)

logger = logging.getLogger(__name__)


class PreviousUploads:
    """The FIFO of one site's uploads before the current round.

    Args:
        keep: m ≥ 1, how many of the latest earlier uploads a round uses.
    """

    def __init__(self, keep: int = 1):
        check_number("keep", keep, low=1, integer=True)
        self.keep = keep
        self.uploads: List[Upload] = []  # oldest first, all from rounds before the current one

    def restore(self, record: Optional[Mapping[str, Any]], round_number: int, network: nn.Module) -> List[int]:
        """Take the uploads from rounds before ``round_number`` out of a stored record (None: no record, no uploads).

        Returns:
            the rounds of the stored uploads that were ignored because they are not before ``round_number``.

        Raises:
            StateUnusable: the record lacks the uploads' rounds or its models do not fit ``network``; no upload is
                kept, so the round trains without the term that needs them.
        """
        self.uploads = []
        if record is None:
            return []
        payload = record.get("payload") or {}
        states, rounds = payload.get("previous_models"), payload.get(HISTORY_ROUNDS)
        expected = tensor_signature(network.state_dict())
        if (
            not isinstance(states, list)
            or not isinstance(rounds, list)
            or len(rounds) != len(states)
            or any(not isinstance(s, dict) or tensor_signature(s) != expected for s in states)
        ):
            raise StateUnusable(
                f"stored previous models (round {record.get('round')}) do not match this job's network or lack their "
                "rounds"
            )
        self.uploads = [(r, s) for r, s in zip(rounds, states) if r < round_number]
        return sorted(r for r in rounds if r >= round_number)

    def models(self, like: nn.Module) -> List[nn.Module]:
        """Frozen copies of ``like`` holding the last ``keep`` uploads, oldest first."""
        models = []
        for _, state in self.uploads[-self.keep :]:
            previous = frozen_copy(like)
            previous.load_state_dict(state)
            models.append(previous)
        return models

    def payload_after(self, round_number: int, uploaded: nn.Module) -> Dict[str, Any]:
        """The record payload to save once ``uploaded`` has been trained in ``round_number``: the last ``keep + 1``
        uploads, this one included."""
        state = {name: t.detach().cpu().clone() for name, t in uploaded.state_dict().items()}
        kept = (self.uploads + [(round_number, state)])[-(self.keep + 1) :]
        return {HISTORY_ROUNDS: [r for r, _ in kept], "previous_models": [s for _, s in kept]}


class StoredUploads:
    """The :class:`PreviousUploads` of one site, read from a state store at a round's start and written at its end.

    A stored file that does not fit the network is set aside (never deleted), and the round trains without the term
    that needs the uploads; the warning says which.

    Args:
        store: the site's store for this state (a :class:`~.state.SiteStateStore`, or anything with its ``load``,
            ``save`` and ``set_aside``, such as :class:`~.job_state.ContinuedStateStore`).
    """

    def __init__(self, store):
        self.store = store
        self.previous = PreviousUploads()
        self.round_number: Optional[int] = None

    def start(self, round_number: int, network: nn.Module, keep: int, without: str) -> List[nn.Module]:
        """Frozen copies of ``network`` holding the last ``keep`` uploads before ``round_number``, oldest first."""
        where = f"{self.store.site}: round {round_number}"
        self.previous = PreviousUploads(keep)
        self.round_number = round_number
        try:
            record = self.store.load()
            self.loaded(record, round_number)
            try:
                ignored = self.previous.restore(record, round_number, network)
            except StateUnusable as e:
                raise self.store.set_aside("other-network", str(e)) from e
        except StateUnusable as e:
            logger.warning(f"{where}: {e}; training this round without {without}")
            return []
        if ignored:
            logger.info(f"{where}: ignoring the stored uploads of rounds {ignored}, not before it")
        models = self.previous.models(network)
        rounds = [r for r, _ in self.previous.uploads[-keep:]]
        logger.info(f"{where}: previous local models from rounds {rounds}" if models else f"{where}: no previous model")
        return models

    def loaded(self, record: Optional[Mapping[str, Any]], round_number: int) -> None:
        """Called with the stored record (None: none) before ``round_number`` reads it; a subclass may check it."""

    def skip(self, round_number: int) -> None:
        """Start ``round_number`` without reading the uploads (a term that needs none); :meth:`save` keeps only its own."""
        self.previous = PreviousUploads()
        self.round_number = round_number

    def save(self, network: nn.Module) -> None:
        """Store ``network`` as this round's upload."""
        if self.round_number is None:
            raise RuntimeError("StoredUploads.save() was called before start()")
        self.store.save(self.round_number, self.previous.payload_after(self.round_number, network))

    def last_upload(self) -> Optional[Upload]:
        """``(round, state dict)`` of the last stored upload, or None.

        Raises:
            StateUnusable: see :meth:`~.state.SiteStateStore.load`.
        """
        record = self.store.load()
        payload = {} if record is None else record["payload"]
        uploads, rounds = payload.get("previous_models"), payload.get(HISTORY_ROUNDS)
        return (rounds[-1], uploads[-1]) if uploads and rounds else None
