"""Every aggregator of ours rejects a bad site update (NaN, Inf, a missing key, a wrong shape) with a warning naming
the site, and aggregates the honest updates alone. The same end to end on a POC federation: test_deploy_poc.py."""

import inspect
import logging

import numpy as np
import pytest
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.abstract.model import make_model_learnable
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.app_constant import AlgorithmConstants, AppConstants

import nvflare_moon.server as server

from .bad_update_executor import spoil

HONEST = {"conv.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "fc.bias": np.ones(2, dtype=np.float32)}


def scaffold_meta(params):
    return {AlgorithmConstants.SCAFFOLD_CTRL_DIFF: {k: np.zeros_like(v) for k, v in params.items()}}


# aggregator -> (how to build it, the extra meta an honest client of its method sends)
AGGREGATORS = {
    server.WeightedFedAvgAggregator: (lambda: server.WeightedFedAvgAggregator(), lambda params: {}),
    server.DualAggregator: (lambda: server.DualAggregator(), lambda params: {}),
    server.PrototypeSharingAggregator: (lambda: server.PrototypeSharingAggregator(num_classes=2), lambda p: {}),
    server.ScaffoldAggregator: (lambda: server.ScaffoldAggregator(num_sites=2), scaffold_meta),
}


def update(site, params, extra_meta):
    return FLModel(params=params, meta={"client_name": site, "num_samples": 10, **extra_meta(params)})


def test_every_aggregator_of_ours_is_covered_here():
    ours = {c for _, c in inspect.getmembers(server, inspect.isclass) if issubclass(c, ModelAggregator)}
    assert ours == set(AGGREGATORS), "add the new aggregator to AGGREGATORS"


@pytest.mark.parametrize("kind", ["nan", "inf", "missing_key", "wrong_shape"])
@pytest.mark.parametrize("aggregator", list(AGGREGATORS), ids=lambda c: c.__name__)
def test_a_bad_update_is_rejected_with_a_warning_naming_the_site(aggregator, kind, caplog):
    make, extra_meta = AGGREGATORS[aggregator]
    agg = make()
    assert agg.accept_model(update("site-1", dict(HONEST), extra_meta))
    with caplog.at_level(logging.WARNING):
        assert not agg.accept_model(update("site-2", spoil(HONEST, kind), extra_meta))
    assert "rejected the update of site-2" in caplog.text
    result = agg.aggregate_model()
    assert list(result.meta["site_weights"]) == ["site-1"]
    for name, value in HONEST.items():
        np.testing.assert_allclose(result.params[name], value)


@pytest.mark.parametrize("kind", ["missing_key", "wrong_shape"])
def test_a_malformed_first_update_does_not_get_the_honest_ones_rejected(kind):
    # updates are checked against the round's global model, which NVFlare's controller keeps in the run context
    agg = server.WeightedFedAvgAggregator()
    agg.fl_ctx = FLContext()
    agg.fl_ctx.set_prop(AppConstants.GLOBAL_MODEL, make_model_learnable(dict(HONEST), {}), private=True, sticky=False)
    assert not agg.accept_model(update("site-2", spoil(HONEST, kind), lambda p: {}))
    assert agg.accept_model(update("site-1", dict(HONEST), lambda p: {}))
    assert list(agg.aggregate_model().meta["site_weights"]) == ["site-1"]
