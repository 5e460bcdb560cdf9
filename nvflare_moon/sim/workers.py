"""Warm client processes for NVFlare 2.9's simulator: each site's worker is forked from one process that has already
imported torch (and torch._dynamo, which the first optimizer imports), instead of started from a bare interpreter.

With ``-t < -n`` the simulator starts a new ``python -m ...simulator_worker`` process for every task, and importing
torch is most of that start (1.5 of about 1.9 s of CPU here; ``benchmarks/client_start.py``).
:func:`start_simulator_workers_warm` makes the simulator's runner take its worker processes from a *zygote*: a process
started once per simulator run that imports torch and then only forks. A forked child sets the environment,
working folder and arguments that NVFlare asked for and runs the same worker module, so the job, its logs and its
results are those of a normal start; what goes is the repeated import. Nothing but the process start changes:
torch's threads, data and state are set up by the child as before.

The zygote never runs torch code or starts a thread before forking (a fork copies only the forking thread), and it
refuses to serve if its imports left a thread running or imported NVFlare. When it cannot serve, the runner starts
its workers as NVFlare does. ``NVFLARE_MOON_WARM_WORKERS=0`` turns the whole mechanism off.
"""

import json
import logging
import os
import queue
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import traceback
from typing import Dict, List, Optional

from .schedule import shorten_worker_sync_sleep

RUNNER_MODULE = "nvflare.private.fed.app.simulator.simulator_runner"
WORKER_MODULE = "nvflare.private.fed.app.simulator.simulator_worker"
# torch, and torch._dynamo, which the first optimizer a process builds imports (torch.optim's dynamo guard: about 1 s
# of CPU per worker here). Not NVFlare's own modules: they hold import-time state that a forked child must not share
# (preloaded, a child's second task upload was never answered: seen with NVFlare 2.9.0). torch._dynamo reads its
# TORCHDYNAMO_* / TORCH_LOGS settings at import, so a worker sees the simulator's, not ones set for the worker alone.
PRELOADED_MODULES = ("torch", "torch._dynamo")
SWITCH = "NVFLARE_MOON_WARM_WORKERS"

logger = logging.getLogger(__name__)


class ForkedWorker:
    """The runner's handle on one forked worker: the part of ``subprocess.Popen`` that NVFlare's runner uses."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: Optional[int] = None
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The runner's side of the zygote: starts it, asks it for workers, and hears of their exits."""

    def __init__(self):
        self._socket, theirs = socket.socketpair()
        # the simulator's command line after "--" is only a label: ps (and a forked worker's cmdline) shows whose it is
        command = [sys.executable, "-m", __name__, str(theirs.fileno()), "--", *sys.argv]
        self.process = subprocess.Popen(command, pass_fds=[theirs.fileno()], env=dict(os.environ))
        theirs.close()
        self._lock = threading.Lock()  # one request at a time, so the next "started" answers it
        self._started: queue.Queue = queue.Queue()  # ForkedWorker, or why there is none
        self._workers: Dict[int, ForkedWorker] = {}
        threading.Thread(target=self._listen, name="nvflare_moon-zygote", daemon=True).start()

    def start_worker(self, argv: List[str], env: dict, timeout: float = 60.0) -> ForkedWorker:
        """Fork a worker that runs ``argv`` (``python -m <module> ...``) with ``env``; raises RuntimeError if the
        zygote does not answer (it failed to start, or refused)."""
        request = {"module": argv[2], "argv": argv[3:], "env": env, "cwd": os.getcwd()}
        with self._lock:
            if self.process.poll() is not None:
                raise RuntimeError(f"the warm-worker zygote exited with code {self.process.returncode}")
            try:
                self._socket.sendall((json.dumps(request) + "\n").encode())
                answer = self._started.get(timeout=timeout)
            except OSError as e:
                raise RuntimeError(f"the warm-worker zygote cannot be reached: {e}") from e
            except queue.Empty:
                raise RuntimeError(f"the warm-worker zygote did not answer in {timeout} s") from None
        if isinstance(answer, str):
            raise RuntimeError(answer)
        return answer

    def _listen(self) -> None:
        """Messages come in the zygote's order: a worker's start always before its exit."""
        for line in self._socket.makefile("r"):
            message = json.loads(line)
            if "pid" in message:
                self._workers[message["pid"]] = worker = ForkedWorker(message["pid"])
                self._started.put(worker)
            elif "exited" in message:
                self._workers.pop(message["exited"])._set_exit(message["code"])
            else:
                self._started.put(message["error"])
        self._started.put("the warm-worker zygote exited")


