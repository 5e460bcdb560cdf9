"""Server checks that make a job fail loudly instead of training the wrong thing or nothing.

NVFlare's simulator exits non-zero (2) when the server saw a fatal error (``system_panic``); a job whose sites never
answer, or that trains no round, otherwise ends with exit code 0. In POC and production the same panic ends the job
as failed.
"""

from typing import Dict, Optional

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_constant import FLContextKey, ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import ReservedHeaderKey
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType

from ..core.validation import JOB_REFUSED_HEADER, check_number
from ..data import check_site_shards


class ShardCoverageCheck(FLComponent):
    """Stop the job before round 0 trains unless its sites take distinct shards that cover all ``num_sites`` shards.

    A site's shard is the number at the end of its name (:func:`~nvflare_moon.data.site_index`), so ``-c
    east-1,west-1`` would train shard 1 twice, and ``-n 2`` on a job for 3 sites would never train shard 3. Not for a
    job whose sites bring their own ``Dataset``: there is no partition to cover.

    The refusal travels with every train task (header :data:`JOB_REFUSED_HEADER`); our executors answer it with a
    failed reply, which ends the job through NVFlare's controller. Ending the run on the server alone, before the
    sites have connected, leaves the simulator's site workers waiting for a server that is gone.

    Args:
        num_sites: the number of shards the training set is split over (the executors' ``num_sites``).
    """

    def __init__(self, num_sites: int):
        super().__init__()
        check_number("num_sites", num_sites, low=1, integer=True)
        self.num_sites = num_sites
        self._problem: Optional[str] = None

    def handle_event(self, event_type: str, fl_ctx: FLContext):
        if event_type == EventType.START_RUN:
            sites = [client.name for client in fl_ctx.get_engine().get_clients()]
            try:
                check_site_shards(sites, self.num_sites)
            except ValueError as e:
                self._problem = f"the sites do not match the data split: {e}"
                self.log_error(fl_ctx, f"refusing to train: {self._problem}")
                return
            self.log_info(fl_ctx, f"{len(sites)} sites take the {self.num_sites} shards of the data split, one each")
        elif event_type == AppEventType.BEFORE_TRAIN_TASK and self._problem is not None:
            fl_ctx.get_prop(AppConstants.TRAIN_SHAREABLE).set_header(JOB_REFUSED_HEADER, self._problem)


class RunOutcomeCheck(FLComponent):
    """Make a job that did not train all its rounds end as failed, with the sites' reasons as its last errors.

    * At the start: the controller ``controller_id`` must have ``num_rounds >= 1`` (an edited
      ``config_fed_server.json`` can say 0, which trains nothing); the job fails when it ends.
    * A site's failed reply (``EXECUTION_EXCEPTION`` and the like) is logged on the server with the reason the site
      sent (its ``__error__`` header); NVFlare's controller then ends the job.
    * At the end: a round that started and was never aggregated, or no round at all, fails the job. That catches
      sites that never answered, e.g. because their app could not be built from ``config_fed_client.json``. The
      sites' reasons are logged again there, so that they are the job's last error lines.

    Args:
        controller_id: the component id of the training workflow (the recipes' ``"controller"``).
    """

    def __init__(self, controller_id: str = "controller"):
        super().__init__()
        if not isinstance(controller_id, str) or not controller_id:
            raise ValueError(f"controller_id must be a component id, got {controller_id!r}")
        self.controller_id = controller_id
        self._started: Optional[int] = None  # the last round that started
        self._aggregated: Optional[int] = None  # the last round that was aggregated
        self._site_errors: Dict[str, str] = {}  # site (or "server") -> why it could not train

    def handle_event(self, event_type: str, fl_ctx: FLContext):
        if event_type == EventType.START_RUN:
            self._check_num_rounds(fl_ctx)
        elif event_type == AppEventType.ROUND_STARTED:
            self._started = fl_ctx.get_prop(AppConstants.CURRENT_ROUND)
        elif event_type == AppEventType.AFTER_AGGREGATION:
            self._aggregated = fl_ctx.get_prop(AppConstants.CURRENT_ROUND)
        elif event_type == EventType.BEFORE_PROCESS_SUBMISSION:
            self._note_site_error(fl_ctx)
        elif event_type == EventType.ABOUT_TO_END_RUN:
            self._check_outcome(fl_ctx)

    def _check_num_rounds(self, fl_ctx: FLContext) -> None:
        num_rounds = getattr(fl_ctx.get_engine().get_component(self.controller_id), "num_rounds", None)
        if isinstance(num_rounds, int) and num_rounds < 1:
            reason = (
                f"the controller {self.controller_id!r} has num_rounds={num_rounds}, so the job would train nothing; "
                "set num_rounds >= 1 (the recipe's num_rounds, or the workflow's args in config_fed_server.json)"
            )
            self.log_error(fl_ctx, reason)
            self._site_errors["server"] = reason  # failed at the end: a panic now would end the run before the
            # simulator's site workers connect, and they would wait for ever

    def _note_site_error(self, fl_ctx: FLContext) -> None:
        result = fl_ctx.get_prop(FLContextKey.TASK_RESULT)
        rc = result.get_return_code(ReturnCode.OK) if result is not None else ReturnCode.OK
        if rc == ReturnCode.OK:
            return
        peer = fl_ctx.get_peer_context()
        site = peer.get_identity_name() if peer is not None else "a site"
        task = fl_ctx.get_prop(FLContextKey.TASK_NAME)
        reason = result.get_header(ReservedHeaderKey.ERROR) or f"see {site}'s log"
        self._site_errors[site] = f"{site} failed its {task!r} task ({rc}): {reason}"
        self.log_error(fl_ctx, self._site_errors[site])

    def _check_outcome(self, fl_ctx: FLContext) -> None:
        if self._started is None:
            problem = "the job ended before round 0 started"
        elif self._aggregated != self._started:
            problem = f"the job ended in round {self._started} before aggregating it"
        else:
            return
        already_failed = fl_ctx.get_prop(FLContextKey.FATAL_SYSTEM_ERROR, False)
        if self._site_errors:
            reason = f"{problem}: " + "; ".join(self._site_errors.values())
        elif already_failed:
            return  # the error that stopped the job is logged above
        else:
            reason = (
                f"{problem}: no site reported an error, so a site stopped without answering (its log says why: a "
                "bad argument in config_fed_client.json, a component path that does not import, a killed process) "
                "or the job was aborted"
            )
        if already_failed:
            self.log_error(fl_ctx, reason)  # the sites' reasons, last
        else:
            self.system_panic(reason, fl_ctx)
