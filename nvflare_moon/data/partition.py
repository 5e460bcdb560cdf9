"""Split a training set's indices among federated parties (sites).

The Dirichlet split reproduces the MOON reference code (QinbinLi/MOON, ``partition_data`` with
``'noniid-labeldir'``) index for index, so a given (labels, N, beta, seed) yields exactly the parties of the paper.
It uses numpy's legacy global RNG like the reference, but saves and restores that RNG's state, so callers are not
affected.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np

__all__ = [
    "dirichlet_partition",
    "iid_partition",
    "partition_indices",
    "proportional_test_split",
    "site_index",
    "PARTITION_METHODS",
]

PARTITION_METHODS = ("dirichlet", "iid")
MAX_DIRICHLET_TRIES = 10_000  # the reference loops forever when min_size is unreachable; we stop with an error


def _check_positive_int(value, name: str, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}; {hint}")
    return int(value)


def _check_labels(labels) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array of class indices, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(
            f"labels must hold integer class indices, got dtype {y.dtype}; convert with labels.astype(int)"
        )
    if y.min() < 0:
        raise ValueError(f"labels must be non-negative class indices, found {int(y.min())}")
    return y


@contextlib.contextmanager
def _seeded_global_rng(seed: int):
    """Seed numpy's legacy global RNG (the reference's) for the block, and restore its previous state after it."""
    saved_state = np.random.get_state()
    try:
        np.random.seed(seed)
        yield
    finally:
        np.random.set_state(saved_state)


def dirichlet_partition(
    labels: np.ndarray, num_parties: int, beta: float, seed: int, min_size: int = 10
) -> list[np.ndarray]:
    """Label-skewed split: each class is divided among parties with proportions p ~ Dir(beta * 1_N).

    Exactly the reference loop, with ``N_total = len(labels)`` and K = ``labels.max() + 1`` classes::

        np.random.seed(seed)
        repeat until min_j |party_j| >= min_size:
            parties = [[] ...]
            for k in 0..K-1:
                idx_k = shuffle(where(labels == k))
                p = Dirichlet(beta * 1_N)
                p_j = 0 for parties with |party_j| >= N_total / N ;  p = p / sum(p)
                split idx_k at int(cumsum(p) * len(idx_k))[:-1] and append piece j to party j
        shuffle each party's list

    Smaller ``beta`` gives more skew. Returns one int64 index array per party. The global numpy RNG state is restored
    on return. Raises ValueError if ``min_size * num_parties`` exceeds the number of samples, or if no draw reaches
    ``min_size`` within ``MAX_DIRICHLET_TRIES`` tries (where the reference would loop forever).
    """
    y, n_parties = _check_dirichlet_args(labels, num_parties, beta, min_size)
    with _seeded_global_rng(seed):
        parties = _draw_until_min_size(y, n_parties, beta, min_size)
        for party in parties:
            np.random.shuffle(party)
    return [np.asarray(party, dtype=np.int64) for party in parties]


def _check_dirichlet_args(labels, num_parties, beta, min_size) -> tuple[np.ndarray, int]:
    """The labels as an array and the number of parties; raises ValueError for an argument out of range."""
    y = _check_labels(labels)
    n_parties = _check_positive_int(num_parties, "num_parties", "pass the number of sites (e.g. the simulator's -n)")
    if not np.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta must be a positive float (Dirichlet concentration, e.g. 0.5), got {beta!r}")
    if isinstance(min_size, bool) or not isinstance(min_size, (int, np.integer)) or min_size < 0:
        raise ValueError(f"min_size must be a non-negative integer, got {min_size!r}")
    if min_size * n_parties > y.shape[0]:
        raise ValueError(
            f"min_size={min_size} samples for each of num_parties={n_parties} parties needs "
            f"{min_size * n_parties} samples but labels has only {y.shape[0]}; "
            f"lower min_size or num_parties"
        )
    return y, n_parties


def _draw_until_min_size(y: np.ndarray, n_parties: int, beta: float, min_size: int) -> list[list[int]]:
    """The parties' index lists of the first draw that gives every party ``min_size`` samples (the reference's
    retry loop); raises ValueError after ``MAX_DIRICHLET_TRIES`` draws."""
    parties: list[list[int]] = [[] for _ in range(n_parties)]
    tries = 0
    while min(len(party) for party in parties) < min_size:
        if tries == MAX_DIRICHLET_TRIES:
            raise ValueError(
                f"no Dirichlet draw gave every one of num_parties={n_parties} parties min_size="
                f"{min_size} samples in {tries} tries (beta={beta}); lower min_size or "
                f"num_parties, or raise beta"
            )
        tries += 1
        parties = _draw_split(y, n_parties, beta)
    return parties


def _draw_split(y: np.ndarray, n_parties: int, beta: float) -> list[list[int]]:
    """One draw of the reference: each class's shuffled indices cut among the parties by Dirichlet proportions."""
    share = y.shape[0] / n_parties
    parties: list[list[int]] = [[] for _ in range(n_parties)]
    for k in range(int(y.max()) + 1):
        idx_k = np.where(y == k)[0]
        np.random.shuffle(idx_k)
        proportions = np.random.dirichlet(np.repeat(beta, n_parties))
        # the reference gives nothing more to a party that already holds its share of the samples
        proportions = np.array([p * (len(party) < share) for p, party in zip(proportions, parties)])
        proportions = proportions / proportions.sum()
        cuts = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
        parties = [party + piece.tolist() for party, piece in zip(parties, np.split(idx_k, cuts))]
    return parties


