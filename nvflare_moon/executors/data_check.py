"""A site's data check: list and decode its own images without training, and answer with counts only.

The decoding writes the decoded copy that training maps later (:mod:`nvflare_moon.data.image_cache`), so a job run
after the check starts without decoding again. The reply's data is an ``APP_DEFINED`` DXO holding
``{"data_report": report}``, ``report`` plain JSON values (:func:`~nvflare_moon.data.site_report.site_report`).
A site whose data cannot be listed or decoded reports ``{"error": message}``, with the data location, its folder
and the site's workspace replaced by ``<site_path>``, ``<site_path's folder>`` and ``<workspace>`` (any other
absolute path by ``<path>``); the full message, and the name of every file that does not decode, stay in the site's
log.
"""

import os
from typing import Any, Dict, Optional

from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.apis.signal import Signal

from ..core.validation import check_choice, check_number
from ..data.site_data import decoding_notes, list_and_decode, site_data_settings, value_range_of
from ..data.site_files import SITE_DATASETS, SiteDataError, resolve_site_root, site_path_argument
from ..data.site_report import DATA_CHECK_TASK, REPORT_KEY, redact_paths, site_report


class DataCheckExecutor(Executor):
    """Answer the ``task_name`` task with the site's data report (see the module's docstring).

    Args:
        dataset: ``"image_folder"`` or ``"datalist"`` (see :mod:`nvflare_moon.data.site_files`).
        site_data: the job's image settings, as for :class:`~nvflare_moon.executors.FedAvgExecutor`
            (``class_names`` required; ``image_size`` and ``channels`` name the decoded copy that training will map;
            ``max_unreadable`` decides when undecodable files are a problem).
        site_path: the site's folder or manifest; None: the site's ``$NVFLARE_MOON_SITE_DATA``, else ``site_path``
            in its ``local/nvflare_moon_data.json`` (:func:`~nvflare_moon.data.site_files.resolve_site_root`). Its
            old name ``data_root`` is accepted until the next release, with a DeprecationWarning.
        min_count: counts below this (and above 0) leave the site as ``"<min_count"``.
        task_name: the task this executor answers.
    """

    def __init__(
        self,
        dataset: str,
        site_data: Dict[str, Any],
        site_path: Optional[str] = None,
        min_count: int = 5,
        task_name: str = DATA_CHECK_TASK,
        **old_names,
    ):
        super().__init__()
        site_path = site_path_argument(site_path, old_names, owner=type(self).__name__)
        check_choice("dataset", dataset, SITE_DATASETS)
        self._settings = site_data_settings(dataset, site_data, seed=0)  # the seed draws no held-out rows here
        check_number("min_count", min_count, low=1, integer=True)
        if not isinstance(task_name, str) or not task_name:
            raise ValueError(f"task_name must be a task name, got {task_name!r}")
        self.dataset = dataset
        self.site_data = site_data
        self.site_path = site_path
        self.min_count = min_count
        self.task_name = task_name

    def execute(self, task_name: str, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        if task_name != self.task_name:
            return make_reply(ReturnCode.TASK_UNKNOWN)
        site = fl_ctx.get_identity_name()
        report = self.check(site, fl_ctx.get_engine().get_workspace().get_root_dir(), fl_ctx)
        return DXO(data_kind=DataKind.APP_DEFINED, data={REPORT_KEY: report}).to_shareable()

    def check(self, site: str, workspace_root: str, fl_ctx: FLContext) -> dict:
        """The site's report, or ``{"error": redacted message}``; logs the full story locally."""
        root = None
        try:
            root = resolve_site_root(self.site_path, site, workspace_root)
            files, decoded = list_and_decode(self._settings, root, site, workspace_root)
        except (SiteDataError, OSError) as e:  # OSError: the decoded copy cannot be written anywhere
            message = str(e).removeprefix(f"{site}: ")  # the server names the site
            self.log_error(fl_ctx, f"{site}: data check failed: {message}")
            return {"error": self._redacted(message, root, workspace_root)}
        for path, why in decoded.unreadable:
            self.log_warning(fl_ctx, f"{site}: {path} cannot be decoded ({why})")
        for example in decoded.unscaled_examples:
            self.log_warning(fl_ctx, f"{site}: {value_range_of(example)}: it needs an intensity_window")
        report = site_report(files, decoded, self._settings, self.min_count)
        self.log_info(
            fl_ctx,
            f"{site}: data check of {root}: training images {report['train']}, test images {report['test']}, "
            f"classes absent {report['classes_absent']}, unreadable {report['unreadable']}, channels "
            f"{report['channels']} ({report['converted']} converted to channels={self._settings.channels}), sizes "
            f"{report['sizes']}" + "".join(f"; PROBLEM: {p}" for p in report["problems"]),
        )
        for note in (*files.notes, *decoding_notes(decoded)):
            self.log_warning(fl_ctx, f"{site}: {note}")
        return report

    @staticmethod
    def _redacted(message: str, root: Optional[str], workspace_root: str) -> str:
        """``message`` without the site's paths."""
        paths = {workspace_root: "<workspace>"}
        if root:
            paths.update({root: "<site_path>", os.path.abspath(root): "<site_path>"})
            if os.path.isfile(root):
                paths[os.path.dirname(os.path.abspath(root))] = "<site_path's folder>"
        return redact_paths(message, paths)
