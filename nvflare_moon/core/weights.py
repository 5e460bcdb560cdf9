"""Model weights as NVFlare carries them: a dict of numpy arrays, name by name, for executors, Client API helpers and
server components alike."""

from typing import Any, Dict

import numpy as np
import torch
import torch.nn as nn


def state_dict_to_numpy(model: nn.Module) -> Dict[str, np.ndarray]:
    """Every entry of ``model.state_dict()`` (buffers included) as a CPU numpy array."""
    return {name: t.detach().cpu().numpy() for name, t in model.state_dict().items()}


def load_numpy_state(model: nn.Module, params: Dict[str, Any]) -> None:
    """Load received weights (numpy or torch) into ``model``.

    Raises:
        ValueError: an entry is missing, unexpected or of another shape; the message names them. Nothing is loaded.
    """
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(params)), sorted(set(params) - set(own))
    if missing or unexpected:
        raise ValueError(f"received model does not match the local network: missing {missing}, unexpected {unexpected}")
    received = {name: torch.as_tensor(np.asarray(value)) for name, value in params.items()}
    mismatched = {n: (tuple(t.shape), tuple(own[n].shape)) for n, t in received.items() if t.shape != own[n].shape}
    if mismatched:
        raise ValueError(
            "received model does not match the local network: shapes (received, local) differ for "
            + ", ".join(f"{n} {r} vs {o}" for n, (r, o) in sorted(mismatched.items()))
        )
    model.load_state_dict(received)


def restore_shapes(params: Dict[str, Any], reference: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    """``params`` with every flat entry that holds as many values as its ``reference`` entry reshaped to it.

    Decrypted CKKS vectors (NVFlare's HE filters) are flat lists; anything else is left for
    :func:`load_numpy_state` to check.
    """
    restored = dict(params)
    for name, value in params.items():
        array = np.asarray(value)
        if name in reference and array.ndim == 1 and array.size == reference[name].numel():
            restored[name] = array.reshape(tuple(reference[name].shape))
    return restored
