"""Peak memory of a run's processes: poll a process tree, keep every process's largest resident set size.

NVFlare's simulator runs each client in a ``simulator_worker`` process (``--client site-k``); with ``-t < -n`` a site
gets a new process per task, so a site's peak is the largest over its processes.
"""

import threading
from typing import Callable, Dict, List, Optional, Tuple

import psutil

MB = 1024 * 1024


def process_role(cmdline) -> Tuple[str, Optional[str]]:
    """``("client", "site-2")`` for a simulator client worker, else ``("other", None)`` (launcher, server, SOLO)."""
    if "--client" in cmdline and cmdline.index("--client") + 1 < len(cmdline):
        return "client", cmdline[cmdline.index("--client") + 1]
    return "other", None


def site_order(site: str) -> Tuple[str, int]:
    """Sort key that puts site-2 before site-10."""
    stem, _, number = site.rpartition("-")
    return (stem, int(number)) if number.isdigit() else (site, -1)


class PeakMemoryWatcher:
    """Polls ``root_pid`` and all its descendants every ``interval`` seconds from a background thread, and calls
    ``visit`` with each of them at every poll (a process may change its session after it was first seen).

    Use as a context manager; :meth:`report` gives the peaks in MB.
    """

    def __init__(
        self,
        root_pid: int,
        interval: float = 0.5,
        visit: Callable[[psutil.Process], None] = lambda process: None,
    ):
        self.root_pid = root_pid
        self.interval = interval
        self.visit = visit
        self._peaks: Dict[int, float] = {}
        self._roles: Dict[int, Tuple[str, Optional[str]]] = {}
        self._processes: Dict[int, psutil.Process] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-memory-watcher", daemon=True)

    def __enter__(self) -> "PeakMemoryWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.poll()
            if self._stop.wait(self.interval):
                return

    def poll(self) -> None:
        """Read the tree once: the root and every process below it now."""
        try:
            root = psutil.Process(self.root_pid)
            processes = [root] + root.children(recursive=True)
        except psutil.Error:  # the tree is gone
            return
        with self._lock:
            for process in processes:
                try:
                    self.visit(process)
                    seen_as = self._roles.get(process.pid)
                    if seen_as is None or seen_as[0] != "client":
                        # a just-forked worker shows its parent's command line and memory until it execs
                        role = process_role(process.cmdline())
                        if seen_as is not None and role != seen_as:
                            self._peaks.pop(process.pid, None)
                        self._roles[process.pid] = role
                        self._processes.setdefault(process.pid, process)
                    rss = process.memory_info().rss / MB
                except psutil.Error:  # it ended between listing and reading
                    continue
                self._peaks[process.pid] = max(rss, self._peaks.get(process.pid, 0.0))

    def live_processes(self) -> List[psutil.Process]:
        """Every process seen under the root that still runs (psutil checks the start time, so a reused PID is not
        mistaken for it), after a fresh look at the tree."""
        self.poll()
        with self._lock:
            return [p for p in self._processes.values() if p.is_running()]

    def report(self) -> Dict:
        """``clients``: each site's peak over its worker processes; ``other``: the largest other process (the
        simulator's launcher and server, or a plain command); ``processes``: every process seen."""
        clients: Dict[str, float] = {}
        other = 0.0
        for pid, peak in self._peaks.items():
            role, site = self._roles.get(pid, ("other", None))
            if role == "client":
                clients[site] = max(peak, clients.get(site, 0.0))
            else:
                other = max(other, peak)
        return {
            "clients": dict(sorted(clients.items(), key=lambda item: site_order(item[0]))),
            "other": other,
            "processes": [
                {
                    "pid": pid,
                    "role": self._roles.get(pid, ("other", None))[0],
                    "site": self._roles.get(pid, ("other", None))[1],
                    "peak_mb": peak,
                }
                for pid, peak in sorted(self._peaks.items())
            ],
        }
