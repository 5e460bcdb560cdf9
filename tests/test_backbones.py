"""Networks a hospital would start from (issue 39, item 3): torchvision backbones by name under MOON's head, initial
weights from a file the submitter provides (refused by name where it does not fit), and mixed precision in local
training; one simulator run trains resnet18 at 64 px from a weights file that the test writes."""

import copy
import json

import pytest
import torch
import torch.nn as nn
import torchvision

from nvflare_moon.core.objectives import CrossEntropyObjective
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.core.training import MixedPrecisionStep, sgd, train_local
from nvflare_moon.executors import FedAvgExecutor, FedSiamDAExecutor
from nvflare_moon.models import TORCHVISION_ARCHS, Network, ProjectionModel
from nvflare_moon.recipes import FedAvgBaselineRecipe, MoonRecipe

from .conftest import run_simulator
from .site_images import write_image_folder


def torchvision_state(builder: str, seed: int = 7) -> dict:
    """A torchvision network's state dict with random weights (a stand-in for ImageNet weights: no download)."""
    torch.manual_seed(seed)
    return getattr(torchvision.models, builder)(weights=None).state_dict()


@pytest.fixture(scope="module")
def resnet18_file(tmp_path_factory):
    """``(path, state dict)`` of a torchvision resnet18 weights file, as a hospital would save one."""
    state = torchvision_state("resnet18")
    path = tmp_path_factory.mktemp("weights") / "resnet18.pt"
    torch.save(state, path)
    return path, state


# ---- the backbones -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", sorted(TORCHVISION_ARCHS))
def test_each_torchvision_arch_gives_its_features_under_moons_head_for_one_channel_images(arch):
    net = Network(arch, num_classes=3, in_channels=1, image_size=32)
    out = net(torch.randn(2, 1, 32, 32))
    assert out.features.shape == (2, TORCHVISION_ARCHS[arch].feat_dim)
    assert out.projection.shape == (2, 256) and out.logits.shape == (2, 3)
    assert net.l1.in_features == TORCHVISION_ARCHS[arch].feat_dim


def test_resnet50_keeps_the_papers_cifar_stem_and_resnet50_imagenet_is_torchvisions():
    cifar, imagenet = Network("resnet50").backbone, Network("resnet50_imagenet", image_size=64).backbone
    assert cifar.conv1.kernel_size == (3, 3) and isinstance(cifar.maxpool, nn.Identity)
    assert imagenet.conv1.kernel_size == (7, 7) and imagenet.conv1.stride == (2, 2)
    assert isinstance(imagenet.maxpool, nn.MaxPool2d) and isinstance(imagenet.fc, nn.Identity)


def test_an_image_too_small_for_a_torchvision_arch_is_refused_by_name():
    with pytest.raises(ValueError, match="image_size must be at least 32 pixels for densenet121"):
        Network("densenet121", image_size=16)


# ---- initial weights -----------------------------------------------------------------------------------------------


def test_a_torchvision_state_dict_loads_into_the_backbone_and_the_head_keeps_its_seeded_weights(resnet18_file):
    path, state = resnet18_file
    net = Network("resnet18", num_classes=3, image_size=64, initial_weights=str(path))
    backbone = net.backbone.state_dict()
    assert set(backbone) == {k for k in state if not k.startswith("fc.")}
    assert all(torch.equal(backbone[k], state[k]) for k in backbone)
    seeded = Network("resnet18", num_classes=3, image_size=64)
    assert torch.equal(net.l1.weight, seeded.l1.weight) and torch.equal(net.l3.bias, seeded.l3.bias)
    assert not torch.equal(seeded.backbone.conv1.weight, state["conv1.weight"])  # the file made the difference
    assert net.initial_weights == str(path)  # stored under its own name, for NVFlare's job exporter


def test_one_channel_input_sums_the_first_convolution_over_its_three_input_channels(resnet18_file):
    path, state = resnet18_file
    net = Network("resnet18", num_classes=3, in_channels=1, image_size=64, initial_weights=str(path))
    torch.testing.assert_close(net.backbone.conv1.weight, state["conv1.weight"].sum(dim=1, keepdim=True))
    assert torch.equal(net.backbone.layer1[0].conv1.weight, state["layer1.0.conv1.weight"])


def test_a_whole_network_or_nvflares_checkpoint_of_it_loads_whole(tmp_path):
    trained = Network("simple_cnn", num_classes=3, seed=1)
    torch.save(trained.state_dict(), tmp_path / "network.pt")
    torch.save({"model": trained.state_dict(), "train_conf": {"train": {}}}, tmp_path / "FL_global_model.pt")
    for name in ("network.pt", "FL_global_model.pt"):
        loaded = Network("simple_cnn", num_classes=3, seed=2, initial_weights=str(tmp_path / name))
        assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), trained.state_dict().values()))


