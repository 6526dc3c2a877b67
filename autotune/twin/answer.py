"""The twin as a trial: a spec in, the `TrialResult` a GPU trial would return out (an `Answer`
for `execute.simulated.SimulatedExecutor`), and the device facts of a GPU not in hand.

The figures carry the noise a GPU trial shows (each step's time off by the measured step CV),
drawn from the seed, the trial's number and its settings: the same search replays to the same
figures, and a setting measured again (confirmation) gets figures of its own.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import statistics
from collections.abc import Collection
from typing import Any

from autotune.common.device import DeviceInfo, tensor_peak_tflops
from autotune.common.knobs import (
    environment,
    model_kwargs,
    quantization_config,
    training_args,
    value_of,
)
from autotune.common.trial import Status, TrialResult, TrialSpec, stopped_reason
from autotune.common.trial_settings import replicas
from autotune.common.units import GIB
from autotune.plan import software_cache
from autotune.plan.estimate import CUDA_CONTEXT_BYTES, flops_per_sample, shape_of
from autotune.twin import model


class TwinAnswer:
    """Answers each trial as `gpu` would run it (`model.predict`), noise included, with the
    settings a worker records (the `TrainingArguments` kwargs, the model's kwargs, the
    environment: `knobs`' one mapping of them, named by the installed transformers' fields
    unless `fields` are given), so that a simulated study's exports train what it measured."""

    def __init__(
        self,
        gpu: model.Gpu | str,
        *,
        seed: int = 0,
        noise: bool = True,
        fields: Collection[str] | None = None,
    ) -> None:
        self.gpu = model.gpu(gpu) if isinstance(gpu, str) else gpu
        self.seed = seed
        self.noise = noise
        self.asked = 0
        """Trials answered: confirmation rounds measure a setting again, with new noise."""
        self._fields = None if fields is None else frozenset(fields)

    @property
    def fields(self) -> frozenset[str]:
        """The `TrainingArguments` fields the settings are named by: those given, else the
        installed transformers' (the probe's, cached per user: no transformers here), read
        at the first trial that trains."""
        if self._fields is None:
            self._fields = frozenset(software_cache.software_facts().training_argument_fields or ())
        return self._fields

    def __call__(self, spec: TrialSpec) -> TrialResult:
        self.asked += 1
        p = model.predict(
            self.gpu,
            spec.model_config,
            task=spec.task,
            seq_len=spec.seq_len,
            params=spec.params,
            warmup_steps=spec.warmup_steps,
            measure_steps=spec.measure_steps,
            devices=spec.devices,
            memory_budget_bytes=spec.memory_budget_bytes,
            adapter=spec.adapter,
        )
        parts = {
            "build_s": p.build_s,
            "overhead_s": p.start_s,
            "wall_s": p.wall_s,
            "device_name": self.gpu.name,
            "peft_config": spec.adapter,
            "quantization_config": quantization_config(spec.params),
        }
        if p.status is Status.OOM:
            budget = (spec.memory_budget_bytes or self.gpu.memory_bytes) / GIB
            return TrialResult(
                status=Status.OOM,
                train_s=p.compile_s,
                **parts,
                reason=f"CUDA out of memory (the GPU twin: a peak of "
                f"{p.peak_gib:.1f} GiB past {budget:.1f} GiB)",
            )
        # What the worker records of a trial that trained (`child.worker`): what it ran.
        recorded = {
            "training_args": training_args(spec.params, device=spec.device, fields=self.fields),
            "model_kwargs": model_kwargs(spec.params),
            "environment": environment(spec.params),
        }
        return self._measured(spec, p, parts | recorded)

    def _steps_ms(self, spec: TrialSpec, p: model.Prediction) -> list[float]:
        """The timed steps, each the predicted step time with the twin's step noise."""
        rng = random.Random(
            json.dumps(
                [self.seed, spec.trial_number, self.asked, spec.params], sort_keys=True, default=str
            )
        )
        sigma = model.model_constant("step_cv") if self.noise else 0.0
        return [
            p.step_s * 1e3 * model.lognormal_factor(sigma, 1 - rng.random(), rng.random())
            for _ in range(spec.measure_steps)
        ]

    def _measured(self, spec: TrialSpec, p: model.Prediction, parts: dict[str, Any]) -> TrialResult:
        """A trial that trained: its steps, pace and memory, stopped early as the worker would."""
        steps_ms = self._steps_ms(spec, p)
        samples = value_of(spec.params, "batch_size") * value_of(spec.params, "grad_accum")
        step_samples = samples * replicas(spec.params, spec.devices)
        median_ms, cv, samples_per_s = _pace(steps_ms, step_samples)
        shape = shape_of(spec.model_config, adapter=spec.adapter)
        flops = flops_per_sample(shape, spec.seq_len, spec.task)
        peak_tflops = tensor_peak_tflops(self.gpu.name)
        mfu = (
            None
            if peak_tflops is None
            else (flops * samples_per_s / spec.devices / (peak_tflops * 1e12))
        )
        stopped = stopped_early(spec, steps_ms, samples)
        timed_s = p.timed_s
        if stopped is not None:  # the timed steps after the stop are not run
            steps_ms = steps_ms[: spec.stop_after_steps]
            median_ms, cv, samples_per_s = _pace(steps_ms, step_samples)
            timed_s = sum(steps_ms) / 1e3
            parts["wall_s"] = p.wall_s - p.timed_s + timed_s
        return TrialResult(
            status=Status.STOPPED if stopped else Status.OK,
            reason=stopped or "",
            samples_per_s=samples_per_s,
            tokens_per_s=samples_per_s * spec.seq_len,
            padding_share=0.0,
            step_time_median_ms=median_ms,
            step_time_cv=cv,
            compile_s=p.compile_s or None,
            mfu=mfu,
            mfu_peak_tflops=peak_tflops,
            flops_per_sample=flops,
            measured_steps=len(steps_ms),
            step_times_ms=steps_ms,
            peak_memory_gib=p.peak_gib,
            peak_allocated_gib=p.peak_gib / model.model_constant("reserved_over_estimate"),
            alloc_retries=0,
            nvml_used_gib=p.peak_gib + CUDA_CONTEXT_BYTES / GIB,
            train_s=p.compile_s + p.warmup_s + timed_s,
            trained_seq_len=spec.seq_len,
            n_params=shape.parameters,
            trainable_params=shape.trained,
            **parts,
        )


