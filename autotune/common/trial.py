"""The parent <-> worker contract: `TrialSpec` in, `TrialResult` out, both JSON with a version;
`Progress` records while the worker runs.

The parent writes a spec file, starts `python -m autotune.child SPEC RESULT`, and decides the
trial's fate from the worker's exit code and the result file alone (never from its stderr).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.common.output_files import write_atomic

SCHEMA_VERSION = 1


class Status(enum.StrEnum):
    OK = "ok"
    OOM = "oom"  # accelerator out of memory, or the memory budget exceeded
    HOST_OOM = "host_oom"  # host RAM exhausted or the worker killed by the kernel
    TIMEOUT = "timeout"
    CRASHED = "crashed"  # killed by a signal, non-zero exit, missing or unreadable result
    NAN_LOSS = "nan_loss"
    ERROR = "error"  # an exception in the worker
    INVALID_CONFIG = "invalid_config"  # the settings were refused before training
    SKIPPED = "skipped"
    STOPPED = "stopped"  # stopped early, clearly slower than the fastest trial so far: measured
    INTERRUPTED = "interrupted"  # the search stopped while it ran: no result (parent side only)


OUT_OF_MEMORY = frozenset({Status.OOM, Status.HOST_OOM})
MEMORY_STATUSES = OUT_OF_MEMORY | {Status.SKIPPED}
"""No throughput, and too big for the budget: told to the sampler as infeasible."""


def stopped_reason(steps: int, fastest: float, below: float) -> str:
    """Why a trial stopped early (`TrialSpec.stop_below_samples_per_s`)."""
    return (
        f"stopped after {steps} timed steps: at most {fastest:.2f} samples/s, under the "
        f"{below:.2f} of the early stop (half the fastest trial's so far)"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialSpec:
    """What one trial runs: the model, the data shape and the tuned settings."""

    trial_number: int
    model_name: str
    model_config: dict[str, Any]
    """The transformers config as a dict (`config.json`); the worker builds the model from it."""
    task: str
    seq_len: int
    device: str
    """`cuda` or `cpu`, already resolved by the parent."""
    params: dict[str, Any]
    """Knob name -> value, as named in the search space."""
    warmup_steps: int
    measure_steps: int
    seed: int
    memory_budget_bytes: int | None = None
    """Enforced inside the worker on CUDA (allocator cap); on CPU the parent's watchdog does."""
    compile_cache_dir: str | None = None
    """Inductor cache shared by the trials of a study, so a compile is paid once."""
    peak_tflops: float | None = None
    """The device's dense peak for MFU when it is not in the built-in table."""
    data_dir: str | None = None
    """The user's prepared data (`autotune.child.prepare_data`); None: synthetic tokens."""
    trainer: str | None = None
    """The user's Trainer factory (`module:function` or `/abs/file.py:function`)."""
    trainer_dir: str | None = None
    """Where a factory module is looked up besides sys.path (the search's working directory)."""
    devices: int = 1
    """Ranks the trial trains on (`devices_per_trial`), sharing it as `params["strategy"]`
    says; on CPU each is a process with its share of the worker's cores."""
    stop_below_samples_per_s: float | None = None
    """After `stop_after_steps` timed steps, the trial stops (`stopped`, with what it
    measured) when even its fastest step's pace is below this: clearly slower than the
    fastest trial so far. None: it runs to its end."""
    stop_after_steps: int = 3
    adapter: dict[str, Any] | None = None
    """peft's `LoraConfig` kwargs of the job's adapter (`RunInfo.adapter`), which the worker
    applies to the model it builds; None: a full fine-tune."""
    schema_version: int = SCHEMA_VERSION


def feasible(status: Status, peak_memory_gib: float | None, budget_gib: float) -> bool:
    """A trial the search may recommend and the front holds: measured, with its peak within
    the memory budget (a trial can end ok a little past it, between two looks of the CPU
    watchdog). Optuna's constraint says the same: peak less budget <= 0."""
    return status is Status.OK and peak_memory_gib is not None and peak_memory_gib <= budget_gib