def test_torchvisions_hosted_densenet_names_are_read(tmp_path):
    """torchvision's DenseNet files at its download address name ``norm1`` ``norm.1`` (its loader renames them) and,
    older than BatchNorm's step counter, hold no ``num_batches_tracked``."""
    state = torchvision_state("densenet121")
    old_names = {
        k.replace(".norm1.", ".norm.1.").replace(".conv2.", ".conv.2."): v
        for k, v in state.items()
        if not k.endswith("num_batches_tracked")
    }
    assert "features.denseblock1.denselayer1.norm.1.weight" in old_names
    torch.save(old_names, tmp_path / "densenet121-a639ec97.pth")
    net = Network("densenet121", num_classes=2, initial_weights=str(tmp_path / "densenet121-a639ec97.pth"))
    key = "features.denseblock1.denselayer1.norm1.running_var"
    assert torch.equal(net.backbone.state_dict()[key], state[key])


@pytest.mark.parametrize(
    "write, expected",
    [
        (None, "initial_weights='{path}': no such file"),
        (lambda path: torch.save(torchvision_state("densenet121"), path), "file {path} does not fit arch='resnet18'"),
        (lambda path: torch.save([1.0, 2.0], path), "file {path} holds a list, not a state dict"),
        (lambda path: path.write_text("not weights"), "file {path} cannot be read by torch.load"),
    ],
    ids=["missing", "densenet_for_resnet18", "a_list", "not_torch"],
)
def test_a_file_that_cannot_be_the_initial_weights_is_refused_naming_it(tmp_path, write, expected):
    path = tmp_path / "weights.pt"
    if write is not None:
        write(path)
    with pytest.raises(ValueError) as refused:
        Network("resnet18", image_size=64, initial_weights=str(path))
    assert expected.format(path=path) in str(refused.value)


def test_a_wrong_arch_file_names_the_first_keys_that_do_not_fit(tmp_path):
    torch.save(torchvision_state("densenet121"), tmp_path / "densenet.pt")
    with pytest.raises(ValueError) as refused:
        Network("resnet18", image_size=64, initial_weights=str(tmp_path / "densenet.pt"))
    message = str(refused.value)
    assert "missing keys: conv1.weight, bn1.weight" in message and "unexpected keys: features.conv0.weight" in message
    assert "of torchvision's network for this arch" in message  # and the fix


def test_a_network_of_other_sizes_is_refused_naming_the_shapes(tmp_path):
    torch.save(Network("simple_cnn", num_classes=3).state_dict(), tmp_path / "three_classes.pt")
    with pytest.raises(
        ValueError, match=r"wrong shapes: l3\.weight \(3, 256\) in the file, \(10, 256\) in the network"
    ):
        Network("simple_cnn", num_classes=10, initial_weights=str(tmp_path / "three_classes.pt"))


@pytest.mark.parametrize("value", ["", 3, b"file.pt"])
def test_initial_weights_that_is_no_path_is_refused_by_name(value):
    with pytest.raises(ValueError, match="initial_weights must be the path of a weights file or None"):
        Network("simple_cnn", initial_weights=value)


def test_the_recipe_refuses_a_relative_path_which_the_server_would_read_elsewhere():
    with pytest.raises(ValueError, match="initial_weights must be the absolute path of a weights file"):
        FedAvgBaselineRecipe(min_clients=2, dataset="synthetic", initial_weights="resnet18.pt")


# ---- mixed precision -----------------------------------------------------------------------------------------------


def tiny_net() -> ProjectionModel:
    torch.manual_seed(0)
    return ProjectionModel(nn.Sequential(nn.Flatten(), nn.Linear(12, 6)), feat_dim=6, num_classes=3, out_dim=4)


def batches(n: int = 3):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 3, 2, 2, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def trained(amp=None):
    """A tiny network after two epochs of SGD with momentum, with ``amp`` given where it is not None."""
    net = tiny_net()
    options = {} if amp is None else {"amp": amp}
    train_local(net, batches(), CrossEntropyObjective(), sgd(net, 0.1, 0.9, 1e-5), 2, torch.device("cpu"), **options)
    return net


def test_amp_off_trains_bit_identically_to_the_loop_without_the_option():
    net = tiny_net()  # the loop as it was written before amp existed
    optimizer = sgd(net, 0.1, 0.9, 1e-5)
    for _ in range(2):
        for x, y in batches():
            loss, _ = CrossEntropyObjective()(net(x), x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    for other in (trained(), trained(amp=False)):
        assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), other.state_dict().values()))


