"""Progress lines while the benchmark runs: which run, which round, the accuracy so far and the time left."""

import time
from typing import Callable, List, Optional


def format_duration(seconds: Optional[float]) -> str:
    """``1h02m``, ``4m05s``, ``12s``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def estimate_remaining(
    elapsed: float, units_done: int, units_total: int, runs_after: int, finished_run_seconds: List[float]
) -> tuple:
    """(seconds left in the current run, seconds left in all), None where there is nothing to go on yet.

    The current run is extrapolated from its own pace; each run after it is assumed to take as long as the finished
    runs did on average, or as long as the current run's projection when none has finished.
    """
    projected = elapsed / units_done * units_total if units_done else None
    run_left = None if projected is None else max(0.0, projected - elapsed)
    typical = sum(finished_run_seconds) / len(finished_run_seconds) if finished_run_seconds else projected
    if run_left is None and typical is not None:
        run_left = max(0.0, typical - elapsed)
    total_left = None if run_left is None or typical is None else run_left + runs_after * typical
    return run_left, total_left


class Progress:
    """Prints one line per finished unit (round or site) and per run start and end."""

    def __init__(
        self, total_runs: int, log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic
    ):
        self.total_runs = total_runs
        self.log = log
        self.clock = clock
        self.finished_run_seconds: List[float] = []
        self._index = 0
        self._name = ""
        self._units = 0
        self._unit_name = ""
        self._done = 0
        self._started = 0.0

    def start_run(self, name: str, units: int, unit_name: str) -> None:
        self._index += 1
        self._name, self._units, self._unit_name, self._done = name, units, unit_name, 0
        self._started = self.clock()
        self.log(f"[{self._index}/{self.total_runs}] {name}: started ({units} {unit_name}s)")

    def unit_done(self, accuracy: Optional[float]) -> None:
        self._done += 1
        elapsed = self.clock() - self._started
        run_left, total_left = estimate_remaining(
            elapsed, self._done, self._units, self.total_runs - self._index, self.finished_run_seconds
        )
        shown = "" if accuracy is None else f", test accuracy {100 * accuracy:.2f}%"
        self.log(
            f"[{self._index}/{self.total_runs}] {self._name}: {self._unit_name} {self._done}/{self._units}{shown}, "
            f"{elapsed / self._done:.1f} s/{self._unit_name}, ETA run {format_duration(run_left)}, "
            f"all {format_duration(total_left)}"
        )

    def end_run(self, outcome: str) -> None:
        """``outcome``: ``done``, ``FAILED`` or ``interrupted``; only a finished run's time feeds the estimates."""
        seconds = self.clock() - self._started
        if outcome == "done":
            self.finished_run_seconds.append(seconds)
        self.log(f"[{self._index}/{self.total_runs}] {self._name}: {outcome} in {format_duration(seconds)}")