STDERR_TAIL_CHARS = 4000
"""How much of a failed trial's output or traceback its result keeps (`stderr_tail`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialResult:
    """What one trial measured, or why it measured nothing."""

    status: Status
    reason: str = ""
    """One line for the user: why a trial is not ok."""
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    """Real tokens: padding is not counted."""
    padding_share: float | None = None
    """Padding among the token positions the timed steps computed on (0 for synthetic data)."""
    step_time_median_ms: float | None = None
    step_time_cv: float | None = None
    """Coefficient of variation (stdev / mean) of the timed optimizer steps."""
    compile_s: float | None = None
    """Warm-up time beyond ordinary steps in a compiled trial: the cost of compiling."""
    mfu: float | None = None
    """Model FLOPs utilisation: achieved model FLOP/s over `mfu_peak_tflops` (per device)."""
    mfu_peak_tflops: float | None = None
    """MFU's denominator: the device's dense 16-bit peak (or `peak_tflops=`), the same for
    every trial whatever its precision."""
    flops_per_sample: float | None = None
    measured_steps: int = 0
    step_times_ms: list[float] = field(default_factory=list)
    """Each timed optimizer step, in order: the raw data behind the median and the CV."""
    peak_memory_gib: float | None = None
    """CUDA: peak reserved by PyTorch's allocator. CPU: peak RSS above the worker's baseline."""
    estimate_gib: float | None = None
    """The peak `autotune.plan.estimate` gave before the trial ran (set by the parent)."""
    peak_allocated_gib: float | None = None
    """CUDA: peak held by tensors (reserved minus the allocator's cache)."""
    alloc_retries: int | None = None
    """CUDA: times the allocator freed its cache to retry an allocation (memory pressure)."""
    nvml_used_gib: float | None = None
    """CUDA: the process's memory as NVML sees it, CUDA context included."""
    final_loss: float | None = None
    build_s: float | None = None
    """Seconds spent building the model and the Trainer."""
    train_s: float | None = None
    """Seconds spent in `Trainer.train`, warm-up included."""
    wall_s: float | None = None
    """Seconds from starting the trial to reading its result (set by the executor): its cost."""
    device_s: float | None = None
    """The trial's cost in device seconds: wall_s times the devices it held."""
    overhead_s: float | None = None
    """wall_s less build_s and train_s: process_s + imports_s + cuda_init_s + finish_s (set
    by the parent)."""
    process_s: float | None = None
    """Starting the worker process, ending it and reading its result: wall_s less the
    worker's own parts (set by the parent)."""
    imports_s: float | None = None
    """The worker's imports after its process started (~0 forked from the fork server)."""
    cuda_init_s: float | None = None
    """CUDA: creating the process's CUDA context."""
    model_build_s: float | None = None
    """Building the model and its random init, where it trains (part of build_s)."""
    data_s: float | None = None
    """Making or opening the training data (part of build_s)."""
    trainer_init_s: float | None = None
    """Making the Trainer, or calling the user's factory (part of build_s)."""
    warmup_s: float | None = None
    """train_s less the timed steps: the Trainer's setup in `train()` and the warm-up steps,
    compile included."""
    finish_s: float | None = None
    """The worker's time outside its named parts: seeds and caches before, the memory
    figures and the result after."""
    n_params: int | None = None
    worker_pid: int | None = None
    """The process that ran the trial: each trial has one of its own."""
    node: str | None = None
    """The cluster node(s) the trial ran on, comma-separated in rank order (set by a cluster
    executor); None: the search's own host."""
    rerun: bool = False
    """It ended for a reason outside its settings (its node left the cluster): they are run
    again (`study.loop`)."""
    device_name: str = ""
    cpu_threads: int | None = None
    """CPU: the threads torch trained with (the cores the trial's worker was given)."""
    trained_model: str | None = None
    """What the Trainer trained: its model's `name_or_path`, else its `model_type`."""
    trained_seq_len: int | None = None
    """The longest batch row the Trainer trained on (padding included): on data of many
    lengths the first step's, of the longest samples, so the peak covers the run's longest."""
    trained_config: dict[str, Any] | None = None
    """A `trainer=` factory's model's config (the base's, under an adapter), as
    `config.to_dict()` gives it: what the estimate of the study's later trials is made of
    (`autotune.plan.factory_model`); None for the model autotune builds."""
    trained_task: str | None = None
    """The task of a factory's model, told by its class (`common.models.task_of_class`)."""
    training_args: dict[str, Any] = field(default_factory=dict)
    """The tuned `TrainingArguments` kwargs the worker trained with (no run-only fields)."""
    rank_peak_memory_gib: list[float] | None = None
    """Several devices a trial: each rank's own peak (`peak_memory_gib` is the largest)."""
    rank_params: list[int] | None = None
    """Several devices a trial: the parameters each rank held while it trained (all of them
    under DDP, 1/N under a sharding strategy): counted, not inferred from memory."""
    rank_model_state_bytes: list[int] | None = None
    """Several devices a trial: the bytes of weights, gradients and optimizer states each rank
    held after its last step, counted tensor by tensor."""
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    peft_config: dict[str, Any] | None = None
    """The adapter the trial trained (peft's `LoraConfig` kwargs); None: every weight."""
    quantization_config: dict[str, Any] | None = None
    """The quantized base's `BitsAndBytesConfig` kwargs; None: not quantized."""
    trainable_params: int | None = None
    """The parameters that trained (the adapter's alone on a frozen base)."""
    compiled_modules: int | None = None
    """torch.compile's compiled modules in what the Trainer trained: 1 for the whole model,
    one per repeated block (and the rest) under regional compilation; None: not compiled."""
    environment: dict[str, str] = field(default_factory=dict)
    """The environment variables the knobs set (torch.compile's dynamic, full-graph and
    regional modes, which accelerate reads), as the trial trained with them."""
    stderr_tail: str = ""
    """The end of what the trial printed, or of its traceback: `STDERR_TAIL_CHARS` at most."""
    schema_version: int = SCHEMA_VERSION

    def feasible(self, budget_gib: float) -> bool:
        """Measured, and within the memory budget (`feasible`)."""
        return feasible(self.status, self.peak_memory_gib, budget_gib)

    def noisy(self, noise_cv: float) -> bool:
        """Its timed steps varied more than `noise_cv` (stdev / mean): its figure is less
        certain."""
        return self.step_time_cv is not None and self.step_time_cv > noise_cv

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        for name in CLUSTER_FIELDS:  # a trial of one machine is stored as before they were
            if data[name] == _DEFAULTS[name]:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"result schema {data.get('schema_version')} != {SCHEMA_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown result fields: {sorted(unknown)}")
        return cls(**{**data, "status": Status(data["status"])})


