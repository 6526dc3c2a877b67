"""One trial in a process of its own: `python -m autotune.child SPEC.json RESULT.json`, or forked.

Builds the model from its config, the data (random token ids, as the HF guide does, or the
user's prepared data) and the real HF `Trainer` with the tuned `TrainingArguments`, or calls
the user's own Trainer factory with those arguments; trains warm-up plus measured steps, counts
what the loop trained on, and writes a `TrialResult` atomically. The only code that touches the
device; it never imports optuna. Exit code 0 means the result file says what happened.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import gc
import getpass
import json
import math
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import torch
import transformers
import transformers.trainer

from autotune.child import cuda_free, data, measure, rank_training, ranks
from autotune.child import factory as factories
from autotune.child.models import build_model
from autotune.common import knobs
from autotune.common.device import tensor_peak_tflops
from autotune.common.layout import PROGRESS_FILE, TRIAL_TEMP_PREFIX, socket_folder_prefix
from autotune.common.models import ModelSpec
from autotune.common.processes import (
    children_die_with_this_process,
    end_own_descendants,
    keep_orphans_in_this_tree,
)
from autotune.common.trial import (
    STDERR_TAIL_CHARS,
    Progress,
    Stage,
    Status,
    TrialResult,
    TrialSpec,
    spec_from_dict,
    write_json_atomic,
    write_progress,
)
from autotune.common.units import GIB
from autotune.common.user_data import read_ready


class InvalidConfig(Exception):
    """The settings were refused before training started."""


def train_trial(
    spec: TrialSpec, progress_path: Path, rank: ranks.Rank | None = None
) -> TrialResult | None:
    """The trial in stages: memory baseline, arguments, model, data, timed training, result.
    On several devices it runs on each `rank`, and rank 0 returns the result (others None)."""
    trial_started_s = time.perf_counter()
    clock = measure.StageClock()
    # The Trainer wants an output folder; with saving and logging off it stays empty.
    with tempfile.TemporaryDirectory(prefix="autotune-trainer-") as workdir:
        if (reason := knobs.conflict(spec.params)) is not None:
            raise InvalidConfig(reason)
        baseline_rss = _prepare(spec, clock, rank)
        on_cuda = spec.device == "cuda"
        if rank is not None:
            sync = rank_training.barrier_sync(on_cuda)
        else:
            sync = torch.cuda.synchronize if on_cuda else _no_sync
        # Stopping a loser early is for one process: ranks would each decide on their own.
        stop_below = spec.stop_below_samples_per_s if rank is None else None
        timer = measure.StepTimer(
            spec.warmup_steps, sync, stop_below=stop_below, stop_after=spec.stop_after_steps
        )
        reporter = ProgressReporter(
            progress_path,
            timer,
            spec=spec,
            baseline_rss_bytes=baseline_rss,
            started_s=trial_started_s,
        )
        reports = rank is None or rank.rank == 0  # one writer of the trial's progress
        if reports:
            reporter.report_building()  # with this record the parent's CPU watchdog has its zero
        started = time.perf_counter()
        tuned_args = knobs.training_args(spec.params, device=spec.device, fields=_ARG_FIELDS)
        model_kwargs = knobs.model_kwargs(spec.params)
        environment = knobs.environment(spec.params)
        os.environ.update(environment)  # read as the Trainer builds its accelerator
        if spec.trainer:
            with clock.stage("trainer_init_s"):
                trainer = _users_trainer(spec, tuned_args, model_kwargs, workdir, rank)
        else:
            trainer = _our_trainer(spec, tuned_args, model_kwargs, workdir, clock, rank)
        states = rank_training.ModelStates(trainer)  # counted on several ranks only
        if rank is not None:
            rank_training.set_ddp(rank, trainer)
            rank_training.shard(
                rank, trainer.model, prefetch=knobs.value_of(spec.params, "fsdp_prefetch")
            )
            trainer.add_callback(states)
        if spec.data_dir or spec.trainer:  # samples of many lengths: the peak covers the longest
            measure.longest_at(trainer, step=spec.warmup_steps)
        timer.counter = measure.count_batches(trainer)
        # Callbacks run in list order, after the Trainer's and the user's own: the reporter
        # after the timer has read the clock.
        trainer.add_callback(timer)
        if reports:
            trainer.add_callback(reporter)
        build_s = time.perf_counter() - started

        started = time.perf_counter()
        output = trainer.train()
        train_s = time.perf_counter() - started

        model = trainer.model
        memory = _cuda_memory() if on_cuda else _cpu_memory(baseline_rss, rank)
        counts = None
        if rank is not None:
            gathered = rank_training.gather(
                rank, trainer, timer.measured_counts(), memory["peak_memory_gib"], states
            )
            if rank.rank != 0:
                return None
            counts = gathered.counts
            memory["peak_memory_gib"] = max(gathered.peak_memory_gib)
            memory["rank_peak_memory_gib"] = gathered.peak_memory_gib
            memory["rank_params"] = gathered.params
            memory["rank_model_state_bytes"] = gathered.model_state_bytes
        device_name = torch.cuda.get_device_name() if on_cuda else "cpu"
        step_times_s = timer.measured_step_times_s()
        measured: dict[str, Any] = {
            **memory,
            "final_loss": output.training_loss,
            "build_s": build_s,
            "train_s": train_s,
            "n_params": rank_training.full_parameters(model),
            "device_name": device_name,
            "cpu_threads": None if on_cuda else torch.get_num_threads(),
            "training_args": tuned_args,
            "model_kwargs": model_kwargs,
            "environment": environment,
            "compiled_modules": _compiled_modules(trainer)
            if knobs.is_compiled(spec.params)
            else None,
            "step_times_ms": [t * 1e3 for t in step_times_s],
            # What a user's factory really trains, which `model=` and `seq_len=` only name.
            "trained_model": getattr(model.config, "name_or_path", "") or model.config.model_type,
            "trained_seq_len": timer.counter.longest or None,
            **clock.seconds,
            "warmup_s": train_s - sum(step_times_s),
        }
        # The worker's time outside its named stages: seeds and caches before, the memory
        # figures and the result after (the directory's removal and the exit are the parent's).
        measured["finish_s"] = (
            time.perf_counter()
            - trial_started_s
            - build_s
            - train_s
            - clock.seconds.get("cuda_init_s", 0.0)
        )
        return _result(spec, timer, model, output.training_loss, measured, counts)


def _compiled_modules(trainer: transformers.Trainer) -> int:
    """The modules torch.compile wrapped in what the Trainer trained (whole or regional)."""
    return sum(type(m).__name__ == "OptimizedModule" for m in trainer.model_wrapped.modules())


def _our_trainer(
    spec: TrialSpec,
    tuned_args: dict[str, Any],
    model_kwargs: dict[str, Any],
    workdir: str,
    clock: measure.StageClock,
    rank: ranks.Rank | None = None,
) -> transformers.Trainer:
    """The HF Trainer on the model built from its config, with random tokens or the user's
    prepared data (`data=`), memory-mapped here, after the fork: the fork server never loads
    data, so no arrow thread or mapping crosses a fork."""
    run_only = {"remove_unused_columns": False} if spec.data_dir else {}
    # The collator reads only the columns it needs; kept, the `length` column spares
    # group_by_length a pass over every sample to measure it.
    args = _training_arguments(spec, tuned_args | run_only, workdir, rank)
    # One device on a GPU: built there, its random init run by the GPU, and nothing copied
    # (bert-large built in 6.6 s on two host cores here, then copied). On ranks the
    # strategy places the model (FSDP2 shards it from the host, DeepSpeed's engine moves it).
    where = "cuda" if spec.device == "cuda" and rank is None else "cpu"
    with clock.stage("model_build_s"):
        model = build_model(
            ModelSpec(name=spec.model_name, source="spec", config=spec.model_config),
            spec.task,
            device=where,
            **model_kwargs,
        )
    with clock.stage("data_s"):
        dataset, collator = _data(spec, args, model, rank)
    with clock.stage("trainer_init_s"):
        return transformers.Trainer(
            model=model, args=args, train_dataset=dataset, data_collator=collator
        )


def _data(
    spec: TrialSpec,
    args: transformers.TrainingArguments,
    model: Any,
    rank: ranks.Rank | None,
) -> tuple[Any, Any]:
    """The training data and its collator (None: the Trainer's default)."""
    if spec.data_dir:
        import datasets

        dataset = datasets.load_from_disk(spec.data_dir)
        if spec.params.get("packing"):  # a batch's samples in one row, none padded
            collator = transformers.DataCollatorWithFlattening()
        else:
            collator = data.PaddingCollator(
                task=spec.task,
                pad_token_id=read_ready(Path(spec.data_dir))["pad_token_id"],
                pad_to_multiple_of=knobs.value_of(spec.params, "pad_to_multiple_of"),
            )
    else:
        samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        # A distributed Trainer splits one dataset between the ranks; under sharding each rank
        # loads its own, other samples on each.
        shared = rank is not None and rank.trainer_distributed
        dataset = data.SyntheticDataset(
            task=spec.task,
            vocab_size=model.config.vocab_size,
            seq_len=spec.seq_len,
            n_samples=samples_per_step * args.max_steps * (rank.world_size if shared else 1),
            seed=spec.seed + (rank.rank if rank is not None and not shared else 0),
        )
        collator = None  # the Trainer's default: the samples are of one length
    return dataset, collator


def _users_trainer(
    spec: TrialSpec,
    tuned_args: dict[str, Any],
    model_kwargs: dict[str, Any],
    workdir: str,
    rank: ranks.Rank | None = None,
) -> transformers.Trainer:
    """The Trainer the user's factory (`trainer=`) makes with the tuned arguments."""
    args = _training_arguments(spec, tuned_args, workdir, rank)
    factory = factories.load(spec.trainer, spec.trainer_dir)
    # A copy taken before the call: the factory may change the very object it is given.
    expected = _set_by_autotune(args, spec, tuned_args)
    print(f"calling {spec.trainer}(args, model_kwargs={model_kwargs!r})", flush=True)
    trainer = factory(args, dict(model_kwargs))
    if not isinstance(trainer, transformers.Trainer):
        raise factories.FactoryError(
            f"{spec.trainer} returned {type(trainer).__name__}, not a transformers.Trainer"
        )
    check_trained_args(spec.trainer, expected, trainer.args)
    return trainer


def _set_by_autotune(
    args: transformers.TrainingArguments, spec: TrialSpec, tuned_args: dict[str, Any]
) -> dict[str, Any]:
    """The values of every argument autotune set (the tuned ones and the fixed run length),
    as TrainingArguments holds them after its own checks."""
    names = [*tuned_args, *_run_args(spec)]
    return {name: copy.deepcopy(getattr(args, name)) for name in names}


def check_trained_args(ref: str, expected: dict[str, Any], trained: Any) -> None:
    """Refuse a Trainer whose arguments differ from those autotune set: its trial would be
    recorded under settings that never ran."""
    changed = [
        f"{name}={getattr(trained, name, None)!r} (tuned: {value!r})"
        for name, value in expected.items()
        if getattr(trained, name, None) != value
    ]
    if changed:
        raise factories.FactoryError(
            f"{ref}: the Trainer trains with other arguments than the trial's: "
            f"{', '.join(changed)}. Pass `args` to the Trainer unchanged (Trainer(args=args, "
            "...)); settings of your own belong in the search space"
        )


_ARG_FIELDS = frozenset(f.name for f in dataclasses.fields(transformers.TrainingArguments))
"""The installed transformers' TrainingArguments fields (names change between releases)."""


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


PROGRESS_INTERVAL_S = 0.5
"""Least time between two progress records during training (the records before the first
step and the last step's are always written). A record costs 0.3-0.7 ms on ext4 (1000 atomic
writes without fsync) and falls into the next step's timed interval: written every step it
would add up to ~1% to a 50-100 ms CPU step and ~10% to a 5 ms GPU step; twice a second it is
at most 0.15% of the training time."""


class ProgressReporter(transformers.TrainerCallback):
    """Tells the parent (`progress.json`) and the log (one line a step) how far the trial is.

    It reads no clock of its own: times come from the `StepTimer` placed before it among the
    callbacks, so its work starts after step k's end was read and is charged to step k+1. A
    log line costs ~3 us, so every step gets one; records are spaced by PROGRESS_INTERVAL_S.
    """

    def __init__(
        self,
        path: Path,
        timer: measure.StepTimer,
        *,
        spec: TrialSpec,
        baseline_rss_bytes: int,
        started_s: float,
    ) -> None:
        self.path = path
        self.timer = timer
        self.warmup_steps = spec.warmup_steps
        self.total_steps = spec.warmup_steps + spec.measure_steps
        self.baseline_rss_bytes = baseline_rss_bytes
        self.started_s = started_s
        self.written_s = -math.inf

    def report_building(self) -> None:
        self._report(Stage.BUILDING, 0, time.perf_counter(), write=True)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        assert self.timer.train_begin_s is not None, "the StepTimer must come first"
        self._report(Stage.WARMUP, 0, self.timer.train_begin_s, write=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = len(self.timer.step_end_s)
        now_s = self.timer.step_end_s[-1]
        stage = Stage.WARMUP if step < self.warmup_steps else Stage.MEASURING
        last = step == self.total_steps
        self._report(
            stage, step, now_s, write=last or now_s - self.written_s >= PROGRESS_INTERVAL_S
        )

    def _report(self, stage: Stage, step: int, now_s: float, *, write: bool) -> None:
        progress = Progress(
            baseline_rss_bytes=self.baseline_rss_bytes,
            stage=stage,
            step=step,
            total_steps=self.total_steps,
            elapsed_s=now_s - self.started_s,
            eta_s=measure.eta_s(self.timer.step_end_s, self.total_steps),
        )
        print(progress.summary(), flush=True)
        if write:
            write_progress(self.path, progress)
            self.written_s = now_s


def _cap_cuda_memory(budget_bytes: int | None) -> None:
    """Cap PyTorch's allocator at the budget, so an 80 GB card can tune for a 24 GB one.

    Must run before the model reaches the GPU; past the cap, allocations raise
    torch.OutOfMemoryError as a smaller card would.
    """
    total = torch.cuda.get_device_properties(0).total_memory
    if budget_bytes is not None and budget_bytes < total:
        torch.cuda.set_per_process_memory_fraction(budget_bytes / total)


def _training_arguments(
    spec: TrialSpec, tuned_args: dict[str, Any], workdir: str, rank: ranks.Rank | None = None
) -> transformers.TrainingArguments:
    """The tuned arguments plus what every trial runs with: a fixed number of steps, no saving,
    logging, progress bars or trackers; on a rank that FSDP2 shards, its kind of them."""
    kind = (
        rank_training.ShardedArguments
        if rank is not None and rank.fsdp
        else transformers.TrainingArguments
    )
    try:
        return kind(output_dir=workdir, **_run_args(spec), **tuned_args)
    except (ValueError, ImportError) as exc:  # TrainingArguments validates combinations here
        raise InvalidConfig(f"TrainingArguments refused the settings: {exc}") from exc


def _run_args(spec: TrialSpec) -> dict[str, Any]:
    """What every trial runs with, beside the tuned arguments."""
    return {
        "max_steps": spec.warmup_steps + spec.measure_steps,
        "save_strategy": "no",
        "logging_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": spec.seed,
    }


def _result(
    spec: TrialSpec,
    timer: measure.StepTimer,
    model: Any,
    loss: float,
    measured: dict[str, Any],
    counts: measure.Counts | None = None,
) -> TrialResult:
    """The verdict, and for an `ok` trial throughput, compile time and MFU; `counts` are every
    rank's batches on several devices."""
    step_times_s = timer.measured_step_times_s()
    planned = len(step_times_s) if timer.stopped else spec.measure_steps
    status, reason = verdict(len(step_times_s), planned, loss)
    if status is not Status.OK:
        return TrialResult(
            status=status, reason=reason, measured_steps=len(step_times_s), **measured
        )
    counts = counts or timer.measured_counts()
    if counts.samples == 0:
        return TrialResult(
            status=Status.ERROR,
            reason="no batch was seen: the Trainer's loader did not come from "
            "get_train_dataloader, so samples/s cannot be measured",
            measured_steps=len(step_times_s),
            **measured,
        )
    stats = measure.throughput(step_times_s, counts)
    compile_s = None
    if knobs.is_compiled(spec.params):
        compile_s = measure.compile_s(timer.warmup_step_times_s(), stats.step_time_median_ms / 1e3)
    flops = measure.training_flops(model, counts) if counts.tokens else None
    # Every trial's MFU against one peak, the device's 16-bit one, whatever its precision.
    peak = spec.peak_tflops or tensor_peak_tflops(measured["device_name"])
    return TrialResult(
        status=Status.STOPPED if timer.stopped else Status.OK,
        reason=timer.stopped or "",
        **measured,
        **dataclasses.asdict(stats),
        compile_s=compile_s,
        flops_per_sample=flops / counts.samples if flops else None,
        mfu=flops / sum(step_times_s) / (peak * 1e12 * spec.devices) if flops and peak else None,
        mfu_peak_tflops=peak if flops and peak else None,
    )


def _cpu_memory(baseline_rss: int, rank: ranks.Rank | None = None) -> dict[str, Any]:
    if rank is not None:
        return {"peak_memory_gib": rank_training.peak_rss_gib_since(baseline_rss)}
    return {"peak_memory_gib": (measure.peak_rss_bytes() - baseline_rss) / GIB}


def _cuda_memory() -> dict[str, Any]:
    stats = torch.cuda.memory_stats()
    nvml_bytes = _nvml_used_bytes()
    return {
        "peak_memory_gib": torch.cuda.max_memory_reserved() / GIB,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
        "alloc_retries": stats.get("num_alloc_retries", 0),
        "nvml_used_gib": nvml_bytes / GIB if nvml_bytes is not None else None,
    }


def _nvml_used_bytes() -> int | None:
    """This process's GPU memory per NVML (context included); None where NVML cannot say."""
    import pynvml

    try:
        pynvml.nvmlInit()
        props = torch.cuda.get_device_properties(0)
        bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == os.getpid():
                return process.usedGpuMemory
    except (pynvml.NVMLError, AttributeError):
        return None  # no NVML library, or a torch without PCI ids: report n/a, not a guess
    return None  # our pid is not visible (e.g. another PID namespace)


def verdict(measured_steps: int, planned_steps: int, loss: float) -> tuple[Status, str]:
    """A finished training run is `ok` only with every planned step timed and a finite loss."""
    if measured_steps < planned_steps:
        return Status.ERROR, f"only {measured_steps} of {planned_steps} measured steps ran"
    if not math.isfinite(loss):
        return Status.NAN_LOSS, f"training loss is {loss}"
    return Status.OK, ""


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
    except (InvalidConfig, rank_training.StrategyNotApplied) as exc:
        status = Status.INVALID_CONFIG if isinstance(exc, InvalidConfig) else Status.ERROR
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
            result = ranks.run(spec, result_path.parent, attempt)
        else:
            result, _ = attempt_trial(spec, progress_path)
            assert result is not None  # one device: this process is rank 0
        result = dataclasses.replace(result, worker_pid=os.getpid(), imports_s=imports_s)
        write_json_atomic(result_path, result.to_dict())
        # Exited, this process would leave its descendants to PID 1, out of the search's sight.
        end_own_descendants()
    return 0


def _user_name() -> str:
    """As torch names its default compile cache (`torchinductor_<user>`)."""
    try:
        return re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except (KeyError, OSError):
        return f"uid_{os.getuid()}"


def _short_folder(system: str) -> str | None:
    """A new folder for sockets under the system's temp folder, or /tmp, or /var/tmp: the
    first whose path leaves room for a socket's name; None where none does."""
    for base in dict.fromkeys((system, "/tmp", "/var/tmp")):
        if len(base) + len("/autotune-mp-XXXXXXXX") <= SOCKET_FOLDER_CHARS and os.access(
            base, os.W_OK
        ):
            return tempfile.mkdtemp(dir=base, prefix=socket_folder_prefix(os.getpid()))
    return None


SOCKET_FOLDER_CHARS = 80
"""The longest folder multiprocessing's sockets go in: an AF_UNIX path holds 107 bytes, and a
socket's own name (`/listener-XXXXXXXX`) takes 18 of them."""


@contextlib.contextmanager
def temporary_files_in(trial_dir: Path) -> Iterator[None]:
    """Every temporary file of this process, and of the processes it starts, in a new folder
    inside `trial_dir`, removed when the trial ends.

    Nothing of a trial lands in the system's temp folder: a worker killed at its timeout
    (SIGKILL: none of its code runs) leaves its Trainer's output folder and its DataLoader
    workers' sockets among the trial's own files, not as `autotune-trainer-*` and `pymp-*`
    folders in $TMPDIR that nothing removes."""
    system = tempfile.gettempdir()
    folder = tempfile.mkdtemp(dir=trial_dir, prefix=TRIAL_TEMP_PREFIX)
    # multiprocessing keeps the folder of its sockets in the process's config, copied from the
    # parent: forked from the fork server, the search's own `pymp-*` folder in $TMPDIR. Its
    # sockets (a DataLoader worker hands tensors over one) need a path of at most 107 bytes:
    # a deep study folder gets a short folder of the system's instead, removed as well.
    sockets = folder if len(folder) <= SOCKET_FOLDER_CHARS else _short_folder(system) or folder
    config = multiprocessing.current_process()._config
    before = tempfile.tempdir, os.environ.get("TMPDIR"), config.get("tempdir")
    # torch.compile's cache stays where it was (torch derives it from the temp folder): a
    # trial without a study's cache (`compile_cache_dir`) reuses what earlier ones compiled.
    cache = "TORCHINDUCTOR_CACHE_DIR"
    kept_cache = cache in os.environ
    os.environ.setdefault(cache, os.path.join(system, f"torchinductor_{_user_name()}"))
    tempfile.tempdir = folder  # this process and what it forks (DataLoader workers, ranks)
    os.environ["TMPDIR"] = folder  # the programs it runs (compilers, a factory's subprocesses)
    config["tempdir"] = sockets
    try:
        yield
    finally:
        # What cannot be removed stays in the trial's folder; the result is written already.
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(sockets, ignore_errors=True)
        tempfile.tempdir, environ, config["tempdir"] = before
        if not kept_cache:
            os.environ.pop(cache, None)
        if environ is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = environ
