"""Networks shared by every method: an encoder, MOON's projection head and a classifier on the projection.

    h = encoder(x)                 features, F-dimensional
    z = l2(relu(l1(h)))            projection, out_dim-dimensional (no activation after l2)
    logits = l3(z)                 the classifier reads the projection, as in the MOON reference code

FedAvg, FedProx, SCAFFOLD and SOLO use this same network so that comparisons are fair.
"""

from functools import partial
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn as nn

from .core.initial_weights import first_conv_name, load_initial_weights
from .core.validation import check_number


class ModelOutput(NamedTuple):
    features: torch.Tensor  # h
    projection: torch.Tensor  # z
    logits: torch.Tensor


class ProjectionModel(nn.Module):
    """Wrap any backbone that maps a batch to ``feat_dim`` features with MOON's projection head and classifier.

    Args:
        backbone: module returning ``[B, feat_dim]`` (or anything that flattens to it).
        feat_dim: F, the backbone's output size.
        out_dim: size of the projection z (256 in the papers).
        num_classes: K.
        predictor_hidden_dim: when set, add FedSiam-DA's SimSiam predictor ``p = predictor(z)``
            (out_dim → predictor_hidden_dim → out_dim, Linear–BN–ReLU–Linear; the paper's 256→64→256 is 64). It is
            part of the state dict, so it is aggregated with the rest of the model. None: no predictor.

    ``feature_noise`` (not an argument; None by default) is a callable applied to h before the projection head in
    training mode only, e.g. :class:`~nvflare_moon.core.feature_noise.FeatureNoise`, which the MOON and FedSSC
    executors set every round when ``feature_noise_std > 0``. It holds no parameters: the state dict is unchanged.
    """

    def __init__(
        self,
        backbone: nn.Module,
        feat_dim: int,
        num_classes: int,
        out_dim: int = 256,
        predictor_hidden_dim: Optional[int] = None,
    ):
        super().__init__()
        sizes = [("feat_dim", feat_dim), ("num_classes", num_classes), ("out_dim", out_dim)]
        if predictor_hidden_dim is not None:
            sizes.append(("predictor_hidden_dim", predictor_hidden_dim))
        for name, value in sizes:
            check_number(name, value, low=1, integer=True)
        self.backbone = backbone
        self.l1 = nn.Linear(feat_dim, feat_dim)
        self.l2 = nn.Linear(feat_dim, out_dim)
        self.l3 = nn.Linear(out_dim, num_classes)
        # created last, so that the other layers' initial weights do not depend on it
        self.predictor = None if predictor_hidden_dim is None else simsiam_predictor(out_dim, predictor_hidden_dim)
        self.feature_noise: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def forward(self, x: torch.Tensor) -> ModelOutput:
        h = torch.flatten(self.backbone(x), 1)
        head_input = self.feature_noise(h) if self.training and self.feature_noise is not None else h
        z = project(self.l1, self.l2, head_input)
        return ModelOutput(h, z, self.l3(z))


def project(l1: nn.Linear, l2: nn.Linear, h: torch.Tensor) -> torch.Tensor:
    """MOON's projection head: z = l2(relu(l1(h))), ``[B, F] -> [B, out_dim]``."""
    return l2(torch.relu(l1(h)))


class ProjectionHead(nn.Module):
    """The projection head of a :class:`ProjectionModel`, sharing its layers: ``head(h) = l2(relu(l1(h)))``.

    Its state dict is the model's ``l1.*`` and ``l2.*`` entries, under the same names, so a stored head loads into
    ``ProjectionHead(model)`` and MOON's light history (``light_history``) keeps only these tensors.
    """

    def __init__(self, model: ProjectionModel):
        super().__init__()
        self.l1 = model.l1
        self.l2 = model.l2

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return project(self.l1, self.l2, h)


def simsiam_predictor(dim: int, hidden_dim: int) -> nn.Sequential:
    """SimSiam's prediction MLP (Chen and He, CVPR 2021): Linear(dim→hidden)–BN–ReLU–Linear(hidden→dim)."""
    return nn.Sequential(nn.Linear(dim, hidden_dim), nn.BatchNorm1d(hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, dim))


