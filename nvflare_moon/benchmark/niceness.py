"""Keep a run's processes as nice as the benchmark that started them.

Linux's autogroup scheduling (on by default in most distributions) weighs the CPU between sessions first, and
``nice`` ranks a process only against the others of its own session. The runner starts each run in a session of its
own, and NVFlare's simulator starts every site's worker in another, so under ``nice -n 19 python -m
nvflare_moon.benchmark`` the training would still compete as an equal with whatever runs in the foreground (seen here:
a niced paper run took 70 % of the CPU from a test suite). Giving each new session the runner's nice value restores
what the user asked for. Without autogroups (no ``/proc/<pid>/autogroup``) or when not niced, nothing is done.
"""

import os

import psutil


def autogroup(pid="self") -> str:
    """A process's autogroup and its nice value (``/autogroup-12 nice 19``); "" without autogroups or once it ended."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return f.read().strip()
    except OSError:
        return ""


def share_niceness(process: psutil.Process) -> None:
    """Set the nice value of ``process``'s session (its autogroup) to this process's, if this one is niced and the
    session's differs. Only a differing value is written: without CAP_SYS_ADMIN the kernel takes one such write per
    100 ms on the whole machine and refuses the rest (EAGAIN), so rewriting settled sessions would starve new ones; a
    refused write is tried again at the caller's next poll."""
    niceness = os.nice(0)
    if niceness <= 0:
        return
    current = autogroup(process.pid)
    if not current or current.split()[-1:] == [str(niceness)]:  # no autogroups, ended, or settled
        return
    try:
        with open(f"/proc/{process.pid}/autogroup", "w") as f:
            f.write(str(niceness))
    except OSError:  # the process has ended, or the write was refused for now
        pass
