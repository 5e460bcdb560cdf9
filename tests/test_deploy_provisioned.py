"""The hospital federation of deploy/project.yml, provisioned with ``nvflare provision`` and run on loopback: the server
and two hospitals started from their startup kits, a job WITHOUT ``custom/`` submitted by the project admin.

Refused while the sites keep NVFlare's default class allow-list (with NVFlare's message surfaced), it completes once
deploy/allow_plugin.py has put the plugin on the allow-lists of the server and the hospitals, without a restart.
"""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from nvflare.lighter.utils import update_storage_locations
from nvflare.recipe import ProdEnv

from nvflare_moon.ops import submit
from nvflare_moon.ops.submit import JobResults
from nvflare_moon.recipes import DataCheckRecipe, MoonRecipe

from .conftest import REPO
from .federation import (
    connect,
    export_tiny_moon,
    free_port,
    kill,
    nvflare_env,
    pids_of,
    run_script,
    saved_state,
    wait_until,
)
from .site_images import write_image_folder

pytestmark = pytest.mark.deploy
SERVER = "localhost"  # the server's name is the host the sites dial: on a test machine, loopback
HOSPITALS = ["hospital-1", "hospital-2"]  # hospital-3 stays offline
ADMIN = "admin@consortium.example"
ROUNDS = 2


