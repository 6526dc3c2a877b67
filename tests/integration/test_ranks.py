"""Trials on several devices: real ranks (2 processes, gloo) training the tiny BERT, checked as
applied, and ended together whichever of them dies or freezes."""

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import transformers
import yaml

from autotune.common.models import resolve_model
from autotune.common.trial import Stage, Status, TrialSpec
from autotune.execute.launchers import WORKER_COMMAND, CommandLauncher, ForkserverLauncher
from autotune.execute.local import launch_trial
from autotune.plan.estimate import estimate
from tests.conftest import TINY_MODEL
from tests.integration import test_hardening
from tests.integration.test_hardening import LONG, search_command, wait_for
from tests.processes import alive, command_of, tree

pytestmark = pytest.mark.slow
start = test_hardening.start  # the fixture: searches in sessions of their own, cleaned up


def two_rank_spec(strategy: str, measure_steps: int = 3, **knobs) -> TrialSpec:
    model = resolve_model(TINY_MODEL)
    return TrialSpec(
        trial_number=0,
        model_name=model.name,
        model_config=model.config,
        task="sequence-classification",
        seq_len=32,
        device="cpu",
        params={
            "batch_size": 8,
            "precision": "fp32",
            "optim": "adamw_torch",
            "strategy": strategy,
            **knobs,
        },
        warmup_steps=1,
        measure_steps=measure_steps,
        seed=0,
        devices=2,
    )


@pytest.fixture(scope="module")
def launcher():
    return ForkserverLauncher()


DDP_KNOBS = {"ddp_find_unused_parameters": False, "ddp_bucket_cap_mb": 10, "ddp_static_graph": True,
             "gradient_as_bucket_view": True}  # fmt: skip


PSI_BYTES = {"ddp": 16, "fsdp": 8, "fsdp_grad_op": 8, "zero1": 8 + 6, "zero2": 4 + 8, "zero3": 10}
"""Model-state bytes a rank holds per parameter at 2 ranks, in fp32 with AdamW (4 B weights,
4 B gradients, 8 B states; DeepSpeed's optimizer adds an fp32 copy of its partition): DDP all
of it, FSDP 16 / 2; ZeRO-1 weights and gradients + 12 / 2; ZeRO-2 the weights + 16 / 2; ZeRO-3
20 / 2."""


@pytest.mark.parametrize(
    ("strategy", "knobs"),
    [
        ("ddp", {}),
        ("ddp", DDP_KNOBS),
        ("fsdp", {"fsdp_prefetch": True}),
        ("fsdp_grad_op", {}),
        ("single", {}),
        ("zero1", {}),
        ("zero2", {"zero_overlap_comm": True}),
        ("zero3", {}),
    ],
)
def test_each_strategy_trains_on_two_ranks_as_asked(tmp_path, launcher, strategy, knobs):
    spec = two_rank_spec(strategy, **knobs)
    result = launch_trial(spec, tmp_path, timeout_s=600, launcher=launcher)
    assert result.status is Status.OK, result.reason + result.stderr_tail
    if strategy == "ddp":  # DDP's own settings, through TrainingArguments but one
        fields = {k: v for k, v in knobs.items() if k != "gradient_as_bucket_view"}
        assert fields.items() <= result.training_args.items()
        # That one on the Trainer's DDP settings: each rank checked its wrapper had it (a
        # trial whose DDP had not is an error).
    full = result.n_params
    ranks = 1 if strategy == "single" else 2  # single: one of the two devices, for reference
    if strategy == "single":
        # One device of two: its share of the cores.
        assert result.rank_params == [full]
        assert result.cpu_threads == len(sorted(os.sched_getaffinity(0))[::2])
    elif strategy in ("ddp", "zero1", "zero2"):
        assert result.rank_params == [full, full]  # replicated
    else:
        # Sharded: an even split, give or take (ZeRO-3 pads its partitions to equal sizes).
        assert full <= sum(result.rank_params) <= full + 2 and max(result.rank_params) < full
        assert min(result.rank_params) > full // 2 - full // 100
    if strategy.startswith("zero"):  # DeepSpeed's config, with its own settings
        zero = result.training_args["deepspeed"]["zero_optimization"]
        assert zero["stage"] == int(strategy[-1])
        assert zero.get("overlap_comm") == knobs.get("zero_overlap_comm")
    assert len(result.rank_peak_memory_gib) == ranks
    assert result.peak_memory_gib == max(result.rank_peak_memory_gib) > 0
    # Every rank's batches are counted: 8 samples a step on each, over the timed steps' sum
    # (one slow step, as DeepSpeed's overlapped reduction may make on CPU, moves no count).
    timed_s = sum(result.step_times_ms) / 1e3
    assert result.samples_per_s == pytest.approx(
        8 * ranks * len(result.step_times_ms) / timed_s, rel=0.01
    )
    if strategy == "single":
        return
    # The model states each rank counted are the formula's, which the estimate gives, plus
    # AdamW's step counters (and under ZeRO-3 the small parameters it keeps whole on each rank).
    expected = estimate(
        spec.model_config,
        task=spec.task,
        seq_len=spec.seq_len,
        params=spec.params,
        device="cpu",
        parameters=full,
        devices=2,
    )
    assert expected.model_states == pytest.approx(PSI_BYTES[strategy] * full, abs=4)
    spare = 1024 if strategy != "zero3" else full // 100
    counted = result.rank_model_state_bytes
    assert all(0 <= b - expected.model_states <= spare for b in counted), (counted, expected)


