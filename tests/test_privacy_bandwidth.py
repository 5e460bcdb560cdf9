"""The recipes' privacy and bandwidth options (nvflare_moon/filters/privacy.py, docs/deployment.md "Privacy and bandwidth"):
what our aggregators accept from NVFlare's filters, the refusals at recipe build, and each option in the simulator."""

import json
import logging
import re

import numpy as np
import pytest
import torch
from nvflare.apis.filter import Filter
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.abstract.model import make_model_learnable
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.filters import ExcludeVars, PercentilePrivacy, SVTPrivacy

import nvflare_moon.server as server
from nvflare_moon.models import Network
from nvflare_moon.recipes import (
    FedProxRecipe,
    FedSiamDARecipe,
    FedSSCRecipe,
    MoonRecipe,
    MoonScriptRecipe,
    ScaffoldRecipe,
)

from .conftest import REPO, TINY_TRAINING

pytest.importorskip("bitsandbytes", reason="NVFlare's quantization filters import bitsandbytes (extra 'compression')")

GLOBAL = {"conv.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "fc.bias": np.ones(2, dtype=np.float32)}


class Passthrough(Filter):
    def process(self, shareable, fl_ctx):
        return shareable


def with_global(agg, global_params=GLOBAL):
    agg.fl_ctx = FLContext()
    learnable = make_model_learnable(dict(global_params), {})
    agg.fl_ctx.set_prop(AppConstants.GLOBAL_MODEL, learnable, private=True, sticky=False)
    return agg


def update(site, params, params_type=ParamsType.FULL, num_samples=10):
    return FLModel(params=params, params_type=params_type, meta={"client_name": site, "num_samples": num_samples})


# ---- what the aggregators accept ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [server.WeightedFedAvgAggregator, server.DualAggregator, lambda: server.PrototypeSharingAggregator(num_classes=2)],
)
def test_a_weight_difference_is_added_to_the_global_model(make):
    agg = with_global(make())
    diffs = [
        {k: np.full_like(v, 0.5) for k, v in GLOBAL.items()},
        {k: np.full_like(v, -0.25) for k, v in GLOBAL.items()},
    ]
    assert agg.accept_model(update("site-1", diffs[0], ParamsType.DIFF, num_samples=10))
    assert agg.accept_model(update("site-2", diffs[1], ParamsType.DIFF, num_samples=30))
    result = agg.aggregate_model()
    assert result.params_type == ParamsType.FULL
    for k, v in GLOBAL.items():  # every site's full model is global + 0.5 or global − 0.25: the same direction
        if isinstance(agg, server.DualAggregator):
            assert np.all(np.isfinite(result.params[k]))
        else:
            np.testing.assert_allclose(result.params[k], v + 0.25 * 0.5 + 0.75 * -0.25)


def test_a_difference_that_overflows_the_global_model_is_rejected(caplog):
    huge = {k: np.full_like(v, np.finfo(np.float32).max) for k, v in GLOBAL.items()}
    agg = with_global(server.WeightedFedAvgAggregator(), huge)
    with caplog.at_level(logging.WARNING):
        assert not agg.accept_model(update("site-1", huge, ParamsType.DIFF))
    assert "rejected the update of site-1" in caplog.text and "NaN or Inf" in caplog.text


def test_a_partial_update_needs_allow_partial_updates_and_its_missing_entries_count_as_unchanged(caplog):
    partial = {"conv.weight": GLOBAL["conv.weight"] + 1}
    with caplog.at_level(logging.WARNING):
        assert not with_global(server.WeightedFedAvgAggregator()).accept_model(update("site-1", partial))
    assert "allow_partial_updates=True" in caplog.text
    agg = with_global(server.WeightedFedAvgAggregator(allow_partial_updates=True))
    assert agg.accept_model(update("site-1", partial))
    assert agg.accept_model(update("site-2", {k: v + 3 for k, v in GLOBAL.items()}))
    result = agg.aggregate_model().params
    np.testing.assert_allclose(result["conv.weight"], GLOBAL["conv.weight"] + 2)
    np.testing.assert_allclose(result["fc.bias"], GLOBAL["fc.bias"] + 1.5)  # site-1 counts as the global's value
    # extra keys are still refused
    assert not agg.accept_model(update("site-3", {**GLOBAL, "extra": np.zeros(1)}))


def test_a_dequantized_update_is_an_ordinary_update():
    agg = with_global(server.WeightedFedAvgAggregator())
    dequantized = {k: (v / 3).astype(np.float16).astype(np.float32) for k, v in GLOBAL.items()}
    assert agg.accept_model(update("site-1", dequantized))
    np.testing.assert_array_equal(agg.aggregate_model().params["conv.weight"], dequantized["conv.weight"])


