"""Encrypted aggregation (the recipes' ``encryption="ckks"``) on a POC prepared with NVFlare's HE contexts
(``poc/prepare.py --he``): a server and two sites on loopback.

Two tiny 2-round MOON jobs run at the same time, one under HE and the same one in the clear, and a FedProx job
under HE (μ reaches the sites beside NVFlare's ScatterAndGather). Then site-2's
``client_context.tenseal`` is moved away and the HE job is submitted again: it must fail, naming NVFlare's error and
the fix.

The HE result is compared with the plaintext one within ``CKKS_TOLERANCE``. CKKS encodes each value with a scale of
2⁴⁰ (NVFlare's HEBuilder default), so the encrypted weighted sum Σ n_k·w_k divided by Σ n_k comes back with an
absolute error of about 1e-9 to 1e-7 per weight. Round 1 then trains from a global model that differs by that much,
and a few SGD steps amplify it a little: the measured largest difference after 2 rounds is about 6e-7. 1e-5 leaves a
margin, and is still far below what a wrong weighting changes: from this test's last uploads (331 and 269 samples,
10 and 8 steps), weighting by the step count instead of n_k moves the final weights by up to 1.5e-3, equal weights by
up to 2e-2.
"""

import json
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch

from nvflare_moon.executors.weight_exchange import HE_CLIENT_CONTEXT
from nvflare_moon.ops import submit
from nvflare_moon.recipes import FedProxRecipe

from .federation import SITES, connect, export_tiny_moon, running_poc, saved_state

ts = pytest.importorskip("tenseal", reason="encrypted aggregation needs TenSEAL (extra 'he')")

pytestmark = pytest.mark.deploy
ROUNDS = 2
JOB_TIMEOUT = 300
CKKS_TOLERANCE = 1e-5
PROBE_VALUES = 16  # consecutive values of a weight entry whose bytes are looked for in the server's files


@pytest.fixture(scope="module")
def poc(tmp_path_factory):
    yield from running_poc(tmp_path_factory.mktemp("poc_he"), he=True)


@pytest.fixture(scope="module")
def outcomes(poc):
    jobs = poc.root / "jobs"
    paths = {
        "he": export_tiny_moon(jobs, "moon_he", ROUNDS, server_evaluation=False, encryption="ckks"),
        "plain": export_tiny_moon(jobs, "moon_plain", ROUNDS, server_evaluation=False),
        "fedprox_he": export_tiny_moon(
            jobs, "fedprox_he", ROUNDS, recipe_class=FedProxRecipe, mu=0.5, server_evaluation=False, encryption="ckks"
        ),
    }
    session = connect(poc.admin_kit, 60)
    try:
        ids = {name: session.submit_job(str(path)) for name, path in paths.items()}
        metas = {name: submit.wait_for_job(session, job_id, JOB_TIMEOUT) for name, job_id in ids.items()}
        results = {
            name: submit.JobResults(session.download_job_result(job_id, str(poc.root / "results")))
            for name, job_id in ids.items()
        }
        context = poc.site("site-2") / "startup" / HE_CLIENT_CONTEXT
        context.rename(context.with_suffix(".moved"))
        try:
            ids["no_context"] = session.submit_job(str(paths["he"]))
            metas["no_context"] = submit.wait_for_job(session, ids["no_context"], JOB_TIMEOUT)
            reasons = submit.failure_reasons(session, ids["no_context"])
        finally:
            context.with_suffix(".moved").rename(context)
    finally:
        session.close()
    return dict(ids=ids, metas=metas, results=results, no_context_reasons=reasons)


def site_context(poc, site: str) -> ts.Context:
    """The site's TenSEAL context, with the secret key the server does not have."""
    return ts.context_from((poc.site(site) / "startup" / HE_CLIENT_CONTEXT).read_bytes())


def decrypted_global_model(path: str, context: ts.Context, shapes: Dict[str, tuple]) -> Dict[str, np.ndarray]:
    saved = torch.load(path, weights_only=False)["model"]
    return {k: np.asarray(ts.ckks_vector_from(context, v).decrypt()).reshape(shapes[k]) for k, v in saved.items()}


def plaintext_global_model(path: str) -> Dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in torch.load(path, weights_only=False)["model"].items()}


def files_holding(folders: List[Path], weights: Dict[str, np.ndarray]) -> Dict[str, list]:
    """Entry -> files under ``folders`` that hold the bytes of the entry's first values, as float32 or float64."""
    files = [p for folder in folders for p in folder.rglob("*") if p.is_file()]
    contents = {p: p.read_bytes() for p in files}
    found = {}
    for name, value in weights.items():
        flat = np.asarray(value).ravel()[:PROBE_VALUES]
        if flat.size < PROBE_VALUES:
            continue  # too short to tell from chance
        probes = [flat.astype("<f4").tobytes(), flat.astype("<f8").tobytes()]
        found[name] = [str(p) for p, data in contents.items() if any(probe in data for probe in probes)]
    return found


def largest_transfers(site_job_dir: Path, direction: str) -> Dict[str, float]:
    """Channel -> the largest stream (MiB) the site sent ('sent') or received ('received') in the job, from the
    cell statistics NVFlare writes at the end of a job (``stats_pool_summary.json``)."""
    stats = json.loads((site_job_dir / "stats_pool_summary.json").read_text())
    channels = stats[f"{direction}_stream_sizes"]["pool"]["cat_data"]
    largest = {}
    for channel, bins in channels.items():
        sizes = [b["max"] for b in bins if b]
        if sizes:
            topic = ":".join(channel.split(":")[-2:])  # e.g. server_command:submit_update
            largest[topic] = max(largest.get(topic, 0.0), *sizes)
    return largest


