"""docs/hospital_data.md's own snippets, run as a new user would: the recipe of "4. Build and submit the job"
(``byoc=False``), then "Try it on one machine first" in ``SimEnv``, in a fresh Python process. Only the folders
(``/data/h1`` and ``/data/h2``, here test folders), the number of rounds and epochs, and SimEnv's workspace are
replaced; a snippet that stops working as written fails here."""

import json
import re
import sys
from pathlib import Path

import pytest

from .conftest import run_command
from .site_images import write_image_folder

pytestmark = pytest.mark.e2e
DOC = Path(__file__).resolve().parents[1] / "docs" / "hospital_data.md"
CLASSES = ["normal", "pneumonia", "covid"]


def python_block_after(text: str, heading: str) -> str:
    """The first ```python block after ``heading``."""
    start = text.index(heading)
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def test_the_hospital_page_snippets_train_in_simenv_as_written(tmp_path):
    text = DOC.read_text()
    build = python_block_after(text, "## 4. Build and submit the job")
    try_it = python_block_after(text, "### Try it on one machine first")
    for site, seed in (("h1", 1), ("h2", 2)):  # grayscale, as the page's X-rays; hospital-2 has no covid
        counts = {"normal": 20, "pneumonia": 20, "covid": 10} if site == "h1" else {"normal": 20, "pneumonia": 20}
        write_image_folder(tmp_path / site, CLASSES, counts, mode="L", seed=seed)
    replaced = {
        "/data/h1": str(tmp_path / "h1"),
        "/data/h2": str(tmp_path / "h2"),
        "num_rounds=50": "num_rounds=2",
        "local_epochs=5": "local_epochs=1",
        "num_threads=2)": f"num_threads=2, workspace_root={str(tmp_path / 'sim')!r})",
    }
    script = build + try_it
    for old, new in replaced.items():
        assert old in script, f"the page's snippets no longer hold {old!r}: update this test with the page"
        script = script.replace(old, new)
    (tmp_path / "job.py").write_text(script)
    run = run_command([sys.executable, "job.py"], tmp_path, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
    assert (tmp_path / "jobs" / "moon_xray" / "meta.json").is_file()  # the page's export
    assert not (tmp_path / "jobs" / "moon_xray" / "app" / "custom").exists()  # byoc=False: no custom/ folder
    assert "has no custom/ folder (byoc=False)" in run.stdout  # the export says what such a job needs
    log = (tmp_path / "sim" / "moon_xray" / "server" / "log.txt").read_text()
    assert "not in allow_list" not in log
    assert re.search(r"round 1: .*hospital-1", log), log[-2000:]
    resources = (tmp_path / "sim" / "moon_xray" / "local" / "resources.json").read_text()
    assert '"nvflare_moon."' in resources


def test_nvflare_simulator_runs_a_job_without_custom_once_its_workspace_allow_lists_the_plugin(tmp_path):
    from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

    from nvflare_moon.recipes import FedAvgBaselineRecipe

    from .conftest import run_simulator

    recipe = FedAvgBaselineRecipe(
        name="plain", dataset="synthetic", min_clients=2, num_rounds=1, local_epochs=1, byoc=False
    )
    recipe.export(str(tmp_path / "jobs"))
    refused = run_simulator(tmp_path / "jobs" / "plain", tmp_path / "ws", n=2, t=2)
    assert refused.returncode != 0 and "is not in allow_list" in refused.output
    allow = [sys.executable, "-m", "nvflare_moon.ops.allow_list", "--simulator", str(tmp_path / "ws")]
    for expected in (
        "added ['nvflare_moon.', 'nvflare.app_opt.pt.file_model_persistor.PTFileModelPersistor']",
        "already allows the plugin",
    ):  # idempotent
        done = run_command(allow, tmp_path, timeout=60)
        assert done.returncode == 0 and expected in done.stdout, done.stdout
    resources = json.loads((tmp_path / "ws" / "local" / "resources.json").read_text())
    assert resources["class_allow_list"][: len(DEFAULT_CLASS_ALLOW_LIST)] == list(DEFAULT_CLASS_ALLOW_LIST)
    ran = run_simulator(tmp_path / "jobs" / "plain", tmp_path / "ws", n=2, t=2)
    assert ran.returncode == 0 and "round 0: global test accuracy" in ran.output, ran.output[-3000:]
