"""FedSSC's shared class prototypes, framework-free: what a site uploads and what the server shares back.

Site, during the last local epoch, over the training forward passes:

    mean_c = (1/n_c) · Σ_{i: y_i = c} z_i        n_c = number of those samples

A class seen fewer than ``min_class_count`` times is withheld (its mean and count are sent as 0): the server would
never share it. Optionally each remaining mean is clipped to L2 norm C and gets Gaussian noise N(0, σ²·I).

Server, every round, for each class c: the eligible sites are those with n_c ≥ ``min_class_count`` and a finite mean of
the right shape. One of them is drawn uniformly at random (a generator seeded by (seed, round)); its mean becomes the
prototype P_c and c is marked available. The K×D matrix P and the K availability mask go to every site with the next
global model. Everything in ``FLModel.meta`` is numpy: a torch tensor there crashes the NVFlare server.

Excluding a site's own prototype (an option; the paper speaks of prototypes "from another device"): the server also
draws, per class, an alternate among the eligible sites other than the drawn one, and sends the alternates and the
drawn sites' names. A site that is the source of P_c uses the alternate instead (or no prototype of c, if c has only
one eligible site). Each site then gets a mean drawn uniformly from the eligible sites other than itself: a site that
is not the drawn one gets the drawn one, uniform over the others; the drawn one gets the alternate, uniform over the
others. The price: every site learns which site each prototype came from.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

# FLModel.meta keys: site → server
CLASS_MEANS = "class_means"  # [K, D] float32
CLASS_COUNTS = "class_counts"  # [K] int64
# server → sites, with the next global model
PROTOTYPES = "prototypes"  # [K, D] float32
PROTOTYPE_AVAILABLE = "prototype_available"  # [K] bool
# server → sites, only when a site's own prototype is excluded
PROTOTYPE_SOURCES = "prototype_sources"  # [K] site names, "" for a class without a prototype
ALTERNATE_PROTOTYPES = "alternate_prototypes"  # [K, D] float32, from another eligible site than the source
ALTERNATE_AVAILABLE = "alternate_available"  # [K] bool


class ClassMeanAccumulator:
    """Per-class running mean of projections over the batches given to :meth:`add`."""

    def __init__(self, num_classes: int):
        self.num_classes = num_classes
        self._sums: Optional[torch.Tensor] = None  # float64, so that long epochs do not lose precision
        self._counts: Optional[torch.Tensor] = None

    def add(self, z: torch.Tensor, labels: torch.Tensor) -> None:
        z = z.detach()
        if self._sums is None:
            self._sums = torch.zeros(self.num_classes, z.shape[1], dtype=torch.float64, device=z.device)
            self._counts = torch.zeros(self.num_classes, dtype=torch.int64, device=z.device)
        self._sums.index_add_(0, labels, z.double())
        self._counts.index_add_(0, labels, torch.ones_like(labels))  # not bincount: on a GPU it waits for the CPU

    @property
    def empty(self) -> bool:
        """No batch was recorded yet."""
        return self._sums is None

    def result(self) -> Tuple[np.ndarray, np.ndarray]:
        """``(means [K, D] float32, counts [K] int64)``; a class never seen has a zero mean and count 0."""
        if self._sums is None:
            raise ValueError("no batch was recorded")
        counts = self._counts.cpu()
        means = self._sums.cpu() / counts.clamp(min=1).unsqueeze(1)
        return means.float().numpy(), counts.numpy()


def prepare_upload(
    means: np.ndarray,
    counts: np.ndarray,
    min_class_count: int,
    clip_norm: Optional[float] = None,
    noise_std: float = 0.0,
    rng: Optional[np.random.Generator] = None,
) -> Tuple[np.ndarray, np.ndarray]:
    """What leaves the site: ``(means, counts)`` with the classes below ``min_class_count`` zeroed and, for the others,
    each mean scaled to L2 norm ≤ ``clip_norm`` (None: no clipping) and then given N(0, ``noise_std``²) noise per
    entry (``rng``: the noise source, default fresh OS entropy so that the server cannot predict it)."""
    shared = np.asarray(counts) >= min_class_count
    means = np.where(shared[:, None], means, 0.0).astype(np.float32)
    counts = np.where(shared, counts, 0).astype(np.int64)
    if clip_norm is not None:
        norms = np.linalg.norm(means, axis=1, keepdims=True)
        means = (means * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-12))).astype(np.float32)
    if noise_std > 0:
        rng = rng if rng is not None else np.random.default_rng()
        noise = rng.normal(0.0, noise_std, size=means.shape)
        means = np.where(shared[:, None], means + noise, 0.0).astype(np.float32)
    return means, counts


def usable_class_means(means: Any, counts: Any, num_classes: int, dim: int) -> Tuple[np.ndarray, np.ndarray, List[str]]:
    """One site's upload as the server may use it: ``(means [K, D] float32, counts [K] int64, problems)``.

    A wrong shape or type refuses the whole upload (all counts 0); a class whose mean holds NaN or Inf, or whose count
    is negative, is refused alone (its count 0). ``problems`` says what was refused and why.
    """
    zeros = np.zeros((num_classes, dim), np.float32), np.zeros(num_classes, np.int64)
    try:
        means, counts = np.asarray(means), np.asarray(counts)
    except (TypeError, ValueError) as e:  # e.g. ragged lists
        return (*zeros, [f"class means or counts are not arrays ({e})"])
    if means.shape != (num_classes, dim) or not np.issubdtype(means.dtype, np.floating):
        expected = f"a float array of shape {(num_classes, dim)}"
        return (*zeros, [f"{CLASS_MEANS} must be {expected}, got {means.dtype} {means.shape}"])
    if counts.shape != (num_classes,) or not np.issubdtype(counts.dtype, np.integer):
        expected = f"an integer array of shape {(num_classes,)}"
        return (*zeros, [f"{CLASS_COUNTS} must be {expected}, got {counts.dtype} {counts.shape}"])
    non_finite, negative = ~np.all(np.isfinite(means), axis=1), counts < 0
    problems = [f"class {c}: its mean holds NaN or Inf" for c in np.flatnonzero(non_finite)]
    problems += [f"class {c}: negative count {counts[c]}" for c in np.flatnonzero(negative)]
    refused = non_finite | negative
    return (
        np.where(refused[:, None], 0.0, means).astype(np.float32),
        np.where(refused, 0, counts).astype(np.int64),
        problems,
    )


@dataclass
class SharedPrototypes:
    prototypes: np.ndarray  # [K, D] float32, zero rows for unavailable classes
    available: np.ndarray  # [K] bool
    sources: Dict[int, str]  # class -> the site whose mean was drawn
    alternates: Optional[np.ndarray] = None  # [K, D] float32 (exclude_own only)
    alternate_available: Optional[np.ndarray] = None  # [K] bool (exclude_own only)

    def meta(self) -> Dict[str, Any]:
        meta = {PROTOTYPES: self.prototypes, PROTOTYPE_AVAILABLE: self.available}
        if self.alternates is not None:
            meta[PROTOTYPE_SOURCES] = [self.sources.get(c, "") for c in range(len(self.available))]
            meta[ALTERNATE_PROTOTYPES] = self.alternates
            meta[ALTERNATE_AVAILABLE] = self.alternate_available
        return meta


def select_prototypes(
    uploads: Mapping[str, Tuple[np.ndarray, np.ndarray]],
    num_classes: int,
    dim: int,
    min_class_count: int,
    rng: np.random.Generator,
    exclude_own: bool = False,
) -> SharedPrototypes:
    """For each class, draw one site uniformly among those with count ≥ ``min_class_count``; take its mean. With
    ``exclude_own``, also draw an alternate uniformly among the other eligible sites (see the module's docstring).

    ``uploads`` maps each site to its usable ``(means, counts)`` (see :func:`usable_class_means`). Sites are considered
    in sorted order, so the draw depends on ``rng`` alone, not on the order in which the updates arrived.
    """
    prototypes = np.zeros((num_classes, dim), np.float32)
    available = np.zeros(num_classes, bool)
    alternates, alternate_available = np.zeros_like(prototypes), np.zeros_like(available)
    sources = {}
    for c in range(num_classes):
        eligible = [site for site in sorted(uploads) if uploads[site][1][c] >= min_class_count]
        if eligible:
            site = eligible.pop(int(rng.integers(len(eligible))))
            prototypes[c] = uploads[site][0][c]
            available[c] = True
            sources[c] = site
            if exclude_own and eligible:
                alternates[c] = uploads[eligible[int(rng.integers(len(eligible)))]][0][c]
                alternate_available[c] = True
    if not exclude_own:
        return SharedPrototypes(prototypes, available, sources)
    return SharedPrototypes(prototypes, available, sources, alternates, alternate_available)


def read_shared_prototypes(
    meta: Mapping[str, Any], num_classes: int, dim: int, site: Optional[str] = None
) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """The ``(prototypes, available)`` a site received with the global model, or None if the server sent none. When
    the server excludes a site's own prototype (it sent ``prototype_sources``), the classes whose source is ``site``
    take the alternate prototype instead.

    Raises:
        ValueError: they were sent but do not fit this site's network (shape, type, or NaN in an available row).
    """
    if PROTOTYPES not in meta and PROTOTYPE_AVAILABLE not in meta:
        return None
    prototypes, available = _checked(meta.get(PROTOTYPES), meta.get(PROTOTYPE_AVAILABLE), num_classes, dim, "")
    if PROTOTYPE_SOURCES in meta:
        sources = list(meta[PROTOTYPE_SOURCES])
        if len(sources) != num_classes:
            raise ValueError(f"received {len(sources)} prototype sources, expected {num_classes}")
        alternates, alternate_available = _checked(
            meta.get(ALTERNATE_PROTOTYPES), meta.get(ALTERNATE_AVAILABLE), num_classes, dim, "alternate "
        )
        own = np.array([source == site for source in sources]) & available
        prototypes = np.where(own[:, None], alternates, prototypes)
        available = np.where(own, alternate_available, available)
    return prototypes, available


def _checked(prototypes: Any, available: Any, num_classes: int, dim: int, which: str) -> Tuple[np.ndarray, np.ndarray]:
    prototypes, available = np.asarray(prototypes), np.asarray(available)
    if prototypes.shape != (num_classes, dim) or not np.issubdtype(prototypes.dtype, np.floating):
        got = f"{prototypes.dtype} {prototypes.shape}"
        raise ValueError(f"received {which}prototypes of {got}, expected float {(num_classes, dim)}")
    if available.shape != (num_classes,) or available.dtype != bool:
        got = f"{available.dtype} {available.shape}"
        raise ValueError(f"received an {which}availability mask of {got}, expected bool {(num_classes,)}")
    if not np.all(np.isfinite(prototypes[available])):
        raise ValueError(f"received {which}prototypes hold NaN or Inf")
    return prototypes.astype(np.float32), available
