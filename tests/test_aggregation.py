import logging

import numpy as np
import pytest
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import ReservedKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import FLModel

from nvflare_moon.core.aggregation import normalized_weights, update_problem, weighted_average
from nvflare_moon.server import WeightedFedAvgAggregator


def site_model(site, n, w, steps=7, loss=1.0):
    params = {"w": np.array(w, dtype=np.float32), "bn.num_batches_tracked": np.array(steps, dtype=np.int64)}
    return FLModel(params=params, metrics={"train_loss": loss}, meta={"client_name": site, "num_samples": n})


def test_weighted_average_by_sample_count():
    weights = normalized_weights([100, 300])
    np.testing.assert_allclose(weights, [0.25, 0.75])
    avg = weighted_average([{"w": np.array([1.0, 0.0])}, {"w": np.array([5.0, 4.0])}], weights)
    np.testing.assert_allclose(avg["w"], [0.25 * 1 + 0.75 * 5, 0.75 * 4])


@pytest.mark.parametrize("counts", [[100, 0], [0, 0], [100, -5], [100, float("inf")], []])
def test_weights_need_a_positive_finite_count_for_every_site(counts):
    # a site with no samples must not be averaged in with weight 0 as if it had answered
    with pytest.raises(ValueError, match="positive and finite"):
        normalized_weights(counts)


def test_integer_buffers_stay_integer():
    avg = weighted_average(
        [{"n": np.array(10, dtype=np.int64)}, {"n": np.array(13, dtype=np.int64)}], np.array([0.5, 0.5])
    )
    assert avg["n"].dtype == np.int64 and avg["n"] == 12  # 11.5 rounds to even


def test_float_dtype_is_kept():
    avg = weighted_average([{"w": np.ones(2, dtype=np.float32)}] * 2, np.array([0.5, 0.5]))
    assert avg["w"].dtype == np.float32


@pytest.mark.parametrize(
    "params, reason",
    [
        ({"w": np.array([np.nan, 1.0])}, "NaN or Inf"),
        ({"w": np.array([np.inf, 1.0])}, "NaN or Inf"),
        ({"w": np.zeros(3)}, "shape"),
        ({"v": np.zeros(2)}, "keys differ"),
        ({}, "no weights"),
    ],
)
def test_bad_updates_are_described(params, reason):
    assert reason in update_problem(params, {"w": np.zeros(2)})


def test_aggregator_weights_every_entry_and_reports_metrics():
    agg = WeightedFedAvgAggregator()
    agg.accept_model(site_model("site-1", 100, [1.0, 2.0], steps=10, loss=2.0))
    agg.accept_model(site_model("site-2", 300, [3.0, 6.0], steps=20, loss=1.0))
    result = agg.aggregate_model()
    np.testing.assert_allclose(result.params["w"], [2.5, 5.0])
    assert result.params["bn.num_batches_tracked"] == 18 and result.params["bn.num_batches_tracked"].dtype == np.int64
    assert result.metrics["train_loss"] == pytest.approx(0.25 * 2.0 + 0.75 * 1.0)
    assert result.meta["site_weights"] == {"site-1": 0.25, "site-2": 0.75}
    assert agg._updates == {}  # ready for the next round


def test_aggregator_rejects_bad_updates_with_a_warning_naming_the_site(caplog):
    agg = WeightedFedAvgAggregator()
    agg.accept_model(site_model("site-1", 100, [1.0, 2.0]))
    with caplog.at_level(logging.WARNING):
        assert not agg.accept_model(site_model("site-2", 100, [np.nan, 2.0]))
        assert not agg.accept_model(site_model("site-3", 0, [1.0, 2.0]))
    assert "site-2" in caplog.text and "NaN" in caplog.text and "site-3" in caplog.text
    result = agg.aggregate_model()
    np.testing.assert_allclose(result.params["w"], [1.0, 2.0])
    assert list(result.meta["site_weights"]) == ["site-1"]


def test_aggregator_with_no_valid_update_fails_the_round():
    agg = WeightedFedAvgAggregator()
    agg.accept_model(site_model("site-1", 100, [np.inf, 0.0]))
    with pytest.raises(RuntimeError, match="no valid update"):
        agg.aggregate_model()


def test_a_round_is_not_aggregated_once_the_job_is_ending():
    # a site's failed reply panics the job (the run's abort signal), and NVFlare's FedAvg may still ask for the
    # aggregate of the sites that answered when that reply ended the round's last task
    signal = Signal()
    fl_ctx = FLContext()
    fl_ctx.set_prop(ReservedKey.RUN_ABORT_SIGNAL, signal, private=True, sticky=True)
    agg = WeightedFedAvgAggregator()
    agg.handle_event(EventType.START_RUN, fl_ctx)
    agg.accept_model(site_model("site-1", 100, [1.0, 2.0]))
    np.testing.assert_allclose(agg.aggregate_model().params["w"], [1.0, 2.0])  # running: aggregated
    agg.accept_model(site_model("site-1", 100, [1.0, 2.0]))
    signal.trigger(True)
    with pytest.raises(RuntimeError, match="not aggregated, the job is ending"):
        agg.aggregate_model()