def ranks_of(worker_cmd: str) -> list[psutil.Process]:
    workers = [p for p in psutil.Process().children() if worker_cmd in command_of(p)]
    return [c for w in workers for c in w.children()]


def run_and_hit_a_rank(tmp_path: Path, signum: int, timeout_s: float, stage: Stage):
    """A 2-rank DDP trial started as a cold worker (a child of this process); `signum` goes to
    rank 1 at the trial's first progress record of `stage` (both ranks have joined the group
    by the first record of all). Returns the result and every rank's pid."""
    seen: list[psutil.Process] = []

    def on_progress(progress):
        if progress.stage is stage and not seen:
            seen.extend(ranks_of("-m autotune.child "))
            assert len(seen) == 2, seen
            os.kill(seen[1].pid, signum)

    result = launch_trial(
        two_rank_spec("ddp", measure_steps=400),
        tmp_path,
        timeout_s=timeout_s,
        launcher=CommandLauncher(WORKER_COMMAND),
        on_progress=on_progress,
    )
    assert seen, "the trial never reached its timed steps"
    return result, seen


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_rank_killed_mid_step_ends_the_trial_as_crashed_and_leaves_nothing(tmp_path):
    result, ranks = run_and_hit_a_rank(tmp_path, signal.SIGKILL, 600, Stage.MEASURING)
    assert result.status is Status.CRASHED
    assert result.reason == "rank 1 was killed by SIGKILL"
    assert all(gone(r) for r in ranks)


def test_a_frozen_rank_ends_the_trial_by_its_timeout_and_leaves_nothing(tmp_path):
    # Frozen as soon as it exists: the trial cannot end otherwise, however loaded the machine.
    result, ranks = run_and_hit_a_rank(tmp_path, signal.SIGSTOP, 30, Stage.BUILDING)
    assert result.status is Status.TIMEOUT
    assert all(gone(r) for r in ranks)


