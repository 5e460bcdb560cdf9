"""Server-side math on state dicts of numpy arrays, framework-free.

    weighted FedAvg:  w = Σ_k (n_k / Σ_j n_j) · w_k     over the participating sites

Every state-dict entry is averaged, BatchNorm running statistics included. Integer entries (``num_batches_tracked``)
are averaged in float64 and rounded back to their integer dtype.
"""

from typing import Dict, List, Mapping, Optional

import numpy as np

NUM_SAMPLES = "num_samples"  # FLModel.meta key of a site's FedAvg weight n_k, sent with every update

Params = Dict[str, np.ndarray]


def normalized_weights(sample_counts: List[float]) -> np.ndarray:
    """n_k / Σ_j n_j."""
    counts = np.asarray(sample_counts, dtype=np.float64)
    if counts.size == 0 or np.any(counts <= 0) or not np.all(np.isfinite(counts)):
        raise ValueError(f"sample counts must be positive and finite, got {sample_counts}")
    return counts / counts.sum()


def weighted_average(models: List[Mapping[str, np.ndarray]], weights: np.ndarray) -> Params:
    """Σ_k weights_k · models_k, entry by entry; integer entries are rounded back to their dtype."""
    result = {}
    for name, first in models[0].items():
        total = sum(float(w) * np.asarray(m[name], dtype=np.float64) for w, m in zip(weights, models))
        dtype = np.asarray(first).dtype
        result[name] = np.rint(total).astype(dtype) if np.issubdtype(dtype, np.integer) else total.astype(dtype)
    return result


def update_problem(
    params: Mapping[str, np.ndarray], reference: Optional[Mapping[str, np.ndarray]], allow_missing: bool = False
) -> Optional[str]:
    """Why an update cannot be aggregated (non-finite values, missing or extra keys, wrong shapes), or None.

    ``reference`` is the round's global model (or any accepted update of the same round), or None for the first one.
    ``allow_missing``: an update may lack keys of the reference (a site that withholds layers, e.g. NVFlare's
    ``ExcludeVars``); extra keys are still refused.
    """
    if not params:
        return "it holds no weights"
    if reference is not None:
        missing, extra = sorted(set(reference) - set(params)), sorted(set(params) - set(reference))
        if extra or (missing and not allow_missing):
            return f"its keys differ from the other sites' (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, value in params.items():
        value = np.asarray(value)
        if reference is not None and value.shape != np.shape(reference[name]):
            return f"{name} has shape {value.shape}, expected {np.shape(reference[name])}"
        if not np.issubdtype(value.dtype, np.number):
            return f"{name} is not numeric ({value.dtype})"
        if not np.all(np.isfinite(value)):
            return f"{name} holds NaN or Inf"
    return None


def full_update(params: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], is_diff: bool) -> Params:
    """A site's update as full weights: a weight difference is added to ``reference`` (the round's global model), and
    keys the site withheld take the reference's value (they count as unchanged).

    Float entries come out in at least float32: NVFlare's server-side quantizer converts the global model it sends in
    place, so the reference may hold float16 copies.
    """
    full = {}
    for name, base in reference.items():
        value = np.asarray(base)
        if name in params:
            value = value + np.asarray(params[name]) if is_diff else np.asarray(params[name])
        if np.issubdtype(value.dtype, np.floating):
            value = value.astype(np.result_type(value.dtype, np.float32), copy=False)
        full[name] = value
    return full
