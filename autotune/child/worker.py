"""One trial in a process of its own: `python -m autotune.child SPEC.json RESULT.json`, or forked.

Builds the Trainer (`trainers`: the model from its config with random token ids, as the HF
guide does, or the user's prepared data; or the user's own Trainer factory) with the tuned
`TrainingArguments`, trains warm-up plus measured steps, counts what the loop trained on, and
writes a `TrialResult` (`result`) atomically. The only code that touches the device; it never
imports optuna. Exit code 0 means the result file says what happened.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
import transformers
import transformers.trainer

from autotune.child import cuda_free, measure, rank_training, ranks, result, trainers
from autotune.child.progress import ProgressReporter
from autotune.child.temp_files import temporary_files_in
from autotune.common import knobs, trial_settings
from autotune.common.layout import PROGRESS_FILE
from autotune.common.processes import (
    children_die_with_this_process,
    end_own_descendants,
    keep_orphans_in_this_tree,
)
from autotune.common.trial import (
    STDERR_TAIL_CHARS,
    Status,
    TrialResult,
    TrialSpec,
    spec_from_dict,
    write_json_atomic,
)


def train_trial(
    spec: TrialSpec, progress_path: Path, rank: ranks.Rank | None = None
) -> TrialResult | None:
    """The trial in stages: memory baseline, Trainer, timed training, result. On several
    devices it runs on each `rank`, and rank 0 returns the result (others None)."""
    trial_started_s = time.perf_counter()
    clock = measure.StageClock()
    # The Trainer wants an output folder; with saving and logging off it stays empty.
    with tempfile.TemporaryDirectory(prefix="autotune-trainer-") as workdir:
        if (reason := trial_settings.conflict(spec.params)) is not None:
            raise trainers.InvalidConfig(reason)
        baseline_rss = _prepare(spec, clock, rank)
        timer = _timer(spec, rank)
        reporter = None
        if rank is None or rank.rank == 0:  # one writer of the trial's progress
            reporter = ProgressReporter(
                progress_path,
                timer,
                spec=spec,
                baseline_rss_bytes=baseline_rss,
                started_s=trial_started_s,
            )
            reporter.report_building()  # with this record the parent's CPU watchdog has its zero
        started = time.perf_counter()
        built = _build(spec, workdir, clock, rank, timer, reporter)
        build_s = time.perf_counter() - started

        started = time.perf_counter()
        output = built.trainer.train()
        train_s = time.perf_counter() - started
        if ranks.data_parallel(spec):  # the Trainer's DataParallel, checked
            rank_training.check_data_parallel(built.trainer, spec.devices)

        memory = (
            result.cuda_memory() if spec.device == "cuda" else result.cpu_memory(baseline_rss, rank)
        )
        counts = None
        if rank is not None:
            gathered = rank_training.gather(
                rank, built.trainer, timer.measured_counts(), memory.peak_memory_gib, built.states
            )
            if rank.rank != 0:
                return None
            counts, memory = gathered.counts, _every_rank(memory, gathered)
        measured = _measured(
            spec,
            built,
            timer,
            clock,
            loss=output.training_loss,
            memory=memory,
            build_s=build_s,
            train_s=train_s,
            started_s=trial_started_s,
        )
        return result.of_trial(spec, timer, built.trainer.model, measured, counts)


def _measured(
    spec: TrialSpec,
    built: Built,
    timer: measure.StepTimer,
    clock: measure.StageClock,
    *,
    loss: float,
    memory: result.Memory,
    build_s: float,
    train_s: float,
    started_s: float,
) -> result.Measured:
    """What the trial measured, from the clock readings of its stages and steps."""
    step_times_s = timer.measured_step_times_s()
    model = built.trainer.model
    return result.Measured(
        memory=memory,
        final_loss=loss,
        build_s=build_s,
        train_s=train_s,
        warmup_s=train_s - sum(step_times_s),
        # The worker's time outside its named stages: seeds and caches before, the memory
        # figures and the result after (the folder's removal and the exit are the parent's).
        finish_s=time.perf_counter()
        - started_s
        - build_s
        - train_s
        - clock.seconds.get("cuda_init_s", 0.0),
        stages=clock.seconds,
        n_params=rank_training.full_parameters(model),
        device_name=torch.cuda.get_device_name() if spec.device == "cuda" else "cpu",
        cpu_threads=None if spec.device == "cuda" else torch.get_num_threads(),
        training_args=built.tuned_args,
        model_kwargs=built.model_kwargs,
        peft_config=spec.adapter if spec.trainer is None else trainers.adapter_of(model),
        quantization_config=knobs.quantization_config(spec.params),
        trainable_params=rank_training.trainable_parameters(model),
        environment=built.environment,
        compiled_modules=trainers.compiled_modules(built.trainer)
        if knobs.is_compiled(spec.params)
        else None,
        step_times_ms=[t * 1e3 for t in step_times_s],
        # What a user's factory really trains, which `model=` and `seq_len=` only name.
        trained_model=getattr(model.config, "name_or_path", "") or model.config.model_type,
        trained_seq_len=timer.counter.longest or None,
        **(trainers.factory_model(model) if spec.trainer is not None else {}),
    )


def _every_rank(memory: result.Memory, gathered: rank_training.Gathered) -> result.Memory:
    """Rank 0's memory figures with every rank's: the peak is the largest rank's."""
    return dataclasses.replace(
        memory,
        peak_memory_gib=max(gathered.peak_memory_gib),
        rank_peak_memory_gib=gathered.peak_memory_gib,
        rank_params=gathered.params,
        rank_model_state_bytes=gathered.model_state_bytes,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Built:
    """The Trainer a trial times, with what it was given."""

    trainer: transformers.Trainer
    tuned_args: dict[str, Any]
    model_kwargs: dict[str, Any]
    environment: dict[str, str]
    states: rank_training.ModelStates
    """Counts the model states each rank holds (on several ranks only)."""


def _build(
    spec: TrialSpec,
    workdir: str,
    clock: measure.StageClock,
    rank: ranks.Rank | None,
    timer: measure.StepTimer,
    reporter: ProgressReporter | None,
) -> Built:
    """The Trainer with the tuned arguments, set up on its rank, with the callbacks that time
    it (`timer`) and report its progress (`reporter`, on the one process that reports)."""
    tuned_args = knobs.training_args(spec.params, device=spec.device, fields=trainers.ARG_FIELDS)
    model_kwargs = knobs.model_kwargs(spec.params)
    environment = knobs.environment(spec.params)
    os.environ.update(environment)  # read as the Trainer builds its accelerator
    if spec.trainer:
        with clock.stage("trainer_init_s"):
            trainer = trainers.users_trainer(spec, tuned_args, model_kwargs, workdir, rank)
    else:
        trainer = trainers.our_trainer(spec, tuned_args, model_kwargs, workdir, clock, rank)
    states = rank_training.ModelStates(trainer)  # counted on several ranks only
    if rank is not None:
        rank_training.set_ddp(rank, trainer)
        prefetch = knobs.value_of(spec.params, "fsdp_prefetch")
        rank_training.shard(rank, trainer.model, prefetch=prefetch)
        trainer.add_callback(states)
    if spec.data_dir or spec.trainer:  # samples of many lengths: the peak covers the longest
        measure.longest_at(trainer, step=spec.warmup_steps)
    timer.counter = measure.count_batches(trainer)
    # Callbacks run in list order, after the Trainer's and the user's own: the reporter
    # after the timer has read the clock.
    trainer.add_callback(timer)
    if reporter is not None:
        trainer.add_callback(reporter)
    return Built(
        trainer=trainer,
        tuned_args=tuned_args,
        model_kwargs=model_kwargs,
        environment=environment,
        states=states,
    )


def _timer(spec: TrialSpec, rank: ranks.Rank | None) -> measure.StepTimer:
    """The clock of the trial's steps, which stops a loser early. That is for one process:
    ranks would each decide on their own."""
    stop_below = spec.stop_below_samples_per_s if rank is None else None
    return measure.StepTimer(
        spec.warmup_steps,
        _sync(spec, rank),
        stop_below=stop_below,
        stop_after=spec.stop_after_steps,
    )


def _sync(spec: TrialSpec, rank: ranks.Rank | None) -> Any:
    """What the step timer waits on before reading the clock: the device's queued work, and
    on several ranks every rank's."""
    on_cuda = spec.device == "cuda"
    if rank is not None:
        return rank_training.barrier_sync(on_cuda)
    if on_cuda and ranks.data_parallel(spec):  # one process, its work queued on every GPU
        return _sync_every_gpu
    return torch.cuda.synchronize if on_cuda else _no_sync


def _sync_every_gpu() -> None:
    for device in range(torch.cuda.device_count()):
        torch.cuda.synchronize(device)


def _prepare(spec: TrialSpec, clock: measure.StageClock, rank: ranks.Rank | None = None) -> int:
    """Seeds, caches and memory accounting; returns the process's resident size before the
    trial builds anything (the CPU memory baseline)."""
    # torch and transformers leave millions of objects on the heap; a full garbage collection
    # walking them in the middle of the timed window costs a step 50-100 ms. Freezing them out
    # of the collector's view removes those pauses (and copy-on-write churn after a fork).
    gc.freeze()
    transformers.set_seed(spec.seed)
    if spec.compile_cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = spec.compile_cache_dir
    # Every module a trial needs is imported by now (transformers.trainer at the top of this
    # file, as the fork server preloads it), so growth past this point is the trial's own.
    baseline_rss = psutil.Process().memory_info().rss
    if rank is not None:
        baseline_rss = rank_training.reset_peak_rss()  # a forked rank starts with the worker's peak
    if spec.device == "cuda":
        with clock.stage("cuda_init_s"):  # the process's CUDA context
            torch.cuda.init()
        _cap_cuda_memory(spec.memory_budget_bytes)
        torch.cuda.reset_peak_memory_stats()
    elif hasattr(os, "sched_getaffinity"):  # Linux
        # A worker given a share of the cores (`workers=N` on CPU) trains with that many
        # threads: more would only contend for them.
        cores = len(os.sched_getaffinity(0))
        if torch.get_num_threads() > cores:
            torch.set_num_threads(cores)
    return baseline_rss


def _cap_cuda_memory(budget_bytes: int | None) -> None:
    """Cap PyTorch's allocator at the budget, so an 80 GB card can tune for a 24 GB one.

    Must run before the model reaches the GPU; past the cap, allocations raise
    torch.OutOfMemoryError as a smaller card would.
    """
    for device in range(torch.cuda.device_count()):  # every GPU of a dp trial
        total = torch.cuda.get_device_properties(device).total_memory
        if budget_bytes is not None and budget_bytes < total:
            torch.cuda.set_per_process_memory_fraction(budget_bytes / total, device)


def _no_sync() -> None:
    """CPU work is synchronous: nothing to wait for before reading the clock."""


def _failure(status: Status, exc: BaseException) -> TrialResult:
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return TrialResult(
        status=status,
        reason=f"{type(exc).__name__}: {first_line}"[:300],
        stderr_tail="".join(traceback.format_exception(exc))[-STDERR_TAIL_CHARS:],
    )


def attempt_trial(
    spec: TrialSpec, progress_path: Path, rank: ranks.Rank | None = None
) -> tuple[TrialResult | None, bool]:
    """`train_trial`, whatever it raises turned into the trial's result: (the result, or None
    on a rank other than 0; whether it failed)."""
    try:
        return train_trial(spec, progress_path, rank), False
    except torch.OutOfMemoryError as exc:
        return _failure(Status.OOM, exc), True
    except (trainers.InvalidConfig, rank_training.StrategyNotApplied) as exc:
        status = Status.INVALID_CONFIG if isinstance(exc, trainers.InvalidConfig) else Status.ERROR
        return _failure(status, exc.__cause__ or exc), True
    except Exception as exc:  # noqa: BLE001 - any failure is the trial's result, named, kept
        # Some libraries (bitsandbytes, compiled kernels) raise out-of-memory as RuntimeError.
        status = Status.OOM if "out of memory" in str(exc).lower() else Status.ERROR
        return _failure(status, exc), True


def main(argv: list[str], imports_s: float | None = None) -> int:
    """The trial of `argv` (SPEC RESULT); `imports_s`: what importing this module cost the
    process that runs it (nothing where the fork server had imported it)."""
    # DataLoader workers and other forked helpers must not outlive this process; what the
    # user's code starts otherwise (other sessions, double forks) stays in its tree and is
    # ended with the trial.
    children_die_with_this_process()
    keep_orphans_in_this_tree()
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    spec = spec_from_dict(json.loads(spec_path.read_text()))
    progress_path = result_path.parent / PROGRESS_FILE
    if spec.device == "cuda" and torch.cuda._is_in_bad_fork():
        # The fork server initialised CUDA after all (an import `cuda_free` does not cover):
        # forked from it, this process cannot use the GPU. A fresh interpreter can.
        print(
            f"the fork server initialised CUDA ({cuda_free.first_init()}); the trial "
            "starts again in a fresh process",
            flush=True,
        )
        os.execv(sys.executable, [sys.executable, "-m", "autotune.child", *argv])

    with temporary_files_in(result_path.parent):
        if ranks.needed(spec):
            attempt = functools.partial(attempt_trial, spec, progress_path)
            outcome = ranks.run(spec, result_path.parent, attempt)
        else:
            outcome, _ = attempt_trial(spec, progress_path)
            assert outcome is not None  # one device: this process is rank 0
        outcome = dataclasses.replace(outcome, worker_pid=os.getpid(), imports_s=imports_s)
        write_json_atomic(result_path, outcome.to_dict())
        # Exited, this process would leave its descendants to PID 1, out of the search's sight.
        end_own_descendants()
    return 0
