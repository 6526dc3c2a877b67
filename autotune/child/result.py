"""What a trial measured, as typed records, and the `TrialResult` made of them: its verdict,
and for an `ok` trial throughput, compile time and MFU."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from autotune.child import measure, rank_training, ranks
from autotune.common import knobs
from autotune.common.device import tensor_peak_tflops
from autotune.common.trial import Status, TrialResult, TrialSpec
from autotune.common.units import GIB


@dataclass(frozen=True, kw_only=True, slots=True)
class Memory:
    """The trial's peak memory (`TrialResult`'s fields of the same names)."""

    peak_memory_gib: float
    peak_allocated_gib: float | None = None
    alloc_retries: int | None = None
    nvml_used_gib: float | None = None
    rank_peak_memory_gib: list[float] | None = None
    rank_params: list[int] | None = None
    rank_model_state_bytes: list[int] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """What a trial that trained to its end measured, before its verdict (`TrialResult`'s
    fields of the same names; `stages` are the `StageClock`'s)."""

    memory: Memory
    final_loss: float
    build_s: float
    train_s: float
    warmup_s: float
    finish_s: float
    stages: dict[str, float] = field(default_factory=dict)
    n_params: int
    device_name: str
    cpu_threads: int | None
    training_args: dict[str, Any]
    model_kwargs: dict[str, Any]
    peft_config: dict[str, Any] | None
    quantization_config: dict[str, Any] | None
    trainable_params: int
    environment: dict[str, str]
    compiled_modules: int | None
    step_times_ms: list[float]
    trained_model: str
    trained_seq_len: int | None
    trained_config: dict[str, Any] | None = None
    trained_task: str | None = None

    def fields(self) -> dict[str, Any]:
        """As `TrialResult` keyword arguments."""
        named = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("memory", "stages")
        }
        memory = {f.name: getattr(self.memory, f.name) for f in dataclasses.fields(self.memory)}
        return memory | named | self.stages


def of_trial(
    spec: TrialSpec,
    timer: measure.StepTimer,
    model: Any,
    measured: Measured,
    counts: measure.Counts | None = None,
) -> TrialResult:
    """The verdict, and for an `ok` trial throughput, compile time and MFU; `counts` are every
    rank's batches on several devices."""
    step_times_s = timer.measured_step_times_s()
    planned = len(step_times_s) if timer.stopped else spec.measure_steps
    status, reason = verdict(len(step_times_s), planned, measured.final_loss)
    if status is not Status.OK:
        return TrialResult(
            status=status, reason=reason, measured_steps=len(step_times_s), **measured.fields()
        )
    counts = counts or timer.measured_counts()
    if counts.samples == 0:
        return TrialResult(
            status=Status.ERROR,
            reason="no batch was seen: the Trainer's loader did not come from "
            "get_train_dataloader, so samples/s cannot be measured",
            measured_steps=len(step_times_s),
            **measured.fields(),
        )
    stats = measure.throughput(step_times_s, counts)
    compile_s = None
    if knobs.is_compiled(spec.params):
        compile_s = measure.compile_s(timer.warmup_step_times_s(), stats.step_time_median_ms / 1e3)
    flops = measure.training_flops(model, counts) if counts.tokens else None
    # Every trial's MFU against one peak, the device's 16-bit one, whatever its precision.
    peak = spec.peak_tflops or tensor_peak_tflops(measured.device_name)
    return TrialResult(
        status=Status.STOPPED if timer.stopped else Status.OK,
        reason=timer.stopped or "",
        **measured.fields(),
        **dataclasses.asdict(stats),
        compile_s=compile_s,
        flops_per_sample=flops / counts.samples if flops else None,
        mfu=flops / sum(step_times_s) / (peak * 1e12 * spec.devices) if flops and peak else None,
        mfu_peak_tflops=peak if flops and peak else None,
    )


def verdict(measured_steps: int, planned_steps: int, loss: float) -> tuple[Status, str]:
    """A finished training run is `ok` only with every planned step timed and a finite loss."""
    if measured_steps < planned_steps:
        return Status.ERROR, f"only {measured_steps} of {planned_steps} measured steps ran"
    if not math.isfinite(loss):
        return Status.NAN_LOSS, f"training loss is {loss}"
    return Status.OK, ""


def cpu_memory(baseline_rss: int, rank: ranks.Rank | None = None) -> Memory:
    if rank is not None:
        return Memory(peak_memory_gib=rank_training.peak_rss_gib_since(baseline_rss))
    return Memory(peak_memory_gib=(measure.peak_rss_bytes() - baseline_rss) / GIB)


def cuda_memory() -> Memory:
    stats = torch.cuda.memory_stats()
    nvml_bytes = _nvml_used_bytes()
    return Memory(
        peak_memory_gib=torch.cuda.max_memory_reserved() / GIB,
        peak_allocated_gib=torch.cuda.max_memory_allocated() / GIB,
        alloc_retries=stats.get("num_alloc_retries", 0),
        nvml_used_gib=nvml_bytes / GIB if nvml_bytes is not None else None,
    )


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
