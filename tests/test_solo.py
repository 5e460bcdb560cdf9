"""SOLO: every site trains alone; the report is each site's test accuracy and their mean ± std."""

import json

import numpy as np
import pytest

from nvflare_moon.data import load_dataset, site_train_arrays
from nvflare_moon.solo import main, run_solo

SETTINGS = dict(dataset="synthetic", num_sites=3, epochs=2, batch_size=32, lr=0.05, seed=1, device="cpu")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    output = tmp_path_factory.mktemp("solo") / "solo.json"
    return run_solo(**SETTINGS, output=str(output), log=lambda msg: None), output


def test_every_site_trains_on_its_own_shard_and_the_summary_is_mean_and_std(report):
    result, output = report
    splits = load_dataset("synthetic", None)
    sites = result["sites"]
    assert list(sites) == ["site-1", "site-2", "site-3"]
    for site, figures in sites.items():
        assert figures["num_samples"] == len(site_train_arrays(splits, site, 3, seed=1))
        assert np.isfinite(figures["train_loss"])
    accuracies = [s["test_accuracy"] for s in sites.values()]
    assert result["mean_test_accuracy"] == pytest.approx(np.mean(accuracies))
    assert result["std_test_accuracy"] == pytest.approx(np.std(accuracies))
    assert json.loads(output.read_text()) == result


def test_every_site_learns_the_synthetic_classes_alone():
    """The synthetic set's classes are noisy copies of 10 fixed smooth images, learnt to ~100 % by the simple-CNN
    after ~150 SGD steps at lr 0.02 (its first ~75 steps stay at chance). Two sites with every class, 216 steps each:
    each should be near 100 %; 50 % is five times chance."""
    result = run_solo(
        dataset="synthetic",
        num_sites=2,
        partition="iid",
        epochs=24,
        batch_size=32,
        lr=0.02,
        device="cpu",
        log=lambda msg: None,
    )
    accuracies = {site: figures["test_accuracy"] for site, figures in result["sites"].items()}
    assert min(accuracies.values()) >= 0.5, accuracies


def test_a_site_alone_gives_the_same_result_and_finished_sites_are_not_retrained(report, tmp_path):
    result, output = report
    alone = run_solo(**SETTINGS, sites=["site-2"], log=lambda msg: None)  # reproducible from the seed
    for key in ("test_accuracy", "test_loss", "train_loss", "num_samples"):
        assert alone["sites"]["site-2"][key] == pytest.approx(result["sites"]["site-2"][key], rel=1e-6)
    logged = []
    again = run_solo(**SETTINGS, output=str(output), log=logged.append)
    assert again == result and sum("already in" in line for line in logged) == 3


def test_a_report_from_other_settings_is_not_reused(report):
    _, output = report
    with pytest.raises(ValueError, match="other settings"):
        run_solo(**{**SETTINGS, "epochs": 3}, output=str(output), log=lambda msg: None)


def test_unknown_sites_and_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="site-4"):
        run_solo(**SETTINGS, sites=["site-4"])
    with pytest.raises(ValueError, match="epochs"):
        run_solo(**{**SETTINGS, "epochs": 0})


def test_command_line_prints_mean_and_std_and_writes_the_report(tmp_path, capsys):
    output = tmp_path / "cli.json"
    main(
        [
            "--dataset",
            "synthetic",
            "--num-sites",
            "3",
            "--epochs",
            "1",
            "--batch-size",
            "32",
            "--sites",
            "site-1",
            "--device",
            "cpu",
            "--output",
            str(output),
        ]
    )
    printed = capsys.readouterr().out
    written = json.loads(output.read_text())
    assert list(written["sites"]) == ["site-1"] and written["settings"]["arch"] == "simple_cnn"
    assert f"{written['mean_test_accuracy']:.4f} ± {written['std_test_accuracy']:.4f}" in printed
