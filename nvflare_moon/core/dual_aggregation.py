"""FedSiam-DA's dual aggregation on the server (Wang et al., FedSiam-DA), framework-free numpy.

    w_f0 = Σ_k (n_k / Σ_j n_j) · w_k                 first aggregation: weighted FedAvg
    c_k  = cos(vec(w_k), vec(w_f0))                  vec: the float entries of the state dict that ``vector`` names,
                                                     flattened and concatenated in sorted key order
    ξ_k  = c_k⁺ / Σ_j c_j⁺,   c⁺ = c if c > 0 else ε  a non-positive cosine is clamped to a small ε
    w_f  = Σ_k ξ_k · w_k                             second aggregation; integer entries (num_batches_tracked) from w_f0

``vector`` (a choice, the paper's w being "the model"): ``"state"`` every float entry, BatchNorm running statistics
included; ``"parameters"`` without BatchNorm's running statistics (keys ending in ``running_mean`` / ``running_var``,
PyTorch's names), i.e. the trainable parameters of a network whose only float buffers are BatchNorm's. Under non-IID
data the running statistics differ by site and are a large share of ‖vec‖² (14.9% at initialisation on the simple-CNN,
26.8% on ResNet-50), so the choice moves ξ. Either way the second aggregation averages every float entry with ξ.

Late in training all cosines are ≈ 1, so ξ is ≈ uniform: that is expected.
"""

from dataclasses import dataclass
from typing import Iterable, List, Mapping

import numpy as np

from .aggregation import Params, weighted_average

VECTORS = ("state", "parameters")
BATCHNORM_STATISTICS = ("running_mean", "running_var")  # the last component of their state-dict keys


@dataclass
class DualAggregation:
    params: Params  # w_f
    xi: np.ndarray  # ξ_k, in the order of the models
    cosines: np.ndarray  # c_k, before clamping
    clamped: np.ndarray  # bool: c_k ≤ 0 (or undefined) was replaced by ε


def vector_keys(params: Mapping[str, np.ndarray], vector: str = "state") -> List[str]:
    """The keys of the entries vec(w) concatenates, sorted: the float ones, and with ``vector="parameters"`` not
    BatchNorm's running statistics."""
    if vector not in VECTORS:
        raise ValueError(f"vector must be one of {list(VECTORS)}, got {vector!r}")
    keys = [k for k in sorted(params) if _is_float(params[k])]
    if vector == "parameters":
        keys = [k for k in keys if k.rsplit(".", 1)[-1] not in BATCHNORM_STATISTICS]
    return keys


def float_vector(params: Mapping[str, np.ndarray], keys: Iterable[str]) -> np.ndarray:
    """vec(w): the entries ``keys`` of ``params``, flattened and concatenated in that order (float64)."""
    floats = [np.asarray(params[k], dtype=np.float64).ravel() for k in keys]
    return np.concatenate(floats) if floats else np.zeros(0)


def dual_aggregate(
    models: List[Mapping[str, np.ndarray]],
    sample_weights: np.ndarray,
    cosine_floor: float = 1e-6,
    vector: str = "state",
) -> DualAggregation:
    """The dual aggregate of ``models`` (state dicts with the same keys), ``sample_weights`` being n_k / Σ_j n_j,
    ``cosine_floor`` the ε that non-positive cosines are clamped to and ``vector`` what vec(w) holds (see above)."""
    fedavg = weighted_average(models, sample_weights)
    keys = vector_keys(fedavg, vector)
    reference = float_vector(fedavg, keys)
    cosines = np.array([_cosine(float_vector(m, keys), reference) for m in models])
    clamped = ~(cosines > 0)  # NaN (a zero vector) counts as non-positive
    xi = np.where(clamped, cosine_floor, cosines)
    xi = xi / xi.sum()
    params = weighted_average(models, xi)
    params.update({k: v for k, v in fedavg.items() if not _is_float(v)})
    return DualAggregation(params, xi, cosines, clamped)


def _is_float(value) -> bool:
    return np.issubdtype(np.asarray(value).dtype, np.floating)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = np.sqrt(_dot(a, a) * _dot(b, b))
    return _dot(a, b) / norms if norms > 0 else float("nan")


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """Σ a_i·b_i by numpy's own (pairwise) summation, not BLAS. NVFlare's simulator forks its server from a process
    whose OpenBLAS threads already ran, and a multithreaded BLAS call in the forked server can wait for ever: the
    FedSiam-DA server hung in ``np.linalg.norm`` (OpenBLAS ``exec_blas``) after aggregating round 0 on a loaded
    machine, and the job never ended."""
    return float(np.add.reduce(a * b))
