import pytest
import torch
import torch.nn as nn

from nvflare_moon.models import Network, ProjectionModel, check_num_classes, cifar_resnet50


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_simple_cnn_network_has_the_papers_parameter_count():
    assert n_params(Network("simple_cnn", num_classes=10)) == 92_626


def test_network_returns_features_projection_and_logits_from_one_pass():
    out = Network("simple_cnn", num_classes=10)(torch.zeros(4, 3, 32, 32))
    assert out.features.shape == (4, 84)
    assert out.projection.shape == (4, 256)
    assert out.logits.shape == (4, 10)


def test_classifier_reads_the_projection_with_no_activation_after_l2():
    net = Network("simple_cnn", num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    out = net(x)
    expected_z = net.l2(torch.relu(net.l1(net.backbone(x))))
    torch.testing.assert_close(out.projection, expected_z)
    torch.testing.assert_close(out.logits, net.l3(expected_z))
    assert (out.projection < 0).any(), "z must not pass through a ReLU"


def test_cifar_resnet50_stem_no_maxpool_and_2048_features():
    backbone = cifar_resnet50()
    assert backbone.conv1.kernel_size == (3, 3) and backbone.conv1.stride == (1, 1)
    assert backbone.conv1.padding == (1, 1) and backbone.conv1.bias is None
    assert isinstance(backbone.maxpool, nn.Identity) and isinstance(backbone.fc, nn.Identity)
    assert backbone.eval()(torch.zeros(1, 3, 32, 32)).shape == (1, 2048)


def test_resnet50_network_parameter_count_with_100_classes():
    assert n_params(Network("resnet50", num_classes=100)) == 28_246_948  # "about 28.25M" in the spec


def test_projection_model_wraps_any_backbone():
    net = ProjectionModel(nn.Sequential(nn.Flatten(), nn.Linear(12, 7)), feat_dim=7, num_classes=3, out_dim=5)
    out = net(torch.zeros(2, 3, 2, 2))
    assert (out.features.shape, out.projection.shape, out.logits.shape) == ((2, 7), (2, 5), (2, 3))


@pytest.mark.parametrize("kwargs, name", [({"arch": "vgg"}, "arch"), ({"num_classes": 0}, "num_classes")])
def test_network_rejects_bad_arguments_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Network(**kwargs)


def test_num_classes_mismatch_names_the_fix():
    with pytest.raises(ValueError, match="num_classes=100"):
        check_num_classes(Network(num_classes=10), 100, "cifar100")


def test_network_seed_fixes_initial_weights_without_touching_the_global_rng():
    torch.manual_seed(5)
    expected_next = torch.rand(1)
    torch.manual_seed(5)
    a, b = Network(seed=3), Network(seed=3)
    assert torch.equal(torch.rand(1), expected_next)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(Network(seed=4).l1.weight, a.l1.weight)


def test_cifar_resnet50_takes_tiny_imagenet_64x64_input_to_2048_features():
    out = Network("resnet50", num_classes=200).eval()(torch.zeros(1, 3, 64, 64))
    assert out.features.shape == (1, 2048) and out.logits.shape == (1, 200)
