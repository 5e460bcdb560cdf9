"""DP-SGD inside a user's own Client API training script: every sample's gradient clipped, their sum noised, and the ε
the site has spent kept in the job's run folder on the site, as the executors do (``docs/differential_privacy.md``).

    dp = PTDPHelper(model, num_samples=len(train_set), batch_size=64, local_epochs=2, dp_target_epsilon=3.0)
    while flare.is_running():
        input_model = flare.receive()
        model.load_state_dict(input_model.params)
        if flare.is_train():
            moon.start_round(input_model)              # a method's helper first: its frozen models stay plain
            dp.start_round(input_model)                # σ for the job; per-sample gradients from here on
            for epoch in range(2):
                for x, y in loader:                    # DataLoader(train_set, 64, shuffle=True, drop_last=True)
                    optimizer.zero_grad()
                    loss = ...; loss.backward()
                    dp.privatize()                     # the clipped, noised mean gradient into every .grad
                    optimizer.step()
            figures = dp.finish_round()                # per-sample gradients off; {"dp_epsilon", "dp_delta"}
            moon.save_local_model()
            flare.send(flare.FLModel(params=model.state_dict(), metrics=figures, meta=moon.upload_meta(n)))

The round is :class:`~nvflare_moon.core.dp_training.SitePrivacy`, the object the executors train with.
"""

from typing import Dict, Optional

import torch.nn as nn

from ..core.dp import DPSettings, check_dp_network
from ..core.dp_training import DPSGD, LEDGER_STATE, SitePrivacy
from ..core.validation import check_module, check_number
from .common import site_identity
from .state import script_state_store


class PTDPHelper:
    """DP-SGD for a Client API script's model: :meth:`start_round` after a method's helper has started its round,
    :meth:`privatize` between ``loss.backward()`` and ``optimizer.step()`` for every batch, :meth:`finish_round` after
    training, whose figures (``dp_epsilon``, ``dp_delta``) go in the reply's metrics.

    A loss term that reads the weights alone and no sample (FedProx's proximal term) is not clipped nor noised: call
    its ``backward()`` after :meth:`privatize`, which replaces every gradient, so that its gradient adds to the
    privatised one. Batch statistics are not private: the model must have no BatchNorm.

    Args:
        model: the network being trained (any ``nn.Module`` without BatchNorm).
        num_samples: N, the site's training samples.
        batch_size: B, the size of every batch (load them with ``drop_last=True``): each step samples at q = B/N.
        local_epochs: epochs per round; with N and B, the steps of a round, from which σ is calibrated to
            ``dp_target_epsilon`` for the job's rounds (``input_model.total_rounds``).
        dp_noise_multiplier, dp_target_epsilon, dp_delta, dp_max_grad_norm: the fields of
            :class:`~nvflare_moon.core.dp.DPSettings`, as the executors take them: exactly one of σ and ε.
        state_dir, job_id, site: where the site's ledger is kept, as for :class:`~nvflare_moon.client.PTMoonHelper`.
    """

    STATE_NAME = LEDGER_STATE

    def __init__(
        self,
        model: nn.Module,
        num_samples: int,
        batch_size: int,
        local_epochs: int = 1,
        dp_noise_multiplier: Optional[float] = None,
        dp_target_epsilon: Optional[float] = None,
        dp_delta: float = DPSettings.delta,
        dp_max_grad_norm: float = DPSettings.max_grad_norm,
        state_dir: Optional[str] = None,
        job_id: Optional[str] = None,
        site: Optional[str] = None,
    ):
        check_module("model", model)
        check_number("batch_size", batch_size, low=1, integer=True)
        check_number("num_samples", num_samples, low=batch_size, integer=True)
        check_number("local_epochs", local_epochs, low=1, integer=True)
        self.settings = DPSettings.from_arguments(dp_noise_multiplier, dp_target_epsilon, dp_delta, dp_max_grad_norm)
        if self.settings is None:
            raise ValueError("PTDPHelper needs dp_noise_multiplier (σ) or dp_target_epsilon (ε)")
        check_dp_network(model)
        self.model = model
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.local_epochs = local_epochs
        self.state_dir = state_dir
        self.job_id = job_id
        self.site = site
        self._privacy: Optional[SitePrivacy] = None
        self._step: Optional[DPSGD] = None
        self._round_number = 0

    def start_round(self, input_model) -> None:
        """Start DP-SGD for a training round on the received ``input_model`` (an ``FLModel``): after a method's
        helper started its round (its frozen copies of the model are taken without the per-sample hooks).

        Raises:
            ValueError: the ledger of the ε spent cannot be read, or ``dp_target_epsilon`` without the job's rounds.
        """
        if self._step is not None:
            self._step.close()  # a round that was not finished: its steps were not sent, so they are not counted
        job_id, site = site_identity(self.job_id, self.site, type(self).__name__)
        store = script_state_store(self.STATE_NAME, job_id, site, self.state_dir)
        steps_per_round = self.local_epochs * (self.num_samples // self.batch_size)
        self._privacy = SitePrivacy(self.settings, store, site, self.num_samples, self.batch_size, steps_per_round)
        self._round_number = input_model.current_round or 0
        self._step = self._privacy.start_round(self.model, input_model.total_rounds)

    @property
    def noise_multiplier(self) -> Optional[float]:
        """σ of this job, once a round has started."""
        return None if self._step is None else self._step.noise_multiplier

    def privatize(self) -> None:
        """Replace every gradient by the privatised mean of the batch's per-sample gradients: after the batch's
        ``loss.backward()`` (one per batch), before ``optimizer.step()``.

        Raises:
            ValueError: the batch does not hold ``batch_size`` samples, which the accounting assumes.
        """
        step = self._started()
        sizes = {p.grad_sample.shape[0] for p in step.parameters if getattr(p, "grad_sample", None) is not None}
        if sizes and sizes != {self.batch_size}:
            raise ValueError(
                f"a batch of {sorted(sizes)} samples: DP-SGD's accounting assumes batches of batch_size="
                f"{self.batch_size}; load them with drop_last=True, one loss.backward() per privatize()"
            )
        step.privatize(self.batch_size)

    def finish_round(self) -> Dict[str, float]:
        """End the round: the per-sample hooks come off the model, its steps go in the site's ledger. Returns the
        figures to send in the reply's metrics: ``dp_epsilon`` (the ε spent in the job so far) and ``dp_delta``."""
        step = self._started()
        step.close()
        self._step = None
        return self._privacy.finish_round(self._round_number, step)

    def _started(self) -> DPSGD:
        if self._step is None:
            raise RuntimeError(f"call {type(self).__name__}.start_round(input_model) at the start of every round")
        return self._step
