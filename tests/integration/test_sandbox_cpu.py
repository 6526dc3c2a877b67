"""The sandbox with real workers: memory budget, kill -9 and Ctrl-C, fast start, no leftovers."""

import csv
import dataclasses
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest

from autotune.common.models import resolve_model
from autotune.common.trial import Progress, Stage, Status, TrialSpec
from autotune.execute.launchers import WORKER_COMMAND, CommandLauncher, ForkserverLauncher
from autotune.execute.local import launch_trial
from autotune.store.records import PARAMS_ATTR, RESULT_ATTR, RETRY_OF_ATTR
from tests.benchmarking import up_to_three_attempts
from tests.conftest import TINY_MODEL

pytestmark = pytest.mark.slow
SPACE = """
description: three batch sizes, the rest fixed
device: any
knobs:
  batch_size: {choices: [8, 16, 256]}
  precision: fp32
  optim: sgd
  gradient_checkpointing: false
  dataloader_num_workers: 0
"""


def search_command(out: Path, space: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "autotune",
        "search",
        f"model={TINY_MODEL}",
        "seq_len=128",
        f"space={space}",
        "warmup_steps=1",
        "measure_steps=2",
        f"out={out}",
        "study=s",
        "confirm_rounds=0",
        *extra,
    ]


@pytest.fixture
def space(tmp_path):
    path = tmp_path / "three.yaml"
    path.write_text(SPACE)
    return path


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_over_budget_batches_are_oom_and_larger_ones_after_an_oom_are_skipped(tmp_path):
    # Measured here: batch 8 and 16 grow the worker by ~0.1-0.2 GiB, batch 256 by ~0.9 GiB.
    space = tmp_path / "batches.yaml"
    space.write_text(SPACE.replace("[8, 16, 256]", "[8, 16, 256, 384, 512, 640]"))
    # Skipping by estimate off, and the search's own stop (the model sees the large batches
    # unlikely to fit): these batches must run to meet the watchdog.
    proc = subprocess.run(
        search_command(
            tmp_path,
            space,
            "n_trials=7",
            "memory_budget=600MiB",
            "estimate_margin=null",
            "min_gain_per_minute=0",
        ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    table = [r for r in rows(tmp_path / "s" / "trials.csv") if r["baseline"] == "False"]
    status = {int(r["batch_size"]): r["status"] for r in table}
    assert set(status) == {8, 16, 256, 384, 512, 640}
    assert status[8] == status[16] == "ok"
    # 600 MiB is 0.5859 GiB: "0.59", or "0.586" or "0.5859" when the growth rounds alike.
    assert re.search(r"exceeded memory_budget 0\.5(9|8\d+) GiB", proc.stdout), proc.stdout
    first_oom = None
    for row in table:  # in the order they ran
        batch = int(row["batch_size"])
        if first_oom is not None and batch >= first_oom:
            assert row["status"] == "skipped", row
            assert "as memory-hungry as trial" in row["reason"]
            assert not (tmp_path / "s" / "trials" / f"{int(row['number']):04d}").exists()
        elif batch >= 256:
            assert row["status"] == "oom", row
            first_oom = batch if first_oom is None else min(first_oom, batch)
    assert "skipped" in status.values(), "seed 0 runs a larger batch after a smaller OOM"


def test_batches_the_estimate_puts_over_budget_are_skipped_without_running(tmp_path):
    """With the estimate on (the default margin): batches that cannot fit whatever the other
    knobs leave the space before the search, a proposal estimated over the budget never
    starts, and every trial that ran keeps its estimate beside its measured peak. Estimated
    (eager attention, SGD, fp32): batch 320 at 1.37 GiB without checkpointing and 1.00 with,
    1024 at 2.9 with; the limit is 1.10 GiB. Checkpointing has a memory order: had batch 320
    with it run out of memory first, the one without would be skipped for that (a check that
    comes first); the grid's order (its seed) proposes the one without first."""
    space = tmp_path / "batches.yaml"
    text = SPACE.replace("[8, 16, 256]", "[8, 320, 1024, 2048]")
    text = text.replace(
        "gradient_checkpointing: false", "gradient_checkpointing: {choices: [false, true]}"
    )
    space.write_text(text + "  attn_implementation: eager\n")
    proc = subprocess.run(
        search_command(
            tmp_path, space, "n_trials=5", "sampler=grid", "seed=1", "memory_budget=900MiB"
        ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "batch_size above 320 removed: estimated over the 1.10 GiB" in proc.stdout
    table = rows(tmp_path / "s" / "trials.csv")
    by_point = {
        (int(r["batch_size"]), r["gradient_checkpointing"]): r
        for r in table
        if r["baseline"] == "False"
    }
    assert {batch for batch, _ in by_point} == {8, 320}, "1024 and 2048 never proposed"
    skipped = by_point[320, "False"]
    assert int(skipped["number"]) < int(by_point[320, "True"]["number"]), "the grid's order"
    assert skipped["status"] == "skipped", skipped
    assert skipped["reason"].startswith("estimated at"), skipped["reason"]
    assert not (tmp_path / "s" / "trials" / f"{int(skipped['number']):04d}").exists()
    ran = [r for r in table if r["status"] == "ok"]
    assert ran and all(float(r["estimate_gib"]) > 0 for r in ran)


@pytest.mark.benchmark
@up_to_three_attempts
def test_two_identical_trials_agree_within_ten_percent(tmp_path):
    launcher = ForkserverLauncher()
    specs = [dataclasses.replace(tiny_spec(n), warmup_steps=3, measure_steps=10) for n in range(3)]
    runs = [
        launch_trial(s, tmp_path / str(s.trial_number), timeout_s=120, launcher=launcher)
        for s in specs
    ]
    a, b = runs[1], runs[2]  # the first pays the fork server's start
    assert a.status is b.status is Status.OK
    print(
        f"samples/s {a.samples_per_s:.1f} vs {b.samples_per_s:.1f}, "
        f"CV {a.step_time_cv:.3f} / {b.step_time_cv:.3f}"
    )
    assert abs(a.samples_per_s - b.samples_per_s) / max(a.samples_per_s, b.samples_per_s) < 0.10
    assert a.step_time_cv is not None and len(a.step_times_ms) == 10


def descendants(proc: subprocess.Popen) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def wait_gone(pids: set[int], timeout_s: float = 10) -> set[int]:
    deadline = time.monotonic() + timeout_s
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {
            p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
        }
        time.sleep(0.1)
    return alive


def start_and_interrupt(command: list[str], study_dir: Path, sig: int) -> tuple[int, set[int]]:
    """Start a search, send `sig` while trial 1 runs; its exit code and every process it had."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    deadline = time.monotonic() + 120
    while not (study_dir / "trials" / "0001" / "progress.json").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        seen |= descendants(proc)
        time.sleep(0.05)
    seen |= descendants(proc)
    proc.send_signal(sig)
    proc.communicate(timeout=600)  # a safety net on a loaded machine, not a bound
    return proc.returncode, seen


def test_kill_9_mid_trial_then_rerun_finishes_exactly_n_trials_once_each(tmp_path, space):
    command = search_command(tmp_path, space, "n_trials=3", "trial_timeout=2m")  # baseline + 2
    code, processes = start_and_interrupt(command, tmp_path / "s", signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert processes, "the search had started its worker processes"
    assert not wait_gone(processes), "a worker outlived the killed search"

    again = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0, again.stderr
    assert "trial 1 was interrupted: its settings run again first" in again.stdout
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    measured = [t for t in study.trials if RESULT_ATTR in t.user_attrs]
    assert len(measured) == 3
    configs = [json.dumps(t.user_attrs[PARAMS_ATTR], sort_keys=True) for t in measured]
    assert len(set(configs)) == 3, "a config was measured twice"
    retries = [t for t in measured if t.user_attrs.get(RETRY_OF_ATTR) == 1]
    assert len(retries) == 1
    assert retries[0].user_attrs[PARAMS_ATTR] == study.trials[1].user_attrs[PARAMS_ATTR]


def test_ctrl_c_stops_the_trial_writes_outputs_and_exits_130(tmp_path, space):
    command = search_command(tmp_path, space, "n_trials=3")
    code, processes = start_and_interrupt(command, tmp_path / "s", signal.SIGINT)
    assert code == 130
    assert not wait_gone(processes), "a worker outlived the interrupted search"
    finished = rows(tmp_path / "s" / "trials.csv")
    assert [(r["number"], r["status"]) for r in finished] == [("0", "ok"), ("1", "interrupted")]
    assert (tmp_path / "s" / "report.html").is_file()


def tiny_spec(number: int) -> TrialSpec:
    model = resolve_model(TINY_MODEL)
    return TrialSpec(
        trial_number=number,
        model_name=model.name,
        model_config=model.config,
        task="sequence-classification",
        seq_len=64,
        device="cpu",
        params={"batch_size": 8, "precision": "fp32", "optim": "sgd"},
        warmup_steps=1,
        measure_steps=3,
        seed=0,
    )


def test_a_trial_clearly_slower_than_the_best_so_far_stops_early_with_what_it_measured(tmp_path):
    """A pace no CPU reaches: the trial stops after its first 2 of 6 timed steps, and its
    result says what those measured (the search's model counts it as a slower point)."""
    spec = dataclasses.replace(
        tiny_spec(0), measure_steps=6, stop_below_samples_per_s=1e9, stop_after_steps=2
    )
    launcher = ForkserverLauncher()
    result = launch_trial(spec, tmp_path / "0", timeout_s=300, launcher=launcher)
    assert result.status is Status.STOPPED, result.reason
    assert result.measured_steps == len(result.step_times_ms) == 2
    assert result.samples_per_s > 0 and result.peak_memory_gib is not None
    assert result.reason.startswith("stopped after 2 timed steps: at most ")
    assert not result.feasible(budget_gib=100.0), "never recommended"
    unstopped = launch_trial(
        dataclasses.replace(spec, stop_below_samples_per_s=1e-3),
        tmp_path / "1",
        timeout_s=300,
        launcher=launcher,
    )
    assert unstopped.status is Status.OK and unstopped.measured_steps == 6


SERVER_MODULES = """
import sys
from pathlib import Path
from autotune.execute.local import launch_trial
from autotune.common.placement import Placement
from autotune.execute.launchers import ForkserverLauncher, _fork
from tests.integration.test_sandbox_cpu import tiny_spec, write_modules

launcher = ForkserverLauncher()
launcher.ready(Placement())
probe = _fork(Placement(), target=write_modules, args=(sys.argv[1] + "/modules",))
probe.join()
result = launch_trial(tiny_spec(0), Path(sys.argv[1]) / "trial", timeout_s=120, launcher=launcher)
print(result.status.value, result.reason)
"""


def write_modules(path: str) -> None:
    import torch

    watched = getattr(torch.cuda._lazy_init, "_autotune_watched", False)
    Path(path).write_text("\n".join([*sorted(sys.modules), f"watched={watched}"]))


def test_the_fork_server_holds_the_trainer_with_cudas_initialisation_watched(tmp_path):
    # On an H200 and an H100 (torch 2.11, transformers 5.17) importing transformers.trainer
    # initialised CUDA, and a trial forked after it could not use the GPU: the server held
    # torch and transformers alone there, and each trial paid the Trainer's import (~8 s).
    # Now the server imports `cuda_free` first, on a GPU as here (test_parent_process.py shows
    # on a pretended GPU that the preload initialises nothing), and every trial forks ready.
    out = subprocess.run(
        [sys.executable, "-c", SERVER_MODULES, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split()[0] == "ok", out.stdout + out.stderr
    in_server = set((tmp_path / "modules").read_text().split())
    assert {
        "transformers.trainer",
        "autotune.child.worker",
        "autotune.child.cuda_free",
    } <= in_server
    assert "watched=True" in in_server


def test_a_trials_cost_is_broken_into_its_parts(tmp_path):
    # trials.csv's parts: what the parent saw (wall_s, overhead_s, process_s) and what the
    # worker timed, which must add up to what was measured around them.
    spec = tiny_spec(0)
    forked = launch_trial(spec, tmp_path / "forked", timeout_s=120, launcher=ForkserverLauncher())
    cold = launch_trial(
        dataclasses.replace(spec, trial_number=1),
        tmp_path / "cold",
        timeout_s=120,
        launcher=CommandLauncher(WORKER_COMMAND),
    )
    for result in (forked, cold):
        assert result.status is Status.OK, result.reason
        parts = (result.model_build_s, result.data_s, result.trainer_init_s)
        assert all(p is not None and p >= 0 for p in parts), result
        assert result.build_s == pytest.approx(sum(parts), abs=0.05)
        assert result.cuda_init_s is None  # a CPU trial makes no CUDA context
        timed_s = sum(result.step_times_ms) / 1e3
        assert result.train_s == pytest.approx(result.warmup_s + timed_s)
        assert result.overhead_s == pytest.approx(
            result.process_s + result.imports_s + result.finish_s
        )
        assert min(result.process_s, result.imports_s, result.finish_s, result.warmup_s) >= 0
    # The cold worker imported torch, transformers and the Trainer itself; the forked one
    # found them in the server (the benchmark below compares the two starts' times).
    assert cold.imports_s > forked.imports_s


@pytest.mark.benchmark
@up_to_three_attempts
def test_forked_trials_start_far_faster_than_a_cold_process(tmp_path):
    forked = ForkserverLauncher()
    overheads = []
    for number in range(4):
        result = launch_trial(
            tiny_spec(number), tmp_path / str(number), timeout_s=120, launcher=forked
        )
        assert result.status is Status.OK, result.reason
        overheads.append(result.overhead_s)
    cold = launch_trial(
        tiny_spec(9), tmp_path / "cold", timeout_s=120, launcher=CommandLauncher(WORKER_COMMAND)
    )
    assert cold.status is Status.OK, cold.reason
    warm_median = statistics.median(overheads[1:])  # the first pays the server's start
    print(
        f"overhead_s: forked {overheads} (median after the first {warm_median:.3f}), "
        f"cold {cold.overhead_s:.3f}"
    )
    assert warm_median < 1.0
    assert cold.overhead_s > 3 * warm_median


@pytest.mark.benchmark
@up_to_three_attempts
def test_compiled_trials_share_the_study_inductor_cache(tmp_path):
    cache = tmp_path / "inductor-cache"
    launcher = ForkserverLauncher()
    walls = []
    for number in range(2):
        spec = tiny_spec(number)
        compiled = dataclasses.replace(
            spec,
            params={**spec.params, "torch_compile": "inductor"},
            compile_cache_dir=str(cache),
        )
        result = launch_trial(compiled, tmp_path / str(number), timeout_s=300, launcher=launcher)
        assert result.status is Status.OK, result.reason
        walls.append(result.wall_s)
    assert any(cache.iterdir()), "the compile cache stayed empty"
    print(f"compiled trial wall_s: cold cache {walls[0]:.1f}, warm cache {walls[1]:.1f}")
    assert walls[1] < 0.7 * walls[0]


def test_knobs_added_through_the_catalogue_alone_reach_a_real_trial(tmp_path):
    spec = tiny_spec(0)
    params = {
        **spec.params,
        "gradient_checkpointing": True,
        "checkpointing_reentrant": False,
        "torch_empty_cache_steps": 2,
    }
    result = launch_trial(
        dataclasses.replace(spec, params=params),
        tmp_path,
        timeout_s=120,
        launcher=CommandLauncher(WORKER_COMMAND),
    )
    assert result.status is Status.OK, result.reason
    assert result.training_args["activation_checkpointing_kwargs"] == {"use_reentrant": False}
    assert result.training_args["torch_empty_cache_steps"] == 2


def test_a_real_trial_reports_its_steps_stages_and_eta_while_it_runs(tmp_path):
    spec = dataclasses.replace(tiny_spec(0), warmup_steps=2, measure_steps=4)
    seen: list[Progress] = []
    result = launch_trial(
        spec, tmp_path, timeout_s=120, launcher=ForkserverLauncher(), on_progress=seen.append
    )
    assert result.status is Status.OK, result.reason
    assert seen[0].stage is Stage.BUILDING and seen[0].step == 0
    order = list(Stage)
    assert [order.index(p.stage) for p in seen] == sorted(order.index(p.stage) for p in seen)
    steps = [p.step for p in seen]
    assert steps == sorted(steps) and steps[-1] == 6
    assert {p.total_steps for p in seen} == {6}
    elapsed = [p.elapsed_s for p in seen]
    assert elapsed == sorted(elapsed) and elapsed[-1] < result.wall_s
    assert all(p.eta_s is None for p in seen if p.step < 2)
    assert seen[-1].stage is Stage.MEASURING and seen[-1].eta_s == 0
    log = (tmp_path / "worker.log").read_text()
    for step in range(1, 7):
        stage = "warm-up" if step < 2 else "measuring"
        assert re.search(rf"^step {step}/6 \({stage}\) [\d.]+ s elapsed", log, re.M), log
    assert re.search(r"^step 2/6 \(measuring\) [\d.]+ s elapsed, ETA \d+ s$", log, re.M), log
