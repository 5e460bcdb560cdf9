"""The data and training specs (nvflare_moon.core.specs): each option checked in one place, and passed whole from
the recipe to every site's executor."""

import importlib
import inspect
import json

import pytest
from nvflare.fuel.utils.component_builder import ComponentBuilder
from nvflare.recipe.utils import set_per_site_config

from nvflare_moon.benchmark.methods import flat_spec_args
from nvflare_moon.core.moon import MoonSettings
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.executors import FedSSCExecutor, MoonExecutor
from nvflare_moon.models import Network
from nvflare_moon.recipes import FedSSCRecipe, MoonRecipe


@pytest.mark.parametrize(
    "spec, arguments, message",
    [
        (DataSpec, {"dataset": "mnist"}, "dataset must be one of"),
        (DataSpec, {"beta": 0}, "beta must be > 0"),
        (DataSpec, {"partition": "skewed"}, "partition must be one of"),
        (DataSpec, {"download": "yes"}, "download must be True or False"),
        (DataSpec, {"site_path": "/data/h1"}, "site_path is the folder of a site's own images .* give that dataset's"),
        (DataSpec, {"dataset": "image_folder", "site_path": ""}, "site_path must be the site's folder or manifest"),
        (DataSpec, {"dataset": "datalist", "site_path": "/a", "data_root": "/b"}, "data_root and site_path are both"),
        (TrainingSpec, {"lr": 0}, "lr must be > 0"),
        (TrainingSpec, {"local_epochs": 1.5}, "local_epochs must be an integer"),
        (TrainingSpec, {"device": "tpu"}, "device must be"),
        (TrainingSpec, {"amp": 1}, "amp must be True or False"),
    ],
)
def test_a_bad_field_is_refused_naming_it(spec, arguments, message):
    with pytest.raises(ValueError, match=message):
        spec(**arguments)


def test_a_sites_own_images_are_at_site_path_and_data_root_is_its_old_name_for_one_release():
    site_data = {"class_names": ["normal", "pneumonia"]}
    spec = DataSpec(dataset="image_folder", site_data=site_data, site_path="/data/{SITE_NAME}")
    assert (spec.site_path, spec.data_root) == ("/data/{SITE_NAME}", None)
    with pytest.warns(DeprecationWarning, match=r"data_root for the site's own images .* use site_path=") as warned:
        old = DataSpec(dataset="image_folder", site_data=site_data, data_root="/data/{SITE_NAME}")
    assert old == spec and {warning.filename for warning in warned} == {__file__}
    # one path per site: site_path, or data_root (its old name) as NVFlare's set_per_site_config gives it
    recipe = MoonRecipe(min_clients=2, dataset="image_folder", site_data=site_data)
    with pytest.warns(DeprecationWarning, match="use 'site_path'"):
        set_per_site_config(recipe, {"site-1": {"site_path": "/h1"}, "site-2": {"data_root": "/h2"}})
        paths = {
            site: recipe._site_executor(overrides).data.site_path for site, overrides in recipe.per_site_config.items()
        }
    assert paths == {"site-1": "/h1", "site-2": "/h2"}
    # a location for every site in the recipe, replaced per site by either name
    with pytest.warns(DeprecationWarning, match="use '?site_path") as warned:
        recipe = MoonRecipe(min_clients=2, dataset="image_folder", site_data=site_data, data_root="/all/{SITE_NAME}")
        set_per_site_config(recipe, {"site-1": {"data_root": "/h1"}, "site-2": {"device": "cpu"}})
        paths = {
            site: recipe._site_executor(overrides).data.site_path for site, overrides in recipe.per_site_config.items()
        }
    assert paths == {"site-1": "/h1", "site-2": "/all/{SITE_NAME}"}
    assert {warning.filename for warning in warned} == {__file__}  # the user's lines, past dataclasses.replace
    with pytest.raises(ValueError, match="site 'site-1' gives site_path and data_root; give site_path"):
        set_per_site_config(
            MoonRecipe(min_clients=2, dataset="image_folder", site_data=site_data),
            {"site-1": {"data_root": "/h1", "site_path": "/h1"}, "site-2": {}},
        )
    assert DataSpec(dataset="image_folder", site_data=site_data, data_root="").site_path is None  # "" is unset


def test_the_recipe_passes_its_specs_whole_to_every_sites_executor():
    recipe = MoonRecipe(
        min_clients=3, dataset="synthetic", beta=0.3, lr=0.02, local_epochs=2, amp=False, seed=4, mu=2.0
    )
    assert recipe.data_spec == DataSpec(dataset="synthetic", num_sites=3, beta=0.3, seed=4)
    assert recipe.training_spec == TrainingSpec(lr=0.02, local_epochs=2)
    executor = recipe.make_executor(recipe._executor_args)
    assert executor.data is recipe.data_spec and executor.training is recipe.training_spec and executor.dp is None
    assert executor.settings == MoonSettings(mu=2.0)


def test_an_exported_job_builds_back_the_same_specs_on_the_site(tmp_path):
    """The specs travel as nested components of the job's config: NVFlare's component builder, as a site runs it,
    gives back equal specs (the papers' settings written even where they are the defaults)."""
    recipe = MoonRecipe(min_clients=3, dataset="synthetic", beta=0.3, lr=0.02, mu=2.0, temperature=0.3)
    recipe.export(str(tmp_path))
    with open(tmp_path / recipe._job.name / "app" / "config" / "config_fed_client.json") as f:
        executor_config = json.load(f)["executors"][0]["executor"]
    assert set(executor_config["args"]["training"]["args"]) >= {"local_epochs", "batch_size", "lr", "momentum"}
    executor = PathComponentBuilder().build_component(executor_config)
    assert executor.data == recipe.data_spec and executor.training == recipe.training_spec
    assert executor.settings == MoonSettings(mu=2.0, temperature=0.3)


