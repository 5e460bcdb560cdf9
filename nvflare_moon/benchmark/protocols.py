"""The benchmark's protocols, as data: what every run shares (:class:`Settings`) and which runs there are.

A run is one method variant (a method of :data:`~nvflare_moon.benchmark.methods.METHODS` with optional arguments) at
one seed and one Dirichlet β. Runs with the same specification are the same run whatever protocol asks for them, so
protocols written to the same output folder share them (``heterogeneity`` and ``ablation`` reuse ``quick``'s MOON and
FedAvg at β = 0.5, seed 0).
"""

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..core.runtime import resolve_device
from ..core.validation import check_choice, check_number
from ..data import DATASETS


@dataclass(frozen=True)
class Settings:
    """What every run of a protocol shares; the defaults are the MOON paper's CIFAR-10 settings.

    ``threads`` is the simulator's ``-t``; None runs one worker per site, so that every client process lives for the
    whole job (no process start or data reload per task). ``solo_epochs`` is SOLO's epochs per site; None gives it the
    federated methods' local epochs per site, ``rounds × local_epochs``.
    """

    dataset: str = "cifar10"
    num_sites: int = 10
    rounds: int = 100
    local_epochs: int = 10
    arch: str = "simple_cnn"
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-5
    device: str = "auto"
    threads: Optional[int] = None
    solo_epochs: Optional[int] = None

    @property
    def simulator_threads(self) -> int:
        return self.num_sites if self.threads is None else self.threads

    @property
    def solo_epochs_per_site(self) -> int:
        return self.rounds * self.local_epochs if self.solo_epochs is None else self.solo_epochs