class _SubprocessWithZygote:
    """Stands in for the ``subprocess`` module in NVFlare's simulator runner: its worker starts go to the zygote
    (started at the first of them), everything else, and every worker start the zygote cannot serve, to the real
    module."""

    def __init__(self):
        self._zygote: Optional[Zygote] = None
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(subprocess, name)

    def Popen(self, args, **kwargs):  # noqa: N802 (subprocess's name)
        if isinstance(args, (list, tuple)) and list(args[1:3]) == ["-m", WORKER_MODULE]:
            try:
                return self.zygote().start_worker(list(args), kwargs.get("env") or dict(os.environ))
            except RuntimeError as e:
                logger.warning(f"starting the worker without the zygote: {e}")
        return subprocess.Popen(args, **kwargs)

    def zygote(self) -> Zygote:
        with self._lock:
            if self._zygote is None:
                self._zygote = Zygote()
            return self._zygote


def start_simulator_workers_warm() -> bool:
    """Route the simulator runner's worker starts through a zygote (started with the first of them). ``import nvflare``
    imports the simulator's runner in every process, so this patches a real server's process too, where the runner
    never runs and nothing changes. False when the runner is not imported, when turned off by
    ``NVFLARE_MOON_WARM_WORKERS=0``, or when already done."""
    runner_module = sys.modules.get(RUNNER_MODULE)
    if runner_module is None or os.environ.get(SWITCH, "1") == "0":
        return False
    if isinstance(runner_module.subprocess, _SubprocessWithZygote):
        return False
    runner_module.subprocess = _SubprocessWithZygote()
    logger.info(f"site workers are forked from a process with torch imported ({SWITCH}=0: started as NVFlare does)")
    return True


# The zygote process itself: python -m nvflare_moon.sim.workers <socket fd> -- <the simulator's command line>


def _run_worker(request: dict) -> None:
    """In the forked child: become the worker NVFlare asked for, then exit with its exit code."""
    code = 1
    try:
        os.setsid()
        os.environ.clear()
        os.environ.update(request["env"])
        for path in reversed(request["env"].get("PYTHONPATH", "").split(os.pathsep)):
            if path and path not in sys.path:
                sys.path.insert(0, path)  # the job's custom folder, as a fresh interpreter would see it
        os.chdir(request["cwd"])
        _show_command_line(request["argv"])
        shorten_worker_sync_sleep()
        sys.argv = [request["module"]] + request["argv"]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _show_command_line(argv: List[str]) -> None:
    """Make ``ps`` and ``/proc/<pid>/cmdline`` of this forked child name its site, as a started worker's would:
    ``python -m nvflare_moon.sim.workers --client site-2 -o <its workspace>``, written over the zygote's own
    command line (which holds the simulator's, workspace included, so it fits; cut if not). Tools that find a
    simulator worker by ``--client <site>`` (the benchmark's memory watch, a test's clean-up) then find this one.
    Linux only; elsewhere, and when refused, the label stays."""
    words = [sys.executable, "-m", "nvflare_moon.sim.workers"]
    for flag in ("--client", "-o"):
        if flag in argv[:-1]:
            words += [flag, argv[argv.index(flag) + 1]]
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end: fields 48 and 49 in proc(5)
        text = "\0".join(words).encode()[: end - start - 1]
        with open("/proc/self/mem", "r+b", buffering=0) as memory:
            memory.seek(start)
            memory.write(text.ljust(end - start, b"\0"))
    except (OSError, ValueError, IndexError):
        pass


def _serve(channel: socket.socket) -> None:
    for name in PRELOADED_MODULES:
        __import__(name)
    refusal = None
    if threading.active_count() > 1:
        refusal = f"importing {', '.join(PRELOADED_MODULES)} started a thread, so forking is not safe"
    elif "nvflare" in sys.modules:
        refusal = "NVFlare is imported in the zygote, so its children would share its import-time state"
    selector = selectors.DefaultSelector()
    selector.register(channel, selectors.EVENT_READ)
    requests = channel.makefile("r")
    while True:
        if selector.select(timeout=0.2):
            line = requests.readline()
            if not line:
                return  # the runner is gone
            if refusal:
                answer = {"error": refusal}
            else:
                pid = os.fork()
                if pid == 0:
                    channel.close()
                    _run_worker(json.loads(line))
                answer = {"pid": pid}
            channel.sendall((json.dumps(answer) + "\n").encode())
        _report_exits(channel)


def _report_exits(channel: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        channel.sendall((json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n").encode())


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