class PathComponentBuilder(ComponentBuilder):
    """NVFlare's component builder for configs that name every class by its path (as exported jobs do)."""

    def get_module_scanner(self):
        return None


def test_the_old_flat_names_build_the_same_specs_with_a_warning():
    # every warning recorded, one per spec: a warning left unmatched would be emitted again when the block ends
    with pytest.warns(DeprecationWarning) as warned:
        old = MoonExecutor(Network(num_classes=10), dataset="synthetic", beta=0.3, lr=0.02, mu=2.0)
    assert sorted(str(warning.message) for warning in warned) == sorted(
        f"MoonExecutor({flat}) is deprecated and will be removed in the next release: use {nested}"
        for flat, nested in [
            ("dataset=..., beta=...", "data=DataSpec(dataset=..., beta=...)"),
            ("lr=...", "training=TrainingSpec(lr=...)"),
            ("mu=...", "settings=MoonSettings(mu=...)"),
        ]
    )
    assert {warning.filename for warning in warned} == {__file__}  # the user's line, past the executors' constructors
    assert old.data == DataSpec(dataset="synthetic", beta=0.3)
    assert old.training == TrainingSpec(lr=0.02) and old.settings == MoonSettings(mu=2.0)
    with pytest.raises(TypeError, match=r"give training=TrainingSpec\(...\) alone, not with lr=..."):
        MoonExecutor(Network(num_classes=10), training=TrainingSpec(), lr=0.02)
    with pytest.raises(TypeError, match="unexpected keyword argument.*learning_rate"):
        MoonExecutor(Network(num_classes=10), learning_rate=0.02)
    with pytest.raises(ValueError, match="training must be a TrainingSpec, got dict"):
        MoonExecutor(Network(num_classes=10), training={"lr": 0.02})
    # an empty dict is refused too, not taken for "not given" (it once fell through to the defaults)
    with pytest.raises(ValueError, match="settings must be a MoonSettings, got dict"):
        MoonExecutor(Network(num_classes=10), settings={})
    with pytest.raises(ValueError, match="fedssc_settings must be a FedSSCSettings, got dict"):
        FedSSCExecutor(Network(num_classes=10), fedssc_settings={})


def test_a_config_of_today_compares_equal_to_the_same_job_with_flat_executor_arguments():
    """The records' job digests and the resume points were made when the executors took every field flat."""
    flat = {"path": "x.MoonExecutor", "args": {"mu": 2.0, "beta": 0.3, "lr": 0.02, "dp_target_epsilon": 3.0}}
    nested = {
        "path": "x.MoonExecutor",
        "args": {
            "settings": {"path": "nvflare_moon.core.moon.MoonSettings", "args": {"mu": 2.0}},
            "data": {"path": "nvflare_moon.core.specs.DataSpec", "args": {"beta": 0.3}},
            "training": {"path": "nvflare_moon.core.specs.TrainingSpec", "args": {"lr": 0.02}},
            "dp": {"path": "nvflare_moon.core.dp.DPSettings", "args": {"target_epsilon": 3.0}},
        },
    }
    assert flat_spec_args({"executors": [{"executor": nested}]}) == {"executors": [{"executor": flat}]}


@pytest.mark.parametrize(
    "component",
    [
        "nvflare_moon.executors.FedAvgExecutor",
        "nvflare_moon.server.GlobalModelEvaluator",
        "nvflare_moon.client.PTMoonHelper",
        "nvflare_moon.client.PTFedSiamDAHelper",
        "nvflare_moon.client.PTPersistentScaffoldHelper",
        "nvflare_moon.methods.fedbn.PTFedBNHelper",
    ],
)
def test_every_component_refuses_a_model_that_is_not_a_network_naming_the_argument(component):
    module, name = component.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    with pytest.raises(
        ValueError, match=r"^model must be an nn.Module \(such as nvflare_moon.models.Network\), got dict"
    ):
        cls(model={"w": 1})


def test_a_recipes_signature_shows_every_option_its_bases_included():
    """Recipes are keyword-only dataclasses: ``help(FedSSCRecipe)`` lists MOON's and FedAvg's options too, with their
    defaults, and each option is stored under its own name before the job is built."""
    parameters = inspect.signature(FedSSCRecipe).parameters
    assert {"lr", "beta", "dp_target_epsilon", "stop_cond", "mu", "temperature", "mu_glob"} <= set(parameters)
    assert all(parameter.kind is inspect.Parameter.KEYWORD_ONLY for parameter in parameters.values())
    assert parameters["name"].default == "fedssc_cifar10" and parameters["mu_glob"].default == 1.0
    recipe = FedSSCRecipe(min_clients=2, dataset="synthetic", lr=0.02, mu_glob=0.5)
    assert (recipe.lr, recipe.mu_glob, recipe.mu) == (0.02, 0.5, 5.0)  # mu: MOON's best for CIFAR-10's stand-in
    executor = recipe.make_executor(recipe._executor_args)
    assert executor.fedssc_settings.mu_glob == 0.5 and executor.training.lr == 0.02
    with pytest.raises(ValueError, match="FedSSCRecipe has no representation_loss"):
        FedSSCRecipe(representation_loss="l2")
    with pytest.raises(TypeError, match="unexpected keyword argument 'learning_rate'"):
        MoonRecipe(learning_rate=0.02)