# ---- refusals at recipe build -------------------------------------------------------------------------------------


def test_scaffold_refuses_privacy_filters_naming_both():
    with pytest.raises(ValueError, match=r"privacy_filters=\['PercentilePrivacy'\] cannot be used with ScaffoldRecipe"):
        ScaffoldRecipe(min_clients=2, dataset="synthetic", privacy_filters=[PercentilePrivacy()])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"quantization": "int8"}, "quantization must be None or one of"),
        ({"privacy_filters": [ExcludeVars("l3")]}, "give ExcludeVars a list of entry names"),
        (
            {"privacy_filters": [Passthrough()]},
            "privacy_filters takes instances of NVFlare's PercentilePrivacy, SVTPrivacy, ExcludeVars",
        ),
    ],
)
def test_bad_options_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        MoonRecipe(min_clients=2, dataset="synthetic", **kwargs)


def test_privacy_filters_run_before_the_quantizer_on_the_train_result(tmp_path):
    recipe = MoonRecipe(
        name="filters",
        min_clients=2,
        dataset="synthetic",
        quantization="float16",
        privacy_filters=[PercentilePrivacy(), ExcludeVars(["l3.bias"])],
    )
    recipe.export(str(tmp_path))
    client = json.loads((tmp_path / "filters" / "app" / "config" / "config_fed_client.json").read_text())
    server_config = json.loads((tmp_path / "filters" / "app" / "config" / "config_fed_server.json").read_text())
    train_chain = [c for c in client["task_result_filters"] if c["tasks"] == ["train"]][0]
    assert [f["path"].rsplit(".", 1)[1] for f in train_chain["filters"]] == [
        "PercentilePrivacy",
        "ExcludeVars",
        "FloatModelQuantizer",
    ]
    for config, key in [
        (client, "task_data_filters"),
        (server_config, "task_data_filters"),
        (server_config, "task_result_filters"),
    ]:
        assert sorted(t for c in config[key] for t in c["tasks"]) == ["submit_model", "train", "validate"]
    text = json.dumps(client) + json.dumps(server_config)
    assert '"send_weight_diff": true' in text and '"allow_partial_updates": true' in text


def test_script_recipes_quantize_both_ways(tmp_path):
    recipe = MoonScriptRecipe(
        name="script_fp16",
        model=Network(),
        min_clients=2,
        quantization="float16",
        train_script=str(REPO / "tests" / "client_api_script.py"),
    )
    recipe.export(str(tmp_path))
    configs = tmp_path / "script_fp16" / "app" / "config"
    for side, data_filter, result_filter in [
        ("client", "FloatModelDequantizer", "FloatModelQuantizer"),
        ("server", "FloatModelQuantizer", "FloatModelDequantizer"),
    ]:
        config = json.loads((configs / f"config_fed_{side}.json").read_text())
        for key, expected in [("task_data_filters", data_filter), ("task_result_filters", result_filter)]:
            chains = {t: [f["path"].rsplit(".", 1)[1] for f in c["filters"]] for c in config[key] for t in c["tasks"]}
            assert chains == {t: [expected] for t in ("train", "validate", "submit_model")}, (side, key)


# ---- in the simulator ---------------------------------------------------------------------------------------------

# FedAvg is left out: FedProx's sites and server are FedAvg's, with μ in the meta beside the quantized weights
METHODS = {
    "fedprox": FedProxRecipe,
    "moon": MoonRecipe,
    "fedssc": FedSSCRecipe,
    "fedsiam_da": FedSiamDARecipe,
    "scaffold": ScaffoldRecipe,
}
SITES = ["site-1", "site-2"]


def final_global(run):
    saved = torch.load(run.server_dir() / "app_server" / "FL_global_model.pt", weights_only=False)
    return {k: v.numpy() for k, v in saved["model"].items()}


def local_model(run, site):
    """The model ``site`` trained in the last round, as it keeps it: its local-model record, or the last of the
    previous uploads that MOON-like executors keep instead."""
    folder = run.site_dir(site) / "nvflare_moon"
    if (folder / "local_model.pt").exists():
        return torch.load(folder / "local_model.pt", weights_only=True)["payload"]["model"]
    (state,) = [p.stem for p in folder.glob("*_state.pt")]
    return run.last_upload(site, state)[1]


