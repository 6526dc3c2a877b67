"""GPU landscapes from the GPU twin (`autotune/twin/`): every point of the default CUDA space
answered as the named GPU would run it, the trial's wall time included (start, build, compile,
warm-up and timed steps), so that a replayed search runs on the GPU's clock.

The space is `search_spaces/default.yaml` as a search plans it on that GPU with the software
the H100 run had (`benchmarks/results/2026-11-26-h100/probe.json`: no FlashAttention; Liger
for the models it patches; torchao and bitsandbytes); the budget is the card less its CUDA
context. The points are the twin's noise-free figures; each replay measures them afresh with
the GPUs' measured step noise (1%, `Landscape.remeasure_sigma`), drawn from its seed: seeds are
re-runs of a search on the same GPU, and its pick is scored at the noise-free figure. A trial
past `trial_timeout` (and `compile_timeout` when compiled: the search's defaults, 10 minutes
each) ends `timeout` in the simulated executor, as it would on the GPU.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

import yaml

from autotune.common.device import DeviceInfo
from autotune.common.models import catalogue_parameter_counts, resolve_model
from autotune.common.trial import Status
from autotune.common.trial_settings import conflict
from autotune.common.units import GIB
from autotune.plan import software_cache
from autotune.plan.config import RunConfig
from autotune.plan.estimate import CUDA_CONTEXT_BYTES
from autotune.replay import Landscape, plan_for
from autotune.study.checks import settings_key
from autotune.twin import answer, model

ROOT = Path(__file__).resolve().parents[2]
SPACE = ROOT / "search_spaces" / "default.yaml"
PROBE = ROOT / "benchmarks" / "results" / "2026-11-26-h100" / "probe.json"
MULTI_GPU_SPACE = ROOT / "benchmarks" / "landscapes" / "gpu-multi.yaml"
TWINS = {
    "twin-h100-bert-large-s512": ("H100", "bert-large-uncased", 512, 1),
    "twin-a100-bert-large-s512": ("A100-80GB", "bert-large-uncased", 512, 1),
    "twin-h100-qwen2.5-0.5b-s1024": ("H100", "Qwen/Qwen2.5-0.5B", 1024, 1),
    "twin-8xh100-qwen2.5-7b-s2048": ("H100", "Qwen/Qwen2.5-7B", 2048, 8),
    "twin-4xl4-qwen2.5-7b-s2048": ("L4", "Qwen/Qwen2.5-7B", 2048, 4),
}
"""Name -> (GPU, model, seq_len, GPUs a trial). On several GPUs (an 8x H100 host, NVLink 4
through NVSwitch; a 4x L4 host, PCIe 4.0) the space is `MULTI_GPU_SPACE` and every trial
trains on all of them, by the strategy the search picks."""
HARDWARE = ("cuda_available", "name", "total_memory_bytes", "free_memory_bytes",
            "cuda_device_names", "cuda_free_memory_bytes", "matmul_tflops",
            "host_available_memory_bytes", "host_total_memory_bytes")  # fmt: skip
"""What `autotune.replay.device_info` sets itself from the landscape."""


def landscape(name: str) -> Landscape:
    """Every setting of the default space on the twin's GPU is a point."""
    key, model_name, seq_len, devices = TWINS[name]
    g = model.gpu(key)
    spec = resolve_model(model_name)
    software = DeviceInfo.from_facts(json.loads(PROBE.read_text()))
    # The tensor-parallel plans of the installed transformers (the H100 run's probe predates
    # the fact): the models `strategy=tp` can split.
    planned = software_cache.software_facts().tp_model_types or ()
    software = dataclasses.replace(software, tp_model_types=planned)
    info = answer.device_info(g, software, devices)
    facts = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}  # links as such
    steps = {k: RunConfig.model_fields[k].default for k in ("warmup_steps", "measure_steps")}
    parameters = catalogue_parameter_counts().get(model_name)
    sigma = model.model_constant("step_cv")

    def answer_point(params: dict[str, Any]) -> dict[str, Any]:
        p = model.predict(
            g,
            spec.config,
            task=spec.default_task,
            seq_len=seq_len,
            params=params,
            parameters=parameters,
            devices=devices,
            **steps,
        )
        if p.status is Status.OOM:
            return {
                "status": "oom",
                "reason": f"past the card ({p.peak_gib:.1f} GiB)",
                "samples_per_s": None,
                "peak_memory_gib": None,
                "wall_s": p.wall_s,
            }
        return {
            "status": "ok",
            "reason": "",
            "samples_per_s": p.samples_per_s,
            "tokens_per_s": p.samples_per_s * seq_len,
            "peak_memory_gib": p.peak_gib,
            "step_time_cv": sigma,
            "step_time_median_ms": p.step_s * 1e3,
            "wall_s": p.wall_s,
        }

    empty = Landscape(
        name=name,
        model=model_name,
        seq_len=seq_len,
        device="cuda",
        device_name=g.name,
        memory_budget_gib=(g.memory_bytes - CUDA_CONTEXT_BYTES) / GIB,
        knobs=yaml.safe_load((SPACE if devices == 1 else MULTI_GPU_SPACE).read_text())["knobs"],
        answer=answer_point,
        remeasure_sigma=sigma,
        device_facts={k: v for k, v in facts.items() if k not in HARDWARE},
        description=f"benchmarks/landscapes/twin.py: the GPU twin of the {g.name}"
        + (f", {devices} a trial" if devices > 1 else ""),
        devices=devices,
    )
    with tempfile.TemporaryDirectory() as work:
        plan = plan_for(empty, Path(work), n_trials=1, seed=0)
    seen: dict[str, dict[str, Any]] = {}
    for params, _ in plan.space.points(plan.rules, limit=10**6, rng=None):
        if conflict(params) is None:  # settings that cannot train together never run
            seen[settings_key(params)] = {"params": params, **answer_point(params)}
    baseline = plan.baseline
    seen.setdefault(settings_key(baseline), {"params": baseline, **answer_point(baseline)})
    return dataclasses.replace(empty, points=list(seen.values()))
