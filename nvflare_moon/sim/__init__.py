"""NVFlare 2.9's simulator, made correct and quicker for a job, when the job asks for it.

Nothing here changes NVFlare on import. A job switches the fixes on with the server component
:class:`.fixes.SimulatorFixes`, which every recipe of this plugin puts first in the server's config (remove it from
``config_fed_server.json`` to run NVFlare's simulator as it is); code outside a job calls
:func:`.fixes.enable_simulator_fixes`. The fixes, each in its own module, and the NVFlare behaviour each works around
(reported in ``docs/upstream_reports.md``):

- :mod:`.sites`: two threads of the simulator's runner share one ``build_ctx``, so a worker can start under another
  site's name (one site trains twice, another never, exit 0); and two threads can pick the same site at once;
- :mod:`.schedule`: at ``-t < -n`` a thread starts sites the server has no task for (empty starts), and fixed
  sleeps and the server's ``task_request_interval`` add seconds to every task;
- :mod:`.workers`: at ``-t < -n`` every task starts a new worker process that imports torch again; here workers are
  forked from one process that has imported it.

They act only in the simulator: NVFlare imports its simulator's runner in every process, but its classes run only
in a simulator, and the changes to shared server classes act only for the simulator's server.

This package imports nothing: the workers' zygote (:mod:`.workers`) runs from it and must not hold NVFlare's
import-time state when it forks.
"""
