"""The method registry (nvflare_moon.methods) and FedBN, the method that lives whole in one module of it."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

from nvflare_moon.benchmark.methods import METHODS
from nvflare_moon.core.state import SiteStateStore, StateUnusable
from nvflare_moon.executors import FedAvgExecutor
from nvflare_moon.methods import REGISTRY, Method, paper_jobs
from nvflare_moon.methods.fedbn import FedBNRecipe, FedBNRound, PTFedBNHelper, batch_norm_entries
from nvflare_moon.models import Network
from nvflare_moon.ops.export_jobs import JOBS
from nvflare_moon.recipes import FedAvgBaselineRecipe

from .conftest import REPO, export_and_run
from .site_images import set_site_paths, write_image_folder

# --- the registry ---------------------------------------------------------------------------------------------------


def test_every_method_module_registers_its_parts():
    assert set(REGISTRY) == {"fedavg", "fedprox", "scaffold", "moon", "fedssc", "fedsiam_da", "fedbn"}
    for name, method in REGISTRY.items():
        assert method.name == name
        assert issubclass(method.executor, FedAvgExecutor), name
        assert issubclass(method.recipe, FedAvgBaselineRecipe), name
        assert name in METHODS and METHODS[name].recipe is method.recipe, name
    assert REGISTRY["moon"].helper.__name__ == "PTMoonHelper"
    assert REGISTRY["fedbn"].helper is PTFedBNHelper


def test_the_job_folders_and_the_benchmark_are_read_from_the_registry():
    assert JOBS.keys() == paper_jobs().keys()
    assert {p.name for p in (REPO / "jobs").iterdir() if p.is_dir()} == set(JOBS)
    variants = {name for method in REGISTRY.values() for name in method.benchmark}
    assert variants | {"solo", "moon_percentile_privacy", "moon_svt_privacy", "moon_exclude_vars"} == set(METHODS)
    assert METHODS["scaffold_momentum0"].defaults == {"momentum": 0.0}


TOY_METHOD = '''
"""A toy method that another package registers through the entry point group nvflare_moon.methods."""
from nvflare_moon.core.rounds import FedAvgRound
from nvflare_moon.executors import FedAvgExecutor
from nvflare_moon.methods import Method
from nvflare_moon.recipes import FedAvgBaselineRecipe


class ToyExecutor(FedAvgExecutor):
    def make_round(self, fl_ctx):
        return FedAvgRound()


class ToyRecipe(FedAvgBaselineRecipe):
    def make_executor(self, common_args):
        return ToyExecutor(**common_args)


class ToyHelper:
    pass


METHOD = Method(
    name="toy", label="Toy", paper="none", recipe=ToyRecipe, executor=ToyExecutor, helper=ToyHelper,
    jobs={"toy_cifar10": lambda: ToyRecipe(name="toy_cifar10")}, benchmark={"toy": ("Toy", {})},
)
'''

TOY_CHECK = """
import json, sys
from nvflare_moon.methods import REGISTRY
from nvflare_moon.benchmark.methods import METHODS
from nvflare_moon.ops.export_jobs import JOBS
toy = REGISTRY["toy"]
JOBS["toy_cifar10"]().export(sys.argv[1])
print(json.dumps({"executor": toy.executor.__name__, "helper": toy.helper.__name__, "recipe": toy.recipe.__name__,
                  "benchmark": METHODS["toy"].label, "jobs": sorted(JOBS)}))
