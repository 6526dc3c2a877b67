"""A GPU-like landscape from a cost model: bert-large (seq 512) on an 80 GB H100.

Memory follows the HF single-GPU guide's anatomy, speed rough factors (16-bit and TF32 peak
rates, fused optimizers, checkpointing's recompute, compile, 64-multiple batches). It is crude:
it stands for the shape of a GPU landscape (speed rising with the batch until memory runs out,
precision worth most), not for real speeds; the recorded CPU landscapes are the measurements.
Every point of `cost_model_space.yaml` (the HF guide's knobs, which the factors cover; H100
capabilities) is answered; noise is a fixed 3%
log-normal draw per point, so the landscape is the same on every replay.
"""

from __future__ import annotations

import dataclasses
import math
import random
import tempfile
from pathlib import Path

import yaml

from autotune.common.trial import Status
from autotune.replay import Landscape, plan_for
from autotune.study.checks import settings_key

SPACE = Path(__file__).parent / "cost_model_space.yaml"
PARAMS = 335e6
BUDGET_GB = 80.0
H100 = {"compute_capability": "9.0", "bf16_supported": True, "tf32_supported": True}
OPTIMIZER_STATE_BYTES = {"adamw_torch": 8, "adamw_torch_fused": 8, "adafactor": 4,
                         "adamw_bnb_8bit": 2, "paged_adamw_8bit": 2, "sgd": 0}  # fmt: skip
OPTIMIZER_STEP_COST = {"adamw_torch": 1.0, "adamw_torch_fused": 0.3, "adafactor": 1.5,
                       "adamw_bnb_8bit": 0.6, "paged_adamw_8bit": 0.7, "sgd": 0.3}  # fmt: skip
EFFECTIVE_TFLOPS = {"fp32": 50, "tf32": 300, "fp16": 600, "bf16": 600, "bf16+tf32": 620}


def simulate(params: dict, rng: random.Random) -> dict:
    """The trial's answer: ok with samples/s and peak GiB, or oom past 80 GB."""
    bs, ga = params["batch_size"], params.get("grad_accum", 1)
    sixteen = params["precision"] in ("fp16", "bf16", "bf16+tf32")
    weights = (6 if sixteen else 4) * PARAMS
    states = OPTIMIZER_STATE_BYTES[params["optim"]] * PARAMS + 4 * PARAMS  # + gradients
    act_per_sample = 2.4e9 * (0.5 if sixteen else 1.0)
    if params["attn_implementation"] == "eager":
        act_per_sample += 0.4e9 * (0.5 if sixteen else 1.0)
    if params["gradient_checkpointing"]:
        act_per_sample *= math.sqrt(24) / 24
    if params.get("torch_compile", "off") != "off":
        act_per_sample *= 0.9
    peak_gb = (weights + states + bs * act_per_sample) / 1e9
    if peak_gb > BUDGET_GB:
        return {"status": Status.OOM.value, "reason": "past 80 GB", "peak_memory_gib": None}
    flops_per_sample = 1.97e9 * 512
    rate = EFFECTIVE_TFLOPS[params["precision"]] * 1e12 * bs / (bs + 8)
    if sixteen and bs % 64 == 0:
        rate *= 1.05
    if params["attn_implementation"] == "eager":
        rate *= 0.85
    if params.get("torch_compile", "off") != "off":
        rate *= 1.2 if params.get("compile_mode") == "max-autotune" else 1.12
    step_s = bs * ga * flops_per_sample / rate * (1.33 if params["gradient_checkpointing"] else 1)
    step_s += 0.003 * OPTIMIZER_STEP_COST[params["optim"]]
    samples_per_s = bs * ga / step_s * rng.lognormvariate(0, 0.03)
    return {"status": Status.OK.value, "samples_per_s": samples_per_s,
            "tokens_per_s": samples_per_s * 512, "peak_memory_gib": peak_gb * 1e9 / 2**30,
            "step_time_cv": 0.02}  # fmt: skip


def answer(params: dict) -> dict:
    return simulate(params, random.Random(settings_key(params)))


def landscape() -> Landscape:
    """Every distinct configuration of the space on the H100 is a point."""
    knobs = yaml.safe_load(SPACE.read_text())["knobs"]
    empty = Landscape(
        name="cost-model-h100",
        model="bert-large-uncased",
        seq_len=512,
        device="cuda",
        device_name="NVIDIA H100 80GB HBM3",
        memory_budget_gib=BUDGET_GB * 1e9 / 2**30,
        knobs=knobs,
        answer=answer,
        device_facts=H100,
        description="benchmarks/landscapes/cost_model.py",
    )
    with tempfile.TemporaryDirectory() as work:
        plan = plan_for(empty, Path(work), n_trials=1, seed=0)
    seen: dict[str, dict] = {}
    for params, _ in plan.space.points(plan.rules, limit=10**6, rng=None):
        seen[settings_key(params)] = {"params": params, **answer(params)}
    baseline = plan.baseline
    seen.setdefault(settings_key(baseline), {"params": baseline, **answer(baseline)})
    return dataclasses.replace(empty, points=list(seen.values()))
