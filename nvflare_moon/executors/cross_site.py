"""NVFlare's cross-site evaluation on a site (its ``CrossSiteModelEval`` workflow): ``validate`` evaluates a received
model, the global one or another site's, on the site's local test data; ``submit_model`` hands over the site's last
trained local model, read from the job's state so that it is there after a restart (the simulator with ``-t < -n``).

Both answer for an executor (:class:`~nvflare_moon.executors.FedAvgExecutor`) and log through it.
"""

from typing import Dict

from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from ..core.state import StateUnusable, tensor_signature
from ..core.training import frozen_copy
from ..core.weights import load_numpy_state


def validate_reply(executor, shareable: Shareable, fl_ctx: FLContext) -> Shareable:
    """The received model's local figures; BAD_TASK_DATA for weights that do not fit the network, EMPTY_RESULT for
    a site without local test data."""
    site = fl_ctx.get_identity_name()
    owner = shareable.get_header(AppConstants.MODEL_OWNER, "the server")
    received = FLModelUtils.from_shareable(shareable, fl_ctx)
    model = frozen_copy(executor.network)
    try:
        load_numpy_state(model, executor.received_params(received))
    except ValueError as e:
        executor.log_error(fl_ctx, f"{site}: cannot evaluate the model of {owner}: {e}")
        return make_reply(ReturnCode.BAD_TASK_DATA)
    metrics = executor.evaluate_locally(model, fl_ctx)
    if not metrics:
        return make_reply(ReturnCode.EMPTY_RESULT)
    executor.log_info(fl_ctx, f"{site}: the model of {owner} on the local test data: " + format_metrics(metrics))
    return FLModelUtils.to_shareable(FLModel(metrics=metrics))


def submit_model_reply(executor, fl_ctx: FLContext) -> Shareable:
    """The site's last trained local model; an error naming why when it has none, or none that fits the network."""
    site = fl_ctx.get_identity_name()
    try:
        stored = executor.load_local_model(fl_ctx)
    except StateUnusable as e:
        executor.log_error(fl_ctx, f"{site}: cannot submit the local model: {e}")
        return make_reply(ReturnCode.EXECUTION_EXCEPTION)
    if stored is None:
        executor.log_error(fl_ctx, f"{site}: no local model to submit: this site has not trained in this job")
        return make_reply(ReturnCode.EMPTY_RESULT)
    round_number, state = stored
    if tensor_signature(state) != tensor_signature(executor.network.state_dict()):
        executor.log_error(fl_ctx, f"{site}: the stored local model (round {round_number}) does not match the network")
        return make_reply(ReturnCode.EXECUTION_EXCEPTION)
    executor.log_info(fl_ctx, f"{site}: submitting the local model trained in round {round_number}")
    params = {name: t.numpy() for name, t in state.items()}
    return FLModelUtils.to_shareable(FLModel(params=params, params_type=ParamsType.FULL))


def format_metrics(metrics: Dict[str, float]) -> str:
    """``name value`` pairs, sorted by name, for the site's log."""
    return ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items()))