def iid_partition(num_samples: int, num_parties: int, seed: int) -> list[np.ndarray]:
    """Homogeneous split as in the reference: ``np.array_split(np.random.permutation(num_samples), num_parties)``
    after ``np.random.seed(seed)``. Party sizes differ by at most one. The global numpy RNG state is restored."""
    n = _check_positive_int(num_samples, "num_samples", "pass len(dataset)")
    n_parties = _check_positive_int(num_parties, "num_parties", "pass the number of sites (e.g. the simulator's -n)")
    if n_parties > n:
        raise ValueError(f"num_parties={n_parties} is larger than num_samples={n}; every party needs a sample")
    with _seeded_global_rng(seed):
        idxs = np.random.permutation(n)
    return [part.astype(np.int64) for part in np.array_split(idxs, n_parties)]


def partition_indices(
    labels, num_parties: int, method: str = "dirichlet", beta: float = 0.5, seed: int = 0
) -> list[np.ndarray]:
    """Dispatch: ``method="dirichlet"`` -> :func:`dirichlet_partition` (uses ``beta``), ``"iid"`` ->
    :func:`iid_partition` (ignores ``beta``)."""
    if method == "dirichlet":
        return dirichlet_partition(labels, num_parties, beta, seed)
    if method == "iid":
        return iid_partition(len(_check_labels(labels)), num_parties, seed)
    raise ValueError(f"method must be one of {list(PARTITION_METHODS)}, got {method!r}")


_SITE_SUFFIX = re.compile(r"[-_](\d+)$")


def site_index(site_name: str, num_sites: int) -> int:
    """Map an NVFlare site name to a 0-based party index: ``site-1`` ... ``site-N`` -> 0 ... N-1.

    Any name ending in ``-<int>`` or ``_<int>`` is accepted (1-based). Raises ValueError for other names or when the
    number is outside 1..num_sites.
    """
    n = _check_positive_int(num_sites, "num_sites", "it must equal the simulator's -n (number of clients)")
    expected = f"expected site names 'site-1' ... 'site-{n}' (any name ending in -<k> or _<k>, 1 <= k <= {n})"
    match = _SITE_SUFFIX.search(str(site_name))
    if match is None:
        raise ValueError(f"site_name {site_name!r} has no numeric suffix; {expected}")
    k = int(match.group(1))
    if not 1 <= k <= n:
        raise ValueError(
            f"site_name {site_name!r} is out of range for num_sites={n}; {expected}. "
            f"num_sites must match the simulator's -n (or the number of sites in the project)"
        )
    return k - 1


