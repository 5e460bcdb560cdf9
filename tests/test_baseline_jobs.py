"""The committed baseline and other-dataset jobs hold the paper's settings (their drift from the recipes is checked in
test_jobs.py)."""

import json

import pytest

from .conftest import REPO


def job(name):
    config = REPO / "jobs" / name / "app" / "config"
    server = json.loads((config / "config_fed_server.json").read_text())
    client = json.loads((config / "config_fed_client.json").read_text())
    meta = json.loads((REPO / "jobs" / name / "meta.json").read_text())
    return server["workflows"][0], client["executors"][0]["executor"], meta


@pytest.mark.parametrize(
    "name, executor, dataset, arch, mu, rounds, sites",
    [
        ("fedprox_cifar10", "fedprox.FedProxExecutor", "cifar10", "simple_cnn", None, 100, 10),
        ("scaffold_cifar10", "scaffold.ScaffoldExecutor", "cifar10", "simple_cnn", None, 100, 10),
        ("moon_cifar100", "moon.MoonExecutor", "cifar100", "resnet50", 1.0, 100, 10),
        ("fedavg_cifar100", "fedavg.FedAvgExecutor", "cifar100", "resnet50", None, 100, 10),
        ("moon_tinyimagenet", "moon.MoonExecutor", "tinyimagenet", "resnet50", 1.0, 20, 10),
        ("moon_cifar100_50sites", "moon.MoonExecutor", "cifar100", "resnet50", 10.0, 200, 50),
        ("moon_cifar100_100sites_sampled", "moon.MoonExecutor", "cifar100", "resnet50", 10.0, 500, 100),
    ],
)
def test_jobs_have_the_papers_settings(name, executor, dataset, arch, mu, rounds, sites):
    controller, client, meta = job(name)
    args = client["args"]
    data, training = args["data"]["args"], args["training"]["args"]
    assert client["path"] == f"nvflare_moon.executors.{executor}"
    assert (data["dataset"], args["model"]["args"]["arch"], data["num_sites"]) == (dataset, arch, sites)
    assert args["model"]["args"]["num_classes"] == {"cifar10": 10, "cifar100": 100, "tinyimagenet": 200}[dataset]
    assert (training["local_epochs"], training["batch_size"], training["lr"], data["beta"]) == (10, 64, 0.01, 0.5)
    assert args.get("settings", {}).get("args", {}).get("mu") == mu
    assert controller["args"]["num_rounds"] == rounds and meta["min_clients"] == sites


def test_fedprox_job_sends_mu_from_the_server():
    controller, _, _ = job("fedprox_cifar10")
    assert controller["path"] == "nvflare.app_common.workflows.fedavg.FedAvg"
    assert controller["args"]["fedprox_mu"] == 0.01


def test_scaffold_job_aggregates_controls_over_all_sites():
    controller, _, _ = job("scaffold_cifar10")
    assert controller["args"]["aggregator"] == {
        "path": "nvflare_moon.server.scaffold.ScaffoldAggregator",
        "args": {"num_sites": 10},
    }


def test_the_100_site_job_samples_a_fifth_of_the_sites_each_round_and_the_others_train_all():
    controller, _, _ = job("moon_cifar100_100sites_sampled")
    assert controller["path"] == "nvflare_moon.server.sampling.SampledFedAvg"
    assert (controller["args"]["sample_fraction"], controller["args"]["sample_seed"]) == (0.2, 0)
    assert job("moon_cifar100_50sites")[0]["path"] == "nvflare.app_common.workflows.fedavg.FedAvg"
