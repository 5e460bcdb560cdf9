"""Gaussian noise on the features h before the projection head (the MOON article's deployment notes, section 4.3,
隐私增强: "add differential-privacy noise before the projection").

What it does and does not protect is in ``docs/practical_options.md``: in MOON no h or z leaves the site, so this is
no differential-privacy guarantee for the uploaded weights; it blurs the projections that FedSSC averages into the
prototypes it uploads.
"""

import math
import zlib

import torch

from .validation import check_number


class FeatureNoise:
    """Noise for one round of one site's local training, applied by :class:`~nvflare_moon.models.ProjectionModel` to h
    in training mode (the frozen global and previous models run in eval mode and see none):

        h̃_b = h_b + σ·(‖h_b‖₂/√F)·ε_b,    ε_b ~ N(0, I_F),    so that  E‖h̃_b − h_b‖² = σ²·‖h_b‖²

    The scale is **relative**: σ is the noise-to-signal ratio of each sample's feature vector, the same knob for the
    simple-CNN (F = 84) and ResNet-50 (F = 2048) and at every stage of training. ‖h_b‖ is a constant for the gradient.
    The s-th call (s = 0, 1, ...; one training forward pass per optimizer step) draws ε from a generator seeded with
    ``crc32("feature_noise/{seed}/{site}/{round}/{s}")``, so a run is reproducible and a restarted client process draws
    the same noise.

    Args:
        std: σ > 0.
        seed: the run's seed.
        site: the site's name.
        round_number: the round.
    """

    def __init__(self, std: float, seed: int, site: str, round_number: int):
        check_number("feature_noise_std", std, low=0, low_inclusive=False)
        self.std = std
        self.seed = seed
        self.site = site
        self.round_number = round_number
        self.steps = 0

    def step_seed(self, step: int) -> int:
        return zlib.crc32(f"feature_noise/{self.seed}/{self.site}/{self.round_number}/{step}".encode())

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """``h`` ``[B, F]`` plus this step's noise."""
        generator = torch.Generator(device=h.device).manual_seed(self.step_seed(self.steps))
        self.steps += 1
        noise = torch.randn(h.shape, generator=generator, device=h.device, dtype=h.dtype)
        scale = self.std * torch.linalg.vector_norm(h.detach(), dim=1, keepdim=True) / math.sqrt(h.shape[1])
        return h + scale * noise
