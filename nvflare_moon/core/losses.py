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
        z_prev: the projections of the site's previous local models, oldest first, each ``[B, D]``.
        temperature: τ > 0.
    """
    if not z_prev:
        return z.new_zeros(())
    candidates = torch.stack([z_glob.detach(), *(p.detach() for p in z_prev)], dim=1)  # [B, 1 + m, D]
    logits = F.cosine_similarity(z.unsqueeze(1), candidates, dim=-1) / temperature
    positive_is_first = torch.zeros(len(z), dtype=torch.long, device=z.device)
    return F.cross_entropy(logits, positive_is_first)


def prototype_contrastive_loss(
    z: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor, available: torch.Tensor, temperature: float
) -> torch.Tensor:
    """FedSSC's global class-wise contrastive loss ℓ_glob: each sample against the shared class prototypes.

        ℓ_glob(z, y) = −log( exp(cos(z, P_y)/τ) / Σ_{c∈A} exp(cos(z, P_c)/τ) )     if y ∈ A, else 0

    A is the set of classes that have a shared prototype. The positive (the prototype of the sample's own class) is in
    the denominator; the other available classes are the negatives. A sample whose class has no prototype contributes
    0 but still counts in the batch mean. The prototypes are constants.

    Args:
        z: the local model's projections, ``[B, D]``.
        labels: the samples' classes, ``[B]``.
        prototypes: the shared prototype of every class, ``[K, D]`` (rows of unavailable classes are ignored).
        available: ``[K]`` bool, True for the classes in A.
        temperature: τ > 0.
    """
    available = available.to(device=z.device, dtype=torch.bool)
    prototypes = prototypes.detach().to(z.device, z.dtype)
    shared = F.normalize(torch.where(available[:, None], prototypes, 0.0), dim=1)  # [K, D]; others never read
    logits = F.normalize(z, dim=1) @ shared.T / temperature
    # Unavailable classes leave the softmax (exp underflows to exactly 0); written without boolean indexing, which
    # would make the GPU wait for the CPU at every step.
    logits = logits.masked_fill(~available, torch.finfo(logits.dtype).min)
    per_sample = F.cross_entropy(logits, labels, reduction="none")
    return torch.where(available[labels], per_sample, 0.0).sum() / len(z)


def simsiam_distance(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """SimSiam's distance (Chen and He, CVPR 2021), batch mean:

        D(p, z) = −cos(p, stopgrad(z))

    Only ``p`` receives gradient. FedSiam-DA's history term cos(z_l, stopgrad(z_h)) is −D(z_l, z_h).

    Args:
        p: predictions (or projections) that learn from the term, ``[B, D]``.
        z: the target projections, constants, ``[B, D]``.
    """
    return -F.cosine_similarity(p, z.detach(), dim=-1).mean()


def representation_l2_loss(z: torch.Tensor, z_glob: torch.Tensor, squared: bool = False) -> torch.Tensor:
    """The ℓ2 representation penalty of the MOON paper's loss ablation (Table 5), batch mean:

        ℓ_ℓ2 = mean_b ‖z_b − z_glob,b‖₂          (squared=True: mean_b ‖z_b − z_glob,b‖₂²)

    It pulls the local projections towards the global model's, without MOON's push away from the previous model.
    z_glob is a constant. At z = z_glob (every round's first step) the value and the (sub)gradient are 0.

    Args:
        z: the local model's projections, ``[B, D]``.
        z_glob: the global model's projections of the same batch, ``[B, D]``.
        squared: square the norm. Descriptions of the ablation quote it both with the plain norm and with its square
            (``docs/results.md``), so both are offered.
    """
    distance = torch.linalg.vector_norm(z - z_glob.detach(), dim=1)
    return (distance.square() if squared else distance).mean()
