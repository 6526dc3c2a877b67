"""A stand-in worker: `python fakes/worker.py MODE SPEC RESULT` behaves as MODE says.

MODE `sequence:DIR:m1,m2,...` takes the next mode from the list on each call (a counter file in
DIR), so one search can meet every fault in turn.

MODE `drift:DIR:STEP` measures every setting at the same true speed, 100 samples/s, on a
machine that speeds up by STEP (a share) with each run: call k (a counter file in DIR) reports
100 x (1 + STEP x k) samples/s. Whichever settings run later look faster.

MODE `sleep:SECONDS` takes that long, then writes MODE `ok`'s result. Results give as
`cpu_threads` the number of cores the fake worker could use.

MODE `progress` reports as the real worker does: `building` and training-begins progress
records 0.3 s apart, then a record and a log line per step (warm-up, then measuring; 0.1 s a
step; an ETA from the second step on) up to the spec's warm-up + measured steps, then writes
MODE `ok`'s result.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from autotune.common.knobs import training_args
from autotune.common.trial import Progress, Stage, write_progress
from autotune.plan.software_cache import software_facts

# As the worker records them: the knobs' arguments, named by the installed transformers' fields
# (the probe's cached facts, as the parent has them: no transformers import here).
FIELDS = software_facts().training_argument_fields or ()

mode, spec_path, result_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
if mode.startswith("sequence:"):
    _, state_dir, modes = mode.split(":")
    counter = Path(state_dir) / "calls"
    calls = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(calls + 1))
    mode = modes.split(",")[calls % len(modes.split(","))]
drift = None
if mode.startswith("drift:"):
    _, state_dir, step = mode.split(":")
    counter = Path(state_dir) / "calls"
    calls = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(calls + 1))
    mode, drift = "ok", 100.0 * (1 + float(step) * calls)
spec = json.loads(spec_path.read_text())
print(f"fake worker: {mode}", file=sys.stderr, flush=True)
progress = spec_path.parent / "progress.json"


def write_result(**fields):
    result = {"schema_version": 1, "worker_pid": os.getpid(), **fields}
    result_path.write_text(json.dumps(result))


def write_ok_result():
    batch = spec["params"]["batch_size"]
    write_result(
        status="ok",
        samples_per_s=100.0 + batch if drift is None else drift,
        tokens_per_s=6400.0,
        peak_memory_gib=batch / 64,
        step_time_cv=0.01,
        measured_steps=spec["measure_steps"],
        build_s=0.1,
        train_s=0.2,
        training_args=training_args(spec["params"], device=spec["device"], fields=FIELDS),
        cpu_threads=len(os.sched_getaffinity(0)),
    )


def report(stage, step, started_s, eta_s=None):
    record = Progress(
        baseline_rss_bytes=0,
        stage=stage,
        step=step,
        total_steps=spec["warmup_steps"] + spec["measure_steps"],
        elapsed_s=time.monotonic() - started_s,
        eta_s=eta_s,
    )
    write_progress(progress, record)
    print(record.summary(), flush=True)


if mode == "ok":
    write_ok_result()
elif mode.startswith("sleep:"):
    time.sleep(float(mode.split(":")[1]))
    write_ok_result()
elif mode == "progress":
    STEP_S = 0.1
    started_s = time.monotonic()
    total = spec["warmup_steps"] + spec["measure_steps"]
    report(Stage.BUILDING, 0, started_s)
    time.sleep(3 * STEP_S)
    report(Stage.WARMUP, 0, started_s)  # training begins
    for step in range(1, total + 1):
        time.sleep(STEP_S)
        stage = Stage.WARMUP if step < spec["warmup_steps"] else Stage.MEASURING
        report(stage, step, started_s, eta_s=(total - step) * STEP_S if step > 1 else None)
    write_ok_result()
elif mode == "raise":
    raise RuntimeError("boom in the worker")
elif mode == "error":  # what the real worker writes for an exception it caught
    write_result(status="error", reason="ValueError: bad things", stderr_tail="Traceback ...")
elif mode == "nan":
    write_result(status="nan_loss", reason="training loss is nan", measured_steps=10)
elif mode == "zero":
    write_result(status="error", reason="only 0 of 10 measured steps ran")
elif mode == "exit3":
    sys.exit(3)
elif mode == "sigkill":  # as `kill -9` from anyone does
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "oomkill":  # the kernel's OOM killer: its cgroup counter rises, then SIGKILL
    events = spec_path.parent / "memory.events"
    kills = int(events.read_text().split()[-1])
    events.write_text(f"oom 1\noom_kill {kills + 1}\n")
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "hog":  # grow until something stops it
    time.sleep(0.5)  # time for the test to move this process into a small cgroup
    chunks = []
    while True:
        chunk = bytearray(64 * 2**20)
        for i in range(0, len(chunk), 4096):
            chunk[i] = 1
        chunks.append(chunk)
elif mode == "segfault":
    os.kill(os.getpid(), signal.SIGSEGV)
elif mode == "sleep":
    time.sleep(60)
elif mode == "garbage":
    result_path.write_text("{not json")
elif mode == "alloc":  # grow well past any small budget, then linger
    report(Stage.BUILDING, 0, time.monotonic())
    hog = bytearray(600 * 2**20)
    for i in range(0, len(hog), 4096):
        hog[i] = 1  # touch every page so it is resident
    time.sleep(60)
elif mode == "spawn_sleep":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (spec_path.parent / "pid.txt").write_text(str(child.pid))
    time.sleep(60)