def test_amp_on_the_cpu_runs_the_step_in_bfloat16_and_trains_float32_weights():
    net, seen = tiny_net(), []

    def objective(out, x, y):
        seen.append(out.logits.dtype)
        return CrossEntropyObjective()(out, x, y)

    before = copy.deepcopy(net.state_dict())
    result = train_local(net, batches(), objective, sgd(net, 0.1, 0.9, 0.0), 1, torch.device("cpu"), amp=True)
    assert seen == [torch.bfloat16] * 3 and result.steps == 3
    assert all(p.dtype == torch.float32 for p in net.parameters())
    assert not torch.equal(net.l1.weight, before["l1.weight"])
    assert all(torch.isfinite(torch.tensor(v)) for v in result.mean_terms.values())


def test_the_gpus_gradient_scaler_only_rescales_the_float16_step():
    """The GPU's branch (float16 and a GradScaler) on the CPU, with torch's CPU scaler in place of the CUDA one: with
    a power-of-two scale and no overflow, the weights are bit-identical to float16 steps without a scaler."""
    trained_nets = []
    for scaler in (None, torch.amp.GradScaler("cpu")):
        net = tiny_net()
        optimizer = sgd(net, 0.1, 0.9, 0.0)
        step = MixedPrecisionStep(torch.device("cpu"))
        step.dtype, step.scaler = torch.float16, scaler
        for x, y in batches():
            step(net, CrossEntropyObjective(), optimizer, x, y)
        trained_nets.append(net)
    assert scaler.get_scale() == 2.0**16  # no step was skipped
    unscaled, scaled = (net.state_dict().values() for net in trained_nets)
    assert all(torch.equal(a, b) for a, b in zip(unscaled, scaled))


def test_amp_travels_from_the_recipe_to_every_sites_executor(tmp_path):
    MoonRecipe(name="moon_amp", min_clients=2, dataset="synthetic", amp=True).export(str(tmp_path))
    client = json.loads((tmp_path / "moon_amp" / "app" / "config" / "config_fed_client.json").read_text())
    assert client["executors"][0]["executor"]["args"]["training"]["args"]["amp"] is True


def test_amp_is_a_flag_of_every_executor_but_fedsiam_da():
    with pytest.raises(ValueError, match="amp must be True or False"):
        FedAvgExecutor(model=Network(), data=DataSpec(dataset="synthetic"), training=TrainingSpec(amp="yes"))
    with pytest.raises(ValueError, match="amp=True cannot be used with FedSiam-DA"):
        FedSiamDAExecutor(
            model=Network(predictor_hidden_dim=64), data=DataSpec(dataset="synthetic"), training=TrainingSpec(amp=True)
        )


# ---- end to end ----------------------------------------------------------------------------------------------------

CLASSES = ["normal", "pneumonia"]


@pytest.mark.e2e
def test_resnet18_trains_at_64_px_from_a_weights_file_that_only_the_server_reads(tmp_path, resnet18_file):
    path, state = resnet18_file
    sites = ["site-1", "site-2"]
    for site in sites:
        write_image_folder(tmp_path / site, CLASSES, {"normal": 2, "pneumonia": 2}, {"normal": 1})
    recipe = FedAvgBaselineRecipe(
        name="resnet18_from_file",
        min_clients=2,
        num_rounds=1,
        dataset="image_folder",
        site_data={"class_names": CLASSES, "image_size": 64, "channels": 3, "augment": False},
        site_path=str(tmp_path / "{SITE_NAME}"),
        arch="resnet18",
        initial_weights=str(path),
        local_epochs=1,
        batch_size=2,
        lr=1e-9,  # training leaves the weights within 1e-6 of where they started: the global model shows the start
        num_threads=1,
    )
    recipe.export(str(tmp_path / "jobs"))
    app = tmp_path / "jobs" / "resnet18_from_file" / "app" / "config"
    server, client = (json.loads((app / f"config_fed_{side}.json").read_text()) for side in ("server", "client"))
    assert str(path) in json.dumps(server) and "initial_weights" not in json.dumps(client)  # the sites need no file

    run = run_simulator(tmp_path / "jobs" / "resnet18_from_file", tmp_path / "ws", n=2, t=2, timeout=600)
    assert run.returncode == 0, run.output[-3000:]
    assert f"initial weights of resnet18 from {path}" in run.output  # the server read the file
    assert all(f"{site}: 4 training samples" in run.output for site in sites)
    final = next(run.workspace.glob("server/simulate_job/**/FL_global_model.pt"))
    weights = torch.load(final, weights_only=True)["model"]
    for name, value in state.items():
        if name.startswith("fc.") or "running_" in name or "num_batches" in name:
            continue  # the classifier is MOON's; BatchNorm's running statistics move in training, whatever the lr
        torch.testing.assert_close(weights[f"backbone.{name}"], value, rtol=0, atol=1e-6)
    # and NVFlare's checkpoint of the run is itself a file a next job can start from
    again = Network("resnet18", num_classes=2, image_size=64, initial_weights=str(final))
    assert all(torch.equal(value, weights[name]) for name, value in again.state_dict().items())
