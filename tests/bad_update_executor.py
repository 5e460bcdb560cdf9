"""Test-only: a MOON client whose replies are spoiled on purpose, to check end to end that the server rejects them.

It is copied into a job's ``custom/`` folder by tests/test_deploy_poc.py, never shipped with the plugin.
"""

import os
import time
from typing import Dict, List, Optional

import numpy as np
import torch
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.apis.signal import Signal
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from nvflare_moon.executors.moon import MoonExecutor


def spoil(params: Dict[str, np.ndarray], kind: str) -> Dict[str, np.ndarray]:
    """``params`` with one tensor spoiled: ``nan``, ``inf``, ``missing_key`` or ``wrong_shape``."""
    params = dict(params)
    name = sorted(k for k in params if np.issubdtype(np.asarray(params[k]).dtype, np.floating))[0]
    value = np.array(params[name], dtype=np.float32)
    if kind == "nan":
        value.flat[0] = np.nan
    elif kind == "inf":
        value.flat[0] = np.inf
    elif kind == "missing_key":
        del params[name]
        return params
    elif kind == "wrong_shape":
        value = value.reshape(-1)[:-1]
    else:
        raise ValueError(f"unknown spoil kind {kind!r}")
    params[name] = value
    return params


class SpoilingMoonExecutor(MoonExecutor):
    """MOON whose reply in round r is spoiled as ``spoil_plan[site][r]`` says (None: an honest reply).

    In ``hold_rounds``, ``hold_site`` holds its (honest) reply until ``hold_until_site`` has saved its round, plus
    ``margin`` seconds, so that the spoiled update reaches the server first: the server's checks must not depend on
    the order in which updates arrive.
    """

    def __init__(
        self,
        *args,
        spoil_plan: Dict[str, List[Optional[str]]],
        hold_site: str,
        hold_until_site: str,
        hold_rounds: List[int],
        margin: float = 1.0,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.spoil_plan = spoil_plan
        self.hold_site = hold_site
        self.hold_until_site = hold_until_site
        self.hold_rounds = hold_rounds
        self.margin = margin

    def execute(self, task_name: str, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        round_number = FLModelUtils.from_shareable(shareable, fl_ctx).current_round or 0
        reply = super().execute(task_name, shareable, fl_ctx, abort_signal)
        site = fl_ctx.get_identity_name()
        if site == self.hold_site and round_number in self.hold_rounds:
            self._hold(round_number, fl_ctx)
        plan = self.spoil_plan.get(site, [])
        kind = plan[round_number] if round_number < len(plan) else None
        if kind is None or reply.get_return_code(ReturnCode.OK) != ReturnCode.OK:
            return reply
        model = FLModelUtils.from_shareable(reply, fl_ctx)
        model.params = spoil(model.params, kind)
        self.log_warning(fl_ctx, f"test: sending a {kind} update in round {round_number}")
        return FLModelUtils.to_shareable(model)

    def _hold(self, round_number: int, fl_ctx: FLContext) -> None:
        """Until the other site saved its round (it replies right after), then ``margin`` seconds more."""
        all_sites = os.path.dirname(fl_ctx.get_engine().get_workspace().get_root_dir())  # POC: one folder per site
        run_dir = os.path.join(all_sites, self.hold_until_site, fl_ctx.get_job_id())
        state = os.path.join(run_dir, "nvflare_moon", f"{self.STATE_NAME}.pt")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _saved_round(state) < round_number:
            time.sleep(0.2)
        time.sleep(self.margin)


def _saved_round(path: str) -> int:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)["round"]
    except Exception:  # not written yet
        return -1