class SimpleCNN(nn.Sequential):
    """The MOON paper's CIFAR-10 encoder: two 5×5 conv/ReLU/max-pool stages, then fc 400→120→84 (F = 84).

    ``in_channels`` and ``image_size`` (square inputs) size the first convolution and the first fc layer for a site's
    own images; the defaults are the paper's 3 × 32 × 32, whose feature map is 16 × 5 × 5.
    """

    feat_dim = 84

    def __init__(self, in_channels: int = 3, image_size: int = 32):
        side = ((image_size - 4) // 2 - 4) // 2  # two 5x5 convolutions without padding, each followed by a 2x2 pool
        if side < 1:
            raise ValueError(f"image_size must be at least 16 pixels for simple_cnn, got {image_size}")
        super().__init__(
            nn.Conv2d(in_channels, 6, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * side * side, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
        )


def cifar_resnet50(in_channels: int = 3, image_size: int = 32) -> nn.Module:
    """torchvision's ResNet-50 adapted to 32×32 inputs: 3×3 stride-1 stem, no max-pool, fc removed (F = 2048).
    Any ``image_size`` works (the network ends in a global average pool)."""
    import torchvision  # here, not at the top: it adds ~2 s to every client process start (one per task at -t < -n)

    net = torchvision.models.resnet50(weights=None)
    net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    net.fc = nn.Identity()
    return net


class TorchvisionArch(NamedTuple):
    """A torchvision classification network used as a backbone, in the form torchvision builds it for ImageNet."""

    builder: str  # its function in torchvision.models
    feat_dim: int  # F: the size of the pooled features its classifier reads
    classifier: str  # the attribute holding its classifier, replaced by nn.Identity


# "resnet50" is the MOON paper's CIFAR form (cifar_resnet50), which the paper's jobs and figures name; torchvision's own
# ResNet-50, whose 7x7 stride-2 stem and max-pool fit 64-224 px images and ImageNet-trained weights, is
# "resnet50_imagenet". The others exist in one form only and keep torchvision's names.
TORCHVISION_ARCHS = {
    "resnet18": TorchvisionArch("resnet18", 512, "fc"),
    "resnet34": TorchvisionArch("resnet34", 512, "fc"),
    "resnet50_imagenet": TorchvisionArch("resnet50", 2048, "fc"),
    "densenet121": TorchvisionArch("densenet121", 1024, "classifier"),
    "efficientnet_b0": TorchvisionArch("efficientnet_b0", 1280, "classifier"),
}
TORCHVISION_MIN_IMAGE_SIZE = 32  # these networks downsample by 32 (DenseNet's last pooling fails below)


def torchvision_backbone(arch: str, in_channels: int = 3, image_size: int = 224) -> nn.Module:
    """torchvision's network ``arch`` (a key of :data:`TORCHVISION_ARCHS`) with random weights (``initial_weights``
    brings trained ones), its classifier replaced by ``nn.Identity`` so that it returns the F pooled features, and
    its first convolution reading ``in_channels``. Any ``image_size`` from 32 px works (it ends in a global pool)."""
    import torchvision  # here, not at the top: see cifar_resnet50

    if image_size < TORCHVISION_MIN_IMAGE_SIZE:
        raise ValueError(
            f"image_size must be at least {TORCHVISION_MIN_IMAGE_SIZE} pixels for {arch} (it downsamples by 32), "
            f"got {image_size}"
        )
    spec = TORCHVISION_ARCHS[arch]
    net = getattr(torchvision.models, spec.builder)(weights=None)
    net.set_submodule(spec.classifier, nn.Identity())
    first = first_conv_name(net)
    net.set_submodule(first, with_input_channels(net.get_submodule(first), in_channels))
    return net


def with_input_channels(conv: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    """``conv`` itself where it reads ``in_channels`` channels, else a new convolution like it that reads them."""
    if conv.in_channels == in_channels:
        return conv
    return nn.Conv2d(
        in_channels,
        conv.out_channels,
        conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        groups=conv.groups,
        bias=conv.bias is not None,
    )


BACKBONES = {
    "simple_cnn": (SimpleCNN, SimpleCNN.feat_dim),
    "resnet50": (cifar_resnet50, 2048),
    **{name: (partial(torchvision_backbone, name), spec.feat_dim) for name, spec in TORCHVISION_ARCHS.items()},
}


class Network(ProjectionModel):
    """A named backbone (a key of :data:`BACKBONES`) with the projection head and classifier.

    ``arch``: ``"simple_cnn"`` (the MOON paper's CIFAR-10 encoder, F = 84), ``"resnet50"`` (the paper's ResNet-50
    with a CIFAR stem, F = 2048), or torchvision's networks as built for ImageNet, for 32-224 px images:
    ``"resnet18"``, ``"resnet34"`` (F = 512), ``"resnet50_imagenet"`` (F = 2048), ``"densenet121"`` (F = 1024),
    ``"efficientnet_b0"`` (F = 1280); their classifier is removed, MOON's head and classifier take its place.

    Its arguments are plain values, so NVFlare job configs can build it:
    ``{"path": "nvflare_moon.models.Network", "args": {"arch": "simple_cnn", "num_classes": 10}}``.
    ``seed`` fixes the initial weights (without touching the global RNG), so that runs are reproducible; None draws
    them from torch's global RNG. ``predictor_hidden_dim`` adds FedSiam-DA's predictor (see :class:`ProjectionModel`).
    ``in_channels`` and ``image_size`` fit the encoder to a site's own images (1 channel for grayscale: the first
    convolution reads one channel).

    ``initial_weights``: the path of a weights file to start from, read with ``torch.load(weights_only=True)`` where
    the network is built, never downloaded (:func:`~nvflare_moon.core.initial_weights.load_initial_weights`):
    torchvision's state dict of the arch (e.g. ImageNet weights saved with ``torch.save(net.state_dict(), path)``),
    loaded into the backbone, its classifier's entries ignored, the head keeping its seeded weights; or a whole
    Network's state dict (or NVFlare's ``FL_global_model.pt``). With ``in_channels=1`` and 3-channel weights, the
    first convolution's weights are summed over their input channels. A missing file, one that is no state dict or
    does not fit the arch is refused, naming the file. The recipes give it to the server's initial model alone:
    sites receive that model before they train, so they need no file.
    """

    _always_serialize_args = ("arch", "num_classes", "out_dim", "seed")  # exported configs show the architecture

    def __init__(
        self,
        arch: str = "simple_cnn",
        num_classes: int = 10,
        out_dim: int = 256,
        seed: Optional[int] = 0,
        predictor_hidden_dim: Optional[int] = None,
        in_channels: int = 3,
        image_size: int = 32,
        initial_weights: Optional[str] = None,
    ):
        if arch not in BACKBONES:
            raise ValueError(f"arch must be one of {sorted(BACKBONES)}, got {arch!r}")
        check_number("in_channels", in_channels, low=1, integer=True)
        check_number("image_size", image_size, low=1, integer=True)
        if initial_weights is not None and (not isinstance(initial_weights, str) or not initial_weights):
            raise ValueError(f"initial_weights must be the path of a weights file or None, got {initial_weights!r}")
        make_backbone, feat_dim = BACKBONES[arch]
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            super().__init__(
                make_backbone(in_channels, image_size),
                feat_dim=feat_dim,
                num_classes=num_classes,
                out_dim=out_dim,
                predictor_hidden_dim=predictor_hidden_dim,
            )
        if initial_weights is not None:
            load_initial_weights(self, initial_weights, arch)
        self.arch = arch
        self.num_classes = num_classes
        self.out_dim = out_dim
        self.seed = seed
        self.predictor_hidden_dim = predictor_hidden_dim
        self.in_channels = in_channels
        self.image_size = image_size
        self.initial_weights = initial_weights


def check_num_classes(model: nn.Module, num_classes: int, dataset: str) -> None:
    """Fail early, naming both settings, when the classifier does not fit the dataset."""
    classifier = getattr(model, "l3", None)
    if isinstance(classifier, nn.Linear) and classifier.out_features != num_classes:
        raise ValueError(
            f"model has {classifier.out_features} outputs but dataset {dataset!r} has {num_classes} classes; "
            f"set the model's num_classes={num_classes}"
        )
