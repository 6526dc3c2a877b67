"""The device probe: `python -m autotune.child.probe [--device-only]` prints one JSON object of
device facts (and, without `--device-only`, the installed packages' facts). It is the only
place that initialises CUDA outside a trial; `autotune.plan.hardware.probe` runs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import sys
import time
from typing import Any

from autotune.common.device import DEVICE_ONLY, cpu_name
from autotune.common.links import read_links
from autotune.common.models import TASK_CLASSES


def _bitsandbytes_error() -> str | None:
    try:
        # bitsandbytes prints notices on stdout at import; keep stdout for the probe's JSON.
        with contextlib.redirect_stdout(sys.stderr):
            import bitsandbytes  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure to import means "not usable here"
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    return None


def _package_error(module: str, install: str) -> str | None:
    """Why `module` (of an optional package) cannot be imported; None when it can."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return f"not installed ({install})"
    try:
        # Some log at import (DeepSpeed its accelerator's detection): stdout is the JSON's.
        with contextlib.redirect_stdout(sys.stderr):
            importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure to import means "not usable here"
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    return None


def _liger_model_types() -> list[str]:
    """The model types Liger patches (empty where it does not import)."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except Exception:  # noqa: BLE001 - the error itself is `liger_error`
        return []
    return sorted(MODEL_TYPE_TO_APPLY_LIGER_FN)


def _tp_model_types() -> list[str]:
    """The causal-LM and classification model types whose config has a tensor-parallel plan
    (importing each config's module: about 2 s, cached with the other software facts)."""
    from transformers.models.auto import configuration_auto, modeling_auto

    names = set(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    names |= set(modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)
    planned = []
    for name in sorted(names):
        try:
            config_class = configuration_auto.CONFIG_MAPPING[name]
        except Exception:  # noqa: BLE001 - a model type whose module does not import here
            continue
        if getattr(config_class, "base_model_tp_plan", None):
            planned.append(name)
    return planned


def _software_facts() -> dict[str, Any]:
    import torch
    import torch._dynamo
    import transformers
    from transformers.models.auto import configuration_auto, modeling_auto
    from transformers.training_args import OptimizerNames

    return {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "bitsandbytes_error": _bitsandbytes_error(),
        "deepspeed_error": _package_error("deepspeed", "pip install 'autotune[deepspeed]'"),
        # What adamw_torch_8bit/4bit (and fp8) build on.
        "torchao_error": _package_error("torchao.optim", "pip install 'autotune[torchao]'"),
        "flash_attn_error": _package_error("flash_attn", "pip install flash-attn"),
        "flash_attn_3_error": _package_error(
            "flash_attn_interface", "FlashAttention 3: the flash-attn repository's hopper build"
        ),
        "liger_error": _package_error("liger_kernel", "pip install liger-kernel"),
        "liger_model_types": _liger_model_types(),
        "tp_model_types": _tp_model_types(),
        # The names change between releases (`knobs.training_args` picks by them).
        "training_argument_fields": sorted(
            f.name for f in dataclasses.fields(transformers.TrainingArguments)
        ),
        # exclude_tags=() also lists the debugging backends (eager, aot_eager) users may name.
        "compile_backends": sorted(torch._dynamo.list_backends(exclude_tags=())),
        "optimizer_names": [o.value for o in OptimizerNames],
        "default_optim": str(transformers.TrainingArguments.__dataclass_fields__["optim"].default),
        "model_types": sorted(configuration_auto.CONFIG_MAPPING_NAMES),
        "task_model_types": {
            task: sorted(getattr(modeling_auto, table)) for task, (_, table) in TASK_CLASSES.items()
        },
    }


def _probe_here(device_only: bool = False) -> dict:
    import psutil
    import torch

    host = psutil.virtual_memory()
    facts = {
        "cuda_available": torch.cuda.is_available(),
        "cpu_name": cpu_name(),
        "host_available_memory_bytes": host.available,
        "host_total_memory_bytes": host.total,
        **({} if device_only else _software_facts()),
    }
    if facts["cuda_available"]:
        free, total = torch.cuda.mem_get_info(0)
        major, minor = torch.cuda.get_device_capability(0)
        count = torch.cuda.device_count()
        facts |= {
            "cuda_device_names": [torch.cuda.get_device_name(i) for i in range(count)],
            "cuda_free_memory_bytes": [torch.cuda.mem_get_info(i)[0] for i in range(count)],
            "name": torch.cuda.get_device_name(0),
            "total_memory_bytes": total,
            "free_memory_bytes": free,
            "compute_capability": f"{major}.{minor}",
            # Native bf16 and tf32 tensor cores start with Ampere (8.0); older parts emulate
            # bf16 slowly, so it is treated as unsupported.
            "bf16_supported": major >= 8,
            "tf32_supported": major >= 8,
        }
        if count > 1:
            facts |= _gpu_links(count)
    else:
        facts |= {
            "name": facts["cpu_name"],
            "total_memory_bytes": host.total,
            "free_memory_bytes": host.available,
            # The Trainer runs bf16 autocast on CPU (with use_cpu=True), fast where oneDNN has
            # bf16 instructions (AVX-512 BF16, AMX); elsewhere it is emulated: on a 2-core EPYC
            # with AVX2 only, the tiny BERT trained 10x slower than fp32 at the same peak
            # memory. Treated as unsupported there, as bf16 on a GPU before Ampere.
            "bf16_supported": _cpu_has_bf16(),
            "matmul_tflops": _cpu_matmul_tflops(),
        }
    return facts


def _gpu_links(count: int) -> dict[str, Any]:
    """How the visible GPUs reach each other (`common.links`), through NVML: `gpu_links`, or
    `gpu_links_error` saying why NVML could not tell."""
    import torch

    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            indices = [torch.cuda._get_nvml_device_index(i) for i in range(count)]
            links = read_links(pynvml, indices)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - no NVML (a container without it): links unknown
        return {"gpu_links_error": f"{type(exc).__name__}: {exc}".splitlines()[0][:200]}
    return {"gpu_links": [dataclasses.asdict(link) for link in links]}


def _cpu_has_bf16() -> bool:
    import torch

    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return True if check is None else bool(check())  # an older torch: as before, assume it


def _cpu_matmul_tflops(n: int = 1024, repeats: int = 5) -> float:
    """This CPU's fp32 matmul rate, the best of `repeats` n x n products after one untimed
    (~0.1 s here): no training step computes faster, so time at this rate is a floor."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best / 1e12


if __name__ == "__main__":
    from autotune.child import quiet_imports

    quiet_imports.install()  # its imports of torchao log lines of nothing it probes
    print(json.dumps(_probe_here(device_only=DEVICE_ONLY in sys.argv[1:])))
