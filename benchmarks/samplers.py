"""Which Optuna sampler finds the best speed/memory front in few trials?

Runs each sampler against a cost model of bert-large (seq 512) on an 80 GB H100 built from the
HF single-GPU guide's memory anatomy and rough speed factors, through the real search space
(`search_spaces/default.yaml`, H100 capabilities), the real sampling code and the same
tell rules as a search (constraints for OOM, repeats told their earlier values). The model is
crude; what it measures is how fast each sampler finds a good front, not real speeds.

    python benchmarks/samplers.py [--trials 20] [--seeds 8]

Writes benchmarks/results/samplers.json and prints mean normalised hypervolume per sampler.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import warnings
from pathlib import Path

import optuna

from autotune.capabilities import apply_sampling_rules, fit_space
from autotune.hardware import DeviceInfo
from autotune.pareto import hypervolume
from autotune.space import SamplingRules
from autotune.space_file import SoftwareFacts, load_space

PARAMS = 335e6
BUDGET_GB = 80.0
H100 = DeviceInfo(
    cuda_available=True, name="NVIDIA H100 80GB HBM3", compute_capability="9.0",
    total_memory_bytes=80 * 10**9, free_memory_bytes=79 * 10**9, bf16_supported=True,
    tf32_supported=True,
)  # fmt: skip
OPTIMIZER_STATE_BYTES = {"adamw_torch": 8, "adamw_torch_fused": 8, "adafactor": 4,
                         "adamw_bnb_8bit": 2, "paged_adamw_8bit": 2, "sgd": 0}  # fmt: skip
OPTIMIZER_STEP_COST = {"adamw_torch": 1.0, "adamw_torch_fused": 0.3, "adafactor": 1.5,
                       "adamw_bnb_8bit": 0.6, "paged_adamw_8bit": 0.7, "sgd": 0.3}  # fmt: skip
EFFECTIVE_TFLOPS = {"fp32": 50, "tf32": 300, "fp16": 600, "bf16": 600, "bf16+tf32": 620}


def simulate(params: dict, rng: random.Random) -> tuple[float, float] | None:
    """(samples/s, peak GB), or None when it would not fit in 80 GB."""
    bs, ga = params["batch_size"], params["grad_accum"]
    sixteen = params["precision"] in ("fp16", "bf16", "bf16+tf32")
    weights = (6 if sixteen else 4) * PARAMS
    states = OPTIMIZER_STATE_BYTES[params["optim"]] * PARAMS + 4 * PARAMS  # + gradients
    act_per_sample = 2.4e9 * (0.5 if sixteen else 1.0)
    if params["attn_implementation"] == "eager":
        act_per_sample += 0.4e9 * (0.5 if sixteen else 1.0)
    if params["gradient_checkpointing"]:
        act_per_sample *= math.sqrt(24) / 24
    if params["torch_compile"] != "off":
        act_per_sample *= 0.9
    peak_gb = (weights + states + bs * act_per_sample) / 1e9
    if peak_gb > BUDGET_GB:
        return None
    flops_per_sample = 1.97e9 * 512
    rate = EFFECTIVE_TFLOPS[params["precision"]] * 1e12 * bs / (bs + 8)
    if sixteen and bs % 64 == 0:
        rate *= 1.05
    if params["attn_implementation"] == "eager":
        rate *= 0.85
    if params["torch_compile"] != "off":
        rate *= 1.2 if params.get("compile_mode") == "max-autotune" else 1.12
    step_s = bs * ga * flops_per_sample / rate * (1.33 if params["gradient_checkpointing"] else 1)
    step_s += 0.003 * OPTIMIZER_STEP_COST[params["optim"]]
    return bs * ga / step_s * rng.lognormvariate(0, 0.03), peak_gb


def sampler(name: str, seed: int, trials: int) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return {
            "tpe": lambda: optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True),
            "tpe-independent": lambda: optuna.samplers.TPESampler(seed=seed),
            "nsga2": lambda: optuna.samplers.NSGAIISampler(
                seed=seed, population_size=max(4, min(50, trials // 4))
            ),
            "random": lambda: optuna.samplers.RandomSampler(seed=seed),
            "gp": lambda: optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False),
        }[name]()


def run(name: str, seed: int, trials: int) -> float:
    space = fit_space(load_space("default", SoftwareFacts()), "cuda", H100)
    rules = SamplingRules(tensor_core_64=True)
    space = apply_sampling_rules(space, rules)
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=sampler(name, seed, trials)
    )
    rng, seen, points = random.Random(seed), {}, []
    while len(seen) < trials:
        trial = study.ask()
        params = space.sample(trial, rules)
        key = json.dumps(params, sort_keys=True)
        if key in seen:  # as the search does: told the earlier result, not run
            values, over = seen[key]
        else:
            outcome = simulate(params, rng)
            values, over = ([0.0, BUDGET_GB], 1.0) if outcome is None else (list(outcome), -1.0)
            seen[key] = (values, over)
            if outcome is not None:
                points.append(outcome)
        trial.set_constraint("peak_over_budget_gib", over)
        study.tell(trial, values)
    return hypervolume(points, BUDGET_GB)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, nargs="+", default=[15, 30])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument(
        "--samplers", nargs="+", default=["tpe", "tpe-independent", "nsga2", "random", "gp"]
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results = {}
    for trials in args.trials:
        raw = {
            name: [run(name, seed, trials) for seed in range(args.seeds)] for name in args.samplers
        }
        best = max(max(v) for v in raw.values())
        results[trials] = {
            name: {"mean": statistics.fmean(v) / best, "stdev": statistics.stdev(v) / best}
            for name, v in raw.items()
        }
        for name, r in sorted(results[trials].items(), key=lambda kv: -kv[1]["mean"]):
            print(f"{trials} trials  {name:16s} hypervolume {r['mean']:.3f} +- {r['stdev']:.3f}")
    out = Path(__file__).parent / "results" / "samplers.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps({"seeds": args.seeds, "normalised_hypervolume": results}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
