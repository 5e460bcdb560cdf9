"""The server's side of the data check: ask every site once for its data report, and write the federation's table.

The sites answer with counts only (:class:`~nvflare_moon.executors.data_check.DataCheckExecutor`); the server writes
``<run dir>/data_summary.json`` (:func:`~nvflare_moon.data.site_report.summarize`) and ``label_distribution.png``
(the sites' training images stacked by class; a count below ``min_count`` is drawn as 0), and logs the table with
each site's distance to the pooled label distribution, the federation's non-IID degree.
"""

import json
import os
from typing import Dict

import numpy as np
from nvflare.apis.controller_spec import ClientTask, Task
from nvflare.apis.dxo import from_shareable
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.impl.controller import Controller
from nvflare.apis.shareable import ReservedHeaderKey, Shareable
from nvflare.apis.signal import Signal

from ..data.site_report import DATA_CHECK_TASK, REPORT_KEY, exact, format_table, summarize

SUMMARY_FILENAME = "data_summary.json"
PLOT_FILENAME = "label_distribution.png"


class DataCheckController(Controller):
    """Send ``task_name`` to every site once, wait for all of them, write the summary and the plot, log the table.

    The job fails (``system_panic``: the simulator exits 2, POC and production show the job as failed) when any site
    reported an error (its data cannot be listed), a problem (training would refuse its data), failed the task, or
    did not answer; the reason names the site. The summary and plot are written first, for the other sites.

    Args:
        task_name: the task the sites' executors answer.
    """

    def __init__(self, task_name: str = DATA_CHECK_TASK):
        super().__init__()
        if not isinstance(task_name, str) or not task_name:
            raise ValueError(f"task_name must be a task name, got {task_name!r}")
        self.task_name = task_name
        self._reports: Dict[str, dict] = {}

    def start_controller(self, fl_ctx: FLContext) -> None:
        self._reports = {}

    def stop_controller(self, fl_ctx: FLContext) -> None:
        pass

    def control_flow(self, abort_signal: Signal, fl_ctx: FLContext) -> None:
        sites = sorted(client.name for client in fl_ctx.get_engine().get_clients())
        self.log_info(fl_ctx, f"asking {len(sites)} site(s) for their data report: {', '.join(sites)}")
        task = Task(name=self.task_name, data=Shareable(), result_received_cb=self._receive)
        self.broadcast_and_wait(task, fl_ctx, min_responses=len(sites), abort_signal=abort_signal)
        if abort_signal.triggered:
            return
        for site in sites:
            self._reports.setdefault(site, {"error": f"did not answer the {self.task_name!r} task"})
        try:
            summary = summarize(self._reports)
        except ValueError as e:
            self.system_panic(f"the sites' data reports do not belong together: {e}", fl_ctx)
            return
        run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
        with open(os.path.join(run_dir, SUMMARY_FILENAME), "w") as f:
            json.dump(summary, f, indent=2)
        self._plot(summary, os.path.join(run_dir, PLOT_FILENAME), fl_ctx)
        self.log_info(
            fl_ctx, f"data check of {len(sites)} site(s), written to {SUMMARY_FILENAME}:\n{format_table(summary)}"
        )
        if summary["failed"]:
            reasons = "; ".join(f"{site}: {reason}" for site, reason in summary["failed"].items())
            self.system_panic(f"data check failed at {len(summary['failed'])} site(s): {reasons}", fl_ctx)

    def _receive(self, client_task: ClientTask, fl_ctx: FLContext) -> None:
        """Keep the site's report, or the reason it has none."""
        site, result = client_task.client.name, client_task.result
        rc = result.get_return_code(ReturnCode.OK)
        if rc != ReturnCode.OK:
            reason = result.get_header(ReservedHeaderKey.ERROR) or "see its log"
            self._reports[site] = {"error": f"failed the {self.task_name!r} task ({rc}): {reason}"}
        else:
            try:
                self._reports[site] = from_shareable(result).data[REPORT_KEY]
            except (ValueError, KeyError, TypeError):
                self._reports[site] = {"error": f"answered the {self.task_name!r} task without a data report"}
        client_task.result = None

    def _plot(self, summary: dict, path: str, fl_ctx: FLContext) -> None:
        counted = {site: r["train"] for site, r in summary["sites"].items() if "error" not in r}
        if not counted:
            self.log_warning(fl_ctx, f"no site reported counts: {PLOT_FILENAME} is not drawn")
            return
        try:
            from ..data.label_plot import plot_label_distribution

            names = summary["class_names"]
            counts = np.asarray([[exact(train[c]) for c in names] for train in counted.values()])
            min_count = next(summary["sites"][site]["min_count"] for site in counted)
            title = f"training images per site (counts below {min_count} drawn as 0)"
            plot_label_distribution(counts, list(counted), names, path, title, ylabel="training images")
        except ImportError as e:
            self.log_warning(fl_ctx, f"{PLOT_FILENAME} is not drawn: {e} (pip install matplotlib)")