def transfer_sizes(run, site, direction):
    """Bytes of the weights a site sent ('up': the server's download from the site) or received ('down'), per round,
    from NVFlare's streaming log lines in the site's log."""
    pattern = {
        "up": r"\[server\] download tx \S+ done: .*\(([\d,]+) bytes\)",
        "down": r"\[client\] download ref=\S+ done: .*\(([\d,]+) bytes\)",
    }[direction]
    log = (run.workspace / site / "log.txt").read_text()
    return [int(n.replace(",", "")) for n in re.findall(pattern, log)]


@pytest.mark.e2e
@pytest.mark.parametrize("method", list(METHODS))
def test_quantized_updates_aggregate_to_the_fp16_rounded_uploads_and_halve_the_traffic(method, simulate):
    recipe = METHODS[method](
        name=f"{method}_fp16", min_clients=2, num_rounds=1, quantization="float16", **TINY_TRAINING
    )
    run = simulate(recipe, n=2, t=2)
    assert run.returncode == 0, run.output[-3000:]
    uploads = [local_model(run, s) for s in SITES]  # what each site trained in the last round, as it keeps it
    for model in uploads:  # full precision on the site: not float16 values
        weight = model["l1.weight"]
        assert weight.dtype == torch.float32 and not torch.equal(weight, weight.half().float())
    got = final_global(run)
    last = run.global_metrics()[-1]
    weights = last.get("site_dual_weights", last["site_weights"])  # FedSiam-DA: ξ_k of its dual aggregation
    floats = [k for k in got if np.issubdtype(got[k].dtype, np.floating)]  # FedSiam-DA takes integers from w_f0
    fp16 = {k: sum(weights[s] * u[k].half().double().numpy() for s, u in zip(SITES, uploads)) for k in floats}
    exact = {k: sum(weights[s] * u[k].double().numpy() for s, u in zip(SITES, uploads)) for k in floats}
    for k in floats:
        np.testing.assert_allclose(got[k], fp16[k], rtol=1e-5, atol=1e-6)  # the server averaged the fp16 copies
        bound = 2.0**-11 * max(float(np.abs(u[k].numpy()).max()) for u in uploads) + 1e-7
        assert np.abs(got[k] - exact[k]).max() <= bound, k  # within float16's rounding of the uploads
    fp32_bytes = sum(v.numel() * 4 for v in Network(**recipe.extra_network_args()).state_dict().values())
    # SCAFFOLD's controls travel in the meta, in full precision, beside the weights
    expected = 0.5 * fp32_bytes + (fp32_bytes if method == "scaffold" else 0)
    for site in SITES:
        for direction in ("up", "down"):
            sizes = transfer_sizes(run, site, direction)
            assert sizes and max(sizes) < expected + 0.05 * fp32_bytes, (site, direction, sizes, fp32_bytes)


def steps_per_round(run):
    return max(int(n) for n in re.findall(r"round 0 trained (\d+) steps", run.output))


@pytest.mark.e2e
@pytest.mark.parametrize("which", ["percentile", "svt", "exclude"])
def test_privacy_filters_with_moon(which, simulate):
    privacy_filter = {
        "percentile": PercentilePrivacy(percentile=90, gamma=0.001),
        "svt": SVTPrivacy(fraction=0.1, epsilon=0.1, noise_var=0.1, gamma=1e-5, tau=1e-6),
        "exclude": ExcludeVars(["l3.weight", "l3.bias"]),
    }[which]
    recipe = MoonRecipe(
        name=f"moon_{which}", min_clients=2, num_rounds=1, privacy_filters=[privacy_filter], **TINY_TRAINING
    )
    run = simulate(recipe, n=2, t=2)
    assert run.returncode == 0, run.output[-3000:]
    assert "rejected the update" not in run.output
    initial = {k: v.numpy() for k, v in Network(seed=0).state_dict().items()}
    got = final_global(run)
    change = np.concatenate([(got[k] - initial[k]).ravel() for k in got])
    trained = np.concatenate([(local_model(run, "site-1")[k].numpy() - initial[k]).ravel() for k in got])
    if which == "percentile":  # each site kept only its top 10 % of |Δw| per step, clipped to γ per step
        bound = 0.001 * steps_per_round(run)
        assert np.abs(change).max() <= bound * (1 + 1e-5) < np.abs(trained).max()
        assert np.mean(change == 0) >= 0.8  # at most 10 % of entries per site moved
    elif which == "svt":  # SVT releases about `fraction` of the entries per site, with noise
        assert 0 < np.mean(change != 0) <= 2 * 0.1 + 0.02
    else:  # the excluded layer never left the sites: the global model keeps its initial value there
        for k in ("l3.weight", "l3.bias"):
            np.testing.assert_array_equal(got[k], initial[k])
        assert not np.array_equal(got["l1.weight"], initial["l1.weight"])
