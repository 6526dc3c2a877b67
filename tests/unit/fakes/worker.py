"""A stand-in worker: `python fakes/worker.py MODE SPEC RESULT` behaves as MODE says.

Modes: ok, raise, exit3, segfault, sleep, garbage, spawn_sleep (leaves a grandchild that
writes its pid to pid.txt beside the spec, then sleeps past any timeout).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

mode, spec_path, result_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
spec = json.loads(spec_path.read_text())
print(f"fake worker: {mode}", file=sys.stderr, flush=True)

if mode == "ok":
    result = {
        "schema_version": 1,
        "status": "ok",
        "samples_per_s": 100.0 + spec["params"]["batch_size"],
        "tokens_per_s": 6400.0,
        "peak_memory_gib": spec["params"]["batch_size"] / 64,
        "step_time_cv": 0.01,
        "measured_steps": spec["measure_steps"],
        "training_args": {"per_device_train_batch_size": spec["params"]["batch_size"]},
        "worker_pid": os.getpid(),
    }
    result_path.write_text(json.dumps(result))
elif mode == "raise":
    raise RuntimeError("boom in the worker")
elif mode == "exit3":
    sys.exit(3)
elif mode == "segfault":
    os.kill(os.getpid(), signal.SIGSEGV)
elif mode == "sleep":
    time.sleep(60)
elif mode == "garbage":
    result_path.write_text("{not json")
elif mode == "spawn_sleep":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (spec_path.parent / "pid.txt").write_text(str(child.pid))
    time.sleep(60)
