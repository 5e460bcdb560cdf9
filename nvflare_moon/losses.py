"""Loss terms of the representation-level methods, as pure functions of projections.

Every function takes the projections of one batch and returns the batch mean. Tensors from models that must not
learn from the term (the global model, previous models, prototypes) are detached here, so no caller can forget it.
"""

from typing import Sequence

import torch
import torch.nn.functional as F


def model_contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: Sequence[torch.Tensor], temperature: float
) -> torch.Tensor:
    """MOON's model-contrastive loss (Li, He and Song, CVPR 2021, eq. 3, with m previous models).

        ℓ_con = −log( exp(sim(z, z_glob)/τ) / ( exp(sim(z, z_glob)/τ) + Σ_i exp(sim(z, z_prev_i)/τ) ) )

    with sim the cosine similarity, averaged over the batch. z_glob and z_prev are constants. With no previous model
    the term is dropped: the result is exactly 0. (Using z_glob as the previous model instead would give the constant
    ln 2 with zero gradient: the same optimisation, which the tests check.)

    Args:
        z: the local model's projections, ``[B, D]``.
        z_glob: the global model's projections of the same batch, ``[B, D]``.
        z_prev: the projections of the party's previous local models, oldest first, each ``[B, D]``.
        temperature: τ > 0.
    """
    if not z_prev:
        return z.new_zeros(())
    candidates = torch.stack([z_glob.detach(), *(p.detach() for p in z_prev)], dim=1)  # [B, 1 + m, D]
    logits = F.cosine_similarity(z.unsqueeze(1), candidates, dim=-1) / temperature
    positive_is_first = torch.zeros(len(z), dtype=torch.long, device=z.device)
    return F.cross_entropy(logits, positive_is_first)
