"""Differential privacy of a site's training records by DP-SGD (Abadi et al., CCS 2016): the settings, one step's
clipping and noise, and the accounting of the ε spent.

Each step clips every sample's gradient to the norm C, sums them, adds Gaussian noise N(0, σ²C²) and divides by the
batch size (:func:`noisy_sum`); the privacy spent after a number of such steps, each on a batch sampled at rate
q = B/N, is given by Opacus's Rényi DP accountant of the subsampled Gaussian mechanism (:func:`epsilon_spent`). The
guarantee is record-level (ε, δ)-DP of each site's own training data, per site: adding or removing one training record
of a site changes the distribution of everything that site sends by at most e^ε, up to δ.

Opacus (the extra ``dp``: ``pip install 'nvflare-moon[dp]'``) is imported only where DP-SGD is switched on.
"""

import dataclasses
import warnings
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .validation import check_number

History = List[Tuple[float, float, int]]  # (noise multiplier σ, sample rate q, steps) per setting, as Opacus keeps it
CLIP_EPSILON = 1e-6  # added to a sample's norm before dividing C by it, as Opacus does (a zero gradient stays zero)


@dataclasses.dataclass(frozen=True)
class DPSettings:
    """DP-SGD's settings, checked: the executors' ``dp`` argument, whole; each field is the recipes' argument
    ``dp_<field>``.

    Args:
        noise_multiplier: σ > 0, the noise's standard deviation relative to C; or None, with ``target_epsilon``.
        target_epsilon: the ε > 0 that each site may have spent after the job's last round; or None, with
            ``noise_multiplier``. σ is then calibrated once for the whole job, at the site's first round: the smallest
            σ (to 0.01 in ε) whose ε after ``total rounds × local epochs × ⌊N/B⌋`` steps is at most the target
            (:func:`calibrated_noise_multiplier`), N the site's training samples and B the batch size. A site that
            trains in fewer rounds (``sample_fraction < 1``, an early stop) spends less.
        delta: δ of the (ε, δ) guarantee, in (0, 1); default 1e-5, well below 1/N for a site of up to some 10 000
            records. It should stay below 1/N (a site warns otherwise): δ is the chance that the guarantee fails.
        max_grad_norm: C > 0, the bound of each sample's gradient norm (over every trained parameter at once).
    """

    noise_multiplier: Optional[float] = None
    target_epsilon: Optional[float] = None
    delta: float = 1e-5
    max_grad_norm: float = 1.0

    def __post_init__(self):
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError(
                "DP-SGD takes exactly one of dp_noise_multiplier (σ) and dp_target_epsilon (ε), got "
                f"dp_noise_multiplier={self.noise_multiplier!r} and dp_target_epsilon={self.target_epsilon!r}"
            )
        if self.noise_multiplier is not None:
            check_number("dp_noise_multiplier", self.noise_multiplier, low=0, low_inclusive=False)
        if self.target_epsilon is not None:
            check_number("dp_target_epsilon", self.target_epsilon, low=0, low_inclusive=False)
        check_number("dp_delta", self.delta, low=0, low_inclusive=False)
        if self.delta >= 1:
            raise ValueError(f"dp_delta must be < 1 (well below 1/N, N a site's training samples), got {self.delta!r}")
        check_number("dp_max_grad_norm", self.max_grad_norm, low=0, low_inclusive=False)

    @classmethod
    def from_arguments(
        cls, noise_multiplier: Optional[float], target_epsilon: Optional[float], delta: float, max_grad_norm: float
    ) -> Optional["DPSettings"]:
        """The settings of the ``dp_*`` arguments; None (DP-SGD off) when neither σ nor ε is given, where δ and C
        must keep their defaults (they would silently do nothing)."""
        if noise_multiplier is None and target_epsilon is None:
            for name, value, default in (("dp_delta", delta, cls.delta), ("dp_max_grad_norm", max_grad_norm, 1.0)):
                if value != default:
                    raise ValueError(
                        f"{name}={value!r} sets DP-SGD, which is off: give dp_noise_multiplier or dp_target_epsilon"
                    )
            return None
        require_opacus()
        return cls(noise_multiplier, target_epsilon, delta, max_grad_norm)


def require_opacus() -> None:
    """Raise ValueError, naming the fix, unless Opacus can be imported."""
    try:
        import opacus  # noqa: F401
    except ImportError as e:
        raise ValueError(
            f"DP-SGD (dp_noise_multiplier, dp_target_epsilon) needs Opacus: pip install 'nvflare-moon[dp]' ({e})"
        ) from e


def check_dp_training(model: nn.Module, amp: bool, method: str, refusal: Optional[str]) -> None:
    """Raise ValueError, naming the fix, when ``method`` (an executor's name) cannot train ``model`` with DP-SGD:
    ``refusal`` says why the method cannot (None: it can); mixed precision (``amp``) cannot; see
    :func:`check_dp_network`."""
    if refusal is not None:
        raise ValueError(
            f"{method} cannot train with DP-SGD (dp_noise_multiplier, dp_target_epsilon): {refusal}; run FedAvg, "
            "FedProx, MOON or SCAFFOLD with it"
        )
    if amp:
        raise ValueError(
            "amp=True cannot be used with DP-SGD: mixed precision's gradient scaler scales the per-sample gradients "
            "that DP-SGD clips to dp_max_grad_norm; set amp=False"
        )
    check_dp_network(model)


