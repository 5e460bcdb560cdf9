"""NVFlare's FedAvg controller with seeded partial participation (see :mod:`nvflare_moon.core.sampling`)."""

from nvflare.app_common.workflows.fedavg import FedAvg

from ..core.sampling import check_sample_fraction, sample_sites
from ..core.validation import check_number


class SampledFedAvg(FedAvg):
    """FedAvg that trains ``round(N·sample_fraction)`` of the N connected sites per round, drawn from
    (``sample_seed``, round). NVFlare's own ``FedAvg(num_clients=k)`` draws with the unseeded global RNG.

    The aggregator sees only the sampled sites, so weighted averaging normalises over them. Every site must be
    connected when the round starts (the job's ``min_clients`` = the number of sites), or the draw changes.

    Args:
        sample_fraction: share of the sites trained per round, in (0, 1].
        sample_seed: seed of the draw.
        *args, **kwargs: NVFlare ``FedAvg`` arguments (``num_clients`` is ignored: the fraction decides).
    """

    _always_serialize_args = ("sample_fraction", "sample_seed")  # exported jobs show the draw's settings

    def __init__(self, *args, sample_fraction: float = 1.0, sample_seed: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        check_sample_fraction(sample_fraction)
        check_number("sample_seed", sample_seed, low=0, integer=True)
        self.sample_fraction = sample_fraction
        self.sample_seed = sample_seed

    def sample_clients(self, num_clients=None):
        sites = [client.name for client in self.engine.get_clients()]
        chosen = sample_sites(sites, self.sample_fraction, self.sample_seed, self.current_round)
        self.info(f"round {self.current_round}: sampled {len(chosen)} of {len(sites)} sites: {chosen}")
        return chosen
