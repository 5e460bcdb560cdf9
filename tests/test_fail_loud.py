"""A job that cannot train ends promptly with a non-zero exit code from the simulator, and its last error lines name
the site, the setting and the fix: a site whose set-up fails, a broken client or server config, sites that do not
match the data split. NVFlare's simulator exits 2 when the server saw a fatal error."""

import pytest

from nvflare_moon.data import check_site_shards
from nvflare_moon.recipes import MoonRecipe

from .conftest import run_simulator

TIMEOUT = 300  # a failing run stops after about 10 s of its own work; the rest is process starts on a busy machine


def export(tmp_path, name="job", **kwargs):
    settings = dict(dataset="synthetic", min_clients=2, num_rounds=2, local_epochs=1, batch_size=16, lr=0.05)
    MoonRecipe(name=name, **{**settings, **kwargs}).export(str(tmp_path / "jobs"))
    return tmp_path / "jobs" / name


def edit_config(job_dir, side: str, old: str, new: str):
    config = job_dir / "app" / "config" / f"config_fed_{side}.json"
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, new))


def last_errors(output: str, count: int = 3) -> str:
    return "\n".join([line for line in output.splitlines() if " - ERROR - " in line][-count:])


def assert_failed(run, *words):
    assert run.returncode == 2, run.output[-3000:]
    assert run.leftover_workers == []
    assert not run.global_metrics()  # no round was aggregated
    for word in words:
        assert word in last_errors(run.output), last_errors(run.output)


@pytest.mark.e2e
@pytest.mark.parametrize("n,t", [(2, 2), (2, 1)], ids=["t==n", "t<n"])
def test_a_site_that_cannot_set_up_ends_the_job(tmp_path, n, t):
    # more than the synthetic set's 600 training images: every site fails, whatever its share
    run = run_simulator(export(tmp_path, batch_size=601), tmp_path / "ws", n=n, t=t, timeout=TIMEOUT)
    assert_failed(run, "cannot start training: site site-", "fewer than batch_size=601", "lower batch_size")


@pytest.mark.e2e
def test_a_bad_argument_in_the_client_config_ends_the_job(tmp_path):
    job = export(tmp_path)
    edit_config(job, "client", '"mu": 5.0', '"mu": -1.0')
    run = run_simulator(job, tmp_path / "ws", n=2, t=2, timeout=TIMEOUT)
    assert "mu must be >= 0, got -1.0" in run.output
    assert_failed(run, "before aggregating it", "config_fed_client.json")


@pytest.mark.e2e
def test_a_typo_in_a_component_path_ends_the_job(tmp_path):
    job = export(tmp_path)
    edit_config(job, "client", "moon.MoonExecutor", "moon.MoonExecuter")
    run = run_simulator(job, tmp_path / "ws", n=2, t=2, timeout=TIMEOUT)
    assert "MoonExecuter" in run.output
    assert_failed(run, "before aggregating it", "a component path that does not import")


@pytest.mark.e2e
def test_zero_rounds_in_the_server_config_ends_the_job(tmp_path):
    job = export(tmp_path)
    edit_config(job, "server", '"num_rounds": 2', '"num_rounds": 0')
    run = run_simulator(job, tmp_path / "ws", n=2, t=2, timeout=TIMEOUT)
    assert_failed(run, "num_rounds=0", "set num_rounds >= 1")


@pytest.mark.e2e
def test_two_sites_on_one_shard_end_the_job_naming_them(tmp_path):
    sites = ["east-1", "west-1"]
    run = run_simulator(export(tmp_path), tmp_path / "ws", n=2, t=2, timeout=TIMEOUT, clients=sites)
    assert_failed(run, "east-1 and west-1 take shard 1", "site-1 ... site-2")


@pytest.mark.parametrize(
    "sites,num_sites,words",
    [
        (["east-1", "west-1", "site-3"], 3, "east-1 and west-1 take shard 1"),
        (["site-1", "site-2"], 3, "only 2 take part (site-1, site-2): shard(s) [3] would never be trained"),
        (["site-1", "site-2"], 3, "the simulator's -n 3"),
        (["site-1", "site-2", "site-3"], 2, "'site-3' is out of range for num_sites=2"),
        (["site-1", "hospital"], 2, "'hospital' has no numeric suffix"),
    ],
)
def test_sites_that_do_not_cover_the_shards_one_each_are_named(sites, num_sites, words):
    with pytest.raises(ValueError, match="run exactly") as refused:
        check_site_shards(sites, num_sites)
    assert words in str(refused.value)


def test_sites_that_cover_the_shards_one_each_pass_in_any_order():
    check_site_shards(["site-2", "hospital_3", "east-1"], 3)
