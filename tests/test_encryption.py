"""The recipes' ``encryption`` option (``nvflare_moon.filters.encryption``): what is refused at build and why, the job it
builds, and the site's part (weights by n_k, shapes of the decrypted model). The real run is
``tests/test_deploy_poc_he.py``."""

import json

import numpy as np
import pytest
import torch
from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.fl_constant import FLMetaKey, ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.signal import Signal
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType
from nvflare.app_common.filters import ExcludeVars
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from nvflare_moon.core.specs import DataSpec
from nvflare_moon.core.weights import load_numpy_state, restore_shapes
from nvflare_moon.executors import FedAvgExecutor, weight_exchange
from nvflare_moon.recipes import (
    FedAvgBaselineRecipe,
    FedProxRecipe,
    FedSiamDARecipe,
    FedSSCRecipe,
    MoonRecipe,
    ScaffoldRecipe,
)
from nvflare_moon.server import TrainTaskSettings

from .executor_harness import global_weights, run_task, site_context, started, tiny_dataset, tiny_net, train_task
from .test_executor import LABELS, TRAINING

pytest.importorskip("tenseal", reason="encryption='ckks' needs TenSEAL (extra 'he')")
HE = dict(min_clients=2, num_rounds=2, dataset="synthetic", server_evaluation=False, encryption="ckks")


@pytest.mark.parametrize(
    "recipe, method",
    [
        (ScaffoldRecipe, "SCAFFOLD's control difference"),
        (FedSSCRecipe, "class prototypes"),
        (FedSiamDARecipe, "cosine between plaintext models"),
    ],
)
def test_methods_that_need_plaintext_on_the_server_refuse_encryption_naming_both(recipe, method):
    with pytest.raises(ValueError, match=f"encryption='ckks' cannot be used with {recipe.__name__}: ") as refused:
        recipe(**HE)
    assert method in str(refused.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(encryption="bfv"), "encryption must be None or one of ['ckks'], got 'bfv'"),
        (dict(encryption=True), "encryption must be None or one of ['ckks'], got True"),
        (dict(server_evaluation=True), "cannot be combined with server_evaluation: the server holds no secret key"),
        (dict(privacy_filters=[ExcludeVars(["l3.bias"])]), "cannot be combined with privacy_filters"),
        (dict(stop_cond="accuracy >= 0.5"), "cannot be combined with stop_cond"),
        (dict(sample_fraction=0.5, num_sites=2), "cannot be combined with sample_fraction"),
    ],
)
def test_bad_or_conflicting_options_are_refused_naming_encryption(kwargs, message):
    with pytest.raises(ValueError) as refused:
        MoonRecipe(**{**HE, **kwargs})
    assert message in str(refused.value)


def test_quantization_is_refused_with_encryption():
    pytest.importorskip("bitsandbytes", reason="quantization is checked first and needs bitsandbytes")
    with pytest.raises(ValueError, match="cannot be combined with quantization: the quantizer cannot read CKKS"):
        MoonRecipe(**HE, quantization="float16")


@pytest.mark.parametrize("recipe", [FedAvgBaselineRecipe, MoonRecipe])
def test_the_job_is_nvflares_he_shape_with_the_sites_weighting_by_sample_count(recipe, tmp_path):
    built = recipe(name="he_job", **HE)
    assert built.encryption == "ckks"
    built.export(str(tmp_path))
    config = tmp_path / "he_job" / "app" / "config"
    server = json.loads((config / "config_fed_server.json").read_text())
    client = json.loads((config / "config_fed_client.json").read_text())
    (controller,) = server["workflows"]
    assert controller["path"].endswith("ScatterAndGather")
    paths = {c["id"]: c["path"].rsplit(".", 1)[-1] for c in server["components"]}
    assert paths["aggregator"] == "HEInTimeAccumulateWeightedAggregator"
    assert paths["shareable_generator"] == "HEModelShareableGenerator"
    assert paths["global_evaluator"] == "SiteMetricsRecorder"
    persistor = next(c for c in server["components"] if c["id"] == "persistor")
    assert persistor["args"]["filter_id"] == "model_serialize_filter"
    assert client["executors"][0]["executor"]["args"]["encrypted_aggregation"] is True
    # NVFlare stores a filter's tasks as a set, so their order in the exported JSON varies between runs.
    filters = {
        (kind, frozenset(chain["tasks"])): [f["path"].rsplit(".", 1)[-1] for f in chain["filters"]]
        for kind in ("task_data_filters", "task_result_filters")
        for chain in client[kind]
    }
    assert filters == {
        ("task_data_filters", frozenset({"train", "validate"})): ["HEModelDecryptor"],
        ("task_result_filters", frozenset({"train"})): ["HEModelEncryptor"],
        ("task_result_filters", frozenset({"submit_model"})): ["HEModelEncryptor"],
    }
    train_encryptor = client["task_result_filters"][0]["filters"][0]["args"]
    assert train_encryptor.get("weigh_by_local_iter", True) is True  # n_k, which the executor puts there


