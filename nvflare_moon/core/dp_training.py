"""DP-SGD in local training: the step that privatises every gradient (:class:`DPSGD`), and a site's privacy through a
job (:class:`SitePrivacy`: the noise multiplier, and the ε spent, kept in the site's state so that it survives a
restarted process). Shared by the executors' loop and :class:`~nvflare_moon.client.PTDPHelper`; the math is in
:mod:`.dp`.

Only the trained network gets per-sample gradients: Opacus's ``GradSampleModule`` hooks its layers for the round, and
the objective's frozen models (MOON's global and previous ones) are copies made before, so they stay plain.
"""

import logging
import warnings
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn

from .dp import DPSettings, History, calibrated_noise_multiplier, epsilon_spent, noisy_sum, with_steps
from .state import StateUnusable
from .training import LossTerms, Objective

logger = logging.getLogger(__name__)

LEDGER_STATE = "dp_ledger"  # the state record of a site's DP-SGD history in the job


class DPSGD:
    """DP-SGD for one round of ``network``: per-sample gradients (Opacus's hooks on its layers, until :meth:`close`),
    each clipped to C, summed, with Gaussian noise of std σ·C, divided by the batch size (:func:`~.dp.noisy_sum`).

    Call it as :func:`~.training.train_local`'s ``step``, or, in a loop of one's own, call :meth:`privatize` between
    ``loss.backward()`` and ``optimizer.step()``. The noise comes from a generator seeded from the operating system's
    entropy, never from the job's seed, which is in the job's config: whoever knows a seed can take the noise out.

    Args:
        network: the network being trained (not the frozen models an objective holds).
        noise_multiplier: σ > 0.
        max_grad_norm: C > 0.
    """

    def __init__(self, network: nn.Module, noise_multiplier: float, max_grad_norm: float):
        from opacus import GradSampleModule

        self.parameters = [p for p in network.parameters() if p.requires_grad]
        self.noise_multiplier = noise_multiplier
        self.max_grad_norm = max_grad_norm
        self.generator = torch.Generator(device=self.parameters[0].device)
        self.generator.seed()
        self.hooks = GradSampleModule(network, loss_reduction="mean")  # g_i of each sample's own loss
        # The input takes no gradient, so torch warns that the first layer's hook fires without one: it needs none.
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
        self.steps = 0

    def __call__(
        self, model: nn.Module, objective: Objective, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
    ) -> Tuple[torch.Tensor, LossTerms]:
        """One DP-SGD step on the batch ``(x, y)``. The gradient of the objective's ``weight_terms`` (FedProx's
        proximal term), which read the weights and no sample, is added after the noise: it needs none."""
        loss, terms = objective(model(x), x, y)
        weight_terms = [terms[name] for name in getattr(objective, "weight_terms", ())]
        weight_grads = (
            torch.autograd.grad(sum(weight_terms), self.parameters, retain_graph=True, allow_unused=True)
            if weight_terms
            else ()
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.privatize(len(x))
        for p, g in zip(self.parameters, weight_grads):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g
        optimizer.step()
        return loss, terms

    def privatize(self, batch_size: int) -> None:
        """Replace every trained parameter's gradient by the privatised mean of the batch's per-sample gradients,
        ``noisy_sum / batch_size``, after ``loss.backward()``; the per-sample gradients are then dropped."""
        trained = [p for p in self.parameters if getattr(p, "grad_sample", None) is not None]
        if not trained:
            raise RuntimeError("no per-sample gradients: call DPSGD.privatize() after loss.backward() of a batch")
        sums = noisy_sum([p.grad_sample for p in trained], self.max_grad_norm, self.noise_multiplier, self.generator)
        for p, total in zip(trained, sums):
            p.grad = total / batch_size
            p.grad_sample = None
        self.steps += 1

    def close(self) -> None:
        """Take the per-sample hooks off the network (it is then as before, for evaluation and the next round)."""
        self.hooks._close()


class SitePrivacy:
    """DP-SGD on one site through a job: the round's noise multiplier, and the ε spent so far.

    The ledger, the (σ, q, steps) of every round the site trained, is kept in the site's job-scoped state (``store``),
    so that a client process restarted for every task (the simulator with ``-t < -n``) and a continuation job report
    the ε of all the steps before. A ledger that cannot be read refuses the round: the ε spent would be unknown.

    Args:
        settings: the job's DP-SGD settings.
        store: the site's state store for the ledger (:class:`~.state.SiteStateStore` or
            :class:`~.job_state.ContinuedStateStore`).
        site: the site's name, for the log.
        num_samples: N, the site's training samples.
        batch_size: B; the sample rate is q = B/N.
        steps_per_round: the site's local steps in a round, ``local epochs × ⌊N/B⌋`` (the last batch is dropped).
    """

    def __init__(self, settings: DPSettings, store, site: str, num_samples: int, batch_size: int, steps_per_round: int):
        self.settings = settings
        self.store = store
        self.site = site
        self.sample_rate = batch_size / num_samples
        self.steps_per_round = steps_per_round
        self.history = self._load()
        if not self.history and settings.delta >= 1 / num_samples:  # said once, at the site's first round
            logger.warning(
                f"{site}: dp_delta={settings.delta:g} is not below 1/N = {1 / num_samples:.3g} (N = {num_samples}, its "
                "training samples): the guarantee may then fail for some record; lower dp_delta"
            )

    def _load(self) -> History:
        try:
            record = self.store.load()
        except StateUnusable as e:
            raise ValueError(f"the DP-SGD ledger cannot be read, so the ε spent is unknown: {e}") from e
        aside = self.store.set_aside_files()
        if record is None and aside:
            raise ValueError(
                f"the DP-SGD ledger was set aside as unusable ({aside[0]}), so the ε spent is unknown: put a readable "
                "copy back in its place, or train this site in a new job"
            )
        return [] if record is None else [tuple(entry) for entry in record["payload"]["history"]]

    def noise_multiplier(self, total_rounds: Optional[int]) -> float:
        """σ of this job: the one the site has trained with (calibrated once, at its first round), the setting's, or
        the one calibrated for ``target_epsilon`` after ``total_rounds`` rounds.

        Raises:
            ValueError: ``target_epsilon`` with no ``total_rounds`` (the server sends it with the model).
        """
        if self.history:
            return self.history[0][0]
        if self.settings.noise_multiplier is not None:
            return self.settings.noise_multiplier
        if not total_rounds:
            raise ValueError(
                "dp_target_epsilon needs the job's number of rounds, which the server did not send with the model "
                "(FLModel.total_rounds); give dp_noise_multiplier instead"
            )
        steps = total_rounds * self.steps_per_round
        return calibrated_noise_multiplier(self.settings.target_epsilon, self.settings.delta, self.sample_rate, steps)

    def start_round(self, network: nn.Module, total_rounds: Optional[int]) -> DPSGD:
        """The round's DP-SGD step on ``network`` (its hooks on until :meth:`DPSGD.close`); see :meth:`noise_multiplier`."""
        return DPSGD(network, self.noise_multiplier(total_rounds), self.settings.max_grad_norm)

    def finish_round(self, round_number: int, step: DPSGD) -> Dict[str, float]:
        """Add the round's steps to the ledger, save it, log it; the figures to report, ``dp_epsilon`` (the ε spent
        in the job so far) and ``dp_delta``."""
        self.history = with_steps(self.history, step.noise_multiplier, self.sample_rate, step.steps)
        self.store.save(round_number, {"history": [list(entry) for entry in self.history]})
        settings = self.settings
        epsilon = epsilon_spent(self.history, settings.delta)
        logger.info(
            f"{self.site}: DP-SGD round {round_number}: ε = {epsilon:.4f} spent (δ = {settings.delta:g}) in "
            f"{sum(steps for _, _, steps in self.history)} steps at q = {self.sample_rate:.4g}; noise multiplier "
            f"σ = {step.noise_multiplier:.4g}, clipping norm C = {settings.max_grad_norm:g}"
        )
        if settings.target_epsilon is not None and epsilon > settings.target_epsilon:
            logger.warning(
                f"{self.site} has spent ε = {epsilon:.4f}, more than dp_target_epsilon={settings.target_epsilon:g}: it "
                "trained more steps than the job's rounds (a round done again)"
            )
        return {"dp_epsilon": epsilon, "dp_delta": settings.delta}


def without_training_figures(metrics: Dict[str, float]) -> Dict[str, float]:
    """``metrics`` less the ``train_*`` loss means: measured on the training records outside DP-SGD, they would
    leave the site unprotected by its guarantee, so a site under DP-SGD keeps them in its own log."""
    return {name: value for name, value in metrics.items() if not name.startswith("train_")}