CLUSTER_FIELDS = ("node", "rerun")
"""A result's fields a cluster executor sets, stored only when set: a study searched on one
machine reads as before they were, by an earlier autotune too (sharing its storage)."""
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrialResult)}


PROGRESS_SCHEMA_VERSION = 2
"""The progress record's own version: it is read only while its trial runs, whereas results
stored in old studies are read with `SCHEMA_VERSION`, which its changes must leave alone."""


class Stage(enum.StrEnum):
    """Where a running worker is; a record's stage is the one the worker has just entered."""

    BUILDING = "building"  # the model, the data and the Trainer
    WARMUP = "warm-up"  # untimed optimizer steps
    MEASURING = "measuring"  # timed optimizer steps (warm-up done)


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """What the worker tells the parent while it runs (the trial's `progress.json`)."""

    baseline_rss_bytes: int
    """The worker's resident size before the trial built anything: the CPU watchdog's zero."""
    stage: Stage
    """`measuring` from the end of the last warm-up step on: the next step is timed."""
    step: int
    """Optimizer steps done."""
    total_steps: int
    """Warm-up plus measured steps: training ends when `step` reaches it."""
    elapsed_s: float
    """Seconds since the worker began the trial (before building the model), to this record."""
    eta_s: float | None = None
    """Seconds of training left, estimated from the steps so far; None until two steps ended."""
    schema_version: int = PROGRESS_SCHEMA_VERSION

    def summary(self) -> str:
        """One short line for a log: `step 3/13 (warm-up) 1.2 s elapsed, ETA 8 s`."""
        line = f"step {self.step}/{self.total_steps} ({self.stage}) {self.elapsed_s:.1f} s elapsed"
        return line if self.eta_s is None else f"{line}, ETA {self.eta_s:.0f} s"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["stage"] = self.stage.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Progress:
        if data.get("schema_version") != PROGRESS_SCHEMA_VERSION:
            raise ValueError(
                f"progress schema {data.get('schema_version')} != {PROGRESS_SCHEMA_VERSION}"
            )
        return cls(**{**data, "stage": Stage(data["stage"])})


def write_progress(path: Path, progress: Progress) -> None:
    # No fsync: the record is only read while the worker runs, and a rename alone already
    # shows a reader the old record or the new one. Measured on ext4 (1000 writes): ~0.3-0.7 ms
    # a write without fsync, 0.6-2.5 ms with it.
    write_json_atomic(path, progress.to_dict(), fsync=False)


def read_progress(path: Path) -> Progress | None:
    """The latest progress record; None before the worker has written one.

    Written atomically, so a record is never half there; an unparsable file still reads as
    None, so that supervision never trips over it."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return Progress.from_dict(data)


def spec_to_dict(spec: TrialSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


def spec_from_dict(data: dict[str, Any]) -> TrialSpec:
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"spec schema {data.get('schema_version')} != {SCHEMA_VERSION}")
    return TrialSpec(**data)


def write_json_atomic(path: Path, data: dict[str, Any], *, fsync: bool = True) -> None:
    """Write JSON so that a reader sees the old file, the new file, or none: never half of one
    (`output_files.write_atomic`, which raises a StudyError when it cannot).

    `fsync` also makes it survive a machine crash: results need that, a passing record not."""
    write_atomic(path, json.dumps(data, indent=2, allow_nan=True), fsync=fsync)