def check_dp_network(model: nn.Module) -> None:
    """Raise ValueError, naming the fix, when DP-SGD cannot have a gradient of each sample of ``model``: BatchNorm
    normalises a sample by its batch, so its gradient depends on the other samples; Opacus refuses other layers."""
    batch_norms = [
        name for name, module in model.named_modules() if isinstance(module, nn.modules.batchnorm._BatchNorm)
    ]
    if batch_norms:
        raise ValueError(
            f"DP-SGD cannot train a network with BatchNorm ({len(batch_norms)} layers, the first {batch_norms[0]!r}): "
            "BatchNorm normalises each sample by its batch, so no sample has a gradient of its own to clip. Use "
            "arch='simple_cnn', or a network of your own with GroupNorm instead of BatchNorm "
            "(opacus.validators.ModuleValidator.fix converts one), as the server's model too"
        )
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise ValueError(f"DP-SGD cannot have per-sample gradients of this network (Opacus): {errors[0]}")


# ---- one step ----------------------------------------------------------------------------------------------------


def per_sample_norms(per_sample_grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """‖g_i‖₂ = sqrt(Σ_p ‖g_{i,p}‖²), each sample's gradient norm over all parameters p: ``[B]`` from one
    ``[B, *shape_p]`` tensor per parameter."""
    return torch.stack([g.flatten(1).norm(dim=1) for g in per_sample_grads], dim=1).norm(dim=1)


def clip_factors(norms: torch.Tensor, max_grad_norm: float) -> torch.Tensor:
    """min(1, C / (‖g_i‖ + 1e-6)), ``[B]``: what each sample's gradient is multiplied by so that its norm is ≤ C."""
    return (max_grad_norm / (norms + CLIP_EPSILON)).clamp(max=1.0)


def noisy_sum(
    per_sample_grads: Sequence[torch.Tensor],
    max_grad_norm: float,
    noise_multiplier: float,
    generator: Optional[torch.Generator] = None,
) -> List[torch.Tensor]:
    """DP-SGD's privatised gradient sum of one batch (Abadi et al. 2016, Algorithm 1), per parameter:

        ĝ = Σ_i g_i · min(1, C / (‖g_i‖₂ + 1e-6)) + N(0, σ²C² I)

    ``per_sample_grads``: one ``[B, *shape]`` tensor per parameter, ‖g_i‖₂ over all of them
    (:func:`per_sample_norms`). Returns one ``[*shape]`` tensor per parameter: the sum, to be divided by the batch
    size. The noise is drawn from ``generator`` (torch's default one if None), on the gradients' device.
    """
    factors = clip_factors(per_sample_norms(per_sample_grads), max_grad_norm)
    noise_std = noise_multiplier * max_grad_norm
    sums = []
    for g in per_sample_grads:
        clipped = torch.einsum("i,i...->...", factors.to(g.dtype), g)
        noise = torch.normal(0.0, noise_std, size=clipped.shape, generator=generator, device=g.device)
        sums.append(clipped + noise.to(g.dtype))
    return sums


# ---- accounting ---------------------------------------------------------------------------------------------------


def with_steps(history: History, noise_multiplier: float, sample_rate: float, steps: int) -> History:
    """``history`` with ``steps`` more steps at (σ, q), added to the entry of the same σ and q: Rényi DP adds up over
    steps, so the ε is the same as with an entry per round, and the accountant's work stays one entry per setting."""
    merged, added = [], False
    for sigma, rate, count in history:
        if (sigma, rate) == (noise_multiplier, sample_rate):
            count, added = count + steps, True
        merged.append((sigma, rate, count))
    return merged if added else merged + [(noise_multiplier, sample_rate, steps)]


def epsilon_spent(history: History, delta: float) -> float:
    """The ε of the (ε, δ)-DP guarantee after the steps of ``history``, by Opacus's Rényi DP accountant of the
    subsampled Gaussian mechanism (Mironov 2017; Mironov, Talwar and Zhang 2019); 0 before any step. The accountant
    assumes every step's batch is a Poisson sample of the site's records at rate q (see ``docs/differential_privacy.md``
    for the fixed-size shuffled batches trained here)."""
    if not history:
        return 0.0
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(float(sigma), float(rate), int(steps)) for sigma, rate, steps in history]
    with warnings.catch_warnings():  # "optimal order is the largest alpha": the bound still holds, a little loose
        warnings.simplefilter("ignore", UserWarning)
        return float(accountant.get_epsilon(delta))


def calibrated_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The smallest σ, to 0.01 in ε, whose ε after ``steps`` steps at rate q is at most ``target_epsilon`` (Opacus's
    ``get_noise_multiplier`` with the Rényi DP accountant)."""
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():  # the search tries large σ, whose best Rényi order is the largest one
        warnings.simplefilter("ignore", UserWarning)
        return float(
            get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant="rdp",
            )
        )