"""


def test_a_method_registered_in_one_place_appears_in_the_executor_helper_recipe_benchmark_and_jobs(tmp_path):
    (tmp_path / "toy_method.py").write_text(TOY_METHOD)
    dist = tmp_path / "toy_method-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-method\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[nvflare_moon.methods]\ntoy = toy_method:METHOD\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", TOY_CHECK, str(tmp_path / "jobs")], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["executor"] == "ToyExecutor" and seen["helper"] == "ToyHelper" and seen["recipe"] == "ToyRecipe"
    assert seen["benchmark"] == "Toy" and "toy_cifar10" in seen["jobs"]
    client = json.loads((tmp_path / "jobs/toy_cifar10/app/config/config_fed_client.json").read_text())
    assert client["executors"][0]["executor"]["path"] == "toy_method.ToyExecutor"
    listed = subprocess.run(
        [sys.executable, "-m", "nvflare_moon.benchmark", "--list"], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert "toy (Toy)" in listed.stdout, listed.stderr[-2000:]


def test_a_name_registered_twice_is_refused(monkeypatch):
    import nvflare_moon.methods as registry

    class Twice:
        value = "somewhere:METHOD"

        @staticmethod
        def load():
            return Method(name="moon", label="again", paper="", recipe=FedBNRecipe, executor=FedAvgExecutor)

    monkeypatch.setattr(registry, "entry_points", lambda group: [Twice] if group == "nvflare_moon.methods" else [])
    with pytest.raises(ValueError, match="method 'moon' is registered twice \\(again by somewhere:METHOD\\)"):
        registry._discover()


# --- FedBN ----------------------------------------------------------------------------------------------------------


def small_bn_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2))


def test_batch_norm_entries_are_every_batch_norm_parameter_and_buffer():
    assert batch_norm_entries(small_bn_net()) == [
        "1.weight",
        "1.bias",
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
    ]
    assert "backbone.bn1.running_mean" in batch_norm_entries(Network("resnet18"))
    assert batch_norm_entries(Network("simple_cnn")) == []


def test_a_network_without_batch_norm_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"the network \(simple_cnn\) has none: choose an arch with BatchNorm"):
        FedBNRecipe(arch="simple_cnn")
    with pytest.raises(ValueError, match="FedBN keeps each site's BatchNorm layers"):
        PTFedBNHelper(Network("simple_cnn"))


def test_a_round_starts_from_the_sites_own_batch_norm_and_saves_it_after_training(tmp_path):
    net = small_bn_net()
    store = SiteStateStore(str(tmp_path), "fedbn_state", "site-1", "job")
    round_0 = FedBNRound(net, store, "site-1")
    round_0.start(0)  # nothing stored yet: the received entries stay
    with torch.no_grad():
        net[1].running_mean.fill_(3.0)  # what training left in this site's layer
        net[1].weight.fill_(2.0)
    round_0.finish()
    own = {name: t.clone() for name, t in net.state_dict().items()}
    # the next global model: every entry changed, BatchNorm's included
    with torch.no_grad():
        for tensor in net.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(1.0)
    received = {name: t.clone() for name, t in net.state_dict().items()}
    FedBNRound(net, store, "site-1").start(1)
    after = net.state_dict()
    for name in after:
        expected = own[name] if name.startswith("1.") else received[name]
        assert torch.equal(after[name], expected), name
    assert torch.equal(after["1.running_mean"], torch.full((2,), 3.0))


def test_a_stored_state_of_another_network_is_set_aside(tmp_path):
    store = SiteStateStore(str(tmp_path), "fedbn_state", "site-1", "job")
    store.save(0, {"batch_norm": {"1.weight": torch.ones(5)}})
    with pytest.raises(StateUnusable, match="other-network"):
        FedBNRound(small_bn_net(), store, "site-1").start(1)
    assert list(tmp_path.glob("fedbn_state.pt.unusable-other-network-*"))


class Received:
    def __init__(self, model, current_round):
        self.params = {name: t.numpy() for name, t in model.state_dict().items()}
        self.current_round = current_round
        self.meta = {}


def test_the_client_api_helper_keeps_the_batch_norm_across_a_restarted_script(tmp_path):
    net = small_bn_net()
    helper = PTFedBNHelper(net, state_dir=str(tmp_path), job_id="job", site="site-1")
    helper.start_round(Received(net, 0))
    with torch.no_grad():
        net[1].running_var.fill_(7.0)
    assert helper.finish() == {}
    restarted_net = small_bn_net()  # a new process: fresh weights, the global ones loaded
    restarted = PTFedBNHelper(restarted_net, state_dir=str(tmp_path), job_id="job", site="site-1")
    restarted.start_round(Received(restarted_net, 1))
    assert torch.equal(restarted_net[1].running_var, torch.full((2,), 7.0))
    with pytest.raises(RuntimeError, match="call PTFedBNHelper.start_round"):
        PTFedBNHelper(small_bn_net(), state_dir=str(tmp_path), job_id="job", site="site-2").finish()


@pytest.fixture(scope="module")
def fedbn_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fedbn")
    # ResNet-18 (the smallest network here with BatchNorm) on a few small images per site: the sites' class mixes
    # differ, so do their BatchNorm statistics, and so do their sizes (20 and 28), so the server's mean is weighted. One thread in both runs: ResNet-18's convolutions sum in another order
    # with more threads, and two rounds of BatchNorm training amplify that rounding into visibly different models.
    folders = {
        "site-1": write_image_folder(root / "site-1", ["a", "b"], {"a": 14, "b": 6}, {"a": 4, "b": 4}),
        "site-2": write_image_folder(root / "site-2", ["a", "b"], {"a": 5, "b": 23}, {"a": 4, "b": 4}),
    }
    recipe = FedBNRecipe(
        name="fedbn_tiny",
        dataset="image_folder",
        site_data={"class_names": ["a", "b"], "image_size": 32},
        min_clients=2,
        num_rounds=2,
        local_epochs=1,
        batch_size=8,
        lr=0.05,
        num_threads=1,
    )
    set_site_paths(recipe, folders)
    return {t: export_and_run(recipe, root, n=2, t=t, tag=f"_t{t}") for t in (2, 1)}


@pytest.mark.e2e
@pytest.mark.parametrize("t", [2, 1])
def test_fedbn_in_the_simulator_keeps_each_sites_batch_norm(fedbn_runs, t):
    run = fedbn_runs[t]
    assert run.returncode == 0, run.output[-3000:]
    for site in ("site-1", "site-2"):
        assert f"{site}: round 1 starts from its own BatchNorm entries of round 0" in run.output
    stored = {
        site: torch.load(run.site_dir(site) / "nvflare_moon" / "fedbn_state.pt", weights_only=True)
        for site in ("site-1", "site-2")
    }
    assert all(record["round"] == 1 for record in stored.values())
    one, two = (stored[s]["payload"]["batch_norm"]["backbone.bn1.running_mean"] for s in ("site-1", "site-2"))
    assert not torch.equal(one, two)  # each site keeps its own statistics
    # the server averages what the sites upload, BatchNorm included, weighted by their samples
    weights = run.global_metrics()[-1]["site_weights"]
    assert weights == pytest.approx({"site-1": 20 / 48, "site-2": 28 / 48})  # unequal: a plain mean would differ
    final = torch.load(run.server_dir() / "app_server" / "FL_global_model.pt", weights_only=False)["model"]
    mean = weights["site-1"] * one.numpy() + weights["site-2"] * two.numpy()
    np.testing.assert_allclose(final["backbone.bn1.running_mean"].numpy(), mean, rtol=1e-5, atol=1e-6)


@pytest.mark.e2e
def test_fedbn_trains_the_same_with_client_processes_kept_or_restarted(fedbn_runs):
    models = [
        torch.load(fedbn_runs[t].server_dir() / "app_server" / "FL_global_model.pt", weights_only=False)["model"]
        for t in (2, 1)
    ]
    for name in models[0]:
        np.testing.assert_allclose(models[1][name].numpy(), models[0][name].numpy(), rtol=1e-5, atol=1e-6)
