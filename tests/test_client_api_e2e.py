"""The Client API helpers in NVFlare's real simulator: in-process and as an external process, each with ``-t 1 -n 2``
(a new script process for every task) and ``-t 2 -n 2`` (one per site), MOON through PTMoonHelper on tiny data.

Checked in every run: the previous model site k uses in round r is the model it sent in round r−1 (hashes), the
contrastive term from round 1 on is neither 0 nor ln 2 (what a missing or a global-as-previous model would give), the
PIDs change per task with ``-t 1`` and not with ``-t 2``; and the final global model is the same for ``-t 1`` and
``-t 2``. The example's ``job.py`` runs FedSSC and FedSiam-DA with a restart per task: prototypes come back through
the meta and the history model survives the restart.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from nvflare_moon.recipes import MoonScriptRecipe, ScaffoldScriptRecipe

from .conftest import REPO, export_and_run

SCRIPT = Path(__file__).with_name("client_api_script.py")


def script_module():
    """The script as the top-level module ``client_api_script``, as the sites run it: the exporter then puts it (and
    the server's copy of its TinyNet) at the top of ``custom/``, where the external process's command expects it."""
    spec = importlib.util.spec_from_file_location("client_api_script", SCRIPT)
    module = sys.modules.setdefault("client_api_script", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


SITES = 2
# rounds per run: in process, 3, where the previous model moves on twice; in an external process, the slowest to
# start, 2, where it moves on once
ROUNDS = {False: 3, True: 2}


def run_moon(root: Path, threads: int, external: bool):
    records = root / f"records_t{threads}.jsonl"
    recipe = MoonScriptRecipe(
        name="moon_script_test",
        model=script_module().TinyNet(),
        min_clients=SITES,
        num_rounds=ROUNDS[external],
        train_script=str(SCRIPT),
        train_args=f"--records {records}",
        mu=2.0,
        temperature=0.5,
        launch_external_process=external,
        command=f"{sys.executable} -u",
    )
    run = export_and_run(recipe, root, n=SITES, t=threads, tag=f"_t{threads}", timeout=600)
    assert run.returncode == 0, run.output[-3000:]
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    (final,) = run.workspace.glob("server/simulate_job/**/FL_global_model.pt")
    return lines, torch.load(final, weights_only=False)["model"]


def check_records(records, threads: int, rounds_run: int):
    by_site = defaultdict(dict)
    for r in records:
        by_site[r["site"]][r["round"]] = r
    assert sorted(by_site) == [f"site-{k}" for k in range(1, SITES + 1)]
    for site, rounds in by_site.items():
        assert sorted(rounds) == list(range(rounds_run))
        pids = {rounds[r]["pid"] for r in rounds}
        assert len(pids) == (rounds_run if threads < SITES else 1), (site, pids)
        assert rounds[0]["previous"] == [] and rounds[0]["contrastive"] is None
        for r in range(1, rounds_run):
            assert rounds[r]["previous"] == [rounds[r - 1]["sent"]], (site, r)
            contrastive = rounds[r]["contrastive"]
            assert contrastive > 1e-3 and abs(contrastive - math.log(2)) > 1e-3, (site, r, contrastive)
            assert rounds[r]["mu"] == 2.0


@pytest.mark.parametrize("external", [False, True], ids=["in_process", "external_process"])
def test_moon_helper_same_algorithm_with_and_without_restarts(tmp_path, external):
    restarted, final_restarted = run_moon(tmp_path, threads=1, external=external)
    check_records(restarted, threads=1, rounds_run=ROUNDS[external])
    lived, final_lived = run_moon(tmp_path, threads=SITES, external=external)
    check_records(lived, threads=SITES, rounds_run=ROUNDS[external])
    assert sorted(final_restarted) == sorted(final_lived)
    for name in final_lived:
        torch.testing.assert_close(
            torch.as_tensor(final_restarted[name]), torch.as_tensor(final_lived[name]), rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize(
    "method, evidence",
    [("fedssc", "received prototypes for"), ("fedsiam_da", "'history'")],
)
def test_example_job_restarted_per_task(tmp_path, method, evidence):
    """The documented example, -t 1 -n 2: round 1 shows the term that needs the state of round 0 or the server."""
    cmd = [
        sys.executable,
        str(REPO / "docs/examples/client_api/job.py"),
        "--method",
        method,
        "--dataset",
        "synthetic",
        "--rounds",
        "2",
        "--sites",
        "2",
        "--threads",
        "1",
        "--epochs",
        "1",
        "--workspace",
        str(tmp_path / "ws"),
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:]
    round_one = [line for line in done.stdout.splitlines() if "round 1:" in line]
    for site in ("site-1", "site-2"):
        assert any(site in line and evidence in line for line in round_one), (site, round_one)


def test_scaffold_script_keeps_its_control_when_restarted_every_task(tmp_path):
    """NVFlare's PTScaffoldHelper would start c_i from 0 in every new process; PTPersistentScaffoldHelper reloads the
    control that the site saved in its previous round, under ScaffoldScriptRecipe's server side."""
    records = tmp_path / "records.jsonl"
    recipe = ScaffoldScriptRecipe(
        name="scaffold_script_test",
        model=script_module().TinyNet(),
        min_clients=2,
        num_rounds=3,
        train_script=str(SCRIPT),
        train_args=f"--records {records} --method scaffold",
        command=f"{sys.executable} -u",
    )
    run = export_and_run(recipe, tmp_path, n=2, t=1, timeout=600)
    assert run.returncode == 0, run.output[-3000:]
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    for site in ("site-1", "site-2"):
        rounds = {r["round"]: r for r in lines if r["site"] == site}
        assert sorted(rounds) == [0, 1, 2]
        assert len({r["pid"] for r in rounds.values()}) == 3  # a new process for every task
        assert len({rounds[0]["previous"][0], rounds[0]["sent"], rounds[1]["sent"]}) == 3  # c_i moves every round
        for r in (1, 2):
            assert rounds[r]["previous"] == [rounds[r - 1]["sent"]], (site, r)