def test_fedprox_under_encryption_sends_mu_beside_scatter_and_gather(tmp_path):
    FedProxRecipe(name="prox", mu=0.25, **HE).export(str(tmp_path))
    server = json.loads((tmp_path / "prox" / "app" / "config" / "config_fed_server.json").read_text())
    (settings,) = [c for c in server["components"] if c["id"] == "task_settings"]
    assert settings["path"].endswith("TrainTaskSettings")
    assert settings["args"]["client_settings"] == {"fedprox_mu": 0.25}


def test_train_task_settings_add_to_the_models_meta_and_leave_its_data(tmp_path):
    task = DXO(DataKind.WEIGHTS, data={"w": b"ciphertext"}, meta={"kept": 1}).to_shareable()
    ctx = FLContext()
    ctx.set_prop(AppConstants.TRAIN_SHAREABLE, task, private=True, sticky=False)
    TrainTaskSettings(client_settings={"fedprox_mu": 0.25}).handle_event(AppEventType.BEFORE_TRAIN_TASK, ctx)
    received = FLModelUtils.from_shareable(task)
    assert received.meta["fedprox_mu"] == 0.25 and received.meta["kept"] == 1
    assert received.params == {"w": b"ciphertext"}


def test_without_encryption_the_job_has_no_he_part(tmp_path):
    MoonRecipe(name="clear", min_clients=2, num_rounds=2, dataset="synthetic").export(str(tmp_path))
    config = tmp_path / "clear" / "app" / "config"
    text = (config / "config_fed_server.json").read_text() + (config / "config_fed_client.json").read_text()
    assert ".he." not in text and "encrypted_aggregation" not in text


def he_site(tmp_path, monkeypatch):
    monkeypatch.setattr(weight_exchange, "check_he_context", lambda fl_ctx: None)  # no kit here: see the POC test
    executor = FedAvgExecutor(
        model=tiny_net(seed=7),
        data=DataSpec(dataset=tiny_dataset(LABELS)),
        training=TRAINING,
        encrypted_aggregation=True,
    )
    ctx = site_context(tmp_path)
    return started(executor, ctx), ctx


def test_under_he_a_site_sends_its_sample_count_for_the_encryptor_to_weigh_by(tmp_path, monkeypatch):
    executor, ctx = he_site(tmp_path, monkeypatch)
    code, reply = run_task(executor, ctx, global_weights())
    assert code == ReturnCode.OK
    # HEModelEncryptor multiplies by NUM_STEPS_CURRENT_ROUND; FedAvg's weight is n_k (14), not the steps (2 · 3)
    assert reply.meta[FLMetaKey.NUM_STEPS_CURRENT_ROUND] == reply.meta["num_samples"] == 14


def test_under_he_a_site_trains_from_the_decrypted_flat_global_model_as_from_the_shaped_one(tmp_path, monkeypatch):
    executor, ctx = he_site(tmp_path / "flat", monkeypatch)
    flat = {name: value.ravel().astype(np.float64).tolist() for name, value in global_weights(seed=3).items()}
    _, from_flat = run_task(executor, ctx, flat, round_number=1)
    reference, ctx_ref = he_site(tmp_path / "shaped", monkeypatch)
    _, from_shaped = run_task(reference, ctx_ref, global_weights(seed=3), round_number=1)
    for name in from_shaped.params:
        np.testing.assert_array_equal(from_flat.params[name], from_shaped.params[name])


def test_a_site_without_the_he_context_answers_its_first_task_with_the_reason_and_the_fix(tmp_path):
    executor = FedAvgExecutor(
        model=tiny_net(seed=7),
        data=DataSpec(dataset=tiny_dataset(LABELS)),
        training=TRAINING,
        encrypted_aggregation=True,
    )
    ctx = site_context(tmp_path)
    started(executor, ctx)
    reply = executor.execute("train", train_task(global_weights(), 0), ctx, Signal())
    assert reply.get_return_code() == ReturnCode.EXECUTION_EXCEPTION
    error = reply.get_header("__error__")
    assert "no usable HE context" in error and "Re-provision the federation with NVFlare's HEBuilder" in error


def test_restore_shapes_reshapes_only_flat_entries_of_the_right_size():
    reference = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    restored = restore_shapes({"w": list(range(6)), "b": [1.0, 2.0, 3.0]}, reference)
    assert restored["w"].shape == (2, 3) and restored["w"][1, 0] == 3 and list(restored["b"]) == [1.0, 2.0, 3.0]
    wrong = restore_shapes({"w": list(range(5)), "b": [1.0, 2.0, 3.0]}, reference)
    net = torch.nn.Module()
    net.register_buffer("w", torch.zeros(2, 3))
    net.register_buffer("b", torch.zeros(3))
    with pytest.raises(ValueError, match=r"shapes \(received, local\) differ for w \(5,\) vs \(2, 3\)"):
        load_numpy_state(net, wrong)  # a wrong size is still refused
