"""FedSiam-DA's dual aggregation on the server (Wang et al., FedSiam-DA), framework-free numpy.

    w_f0 = Σ_k (n_k / Σ_j n_j) · w_k                 first aggregation: weighted FedAvg
    c_k  = cos(vec(w_k), vec(w_f0))                  vec: every float entry of the state dict, flattened, concatenated
    ξ_k  = c_k⁺ / Σ_j c_j⁺,   c⁺ = c if c > 0 else ε  a non-positive cosine is clamped to a small ε
    w_f  = Σ_k ξ_k · w_k                             second aggregation; integer entries (num_batches_tracked) from w_f0

Late in training all cosines are ≈ 1, so ξ is ≈ uniform: that is expected.
"""

from dataclasses import dataclass
from typing import List, Mapping

import numpy as np

from .aggregation import Params, weighted_average


@dataclass
class DualAggregation:
    params: Params  # w_f
    xi: np.ndarray  # ξ_k, in the order of the models
    cosines: np.ndarray  # c_k, before clamping
    clamped: np.ndarray  # bool: c_k ≤ 0 (or undefined) was replaced by ε


def float_vector(params: Mapping[str, np.ndarray]) -> np.ndarray:
    """vec(w): the float entries in sorted key order, flattened and concatenated (float64)."""
    floats = [np.asarray(params[k], dtype=np.float64).ravel() for k in sorted(params) if _is_float(params[k])]
    return np.concatenate(floats) if floats else np.zeros(0)


def dual_aggregate(
    models: List[Mapping[str, np.ndarray]], sample_weights: np.ndarray, cosine_floor: float = 1e-6
) -> DualAggregation:
    """The dual aggregate of ``models`` (state dicts with the same keys), ``sample_weights`` being n_k / Σ_j n_j and
    ``cosine_floor`` the ε that non-positive cosines are clamped to."""
    fedavg = weighted_average(models, sample_weights)
    reference = float_vector(fedavg)
    cosines = np.array([_cosine(float_vector(m), reference) for m in models])
    clamped = ~(cosines > 0)  # NaN (a zero vector) counts as non-positive
    xi = np.where(clamped, cosine_floor, cosines)
    xi = xi / xi.sum()
    params = weighted_average(models, xi)
    params.update({k: v for k, v in fedavg.items() if not _is_float(v)})
    return DualAggregation(params, xi, cosines, clamped)


def _is_float(value) -> bool:
    return np.issubdtype(np.asarray(value).dtype, np.floating)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / norms) if norms > 0 else float("nan")