def _pace(steps_ms: list[float], samples: int) -> tuple[float, float, float]:
    """(median step ms, the steps' CV, samples/s at the median step) of `samples` a step."""
    median_ms = statistics.median(steps_ms)
    cv = statistics.pstdev(steps_ms) / statistics.mean(steps_ms)
    return median_ms, cv, samples / (median_ms / 1e3)


def stopped_early(spec: TrialSpec, steps_ms: list[float], samples: int) -> str | None:
    """Why a trial of these timed steps stops early, as the worker's `StepTimer` decides it:
    after `stop_after_steps`, when even the fastest was under the spec's pace; else None."""
    first = steps_ms[: spec.stop_after_steps]
    if spec.stop_below_samples_per_s is None or len(steps_ms) <= spec.stop_after_steps:
        return None
    fastest = samples * replicas(spec.params, spec.devices) / (min(first) / 1e3)
    if fastest >= spec.stop_below_samples_per_s:
        return None
    return stopped_reason(len(first), fastest, spec.stop_below_samples_per_s)


def device_info(gpu: model.Gpu | str, software: DeviceInfo, count: int = 1) -> DeviceInfo:
    """`count` of `gpu` on one host, with the software facts (torch, transformers, the
    optimizers and kernels installed) of `software`: what the probe would find there, each
    pair of GPUs joined by the GPU's link."""
    g = model.gpu(gpu) if isinstance(gpu, str) else gpu
    free = g.memory_bytes - CUDA_CONTEXT_BYTES
    major = int(g.compute_capability.split(".")[0])
    return dataclasses.replace(
        software,
        cuda_available=True,
        name=g.name,
        total_memory_bytes=g.memory_bytes,
        free_memory_bytes=free,
        compute_capability=g.compute_capability,
        bf16_supported=major >= 8,
        tf32_supported=major >= 8,
        cuda_device_names=(g.name,) * count,
        cuda_free_memory_bytes=(free,) * count,
        matmul_tflops=None,
        gpu_links=tuple(
            dataclasses.replace(g.link, a=a, b=b)
            for a, b in itertools.combinations(range(count), 2)
        ),
    )