def loopback_project(folder: Path, port: int) -> Path:
    """deploy/project.yml as this machine can run it: the server on localhost and a free port, and no GPUs offered
    (a site with a GPU capacity refuses to start on a machine without those GPUs)."""
    project = yaml.safe_load((REPO / "deploy" / "project.yml").read_text())
    for participant in project["participants"]:
        if participant["type"] == "server":
            participant.update(name=SERVER, fed_learn_port=port)
        elif participant["type"] == "client":
            participant["capacity"] = {"num_of_gpus": 0, "mem_per_gpu_in_GiB": 0}
    path = folder / "project.yml"
    path.write_text(yaml.safe_dump(project, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    root = tmp_path_factory.mktemp("hospitals")
    env = nvflare_env(root / "home")
    provision = [
        sys.executable,
        "-m",
        "nvflare.cli",
        "provision",
        "-p",
        str(loopback_project(root, free_port())),
        "-w",
        str(root / "provisioned"),
        "--force",
    ]
    provisioned = subprocess.run(provision, env=env, capture_output=True, text=True, timeout=120)
    assert provisioned.returncode == 0, provisioned.stdout + provisioned.stderr
    kits = root / "provisioned" / "moon_hospitals" / "prod_00"
    # NVFlare's own helper: the server's job store inside this test's folder instead of /tmp/nvflare
    update_storage_locations(local_dir=str(kits / SERVER / "local"), workspace=str(root / "server_storage"))
    started = []
    try:
        for name in [SERVER, *HOSPITALS]:
            with open(root / f"{name}.console.log", "w") as console:
                started.append(
                    subprocess.Popen(
                        ["bash", str(kits / name / "startup" / "sub_start.sh"), "--once"],
                        env=env,
                        stdout=console,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        session = connect(kits / ADMIN, 60)
        try:
            wait_until(
                lambda: {c.name for c in session.get_system_info().client_info} >= set(HOSPITALS),
                60,
                "both hospitals to connect",
            )
            yield kits, session, root
        finally:
            session.close()
    finally:
        for process in started:
            os.killpg(process.pid, signal.SIGTERM)  # the group started above: the FL process of a participant
        for process in started:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        kill(pid for name in [SERVER, *HOSPITALS] for pid in pids_of(str(kits / name)))  # job processes: own sessions


def test_a_job_without_custom_runs_only_where_the_sites_allow_the_plugin(federation):
    """Refused, then allowed by deploy/allow_plugin.py (idempotent, NVFlare's default entries kept), no restart."""
    kits, session, root = federation
    job_dir = export_tiny_moon(root / "jobs", "moon_locked_down", ROUNDS, byoc=False)
    assert not (job_dir / "app" / "custom").exists()

    with pytest.raises(submit.JobFailed) as refused:
        submit.run_job(session, str(job_dir), timeout=120, poll_interval=1)
    assert refused.value.status == "FINISHED:ABNORMAL"
    assert "Component 'nvflare_moon." in str(refused.value) and "is not in allow_list" in str(refused.value)
    assert '"nvflare_moon."' in str(refused.value)  # the hint says what to add

    allowed = run_script("deploy/allow_plugin.py", *(str(kits / name) for name in [SERVER, *HOSPITALS]), env=os.environ)
    assert allowed.returncode == 0, allowed.stdout
    results = submit.run_job(
        session, str(job_dir), timeout=180, download_to=str(root / "results"), resubmit=True, poll_interval=1
    )
    assert [m["round"] for m in results.metrics()] == list(range(ROUNDS))
    job_id = Path(results.root).name
    for hospital in HOSPITALS:  # each hospital's MOON state, in its own workspace, under the job's run folder
        record = saved_state(kits / hospital, job_id)
        assert (record["site"], record["job_id"], record["round"]) == (hospital, job_id, ROUNDS - 1)

    again = run_script("deploy/allow_plugin.py", str(kits / SERVER), str(kits / HOSPITALS[0]), env=os.environ)
    assert again.returncode == 0 and again.stdout.count("already allows the plugin") == 2, again.stdout
    allow_list = json.loads((kits / HOSPITALS[0] / "local" / "resources.json").read_text())["class_allow_list"]
    assert allow_list.count("nvflare_moon.") == 1 and "nvflare.app_common.workflows.fedavg.FedAvg" in allow_list


def test_two_hospitals_train_on_their_own_image_folders_at_paths_only_they_know(federation):
    """docs/hospital_data.md on the provisioned federation: each hospital names its own folder in its kit's
    local/nvflare_moon_data.json; the data check, then the training job (no custom/, no path in either) are submitted
    with our CLI: counts only, then each hospital's accuracy."""
    kits, session, root = federation
    allowed = run_script("deploy/allow_plugin.py", *(str(kits / name) for name in [SERVER, *HOSPITALS]), env=os.environ)
    assert allowed.returncode == 0, allowed.stdout
    classes = ["normal", "pneumonia", "covid"]
    folders = {
        "hospital-1": write_image_folder(
            root / "h1_pacs" / "export", classes, {"normal": 20, "pneumonia": 20, "covid": 12}
        ),
        "hospital-2": write_image_folder(root / "h2_share" / "xray", classes, {"normal": 24, "pneumonia": 16}, seed=3),
    }  # hospital-2 has no covid images
    for hospital, folder in folders.items():
        (kits / hospital / "local" / "nvflare_moon_data.json").write_text(json.dumps({"site_path": str(folder)}))
    site_data = {"class_names": classes, "image_size": 16, "channels": 3}

    def submit_with_cli(job_dir: Path) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "nvflare_moon.ops.submit", str(job_dir), "--startup-kit", str(kits / ADMIN)]
        command += ["--download", str(root / "hospital_results"), "--timeout", "240"]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    DataCheckRecipe(
        name="hospital_data_check", dataset="image_folder", site_data=site_data, min_clients=2, byoc=False
    ).export(str(root / "jobs"))
    checked = submit_with_cli(root / "jobs" / "hospital_data_check")  # first: what the sites hold, counts only
    assert checked.returncode == 0, checked.stdout + checked.stderr
    summary = json.loads(Path(re.search(r"^data summary: +(\S+)$", checked.stdout, re.M).group(1)).read_text())
    assert summary["sites"]["hospital-1"]["train"] == {"normal": 20, "pneumonia": 20, "covid": 12}
    assert summary["sites"]["hospital-2"]["classes_absent"] == ["covid"] and str(root) not in json.dumps(summary)

    recipe = MoonRecipe(
        name="hospital_images",
        dataset="image_folder",
        site_data=site_data,
        min_clients=2,
        num_rounds=ROUNDS,
        local_epochs=1,
        batch_size=8,
        lr=0.05,
        num_threads=1,
        byoc=False,
    )
    recipe.export(str(root / "jobs"))
    job_dir = root / "jobs" / "hospital_images"
    assert (
        not (job_dir / "app" / "custom").exists()
        and str(root) not in (job_dir / "app" / "config" / "config_fed_client.json").read_text()
    )

    submitted = submit_with_cli(job_dir)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    for hospital in HOSPITALS:
        assert re.search(
            rf"^  {hospital}: accuracy 0\.\d{{4}}, local_model_accuracy 0\.\d{{4}}$", submitted.stdout, re.M
        )
    for hospital, folder in folders.items():  # decoded on the hospital's machine, beside its images
        assert len(list((folder / ".nvflare_moon_decoded").iterdir())) == 1


def test_a_recipe_runs_on_the_federation_with_prod_env(federation):
    """docs/deployment.md, "From a recipe": ``recipe.execute(ProdEnv(...))`` with the admin's startup kit submits the
    recipe's job (NVFlare exports it into a temporary folder), and ``Run.get_result`` waits and downloads the result.
    The recipe's default ``byoc=True``: the project admin has the byoc right, so no allow-list is needed."""
    kits, session, _ = federation
    recipe = MoonRecipe(
        name="moon_prod_env",
        min_clients=2,
        num_rounds=ROUNDS,
        dataset="synthetic",
        local_epochs=1,
        batch_size=32,
        lr=0.05,
        num_threads=1,
    )
    run = recipe.execute(ProdEnv(startup_kit_location=str(kits / ADMIN), username=ADMIN, login_timeout=30))
    job_id = run.get_job_id()
    result = run.get_result(timeout=180)  # NVFlare's monitor_job, then download_job_result into the kit's transfer/
    assert run.get_status() == submit.COMPLETED, (run.get_status(), submit.failure_reasons(session, job_id))
    assert result is not None and Path(result).is_relative_to(kits / ADMIN / "transfer"), result  # its download_dir
    results = JobResults(result).check()  # the global model, global_metrics.jsonl and the TensorBoard events
    assert [m["round"] for m in results.metrics()] == list(range(ROUNDS))
    assert set(results.metrics()[-1]["site_metrics"]) == set(HOSPITALS)
    for hospital in HOSPITALS:
        record = saved_state(kits / hospital, job_id)
        assert (record["site"], record["job_id"], record["round"]) == (hospital, job_id, ROUNDS - 1)