def proportional_test_split(train_labels_per_site: list, test_labels, seed: int) -> list[np.ndarray]:
    """Split a test set among sites with the class proportions of their training shards.

    For each class k, the test images of class k are shuffled (``np.random.default_rng(seed)``, classes in order) and
    cut like the Dirichlet split cuts a class: site j's share is ``p_j = n_jk / Σ_i n_ik`` (n_jk: site j's training
    images of class k) and the pieces end at ``int(cumsum(p) · m_k)`` (m_k: test images of class k), so every test
    image goes to exactly one site and site j gets ``p_j · m_k`` images of the class up to rounding. A class that no
    site trained on is shared evenly. Returns one sorted int64 index array per site (possibly empty). The training
    shards are inputs only: they and the global numpy RNG stay untouched.

    Example: shares (½, ¼, ¼) of 10 test images cut at int(5), int(7.5) → 5, 2 and 3 images.
    """
    y = _check_labels(test_labels)
    num_sites = len(train_labels_per_site)
    if num_sites == 0:
        raise ValueError("train_labels_per_site must hold one label array per site, got none")
    num_classes = max([int(y.max()) + 1] + [int(np.max(s)) + 1 for s in train_labels_per_site if len(s)])
    train_counts = np.stack(
        [np.bincount(np.asarray(s, dtype=np.int64), minlength=num_classes) for s in train_labels_per_site]
    )  # [sites, classes]
    rng = np.random.default_rng(seed)
    pieces: list[list[np.ndarray]] = [[] for _ in range(num_sites)]
    for k in range(num_classes):
        idx_k = np.where(y == k)[0]
        rng.shuffle(idx_k)
        counts = train_counts[:, k]
        shares = counts / counts.sum() if counts.sum() > 0 else np.full(num_sites, 1.0 / num_sites)
        cuts = (np.cumsum(shares) * len(idx_k)).astype(int)[:-1]
        for j, piece in enumerate(np.split(idx_k, cuts)):
            pieces[j].append(piece)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in pieces]


def check_site_shards(site_names, num_sites: int) -> None:
    """Raise ValueError, naming the sites and the fix, unless the sites take distinct shards that cover all
    ``num_sites`` shards of the partition (:func:`site_index` maps each site to its shard)."""
    n = _check_positive_int(num_sites, "num_sites", "it must equal the simulator's -n (number of clients)")
    sites = sorted(site_names)
    fix = (
        f"run exactly {n} sites named site-1 ... site-{n} (the simulator's -n {n}, or -c with names ending in "
        f"-1 ... -{n}), or set num_sites to the number of sites"
    )
    shard_of = {}
    for site in sites:
        try:
            shard_of[site] = site_index(site, n) + 1
        except ValueError as e:
            raise ValueError(f"{e}; {fix}") from None
    by_shard: dict = {}
    for site, shard in shard_of.items():
        by_shard.setdefault(shard, []).append(site)
    shared = {k: v for k, v in sorted(by_shard.items()) if len(v) > 1}
    if shared:
        listed = "; ".join(f"{' and '.join(v)} take shard {k}" for k, v in shared.items())
        raise ValueError(
            f"sites train the same data: {listed} (a site's shard is the number at the end of its name); {fix}"
        )
    missing = sorted(set(range(1, n + 1)) - set(by_shard))
    if missing:
        raise ValueError(
            f"the data is split over num_sites={n} sites but only {len(sites)} take part "
            f"({', '.join(sites)}): shard(s) {missing} would never be trained; {fix}"
        )