def test_a_search_on_two_devices_a_trial_searches_the_strategy_from_a_ddp_baseline(tmp_path):
    command = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        f"model={TINY_MODEL}",
        "seq_len=32",
        "devices_per_trial=2",
        "n_trials=3",
        "warmup_steps=1",
        "measure_steps=2",
        "confirm_rounds=0",
        f"out={tmp_path}",
        "study=s",
        "seed=1",
    ]
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    with open(tmp_path / "s" / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["baseline"] == "True" and rows[0]["strategy"] == "ddp"
    assert {r["strategy"] for r in rows} <= {
        "ddp",
        "fsdp",
        "fsdp_grad_op",
        "zero1",
        "zero2",
        "zero3",
    }
    for row in rows:  # Adafactor cannot step FSDP's sharded parameters: never proposed
        assert row["status"] == "ok", row
        # Each rank's figures in trials.csv too, in rank order.
        assert len(row["rank_peak_memory_gib"].split(";")) == 2, row
        assert all(int(n) > 0 for n in row["rank_params"].split(";")), row
        assert not (row["strategy"].startswith("fsdp") and row["optim"] == "adafactor"), row
    assert (
        "strategy searched among ddp, fsdp, fsdp_grad_op, zero1, zero2, zero3: 2 devices per trial"
    ) in out.stdout  # on CPU, less the offload strategies, each with its note
    assert "removed strategy=zero3_offload: offload moves model states" in out.stdout
    recommended = json.loads((tmp_path / "s" / "recommended.json").read_text())
    assert len(recommended["metrics"]["rank_peak_memory_gib"]) == 2
    assert len(recommended["metrics"]["rank_params"]) == 2


def test_kill_9_of_the_search_during_a_two_rank_trial_leaves_nothing_running(tmp_path, start):
    search = start(search_command(tmp_path, "devices_per_trial=2", "n_trials=1", LONG))
    # The ranks lead sessions of their own, below the worker.
    wait_for(lambda: sum(os.getsid(p.pid) == p.pid for p in tree(search.pid)) >= 2, search)
    processes = {p.pid for p in tree(search.pid)}
    search.kill()
    search.wait(timeout=60)
    psutil.wait_procs([psutil.Process(p) for p in alive(processes)], timeout=60)
    survivors = [command_of(p) for p in alive(processes)]
    assert not survivors, f"still running after the search died: {survivors}"


SHARDED_SPACE = """
description: batch 8, fp32 AdamW, sharded
device: any
knobs:
  batch_size: 8
  precision: fp32
  optim: adamw_torch
  strategy: {strategy}
"""


@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_the_exported_launch_command_trains_each_strategy_on_two_ranks(tmp_path, strategy):
    space = tmp_path / "sharded.yaml"
    space.write_text(SHARDED_SPACE.format(strategy=strategy))
    command = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        f"model={TINY_MODEL}",
        "seq_len=32",
        "devices_per_trial=2",
        "n_trials=2",
        "warmup_steps=1",
        "measure_steps=2",
        "confirm_rounds=0",
        f"out={tmp_path}",
        "study=s",
        f"space={space}",
    ]
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    study = tmp_path / "s"
    recommended = json.loads((study / "recommended.json").read_text())
    assert recommended["launch"] == "torchrun --standalone --nproc_per_node=2 recommended.py"
    assert f"run it as its trials ran, in the study folder: {recommended['launch']}" in out.stdout
    deepspeed = study / "deepspeed.json"
    if recommended["params"]["strategy"] == "zero3":  # DeepSpeed's config, beside
        config = json.loads(deepspeed.read_text())
        assert config == recommended["training_args"]["deepspeed"]
        assert config["zero_optimization"]["stage"] == 3
    else:
        assert not deepspeed.exists()
    # The baseline's DDP once; the strategy asked each time.
    trials = ((0, "ddp"), (1, strategy)) if strategy == "fsdp" else ((1, strategy),)
    for trial, trained in trials:
        script = subprocess.run(
            [sys.executable, "-m", "autotune", "export", str(study), f"trial={trial}", "format=py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"STRATEGY = {trained!r}" in script
        (study / "recommended.py").write_text(script)
        run = subprocess.run(
            [
                *shlex.split(recommended["launch"]),
                "--max-steps",
                "3",
                "--output-dir",
                str(tmp_path / f"run{trial}"),
            ],
            cwd=study,
            capture_output=True,
            text=True,
            # A rank that aborts prints every thread's Python stack: one zero3 run in CI ended
            # SIGABRT ("terminate called without an active exception") after its training,
            # and none of 24 runs here since (12 of this test, 12 of torchrun alone), loaded
            # or not.
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "train_runtime" in run.stdout, run.stdout
    # The same through accelerate launch and the accelerate config written beside (once: the
    # example in docs/devices.md runs it for its own pick too).
    accelerate = yaml.safe_load((study / "accelerate_config.yaml").read_text())
    assert accelerate["num_processes"] == 2 and accelerate["mixed_precision"] == "no"
    assert recommended["accelerate_launch"] == (
        "accelerate launch --config_file accelerate_config.yaml recommended.py"
    )
    if strategy == "fsdp":
        run = subprocess.run(
            [
                *shlex.split(recommended["accelerate_launch"]),
                "--max-steps",
                "3",
                "--output-dir",
                str(tmp_path / "run1"),
            ],
            cwd=study,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "train_runtime" in run.stdout, run.stdout
    # Without the launcher, the script says how to run it rather than train on one rank.
    alone = subprocess.run(
        [sys.executable, "recommended.py", "--max-steps", "1"],
        cwd=study,
        capture_output=True,
        text=True,
    )
    assert alone.returncode == 1
    assert (
        f"trial 1 trained on 2 devices under {strategy}: run {recommended['launch']}"
        in alone.stderr
    )
    if strategy == "zero3":
        return
    # Sharded, the trained weights are saved whole at the end, gathered from both ranks.
    _, loading = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "run1", output_loading_info=True
    )
    assert not loading["missing_keys"] and not loading["mismatched_keys"], loading


def test_nothing_a_two_rank_trial_listens_on_is_reachable_from_another_host(tmp_path):
    """The rendezvous store (served by the worker) and the collectives' sockets (the ranks')
    listen on 127.0.0.1 alone: `TCPStore` given a port listens on every interface."""
    listening: list[tuple[str, int]] = []

    def on_progress(progress):
        if progress.stage is Stage.MEASURING and not listening:
            workers = [
                p for p in psutil.Process().children() if "-m autotune.child " in command_of(p)
            ]
            for process in workers + [c for w in workers for c in w.children()]:
                listening.extend(
                    c.laddr[:2]
                    for c in process.net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN
                )

    result = launch_trial(
        two_rank_spec("ddp", measure_steps=30),
        tmp_path,
        timeout_s=600,
        launcher=CommandLauncher(WORKER_COMMAND),
        on_progress=on_progress,
    )
    assert result.status is Status.OK, result.reason
    assert len(listening) >= 2, "the store, and gloo's sockets between the ranks"
    assert {address for address, _ in listening} == {"127.0.0.1"}, listening
