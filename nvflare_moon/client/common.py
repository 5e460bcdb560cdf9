"""What every Client API helper needs: who and where the script is, and a check that the received weights were
loaded. (The running means of the loss terms are :class:`~nvflare_moon.core.training.TermMeans`.)"""

import logging
from typing import Mapping, Optional, Tuple

import torch
import torch.nn as nn

from ..core.validation import check_number


def site_identity(job_id: Optional[str], site: Optional[str], helper: str) -> Tuple[str, str]:
    """``(job_id, site)``: the given ones, or the running job's from NVFlare's Client API (after ``flare.init()``).

    Raises:
        RuntimeError: the task is not a training task (the helpers keep a site's state only for what it trains).
    """
    if job_id is not None and site is not None:
        return job_id, site
    import nvflare.client as flare

    if not flare.is_train():
        raise RuntimeError(
            f"{helper}.start_round() was called for the task {flare.get_task_name()!r}; call it only when "
            "flare.is_train() is True (a validate or submit_model task must not change the site's stored models)"
        )
    return job_id or flare.get_job_id(), site or flare.get_site_name()


def check_received_weights(model: nn.Module, params: Optional[Mapping], helper: str) -> None:
    """Raise ValueError unless ``model`` holds the received ``params`` (the helpers freeze it as the global model)."""
    if not params:
        return
    own = model.state_dict()
    for name, value in params.items():
        mine = own.get(name)
        if mine is None or not torch.equal(torch.as_tensor(value).to(mine.device, mine.dtype), mine):
            raise ValueError(
                f"the model does not hold the received weights ({name!r} differs): call "
                f"model.load_state_dict(input_model.params) before {helper}.start_round(input_model)"
            )


def check_upload_count(num_samples: int, saved: bool, save_call: str) -> None:
    """Raise ValueError unless ``num_samples`` is a positive int; warn when the round's model was not saved."""
    check_number("num_samples", num_samples, low=1, integer=True)
    if not saved:
        logging.getLogger(__name__).warning(f"upload_meta() before {save_call}: this round's model is not kept")
