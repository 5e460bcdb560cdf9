"""Partial participation: the seeded draw of sites per round, and weights normalised over the sampled sites."""

from types import SimpleNamespace

import numpy as np
import pytest
from nvflare.app_common.abstract.fl_model import FLModel

from nvflare_moon.core.sampling import sample_sites, sites_per_round
from nvflare_moon.recipes import FedProxRecipe, MoonRecipe
from nvflare_moon.server import SampledFedAvg, WeightedFedAvgAggregator

SITES = [f"site-{k}" for k in range(1, 101)]


def test_each_round_draws_round_n_times_fraction_distinct_sites():
    for round_number in range(5):
        chosen = sample_sites(SITES, 0.2, seed=0, round_number=round_number)
        assert len(chosen) == len(set(chosen)) == 20 and set(chosen) <= set(SITES)
    assert sites_per_round(10, 0.25) == 2  # round(2.5): to even
    assert sites_per_round(7, 0.5) == 4  # round(3.5): to even
    assert sites_per_round(100, 0.2) == 20 and sites_per_round(10, 0.16) == 2 and sites_per_round(3, 1.0) == 3


def test_the_draw_is_reproducible_from_seed_and_round_and_ignores_the_order_of_the_sites():
    shuffled = list(np.random.default_rng(5).permutation(SITES))
    schedule = [sample_sites(SITES, 0.2, seed=3, round_number=r) for r in range(10)]
    assert schedule == [sample_sites(shuffled, 0.2, seed=3, round_number=r) for r in range(10)]
    assert len({tuple(s) for s in schedule}) == 10, "rounds draw different sites"
    assert schedule != [sample_sites(SITES, 0.2, seed=4, round_number=r) for r in range(10)]


def test_sites_are_listed_in_natural_order_and_every_site_gets_drawn():
    chosen = sample_sites(SITES, 0.2, seed=0, round_number=0)
    assert chosen == sorted(chosen, key=lambda s: int(s.split("-")[1]))
    drawn = {s for r in range(50) for s in sample_sites(SITES, 0.2, seed=0, round_number=r)}
    assert drawn == set(SITES)
    assert sample_sites(SITES[:3], 1.0, seed=0, round_number=7) == SITES[:3]


@pytest.mark.parametrize("fraction, message", [(0.0, "sample_fraction must be > 0"), (1.5, "<= 1"), (0.01, "no site")])
def test_bad_fractions_are_refused_by_name(fraction, message):
    with pytest.raises(ValueError, match=message):
        sites_per_round(10, fraction)


def test_controller_trains_the_seeded_sample_of_the_connected_sites():
    controller = SampledFedAvg(sample_fraction=0.2, sample_seed=3, num_rounds=4)
    controller.engine = SimpleNamespace(get_clients=lambda: [SimpleNamespace(name=s) for s in reversed(SITES)])
    controller.current_round = 2
    assert controller.sample_clients(100) == sample_sites(SITES, 0.2, seed=3, round_number=2)


def test_weights_are_normalised_over_the_sampled_sites_only():
    # of ten sites, site-2, site-5 and site-9 answer with 200, 500 and 900 samples: 1600 in all
    agg = WeightedFedAvgAggregator()
    for site, n in (("site-2", 200), ("site-5", 500), ("site-9", 900)):
        agg.accept_model(FLModel(params={"w": np.array([float(n)])}, meta={"client_name": site, "num_samples": n}))
    result = agg.aggregate_model()
    assert result.meta["site_weights"] == pytest.approx({"site-2": 0.125, "site-5": 0.3125, "site-9": 0.5625})
    np.testing.assert_allclose(result.params["w"], [687.5])  # (200·200 + 500·500 + 900·900) / 1600


def test_recipes_sample_only_with_every_site_present_and_a_valid_fraction():
    with pytest.raises(ValueError, match="min_clients=100"):
        MoonRecipe(min_clients=20, num_sites=100, sample_fraction=0.2)
    with pytest.raises(ValueError, match="sample_fraction"):
        MoonRecipe(min_clients=10, sample_fraction=1.2)
    with pytest.raises(ValueError, match="mu"):
        FedProxRecipe(mu=0.0)
