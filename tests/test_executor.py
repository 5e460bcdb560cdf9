"""FedAvgExecutor.execute, which every method runs: each reply it gives a server, on a tiny network and in-memory data
with a site's FLContext (no simulator)."""

import dataclasses
import logging

import numpy as np
import torch
from nvflare.apis.fl_constant import FLMetaKey, ReturnCode
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import ParamsType

from nvflare_moon.core.rounds import FedAvgRound
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.executors import FedAvgExecutor

from .executor_harness import global_weights, run_task, site_context, started, tiny_dataset, tiny_net

LABELS = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1]  # 14 samples: 3 batches of 4, the last 2 dropped
TRAINING = TrainingSpec(local_epochs=2, batch_size=4, lr=0.1, momentum=0.9, weight_decay=0.0, device="cpu")


def fedavg_site(tmp_path, executor_class=FedAvgExecutor, training=TRAINING):
    executor = executor_class(model=tiny_net(seed=7), data=DataSpec(dataset=tiny_dataset(LABELS)), training=training)
    ctx = site_context(tmp_path)
    return started(executor, ctx), ctx


def test_a_round_returns_the_trained_weights_the_sample_count_and_the_steps(tmp_path):
    executor, ctx = fedavg_site(tmp_path)
    sent = global_weights()
    code, reply = run_task(executor, ctx, sent, round_number=0)
    assert code == ReturnCode.OK
    assert reply.params_type == ParamsType.FULL and set(reply.params) == set(sent)
    assert not np.array_equal(reply.params["l3.weight"], sent["l3.weight"])  # trained from the global weights
    assert reply.meta["num_samples"] == 14 and reply.meta[FLMetaKey.NUM_STEPS_CURRENT_ROUND] == 2 * 3
    assert set(reply.metrics) == {"train_ce", "train_loss"} and np.isfinite(reply.metrics["train_ce"])


def test_training_starts_from_the_received_global_weights(tmp_path):
    # the site's own initial weights (seed 7) must not matter: two sites given the same global model agree
    a, ctx_a = fedavg_site(tmp_path / "a")
    b = FedAvgExecutor(model=tiny_net(seed=8), data=DataSpec(dataset=tiny_dataset(LABELS)), training=TRAINING)
    ctx_b = site_context(tmp_path / "b")
    started(b, ctx_b)
    _, from_a = run_task(a, ctx_a, global_weights(seed=3), round_number=2)
    _, from_b = run_task(b, ctx_b, global_weights(seed=3), round_number=2)
    for name in from_a.params:
        np.testing.assert_array_equal(from_a.params[name], from_b.params[name])


def test_every_round_starts_a_new_optimiser(tmp_path):
    """Momentum is not carried across rounds (MOON's reference restarts SGD every round): a site that trained round 0
    answers round 1 exactly as a fresh process given the same global model does."""
    lived_on, ctx = fedavg_site(tmp_path / "a")
    assert run_task(lived_on, ctx, global_weights(seed=1), round_number=0)[0] == ReturnCode.OK
    _, kept = run_task(lived_on, ctx, global_weights(seed=2), round_number=1)
    fresh, fresh_ctx = fedavg_site(tmp_path / "b")
    _, restarted = run_task(fresh, fresh_ctx, global_weights(seed=2), round_number=1)
    for name in kept.params:
        np.testing.assert_array_equal(kept.params[name], restarted.params[name])


class DivergingRound(FedAvgRound):
    """Its loss is NaN from the first step, as with a learning rate far too high."""

    def start(self, round_number, meta=None):
        def nan_loss(out, x, y):
            loss = out.logits.sum() * float("nan")
            return loss, {"ce": loss}

        return nan_loss

    def finish(self):
        raise AssertionError("a diverged round must not be persisted")


class DivergingExecutor(FedAvgExecutor):
    def make_round(self, fl_ctx):
        return DivergingRound()


def test_a_diverged_round_is_an_execution_exception_that_says_so(tmp_path, caplog):
    executor, ctx = fedavg_site(tmp_path, DivergingExecutor, dataclasses.replace(TRAINING, lr=0.5))
    with caplog.at_level(logging.ERROR):
        code, _ = run_task(executor, ctx, global_weights(), round_number=4)
    assert code == ReturnCode.EXECUTION_EXCEPTION
    assert "site-1: training diverged in round 4" in caplog.text and "lower lr=0.5" in caplog.text


def test_a_model_that_does_not_fit_is_refused_naming_the_keys(tmp_path, caplog):
    executor, ctx = fedavg_site(tmp_path)
    sent = global_weights()
    sent["extra.weight"] = sent.pop("l3.bias")
    with caplog.at_level(logging.ERROR):
        code, _ = run_task(executor, ctx, sent)
    assert code == ReturnCode.EXECUTION_EXCEPTION
    assert "does not match the local network" in caplog.text
    assert "missing ['l3.bias']" in caplog.text and "unexpected ['extra.weight']" in caplog.text


def test_a_task_it_does_not_know_is_answered_task_unknown(tmp_path):
    executor, ctx = fedavg_site(tmp_path)
    code, _ = run_task(executor, ctx, global_weights(), task_name="no_such_task")
    assert code == ReturnCode.TASK_UNKNOWN


def test_an_aborted_round_is_answered_task_aborted_without_training(tmp_path):
    executor, ctx = fedavg_site(tmp_path)
    before = {k: v.clone() for k, v in executor.model.state_dict().items()}
    signal = Signal()
    signal.trigger("the server ended the job")
    code, _ = run_task(executor, ctx, global_weights(seed=7), abort_signal=signal)
    assert code == ReturnCode.TASK_ABORTED
    for name, value in executor.model.state_dict().items():
        torch.testing.assert_close(value, before[name])  # no step was taken
