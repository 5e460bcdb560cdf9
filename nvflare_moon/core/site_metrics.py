"""How a figure spreads across sites: the weighted mean, the worst and best site and the standard deviation.

Fairness across sites is what per-site figures show (FedSiam-DA motivates its dual aggregation by it): a global model
whose mean is good may still fail one site. Framework-free, on plain ``{site: value}`` maps.

    mean  = Σ_k w_k·a_k / Σ_k w_k      over the sites k that report the figure (w_k: the site's aggregation weight)
    std   = sqrt(Σ_k (a_k − ā)² / K)   unweighted, population (ddof 0), ā the plain mean: every site counts once
"""

from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, Optional

import numpy as np


@dataclass(frozen=True)
class SiteSpread:
    """One figure across the sites that report it."""

    mean: float
    worst: float
    best: float
    std: float
    worst_site: str
    best_site: str
    num_sites: int

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def site_spread(values: Mapping[str, float], weights: Mapping[str, float]) -> Optional[SiteSpread]:
    """The spread of ``values`` (``{site: figure}``, higher is better); None when no site reports one. Weights are
    renormalised over the reporting sites, so a site without the figure neither counts nor drags the mean to 0."""
    sites = sorted(values)
    if not sites:
        return None
    a = np.array([float(values[s]) for s in sites])
    w = np.array([float(weights[s]) for s in sites])
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {dict(zip(sites, w))}")
    return SiteSpread(
        mean=float(np.dot(w, a) / w.sum()),
        worst=float(a.min()),
        best=float(a.max()),
        std=float(a.std()),
        worst_site=sites[int(a.argmin())],
        best_site=sites[int(a.argmax())],
        num_sites=len(sites),
    )


def weighted_metric_means(
    site_metrics: Mapping[str, Mapping[str, float]], weights: Mapping[str, float]
) -> Dict[str, float]:
    """Every metric's weighted mean over the sites that report it (weights renormalised over them)."""
    names = sorted({name for metrics in site_metrics.values() for name in metrics})
    return {
        name: site_spread({s: m[name] for s, m in site_metrics.items() if name in m}, weights).mean for name in names
    }
