"""Where local training runs: the torch device and the number of CPU threads per client process."""

import os
import sys
from typing import Optional

import torch


def resolve_device(device: str) -> torch.device:
    """``"auto"`` picks the GPU when one is visible, else the CPU; anything else must be a torch device string
    (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...), and a GPU must be visible. Raises ValueError naming ``device``.

    NVFlare's simulator with ``-gpu 0,1`` sets ``CUDA_VISIBLE_DEVICES`` per client process, so ``"auto"`` (``cuda``,
    i.e. the first visible device) spreads the sites over the listed GPUs.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    expected = f"device must be 'auto', 'cpu', 'cuda' or 'cuda:<index>', got {device!r}"
    if not isinstance(device, str):
        raise ValueError(expected)
    try:
        resolved = torch.device(device)
    except RuntimeError as e:
        raise ValueError(expected) from e
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but no GPU is visible; use device='auto' or 'cpu'")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise ValueError(
            f"device={device!r} but only {torch.cuda.device_count()} GPU(s) are visible; use device='auto' or 'cuda'"
        )
    return resolved


def simulator_worker_count(argv=None) -> Optional[int]:
    """The ``-t`` of the NVFlare simulator that started this client process, or None outside the simulator.

    A simulator worker is started with ``--parent_pid``; the runner's command line holds ``-t/--threads``.
    """
    argv = sys.argv if argv is None else argv
    if "--parent_pid" not in argv:
        return None
    try:
        parent = argv[argv.index("--parent_pid") + 1]
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            parent_argv = f.read().decode().split("\0")
    except (IndexError, OSError):
        return None
    for flag in ("-t", "--threads"):
        if flag in parent_argv:
            try:
                return int(parent_argv[parent_argv.index(flag) + 1])
            except (IndexError, ValueError):
                return None
    return None


def resolve_num_threads(num_threads: Optional[int]) -> int:
    """Torch's intra-op threads for one client process.

    ``None`` shares the machine's cores among the simulator's parallel workers (``cores // -t``, at least 1), so that
    ``-t 4`` on 2 cores does not run 8 competing threads. Outside the simulator it keeps torch's default.
    """
    if num_threads is not None:
        return num_threads
    workers = simulator_worker_count()
    if workers is None:
        return torch.get_num_threads()
    return max(1, (os.cpu_count() or 1) // workers)
