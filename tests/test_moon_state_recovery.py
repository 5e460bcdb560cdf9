"""MOON's executor with an unusable state file: a warning, a round without the contrastive term, no crash, and the
file kept aside (a site's state is never deleted)."""

import logging
import os
from types import SimpleNamespace

import torch

from nvflare.apis.fl_constant import ReservedKey
from nvflare.apis.fl_context import FLContext

from nvflare_moon.executors import MoonExecutor
from nvflare_moon.models import Network


def site_context(run_dir, site="site-1", job="job-1"):
    ctx = FLContext()
    workspace = SimpleNamespace(get_run_dir=lambda job_id: str(run_dir / job_id))
    engine = SimpleNamespace(get_workspace=lambda: workspace, fire_event=lambda event, ctx: None)
    for key, value in ((ReservedKey.ENGINE, engine),
                       (ReservedKey.RUN_NUM, job), (ReservedKey.IDENTITY_NAME, site)):  # fmt: skip
        ctx.set_prop(key, value, private=True, sticky=False)
    return ctx


def moon_executor():
    executor = MoonExecutor(model=Network(seed=0), dataset="synthetic")
    executor._net = executor.model
    return executor


def test_uploads_round_trip_through_the_state_file(tmp_path):
    ctx = site_context(tmp_path)
    first = moon_executor()
    assert first.make_objective(0, ctx).previous_models == []
    first.after_training(0, ctx)
    second = moon_executor()  # a new process in the simulator with -t < -n
    (previous,) = second.make_objective(1, ctx).previous_models
    assert not previous.training
    for a, b in zip(previous.parameters(), first.model.parameters()):
        assert torch.equal(a, b) and not a.requires_grad


def test_a_corrupt_state_file_gives_a_warning_and_a_round_without_the_term(tmp_path, caplog):
    ctx = site_context(tmp_path)
    executor = moon_executor()
    executor.after_training(0, ctx)
    state = tmp_path / "job-1" / "nvflare_moon" / "moon_state.pt"
    state.write_bytes(b"\x00 truncated by a crash")
    with caplog.at_level(logging.WARNING):
        objective = moon_executor().make_objective(1, ctx)
    assert objective.previous_models == []
    assert "cannot be used" in caplog.text and "without the contrastive term" in caplog.text
    kept = [f for f in os.listdir(state.parent) if ".unusable-" in f]
    assert len(kept) == 1 and (state.parent / kept[0]).read_bytes() == b"\x00 truncated by a crash"


def test_a_state_file_for_another_network_is_not_used(tmp_path, caplog):
    ctx = site_context(tmp_path)
    other = MoonExecutor(model=Network(seed=0, out_dim=128), dataset="synthetic")
    other._net = other.model
    other.after_training(0, ctx)
    with caplog.at_level(logging.WARNING):
        assert moon_executor().make_objective(1, ctx).previous_models == []
    assert "do not match this job's network" in caplog.text


def test_two_jobs_on_one_site_never_share_state(tmp_path):
    moon_executor().after_training(0, site_context(tmp_path, job="job-1"))
    assert moon_executor().make_objective(1, site_context(tmp_path, job="job-2")).previous_models == []
