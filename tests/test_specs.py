"""The data and training specs (nvflare_moon.core.specs): each option checked in one place, and passed whole from
the recipe to every site's executor."""

import importlib

import pytest

from nvflare_moon.core.specs import DataSpec, TrainingSpec, spec_fields
from nvflare_moon.recipes import MoonRecipe


@pytest.mark.parametrize(
    "spec, arguments, message",
    [
        (DataSpec, {"dataset": "mnist"}, "dataset must be one of"),
        (DataSpec, {"beta": 0}, "beta must be > 0"),
        (DataSpec, {"partition": "skewed"}, "partition must be one of"),
        (DataSpec, {"download": "yes"}, "download must be True or False"),
        (TrainingSpec, {"lr": 0}, "lr must be > 0"),
        (TrainingSpec, {"local_epochs": 1.5}, "local_epochs must be an integer"),
        (TrainingSpec, {"device": "tpu"}, "device must be"),
        (TrainingSpec, {"amp": 1}, "amp must be True or False"),
    ],
)
def test_a_bad_field_is_refused_naming_it(spec, arguments, message):
    with pytest.raises(ValueError, match=message):
        spec(**arguments)


def test_the_recipe_passes_its_specs_whole_to_every_sites_executor():
    recipe = MoonRecipe(min_clients=3, dataset="synthetic", beta=0.3, lr=0.02, local_epochs=2, amp=False, seed=4)
    assert recipe.data_spec == DataSpec(dataset="synthetic", num_sites=3, beta=0.3, seed=4)
    assert recipe.training_spec == TrainingSpec(lr=0.02, local_epochs=2)
    executor = recipe.make_executor(recipe._executor_args)
    assert executor.data_spec == recipe.data_spec and executor.training_spec == recipe.training_spec
    for spec in (executor.data_spec, executor.training_spec):
        for name, value in spec_fields(spec).items():  # stored under its own name too: NVFlare's exporter reads it
            assert getattr(executor, name) == value, name
    assert set(spec_fields(recipe.data_spec)) | set(spec_fields(recipe.training_spec)) <= set(recipe._executor_args)


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
    with pytest.raises(ValueError, match=r"^model must be an nn.Module \(such as nvflare_moon.models.Network\), got dict"):
        cls(model={"w": 1})
