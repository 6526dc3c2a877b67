"""A whole search on a simulated host of 8 H100s with `workers=8`, through the public API: each
worker a thread of this process running the loop on its own slot (GPU, or group of GPUs),
each trial answered by the simulated executor, in seconds, with no process started."""

import dataclasses
import json
import os
import threading
from pathlib import Path

import pytest

from autotune import api
from autotune.common.device import DeviceInfo
from autotune.common.trial import Status, TrialResult, TrialSpec
from autotune.execute.simulated import SimulatedExecutor
from autotune.plan.overrides import make_config
from autotune.study.checks import settings_key

H100 = Path(__file__).resolve().parents[1] / "fixtures" / "probe-h100-2026-11-26.json"
SPEED = {"fp32": 40.0, "tf32": 105.0, "fp16": 290.0, "bf16": 300.0, "bf16+tf32": 300.0}
"""bert-large seq 512 on the H100 at batch 32 (samples/s, as headroom.txt measured): a stand-in
for the GPU model, enough to tell the search's paths apart."""


def answer(spec: TrialSpec) -> TrialResult:
    params = spec.params
    batch = params["batch_size"]
    if batch * params.get("grad_accum", 1) > 48 and params.get("precision") == "fp32":
        return TrialResult(status=Status.OOM, reason="CUDA out of memory", wall_s=20.0)
    speed = SPEED.get(params.get("precision", "fp32"), 200.0) * min(1.0, batch / 32)
    speed *= 0.8 if params.get("gradient_checkpointing") else 1.0
    speed *= spec.devices * 0.9 ** (spec.devices - 1)  # a stand-in for scaling across ranks
    steps = spec.warmup_steps + spec.measure_steps
    samples = batch * params.get("grad_accum", 1) * spec.devices
    return TrialResult(
        status=Status.OK,
        samples_per_s=speed,
        tokens_per_s=speed * spec.seq_len,
        peak_memory_gib=2.0 + batch * 0.5,
        step_time_median_ms=samples / speed * 1e3,
        step_time_cv=0.01,
        measured_steps=spec.measure_steps,
        build_s=2.0,
        train_s=steps * samples / speed,
        wall_s=3.0 + steps * samples / speed,
    )


SPACE = """\
description: bert-large's main knobs.
device: cuda
knobs:
  precision: {choices: [fp32, tf32, fp16, bf16]}
  batch_size: {choices: [8, 16, 32]}
  gradient_checkpointing: {choices: [false, true]}
  optim: {choices: [adamw_torch, adamw_torch_fused]}
  dataloader_num_workers: 0
"""
"""48 settings: enough for 24 trials, few enough for the effects sampler to choose in a blink."""
TWO_GPUS = """\
  strategy: {choices: [ddp, fsdp]}
  ddp_bucket_cap_mb: 25
"""
"""On 2 GPUs a trial: two strategies, and DDP's and FSDP's other settings searched with them."""


class SideBySide:
    """The answer, holding each worker's first trial until every worker has one running: the
    workers run at the same time, or the barrier breaks (after 30 s) and the search with it."""

    def __init__(self, workers: int) -> None:
        self.barrier = threading.Barrier(workers, timeout=30)
        self.waited: set[str] = set()

    def __call__(self, spec: TrialSpec) -> TrialResult:
        name = threading.current_thread().name
        if name.startswith("worker ") and name not in self.waited:  # not the confirmation
            self.waited.add(name)
            self.barrier.wait()
        return answer(spec)


def search(
    tmp_path: Path, executor: SimulatedExecutor, workers: int, **settings
) -> api.SearchResult:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE + TWO_GPUS * (settings.get("devices_per_trial", 1) == 2))
    config = make_config(
        {
            "model": "bert-large-uncased",
            "seq_len": 512,
            "effective_batch_size": 32,
            "workers": workers,
            "n_trials": 24,
            "confirm_rounds": 1,
            "space": str(space),
            "out": str(tmp_path),
            "study": "h100x8",
            "quiet": True,
            # Every trial runs: these answers are noise-free, and the model soon expects nothing
            # left to gain, which would end the search by itself (the coordination is tested here).
            "min_gain_per_minute": 0,
            **settings,
        }
    )
    return api.run(config, executor=executor, device_info=eight_h100s())


