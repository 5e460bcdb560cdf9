"""The test helpers leave nothing behind: a timed-out simulator run's whole process tree, the recipes' temp files."""

import re
import subprocess
import sys
import tempfile

import psutil
import pytest

from nvflare_moon.recipes import MoonRecipe

from .conftest import run_command

# a stand-in for the simulator: it starts a worker in a session of its own (as the simulator's os.setsid does)
SIMULATOR = r"""
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print("worker", worker.pid, flush=True)
time.sleep(120)
"""


def test_a_timed_out_run_ends_every_process_it_started(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        run_command([sys.executable, "-c", SIMULATOR], tmp_path, timeout=5)
    worker = int(re.search(r"worker (\d+)", timed_out.value.output).group(1))
    try:
        assert psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass  # ended and reaped


def test_recipe_exports_leave_nothing_in_the_system_temp_directory(tmp_path, private_temp_dir):
    MoonRecipe(name="moon_tmp", min_clients=2, dataset="synthetic").export(str(tmp_path))
    assert tempfile.gettempdir() == str(private_temp_dir)
    assert any(private_temp_dir.glob("nvflare_moon_byoc_*"))  # the BYOC marker, where pytest removes it
