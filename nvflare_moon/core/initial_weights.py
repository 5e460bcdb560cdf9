"""Initial weights from a file that the submitter or a site provides, never downloaded: a torchvision state dict for
a network's backbone, or a whole network's state dict. Read with ``torch.load(weights_only=True)``, so a file cannot
run code; a file that is missing, is no state dict, or does not fit the network is refused with its path and the
first keys that do not fit."""

import logging
import os
import re
from typing import Any, Dict, List, Mapping

import torch
import torch.nn as nn

StateDict = Dict[str, torch.Tensor]

SHOWN_KEYS = 5  # how many mismatching keys a refusal names, per kind

BACKBONE_PREFIX = "backbone."  # a whole network's state dict names its backbone's entries so

# torchvision's hosted DenseNet weights keep the names of its first release ("norm.1.weight" for "norm1.weight"); its
# own loader renames them, and so does this one, so that a file downloaded from torchvision's address fits
_OLD_DENSENET_KEY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:1|2)\.(?:weight|bias|running_mean|running_var))$"
)

_FIX = (
    "give a state dict saved with torch.save(model.state_dict(), path): of torchvision's network for this arch "
    "(its classifier entries are ignored), or of a whole Network of the same arch, num_classes, out_dim and in_channels"
)


def first_conv_name(module: nn.Module) -> str:
    """The name of ``module``'s first ``nn.Conv2d`` (in registration order): the layer that reads the image."""
    return next(name for name, layer in module.named_modules() if isinstance(layer, nn.Conv2d))


def read_weights_file(path: str) -> StateDict:
    """The state dict in the file ``path`` (on the CPU); NVFlare's checkpoints (``FL_global_model.pt``) are read
    through their ``"model"`` entry.

    Raises:
        ValueError: naming ``initial_weights`` and the path: no such file, not readable by
            ``torch.load(weights_only=True)``, or not a mapping of names to tensors.
    """
    if not os.path.isfile(path):
        raise ValueError(
            f"initial_weights={path!r}: no such file; give the absolute path of a weights file readable where the "
            "model is built (the server reads it again when the job starts), or initial_weights=None for random "
            "initial weights"
        )
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle and zip errors differ by torch version; every one means the same here
        raise ValueError(
            f"initial_weights file {path} cannot be read by torch.load(weights_only=True) "
            f"({type(e).__name__}: {e}); {_FIX}"
        ) from e
    if isinstance(loaded, Mapping) and isinstance(loaded.get("model"), Mapping):
        loaded = loaded["model"]
    if not is_state_dict(loaded):
        raise ValueError(f"initial_weights file {path} holds {_describe(loaded)}, not a state dict; {_FIX}")
    return dict(loaded)


def is_state_dict(value: Any) -> bool:
    """Whether ``value`` is a non-empty mapping of names to tensors."""
    return (
        isinstance(value, Mapping)
        and len(value) > 0
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())
    )


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} of {len(value)} entries (keys {list(value)[:SHOWN_KEYS]})"
    return f"a {type(value).__name__}"


def as_backbone_state(state: StateDict, backbone: nn.Module) -> StateDict:
    """A torchvision network's state dict as ``backbone``'s: the entries of the layers ``backbone`` replaced by
    ``nn.Identity`` (its classifier, whose place MOON's head and classifier take) dropped, DenseNet's old names
    renamed, and a 3-channel first convolution summed over its input channels where ``backbone`` reads 1 channel
    (a grayscale image then gives what it gives the 3-channel weights when copied into all three channels)."""
    replaced = {name for name, child in backbone.named_children() if isinstance(child, nn.Identity)}
    kept = {_OLD_DENSENET_KEY.sub(r"\1\2", k): v for k, v in state.items() if k.split(".", 1)[0] not in replaced}
    first_conv = first_conv_name(backbone) + ".weight"
    weight = kept.get(first_conv)
    reads_one_channel = backbone.get_parameter(first_conv).shape[1] == 1
    if reads_one_channel and weight is not None and weight.dim() == 4 and weight.shape[1] == 3:
        kept[first_conv] = weight.sum(dim=1, keepdim=True)
    return kept


def fit_problems(state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> List[str]:
    """What keeps ``state`` from loading where ``expected`` is the state dict: missing and unexpected keys and
    shape mismatches, the first :data:`SHOWN_KEYS` of each kind. A missing BatchNorm ``num_batches_tracked`` is not
    one: older files lack them, and the network keeps its own."""
    missing = [k for k in expected if k not in state and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k} {tuple(state[k].shape)} in the file, {tuple(expected[k].shape)} in the network"
        for k in expected
        if k in state and state[k].shape != expected[k].shape
    ]
    problems = []
    for kind, keys in (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", shapes)):
        if keys:
            more = f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
            problems.append(f"{kind}: {', '.join(keys[:SHOWN_KEYS])}{more}")
    return problems


def load_initial_weights(model: nn.Module, path: str, arch: str) -> None:
    """Load the weights file ``path`` into ``model``, a :class:`~nvflare_moon.models.ProjectionModel` of
    architecture ``arch``: a whole network's state dict (keys ``backbone.*``, ``l1.*``, ...) into all of it, any
    other state dict (torchvision's) into its backbone (see :func:`as_backbone_state`), the head keeping its own.

    Raises:
        ValueError: see :func:`read_weights_file`; or the file does not fit ``arch``, naming the file, the arch and
            the first keys that do not fit.
    """
    state = read_weights_file(path)
    whole = any(k.startswith(BACKBONE_PREFIX) for k in state)
    target = model if whole else model.backbone
    if not whole:
        state = as_backbone_state(state, model.backbone)
    expected = target.state_dict()
    problems = fit_problems(state, expected)
    if problems:
        form = "a whole Network's state dict" if whole else "a backbone's state dict"
        raise ValueError(
            f"initial_weights file {path} does not fit arch={arch!r} (read as {form}): {'; '.join(problems)}; {_FIX}"
        )
    target.load_state_dict({**expected, **state})
    logging.getLogger(__name__).info(
        f"initial weights of {arch} from {path}: {len(state)} tensors into its "
        + ("whole network" if whole else "backbone (the head keeps its seeded weights)")
    )
