"""benchmarks/gpu_protocol.sh is run once, on a lent GPU machine, with no time to mend it there: every command it runs
must be one that our command lines accept, with the settings it promises. A stand-in ``python`` first on PATH records
each command instead of running it; the real argument parsers then read them."""

import importlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from nvflare_moon.benchmark.cli import parse_args as benchmark_args

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_protocol.sh"

RECORDING_PYTHON = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["COMMANDS"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "env_data": os.environ.get("NVFLARE_MOON_DATA")}) + "\\n")
if sys.argv[1].endswith(".py") and not os.path.isfile(sys.argv[1]):
    sys.exit(f"python: can't open file {sys.argv[1]!r}")  # as the real one would, from the script's folder
if sys.argv[1:2] == ["-c"]:
    print("device: cpu")
if sys.argv[1].endswith("build_batches.py"):
    os.makedirs(os.path.join(sys.argv[2], "cifar-10-batches-py"))
"""


def run_script(tmp_path, data: Path, *args: str, epochs: str = "") -> tuple:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(RECORDING_PYTHON)
    (bin_dir / "python").chmod(0o755)
    commands = tmp_path / "commands.jsonl"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "COMMANDS": str(commands)}
    env.pop("EPOCHS", None)
    if epochs:
        env["EPOCHS"] = epochs
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(SCRIPT), str(data), str(out), *args], cwd=REPO, env=env, capture_output=True, text=True
    )  # from the repository's root, as its usage line says
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in commands.read_text().splitlines()], out, done.stdout


@pytest.fixture
def cifar_folder(tmp_path):
    data = tmp_path / "data"
    (data / "cifar-10-batches-py").mkdir(parents=True)
    return data


def test_the_paper_pair_runs_with_the_papers_settings_on_the_gpu_for_the_rounds_asked(tmp_path, cifar_folder):
    commands, out, stdout = run_script(tmp_path, cifar_folder, "2")
    device_check, benchmark, overhead = commands
    assert device_check["argv"][0] == "-c" and "device: cpu" in stdout
    assert benchmark["argv"][:2] == ["-m", "nvflare_moon.benchmark"]
    args = benchmark_args(benchmark["argv"][2:])
    assert (args.protocol, args.methods, args.seeds) == ("paper", ["moon", "fedavg"], [0])
    assert (args.rounds, args.local_epochs, args.device) == (2, 10, "auto")  # the paper's E unless EPOCHS says
    assert args.data_root == str(cifar_folder) and args.out == str(out / "paper")
    # the overhead split: both modes of the simulator at -t 10 and -t 4, its record in OUT
    overhead_args = importlib.import_module("benchmarks.simulator_overhead").parse_args(overhead["argv"][1:])
    assert overhead["argv"][0] == "benchmarks/simulator_overhead.py" and overhead["env_data"] == str(cifar_folder)
    assert (overhead_args.compare_threads, overhead_args.epochs, overhead_args.modes) == ("10,4", 10, "nvflare,ours")
    assert overhead_args.record == str(out / "overhead_e10.json")


def test_epochs_reach_both_parts_and_the_jpeg_copy_is_unpacked_first(tmp_path):
    jpeg_copy = tmp_path / "shared_copy"  # no cifar-10-batches-py/: the project's JPEG copy with its build script
    jpeg_copy.mkdir()
    (jpeg_copy / "build_batches.py").touch()
    commands, out, _ = run_script(tmp_path, jpeg_copy, epochs="1")
    build, _, benchmark, overhead = commands
    assert build["argv"] == [str(jpeg_copy / "build_batches.py"), str(out / "data")]
    args = benchmark_args(benchmark["argv"][2:])
    assert (args.rounds, args.local_epochs, args.data_root) == (5, 1, str(out / "data"))
    overhead_args = importlib.import_module("benchmarks.simulator_overhead").parse_args(overhead["argv"][1:])
    assert overhead_args.epochs == 1 and overhead_args.record == str(out / "overhead_e1.json")