def eight_h100s() -> DeviceInfo:
    one = DeviceInfo.from_facts(json.loads(H100.read_text()))
    return dataclasses.replace(
        one,
        cuda_device_names=one.cuda_device_names * 8,
        cuda_free_memory_bytes=one.cuda_free_memory_bytes * 8,
    )


@pytest.mark.parametrize(
    ("devices_per_trial", "slots"),
    [
        (1, [f"cuda device {k}" for k in range(8)]),
        (2, [f"cuda devices {k},{k + 1}" for k in range(0, 8, 2)]),
    ],
)
def test_workers_on_a_simulated_8_gpu_host_are_threads_sharing_the_study(
    tmp_path, monkeypatch, devices_per_trial, slots
):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the slots name devices 0-7
    executor = SimulatedExecutor(SideBySide(len(slots)))
    result = search(tmp_path, executor, len(slots), devices_per_trial=devices_per_trial)

    # No slot was applied to this process: its threads share one environment.
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    records = result.snapshot.records
    ran = [r for r in records if r.status is not Status.SKIPPED]  # skips use up no trial
    assert len(ran) == 24 and sum(r.baseline for r in ran) == 1
    assert len({r.number for r in records}) == len(records)  # each recorded once
    assert len({settings_key(r.params) for r in ran}) == 24  # no settings measured twice
    assert all(r.result.device_s == r.result.wall_s * devices_per_trial for r in ran)
    # Each worker ran trials on its own slot, all of them at once; the confirmation after.
    clocks = executor.clocks_s
    workers = {name: s for name, s in clocks.items() if name.startswith("worker ")}
    assert sorted(workers) == sorted(f"worker {k}: {slot}" for k, slot in enumerate(slots))
    searched_s = sum(r.result.wall_s for r in ran)
    assert max(workers.values()) < searched_s  # the makespan, not the sum
    assert executor.clock_s == clocks["MainThread"] > max(workers.values())
    assert executor.device_s == pytest.approx(
        sum(r.wall_s for r in executor.answered) * devices_per_trial
    )
    assert result.recommended is not None
    for name in ("trials.csv", "pareto.csv", "recommended.json", "report.html"):
        assert (tmp_path / "h100x8" / name).is_file(), name
    assert not (tmp_path / "h100x8" / "trials").exists()  # no trial folder: no process ran


def test_an_error_in_one_worker_thread_stops_the_others_and_goes_on(tmp_path):
    answered = []

    def failing(spec: TrialSpec) -> TrialResult:
        answered.append(spec.trial_number)
        if len(answered) == 6:
            raise RuntimeError("the GPU model broke")
        return answer(spec)

    before = threading.active_count()
    with pytest.raises(RuntimeError, match="the GPU model broke"):
        search(tmp_path, SimulatedExecutor(failing), 8)

    assert threading.active_count() == before  # every worker thread has ended
    # The others stopped at their next trial: each ended the one it had at most.
    assert 6 <= len(answered) < 6 + 8
    study = api.load(tmp_path / "h100x8")  # what finished is written
    assert len(study.snapshot.records) < 24
    assert (tmp_path / "h100x8" / "trials.csv").is_file()


class Elsewhere:
    """An executor of another kind than this host's or the simulated one (a cluster's, say):
    it answers through a simulated executor it holds, and keeps where each trial was placed."""

    def __init__(self, answer) -> None:
        self.inner = SimulatedExecutor(answer)
        self.placed: dict[str, set[str]] = {}

    def ready(self) -> None:
        self.inner.ready()

    def submit(self, submission):
        name = threading.current_thread().name
        self.placed.setdefault(name, set()).add(submission.placement.describe())
        return self.inner.submit(submission)


def test_workers_run_their_trials_in_flight_over_an_executor_of_any_kind(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    executor = Elsewhere(SideBySide(2))  # each worker's first trial waits for the other's
    result = search(tmp_path, executor, 2, n_trials=8, study="elsewhere", devices_per_trial=1)
    assert len([r for r in result.snapshot.records if r.status is Status.OK]) >= 2
    # Each worker's trials carried its own slot; the confirmation ran on the first worker's.
    workers = {name: placed for name, placed in executor.placed.items() if "worker" in name}
    assert workers == {
        "worker 0: cuda device 0": {"cuda device 0"},
        "worker 1: cuda device 1": {"cuda device 1"},
    }
    assert executor.placed["MainThread"] == {"cuda device 0"}
