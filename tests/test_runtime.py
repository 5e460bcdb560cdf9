import os

import pytest
import torch

from nvflare_moon.core import runtime


def test_worker_count_is_read_from_the_simulator_command_line(tmp_path, monkeypatch):
    cmdline = "\0".join(["python", "-m", "nvflare.private.fed.app.simulator.simulator", "job", "-n", "10", "-t", "4"])
    proc = tmp_path / "proc" / "123"
    proc.mkdir(parents=True)
    (proc / "cmdline").write_bytes(cmdline.encode())
    real_open = open
    monkeypatch.setattr(
        "builtins.open", lambda p, *a, **k: real_open(str(p).replace("/proc", str(tmp_path / "proc")), *a, **k)
    )
    assert runtime.simulator_worker_count(["worker", "--parent_pid", "123"]) == 4
    assert runtime.simulator_worker_count(["worker"]) is None
    assert runtime.simulator_worker_count(["worker", "--parent_pid", "999"]) is None


def test_threads_share_the_cores_among_simulator_workers(monkeypatch):
    monkeypatch.setattr(runtime, "simulator_worker_count", lambda: 4)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert runtime.resolve_num_threads(None) == 4
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert runtime.resolve_num_threads(None) == 1  # -t 4 on 2 cores: one thread each, not 8 competing
    assert runtime.resolve_num_threads(3) == 3  # an explicit setting wins


def test_outside_the_simulator_torch_keeps_its_default(monkeypatch):
    monkeypatch.setattr(runtime, "simulator_worker_count", lambda: None)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)
    assert runtime.resolve_num_threads(None) == 7


def test_device_auto_falls_back_to_cpu_and_a_missing_gpu_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.resolve_device("auto") == torch.device("cpu")
    assert runtime.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device='cuda'"):
        runtime.resolve_device("cuda")
    with pytest.raises(ValueError, match="device='cuda:1'"):
        runtime.resolve_device("cuda:1")


def test_device_auto_takes_the_gpu_when_one_is_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert runtime.resolve_device("auto") == torch.device("cuda")
    assert runtime.resolve_device("cuda:1") == torch.device("cuda", 1)


@pytest.mark.parametrize("device", ["tpu", "gpu", 0, None])
def test_an_unknown_device_is_refused_by_name(device):
    with pytest.raises(ValueError, match=r"device must be 'auto', 'cpu', 'cuda' or 'cuda:<index>', got"):
        runtime.resolve_device(device)


def test_a_gpu_index_past_the_visible_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert runtime.resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ValueError, match=r"device='cuda:1' but only 1 GPU\(s\) are visible"):
        runtime.resolve_device("cuda:1")


def test_the_executor_names_a_bad_device():
    from nvflare_moon.core.specs import DataSpec, TrainingSpec
    from nvflare_moon.executors import FedAvgExecutor
    from nvflare_moon.models import Network

    with pytest.raises(ValueError, match="device must be"):
        FedAvgExecutor(model=Network(), data=DataSpec(dataset="synthetic"), training=TrainingSpec(device="tpu"))