def test_moon_under_he_ends_where_the_same_job_in_the_clear_ends_up_to_ckks_precision(poc, outcomes):
    assert outcomes["metas"]["he"]["status"] == submit.COMPLETED
    assert outcomes["metas"]["plain"]["status"] == submit.COMPLETED
    he, plain = outcomes["results"]["he"], outcomes["results"]["plain"]
    expected = plaintext_global_model(plain.global_model)
    shapes = {k: v.shape for k, v in expected.items()}
    decrypted = decrypted_global_model(he.global_model, site_context(poc, "site-1"), shapes)
    differences = {k: float(np.abs(decrypted[k] - expected[k]).max()) for k in expected}
    assert max(differences.values()) < CKKS_TOLERANCE, differences
    # the sites' figures replace the server's evaluation: the same rounds, weights and key metric as in the clear
    he_rounds, plain_rounds = he.metrics(), plain.metrics()
    assert [r["round"] for r in he_rounds] == list(range(ROUNDS))
    for he_round, plain_round in zip(he_rounds, plain_rounds):
        assert he_round["site_weights"] == pytest.approx(plain_round["site_weights"])
        assert he_round["best_model"]["key_metric"] == "accuracy"
        assert set(he_round["site_metrics"]) == set(SITES)
    assert he_rounds[0]["spread"]["accuracy"]["mean"] == pytest.approx(plain_rounds[0]["spread"]["accuracy"]["mean"])


def test_fedprox_under_he_trains_with_the_mu_the_server_sent(outcomes):
    assert outcomes["metas"]["fedprox_he"]["status"] == submit.COMPLETED  # a site without μ refuses its task
    rounds = outcomes["results"]["fedprox_he"].metrics()
    assert [r["round"] for r in rounds] == list(range(ROUNDS))
    assert all(r["site_metrics"][site]["train_proximal"] > 0 for r in rounds for site in SITES)


def test_the_server_holds_no_plaintext_weights_of_a_site(poc, outcomes):
    he_id = outcomes["ids"]["he"]
    server = poc.site("server")
    assert not ts.context_from((server / "startup" / "server_context.tenseal").read_bytes()).is_private()
    saved = torch.load(outcomes["results"]["he"].global_model, weights_only=False)["model"]
    assert all(isinstance(v, bytes) for v in saved.values())  # serialized CKKS vectors, nothing in the clear
    # what the server could leak: each site's last upload (its MOON state keeps it) and the decrypted aggregate
    secrets = {}
    for site in SITES:
        upload = saved_state(poc.site(site), he_id)["payload"]["previous_models"][-1]
        secrets.update({f"{site}:{k}": v.numpy() for k, v in upload.items()})
    expected = plaintext_global_model(outcomes["results"]["plain"].global_model)
    shapes = {k: v.shape for k, v in expected.items()}
    decrypted = decrypted_global_model(outcomes["results"]["he"].global_model, site_context(poc, "site-1"), shapes)
    secrets.update({f"global:{k}": v for k, v in decrypted.items()})
    # the server's folder (its logs) and the job's workspace as the server keeps it (zipped in its job store, and
    # unzipped by the download)
    he_workspace, plain_workspace = (Path(outcomes["results"][name].root) for name in ("he", "plain"))
    leaks = {k: v for k, v in files_holding([server, he_workspace], secrets).items() if v}
    assert not leaks
    # the probe finds weights where they are in the clear: the plaintext job's server keeps its global model
    in_clear = files_holding([plain_workspace], expected)
    assert all(in_clear.values()), in_clear


def test_ciphertexts_cost_tens_of_times_the_plaintext_bytes(poc, outcomes, write_record):
    he_dir, plain_dir = (poc.site("site-1") / outcomes["ids"][name] for name in ("he", "plain"))
    he_up, plain_up = largest_transfers(he_dir, "sent"), largest_transfers(plain_dir, "sent")
    he_down, plain_down = largest_transfers(he_dir, "received"), largest_transfers(plain_dir, "received")
    # NVFlare streams numpy weights through its download service; the HE filters' ciphertexts are bytes, each with
    # the public context, and travel inside the task and its result
    streamed = "download_service__:download_service__download"  # where plaintext weights travel
    upload, clear_upload = he_up["server_command:submit_update"], plain_up[streamed]
    download = he_down["server_command:get_task"]  # round 1's encrypted global model (round 0's is the initial one)
    clear_download = plain_down[streamed]
    print(
        f"per round per site: upload {upload:.3f} MiB under HE vs {clear_upload:.3f} MiB in the clear; "
        f"download {download:.3f} MiB vs {clear_download:.3f} MiB"
    )
    assert upload > 20 * clear_upload and download > 5 * clear_download
    mib = {"upload_he": upload, "upload_plain": clear_upload, "download_he": download, "download_plain": clear_download}
    write_record("he_transfer_sizes", {"mib_per_round_per_site": mib})  # docs/deployment.md quotes them


def test_a_site_without_the_he_context_fails_the_job_with_nvflares_error_and_the_fix(outcomes):
    assert outcomes["metas"]["no_context"]["status"] == "FINISHED:EXECUTION_EXCEPTION"
    reasons = "\n".join(outcomes["no_context_reasons"])
    assert "Cannot load tenseal_context client_context.tenseal" in reasons
    assert "Re-provision the federation with NVFlare's HEBuilder" in reasons and "poc/prepare.py --he" in reasons
