"""Run by tests/test_simulator_speed.py as a forked worker: ``python -m tests.zygote_probe <report.json> <exit code>
[<seconds to sleep>]``. It reports what a worker sees of its start, then sleeps, then exits with the code."""

import json
import os
import sys
import time

report = {
    "torch_already_imported": "torch" in sys.modules,
    "dynamo_already_imported": "torch._dynamo" in sys.modules,
    "probe_variable": os.environ.get("PROBE_VARIABLE"),
    "cwd": os.getcwd(),
    "sys_path": sys.path,
    "argv": sys.argv[1:],
    "own_session": os.getsid(0) == os.getpid(),
}
with open(sys.argv[1], "w") as f:
    json.dump(report, f)
time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0)
sys.exit(int(sys.argv[2]))
