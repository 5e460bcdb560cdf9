"""The continuation of a failed job (nvflare_moon.ops.continuation) built from a downloaded result, checked field by field.

The whole path (a site's job process SIGKILLed, the job failed by NVFlare, its continuation run to completion with the
site's state) runs on a POC federation in test_deploy_poc.py.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from nvflare_moon.models import Network
from nvflare_moon.ops.continuation import CHECKPOINT_NAME, last_global_model, make_continuation_job
from nvflare_moon.ops.submit import submit_token
from nvflare_moon.recipes import ScaffoldRecipe

from .federation import export_tiny_moon

ROUNDS = 5


def failed_result(tmp_path: Path, job: Path, last_round) -> Path:
    """A downloaded result as NVFlare lays it out (``job/``, ``workspace/``), whose server aggregated ``last_round``
    (None: no round) before the job failed. The meta holds numpy arrays, as FedSSC's prototypes do."""
    result = tmp_path / "download" / "failed-id"
    shutil.copytree(job, result / "job" / job.name)
    (result / "job" / job.name / ".__nvfl_sig.json").write_text("{}")  # NVFlare's signature of the submitted folder
    server = result / "workspace" / "app_server"
    server.mkdir(parents=True)
    if last_round is not None:
        meta = {"current_round": last_round, "prototypes": np.ones((10, 256), np.float32), "nr_aggregated": 2}
        torch.save({"model": Network(seed=7).state_dict(), "meta_props": meta}, server / "FL_global_model.pt")
    return result


def read(job_dir: Path, side: str) -> dict:
    return json.loads((job_dir / "app" / "config" / f"config_fed_{side}.json").read_text())


def test_the_continuation_starts_after_the_last_aggregated_round_with_its_model_and_every_sites_state(tmp_path):
    result = failed_result(tmp_path, export_tiny_moon(tmp_path / "jobs", "moon_tiny", ROUNDS), last_round=1)
    job = Path(make_continuation_job(str(result), "failed-id", str(tmp_path / "continued")))

    server = read(job, "server")
    assert server["workflows"][0]["args"]["start_round"] == 2
    assert server["workflows"][0]["args"]["num_rounds"] == ROUNDS - 2  # rounds 2, 3, 4: the job's total stays 5
    (persistor,) = [c for c in server["components"] if c["id"] == "persistor"]
    assert persistor["args"]["source_ckpt_file_full_name"] == CHECKPOINT_NAME
    assert persistor["args"]["load_weights_only"] is False  # the meta holds numpy arrays
    shipped = torch.load(job / "app" / "custom" / CHECKPOINT_NAME, weights_only=False)
    assert shipped["meta_props"]["current_round"] == 1
    np.testing.assert_array_equal(shipped["meta_props"]["prototypes"], np.ones((10, 256), np.float32))  # FedSSC's
    for name, value in Network(seed=7).state_dict().items():
        assert torch.equal(shipped["model"][name], value)

    executor = read(job, "client")["executors"][0]["executor"]
    assert executor["args"]["resume_from_job_id"] == "failed-id"
    assert executor["args"]["settings"]["args"]["mu"] == 5.0  # everything else as the job had it
    assert json.loads((job / "meta.json").read_text())["name"] == "moon_tiny-continued-from-round2"
    assert not (job / ".__nvfl_sig.json").exists()  # it would no longer match the changed folder

    # the continuation fails in turn after round 3: its own continuation runs the job's last round only
    again = failed_result(tmp_path / "again", job, last_round=3)
    job = Path(make_continuation_job(str(again), "continuation-id", str(tmp_path / "continued")))
    assert read(job, "server")["workflows"][0]["args"]["start_round"] == 4
    assert read(job, "server")["workflows"][0]["args"]["num_rounds"] == 1
    assert read(job, "client")["executors"][0]["executor"]["args"]["resume_from_job_id"] == "continuation-id"
    assert last_global_model(str(again))[1] == 3


@pytest.mark.parametrize(
    "last_round, message",
    [(None, "stopped before the server aggregated its first round"), (ROUNDS - 1, "there is nothing to continue")],
)
def test_a_job_with_nothing_to_continue_is_refused_with_the_reason(tmp_path, last_round, message):
    result = failed_result(tmp_path, export_tiny_moon(tmp_path / "jobs", "moon_tiny", ROUNDS), last_round)
    with pytest.raises(ValueError, match=message):
        make_continuation_job(str(result), "failed-id", str(tmp_path / "continued"))


def test_scaffold_continues_with_our_aggregator_and_is_refused_with_nvflares_controller(tmp_path):
    """ScaffoldAggregator keeps the global control in the checkpoint's meta; NVFlare's Scaffold controller keeps it in
    memory only, so its continuation would restart it at 0."""
    ScaffoldRecipe(name="scaffold_tiny", min_clients=2, num_rounds=ROUNDS, dataset="synthetic").export(
        str(tmp_path / "jobs")
    )
    result = failed_result(tmp_path, tmp_path / "jobs" / "scaffold_tiny", last_round=1)
    job = Path(make_continuation_job(str(result), "failed-id", str(tmp_path / "continued")))
    assert read(job, "server")["workflows"][0]["args"]["start_round"] == 2

    submitted = result / "job" / "scaffold_tiny" / "app" / "config" / "config_fed_server.json"
    config = json.loads(submitted.read_text())
    config["workflows"][0]["path"] = "nvflare.app_common.workflows.scaffold.Scaffold"
    submitted.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="NVFlare's Scaffold controller keeps its global control variate in memory"):
        make_continuation_job(str(result), "failed-id", str(tmp_path / "continued"))


def test_building_the_continuation_again_gives_the_same_job_so_submitting_again_returns_the_first(tmp_path):
    """``submit.continue_job`` run twice (after a lost terminal, say) must not start a second continuation: NVFlare
    returns the job already submitted only for the same submit token, which follows the folder's content."""
    result = failed_result(tmp_path, export_tiny_moon(tmp_path / "jobs", "moon_tiny", ROUNDS), last_round=1)
    first = make_continuation_job(str(result), "failed-id", str(tmp_path / "first"))
    second = make_continuation_job(str(result), "failed-id", str(tmp_path / "second"))
    assert submit_token(first) == submit_token(second)