@dataclass(frozen=True)
class Variant:
    """A registered method with arguments of its own, e.g. ``Variant("moon_l2", (("mu", 0.1),))``."""

    method: str
    args: Tuple[Tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return self.method + "".join(f"-{key}{format_value(value)}" for key, value in self.args)


def format_value(value: Any) -> str:
    """A method argument as run ids and labels show it: ``0.1``, ``5``, ``l2``."""
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class RunSpec:
    """One run: a variant at a seed (network initialisation, partition and batch order) and a β, under settings."""

    variant: Variant
    seed: int
    beta: float
    settings: Settings

    @property
    def run_id(self) -> str:
        return f"{self.variant.name}-beta{self.beta:g}-seed{self.seed}"

    def fingerprint(self) -> Dict[str, Any]:
        """Everything that determines the run's result; a finished run is reused only if this is equal."""
        return {
            "method": self.variant.method,
            "method_args": dict(self.variant.args),
            "seed": self.seed,
            "beta": self.beta,
            "settings": asdict(self.settings),
        }


@dataclass(frozen=True)
class Protocol:
    """A named set of runs: every variant at every β and seed, plus ``extra_seeds`` for some methods."""

    name: str
    description: str
    settings: Settings
    variants: Tuple[Variant, ...]
    betas: Tuple[float, ...] = (0.5,)
    seeds: Tuple[int, ...] = (0,)
    extra_seeds: Tuple[Tuple[str, Tuple[int, ...]], ...] = field(default=())

    def runs(self, methods: Optional[Sequence[str]] = None) -> List[RunSpec]:
        """The protocol's runs, restricted to ``methods`` when given, in a stable order (variant, β, seed).

        ``extra_seeds`` is keyed by a method (all its variants) or by one variant's name.
        """
        extra = dict(self.extra_seeds)
        runs = []
        for variant in self.variants:
            if methods is not None and variant.method not in methods:
                continue
            more = extra.get(variant.name, extra.get(variant.method, ()))
            seeds = tuple(self.seeds) + tuple(s for s in more if s not in self.seeds)
            runs += [RunSpec(variant, seed, beta, self.settings) for beta in self.betas for seed in seeds]
        return runs


ALL_METHODS = ("fedavg", "fedprox", "scaffold", "solo", "moon", "fedssc", "fedsiam_da")

# Chosen from a measured MOON round on this 2-core machine; see docs/benchmark.md ("The quick protocol").
QUICK = Settings(local_epochs=2, rounds=25)
# Enough to rank options; the references are quick's own runs at round 10 (the same computation, cut short).
QUICK_10_ROUNDS = replace(QUICK, rounds=10)

PROTOCOLS: Dict[str, Protocol] = {
    "quick": Protocol(
        name="quick",
        description="CIFAR-10, 10 sites, β = 0.5, simple-CNN, the paper's optimiser; E and rounds cut to fit a 2-core "
        "CPU (about 15 minutes per MOON run). All methods at seed 0, MOON and FedAvg also at seeds 1 and 2.",
        settings=QUICK,
        variants=tuple(Variant(m) for m in ALL_METHODS),
        extra_seeds=(("fedavg", (1, 2)), ("moon", (1, 2))),
    ),
    "paper": Protocol(
        name="paper",
        description="The MOON paper's CIFAR-10 settings: 10 sites, β = 0.5, E = 10, 100 rounds, simple-CNN; SOLO 300 "
        "epochs. Every method at seed 0; the paper's Table 1 methods (MOON and the baselines) also at seeds 1 and 2, "
        "as the paper reports 3 trials; SCAFFOLD with momentum 0 (NIID-Bench's default) at seed 0 as a second "
        "reading. Meant for a GPU (device 'auto' puts every site and its data on it).",
        settings=Settings(solo_epochs=300),
        variants=tuple(Variant(m) for m in ALL_METHODS + ("scaffold_momentum0",)),
        extra_seeds=tuple((m, (1, 2)) for m in ("fedavg", "fedprox", "scaffold", "solo", "moon")),
    ),
    "heterogeneity": Protocol(
        name="heterogeneity",
        description="The quick settings at Dirichlet β ∈ {0.1, 0.5, 5} (the paper's Table 4 sweep), MOON and FedAvg.",
        settings=QUICK,
        variants=(Variant("fedavg"), Variant("moon")),
        betas=(0.1, 0.5, 5.0),
    ),
    "ablation": Protocol(
        name="ablation",
        description="MOON against the ℓ2 representation penalty μ·mean‖z − z_glob‖₂ (the paper's Table 5) on the "
        "quick settings, the penalty at μ ∈ {0.1, 1, 5}; FedAvg as the reference.",
        settings=QUICK,
        variants=(Variant("fedavg"), Variant("moon"))
        + tuple(Variant("moon_l2", (("mu", mu),)) for mu in (0.1, 1.0, 5.0)),
    ),
    # Issue 15: NVFlare's compression and privacy filters on our methods, one setting each; 10 rounds, so that the
    # references are quick's own runs at round 10 (docs/deployment.md "Privacy and bandwidth").
    "privacy_bandwidth": Protocol(
        name="privacy_bandwidth",
        description="The quick settings cut to 10 rounds, seed 0: float16 updates (NVFlare's quantization filters) "
        "for FedAvg and MOON, and MOON with each of NVFlare's privacy filters at one setting: PercentilePrivacy and "
        "SVTPrivacy at NVFlare's defaults, ExcludeVars on the projection's output layer.",
        settings=QUICK_10_ROUNDS,
        variants=tuple(Variant(m, (("quantization", "float16"),)) for m in ("fedavg", "moon"))
        + tuple(Variant(m) for m in ("moon_percentile_privacy", "moon_svt_privacy", "moon_exclude_vars")),
    ),
    # Issue 16: FedSiam-DA's readings of its paper, μ × history branch, then the parameters-only dual-aggregation
    # vector; 10 rounds rank them (docs/fedssc_fedsiam.md). FedAvg's reference is quick's, at round 10.
    "fedsiam_da_options": Protocol(
        name="fedsiam_da_options",
        description="FedSiam-DA on the quick settings cut to 10 rounds: μ ∈ {0.1, 0.01} × the history term on the "
        "projection or the predictor, the dual aggregation's cosine on the parameters only at μ = 0.01, μ ∈ {0.03, "
        "0.3} on the projection, and the best setting (μ = 0.01 on the projection) at seeds 1 and 2.",
        settings=QUICK_10_ROUNDS,
        # in the order they were run: the parameters-only vector at the best μ of the first two runs, then the rest
        variants=tuple(
            Variant("fedsiam_da", (("mu", mu), ("history_branch", branch)))
            for mu, branch in ((0.1, "predictor"), (0.01, "projection"))
        )
        + (Variant("fedsiam_da", (("mu", 0.01), ("history_branch", "projection"), ("cosine_vector", "parameters"))),)
        + tuple(
            Variant("fedsiam_da", (("mu", mu), ("history_branch", branch)))
            for mu, branch in ((0.01, "predictor"), (0.03, "projection"), (0.3, "projection"), (0.1, "projection"))
        ),
        extra_seeds=(("fedsiam_da-mu0.01-history_branchprojection", (1, 2)),),
    ),
    # K from quick's per-round curves: MOON's deficit is largest in rounds 1-3 and below 4 points from round 4 on
    # (docs/practical_options.md). Plain MOON and FedAvg are quick's runs.
    "practical": Protocol(
        name="practical",
        description="The MOON article's practical options on the quick settings: cold start (μ = 0 for the first "
        "K ∈ {3, 5} rounds) at 3 seeds against MOON and FedAvg; noise on h before the projection head at σ ∈ "
        "{0.1, 0.5} (relative to ‖h‖) and the light history (previous projection heads only) at seed 0.",
        settings=QUICK,
        variants=(Variant("fedavg"), Variant("moon"))
        + tuple(Variant("moon_cold_start", (("mu_off_rounds", k),)) for k in (3, 5))
        + tuple(Variant("moon_feature_noise", (("feature_noise_std", s),)) for s in (0.1, 0.5))
        + (Variant("moon_light_history"),),
        extra_seeds=(("fedavg", (1, 2)), ("moon", (1, 2)), ("moon_cold_start", (1, 2))),
    ),
    # Issue 39: what DP-SGD costs MOON (docs/differential_privacy.md); the run without DP is quick's.
    "dp": Protocol(
        name="dp",
        description="MOON on the quick settings, seed 0, without DP and with DP-SGD at a target ε ∈ {1, 3, 8} per "
        "site (δ = 1e-5, clipping norm C = 1, σ calibrated by each site for the 25 rounds); the records hold every "
        "site's ε spent after every round.",
        settings=QUICK,
        variants=(Variant("moon"),) + tuple(Variant("moon", (("dp_target_epsilon", eps),)) for eps in (1.0, 3.0, 8.0)),
    ),
}


def customised(
    protocol: Protocol, seeds: Optional[Sequence[int]] = None, betas: Optional[Sequence[float]] = None, **settings
) -> Protocol:
    """``protocol`` with some :class:`Settings` fields replaced (smoke tests, shorter runs); None keeps the protocol's
    value. ``seeds`` replaces every method's seeds, extra seeds included.

    Example: ``customised(PROTOCOLS["quick"], dataset="synthetic", rounds=2, num_sites=3, seeds=[0])``.
    """
    changes = {name: value for name, value in settings.items() if value is not None}
    unknown = sorted(set(changes) - {f.name for f in fields(Settings)})
    if unknown:
        raise ValueError(f"unknown settings {unknown}; settings are {[f.name for f in fields(Settings)]}")
    for name in ("rounds", "local_epochs", "num_sites", "threads", "solo_epochs", "batch_size"):
        if name in changes:
            check_number(name, changes[name], low=1, integer=True)
    if "lr" in changes:
        check_number("lr", changes["lr"], low=0, low_inclusive=False)
    if "dataset" in changes:
        check_choice("dataset", changes["dataset"], DATASETS)
    if "device" in changes:
        resolve_device(changes["device"])
    result = replace(protocol, settings=replace(protocol.settings, **changes))
    if seeds is not None:
        for seed in seeds:
            check_number("seed", seed, low=0, integer=True)
        result = replace(result, seeds=tuple(seeds), extra_seeds=())
    if betas is not None:
        for beta in betas:
            check_number("beta", beta, low=0, low_inclusive=False)
        result = replace(result, betas=tuple(betas))
    return result
