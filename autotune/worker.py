"""One trial in a process of its own: `python -m autotune.worker SPEC.json RESULT.json`.

Builds the model from its config, synthetic data (random token ids, as the HF guide does) and
the real HF `Trainer` with the `TrainingArguments` from `autotune.export`, trains warm-up plus
measured steps, and writes a `TrialResult` atomically. The only code that touches the device;
it never imports optuna. Exit code 0 means the result file says what happened.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import psutil
import torch
import transformers
import transformers.trainer

from autotune import export, measure
from autotune.models import ModelSpec, build_model
from autotune.processes import children_die_with_this_process
from autotune.trial import Status, TrialResult, TrialSpec, spec_from_dict, write_json_atomic
from autotune.units import GIB


class SyntheticDataset(torch.utils.data.Dataset):
    """Random token ids of one length, with labels the task's head expects."""

    def __init__(self, *, task: str, vocab_size: int, seq_len: int, n_samples: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(vocab_size, (n_samples, seq_len), generator=generator)
        if task == "sequence-classification":
            self.labels = torch.randint(2, (n_samples,), generator=generator)
        elif task == "seq2seq":
            self.labels = torch.randint(vocab_size, (n_samples, seq_len), generator=generator)
        else:  # causal-lm shifts inside the model; masked-lm predicts every position
            self.labels = self.input_ids

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[i], "labels": self.labels[i]}


class InvalidConfig(Exception):
    """The settings were refused before training started."""


def run_trial(spec: TrialSpec, progress_path: Path) -> TrialResult:
    # The Trainer wants an output folder; with saving and logging off it stays empty.
    with tempfile.TemporaryDirectory(prefix="autotune-trainer-") as workdir:
        return _train(spec, workdir, progress_path)


def _cap_cuda_memory(budget_bytes: int | None) -> None:
    """Cap PyTorch's allocator at the budget, so an 80 GB card can tune for a 24 GB one.

    Must run before the model reaches the GPU; past the cap, allocations raise
    torch.OutOfMemoryError as a smaller card would.
    """
    total = torch.cuda.get_device_properties(0).total_memory
    if budget_bytes is not None and budget_bytes < total:
        torch.cuda.set_per_process_memory_fraction(budget_bytes / total)


def _train(spec: TrialSpec, workdir: str, progress_path: Path) -> TrialResult:
    # torch and transformers leave millions of objects on the heap; a full garbage collection
    # walking them in the middle of the timed window costs a step 50-100 ms. Freezing them out
    # of the collector's view removes those pauses (and copy-on-write churn after a fork).
    gc.freeze()
    transformers.set_seed(spec.seed)
    on_cuda = spec.device == "cuda"
    if spec.compile_cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = spec.compile_cache_dir
    # Every module a trial needs is imported by now (transformers.trainer at the top of this
    # file, as the fork server preloads it), so growth past this point is the trial's own.
    baseline_rss = psutil.Process().memory_info().rss
    # The parent's CPU memory watchdog measures growth from here.
    write_json_atomic(progress_path, {"baseline_rss_bytes": baseline_rss})
    if on_cuda:
        _cap_cuda_memory(spec.memory_budget_bytes)
        torch.cuda.reset_peak_memory_stats()

    started = time.perf_counter()
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    tuned_args = export.training_args(spec.params, device=spec.device, fields=fields)
    try:
        args = transformers.TrainingArguments(
            output_dir=workdir,
            max_steps=spec.warmup_steps + spec.measure_steps,
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=spec.seed,
            **tuned_args,
        )
    except (ValueError, ImportError) as exc:  # TrainingArguments validates combinations here
        raise InvalidConfig(f"TrainingArguments refused the settings: {exc}") from exc

    model_kwargs = export.model_kwargs(spec.params)
    model = build_model(
        ModelSpec(name=spec.model_name, source="spec", config=spec.model_config),
        spec.task,
        **model_kwargs,
    )
    samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
    dataset = SyntheticDataset(
        task=spec.task,
        vocab_size=model.config.vocab_size,
        seq_len=spec.seq_len,
        n_samples=samples_per_step * args.max_steps,
        seed=spec.seed,
    )
    timer = measure.StepTimer(spec.warmup_steps, torch.cuda.synchronize if on_cuda else _no_sync)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset, callbacks=[timer])
    build_s = time.perf_counter() - started

    started = time.perf_counter()
    output = trainer.train()
    train_s = time.perf_counter() - started

    if on_cuda:
        memory = _cuda_memory()
        device_name = torch.cuda.get_device_name()
    else:
        memory = {"peak_memory_gib": (measure.peak_rss_bytes() - baseline_rss) / GIB}
        device_name = "cpu"
    step_times_s = timer.measured_step_times_s()
    common: dict[str, Any] = {
        **memory,
        "final_loss": output.training_loss,
        "build_s": build_s,
        "train_s": train_s,
        "n_params": sum(p.numel() for p in model.parameters()),
        "device_name": device_name,
        "training_args": tuned_args,
        "model_kwargs": model_kwargs,
        "measured_steps": len(step_times_s),
        "step_times_ms": [t * 1e3 for t in step_times_s],
    }
    status, reason = judge(len(step_times_s), spec.measure_steps, output.training_loss)
    if status is not Status.OK:
        return TrialResult(status=status, reason=reason, **common)
    stats = measure.throughput(
        step_times_s, samples_per_step=samples_per_step, seq_len=spec.seq_len
    )
    del common["measured_steps"]
    compiling = spec.params.get("torch_compile", "off") != "off"
    median_s = stats.step_time_median_ms / 1e3
    flops = measure.flops_per_sample(model, spec.seq_len)
    peak = spec.peak_tflops or measure.peak_tflops(
        device_name, spec.params.get("precision", "fp32")
    )
    return TrialResult(
        status=Status.OK,
        **common,
        **dataclasses.asdict(stats),
        compile_s=measure.compile_s(timer.warmup_step_times_s(), median_s) if compiling else None,
        flops_per_sample=flops,
        mfu=stats.samples_per_s * flops / (peak * 1e12) if peak else None,
    )


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


def judge(measured_steps: int, planned_steps: int, loss: float) -> tuple[Status, str]:
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
        stderr_tail="".join(traceback.format_exception(exc))[-4000:],
    )


def main(argv: list[str]) -> int:
    # DataLoader workers and other forked helpers must not outlive this process.
    children_die_with_this_process()
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    spec = spec_from_dict(json.loads(spec_path.read_text()))
    try:
        result = run_trial(spec, result_path.parent / "progress.json")
    except torch.OutOfMemoryError as exc:
        result = _failure(Status.OOM, exc)
    except InvalidConfig as exc:
        result = _failure(Status.INVALID_CONFIG, exc.__cause__ or exc)
    except Exception as exc:  # noqa: BLE001 - any failure is this trial's result, named and kept
        # Some libraries (bitsandbytes, compiled kernels) raise out-of-memory as RuntimeError.
        status = Status.OOM if "out of memory" in str(exc).lower() else Status.ERROR
        result = _failure(status, exc)
    result = dataclasses.replace(result, worker_pid=os.getpid())
    write_json_atomic(result_path, result.to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
