"""MOON's executor with an unusable state file: a warning, a round without the contrastive term, no crash, and the
file kept aside (a site's state is never deleted)."""

import logging
import os

import pytest
import torch

from nvflare_moon.core.specs import DataSpec
from nvflare_moon.core.state import SiteStateStore
from nvflare_moon.executors import MoonExecutor
from nvflare_moon.models import Network

from .executor_harness import site_context

SYNTHETIC = DataSpec(dataset="synthetic")


def moon_executor():
    executor = MoonExecutor(model=Network(seed=0), data=SYNTHETIC)
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
    run_round(ctx, 0, seed=0)
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
    other = MoonExecutor(model=Network(seed=0, out_dim=128), data=SYNTHETIC)
    other._net = other.model
    other.make_objective(0, ctx)
    other.after_training(0, ctx)
    state = tmp_path / "job-1" / "nvflare_moon" / "moon_state.pt"
    original = state.read_bytes()
    with caplog.at_level(logging.WARNING):
        assert moon_executor().make_objective(1, ctx).previous_models == []
    assert "do not match this job's network" in caplog.text
    (kept,) = [f for f in os.listdir(state.parent) if ".unusable-other-network-" in f]
    assert (state.parent / kept).read_bytes() == original  # set aside byte for byte, not overwritten
    assert not state.exists()
    assert f"site-1: state file {state} cannot be used" in caplog.text and str(state.parent / kept) in caplog.text


def test_two_jobs_on_one_site_never_share_state(tmp_path):
    run_round(site_context(tmp_path, job="job-1"), 0, seed=0)
    assert moon_executor().make_objective(1, site_context(tmp_path, job="job-2")).previous_models == []


def run_round(ctx, round_number, seed):
    """One round at the site in a new process: load the state, 'train' (the weights of Network(seed)), save."""
    executor = moon_executor()
    executor.make_objective(round_number, ctx)
    executor._net.load_state_dict(Network(seed=seed).state_dict())
    executor.after_training(round_number, ctx)


def assert_same_weights(model, reference):
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)


def test_a_round_run_again_uses_the_upload_before_it_not_its_own(tmp_path, caplog):
    """A site that trained round 1 and saved it, when round 1 runs again (a job continued after a failure), takes its
    round-0 upload as the previous model, never the round-1 upload that the round is about to replace."""
    ctx = site_context(tmp_path)
    run_round(ctx, 0, seed=10)
    run_round(ctx, 1, seed=11)
    with caplog.at_level(logging.INFO):
        (previous,) = moon_executor().make_objective(1, ctx).previous_models
    assert_same_weights(previous, Network(seed=10))
    assert "ignoring the stored uploads of rounds [1]" in caplog.text
    (previous,) = moon_executor().make_objective(2, ctx).previous_models
    assert_same_weights(previous, Network(seed=11))


def test_a_continuation_job_takes_the_failed_jobs_state_and_keeps_its_own_copy(tmp_path, caplog):
    run_round(site_context(tmp_path, job="failed"), 0, seed=10)
    continuation = MoonExecutor(model=Network(seed=0), data=SYNTHETIC, resume_from_job_id="failed")
    continuation._net = continuation.model
    ctx = site_context(tmp_path, job="continuation")
    with caplog.at_level(logging.INFO):
        (previous,) = continuation.make_objective(1, ctx).previous_models
    assert_same_weights(previous, Network(seed=10))
    assert "continuing job failed: took its moon_state state, saved in round 0" in caplog.text
    copy = SiteStateStore(str(tmp_path / "continuation" / "nvflare_moon"), "moon_state", "site-1", "continuation")
    assert copy.load()["round"] == 0  # the failed job's file is untouched; a later continuation finds the copy
    assert SiteStateStore(str(tmp_path / "failed" / "nvflare_moon"), "moon_state", "site-1", "failed").load()
    # a site that saved nothing in the failed job (its own workspace) trains the round without the term
    other_site = site_context(tmp_path / "site-2-workspace", site="site-2", job="continuation")
    assert continuation.make_objective(1, other_site).previous_models == []
    assert "site-2 has no moon_state state from job failed" in caplog.text


def test_resume_from_job_id_is_checked():
    with pytest.raises(ValueError, match="resume_from_job_id must be a job id"):
        MoonExecutor(model=Network(seed=0), data=SYNTHETIC, resume_from_job_id="")
