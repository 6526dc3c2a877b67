"""One trial of a plan's study, as the search loop, the confirmation and `autotune verify` run
it: its spec built from the plan, its limits, and the pace under which it stops early."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.common.knobs import is_compiled
from autotune.common.layout import COMPILE_CACHE, trial_dir
from autotune.common.trial import Progress, TrialResult, TrialSpec
from autotune.execute.base import Submission, TrialExecutor, run_trial
from autotune.plan.config import RunConfig
from autotune.plan.plan import SearchPlan
from autotune.store.records import TrialRecord

STOP_SHARE = 0.5
"""A trial whose fastest timed step is under this share of the fastest trial's pace so far is
stopped early (`early_stop=`)."""


def time_limit_s(config: RunConfig, params: dict[str, Any]) -> float:
    """How long a trial of these settings may run: `trial_timeout`, and `compile_timeout` on
    top for compiling."""
    return config.trial_timeout + (config.compile_timeout if is_compiled(params) else 0.0)


def stop_threshold(plan: SearchPlan, records: list[TrialRecord]) -> float | None:
    """The pace under which a trial stops early (`early_stop=`): STOP_SHARE of the fastest
    feasible trial so far; None when it is off, before such a trial, or on several devices a
    trial."""
    if not plan.config.early_stop or plan.devices_per_trial > 1:
        return None
    budget = plan.info.memory_budget_gib
    fastest = [r.result.samples_per_s for r in records if r.result.feasible(budget)]
    return STOP_SHARE * max(fastest) if fastest else None


def launch(
    plan: SearchPlan,
    number: int,
    params: dict[str, Any],
    executor: TrialExecutor,
    on_progress: Callable[[Progress], None],
    folder: Path | None = None,
    stop_below: float | None = None,
) -> TrialResult:
    """Run one trial of the plan's study, its files in `folder` (default: `trials/NNNN/`);
    it stops early under `stop_below` samples/s (`TrialSpec.stop_below_samples_per_s`)."""
    config = plan.config
    folder = folder or trial_dir(plan.study_dir, number)
    spec = TrialSpec(
        trial_number=number,
        model_name=plan.model.name,
        model_config=plan.model.config,
        task=plan.info.task,
        seq_len=plan.info.seq_len,
        device=plan.device,
        params=params,
        warmup_steps=plan.info.warmup_steps,
        measure_steps=plan.info.measure_steps,
        seed=config.seed,
        memory_budget_bytes=plan.info.memory_budget_bytes,
        compile_cache_dir=str(plan.study_dir / COMPILE_CACHE),
        peak_tflops=config.peak_tflops,
        data_dir=str(plan.data_dir) if plan.data_dir else None,
        trainer=plan.info.trainer_factory,
        trainer_dir=str(plan.search_dir),
        devices=plan.devices_per_trial,
        stop_below_samples_per_s=stop_below,
        adapter=plan.info.adapter,
    )
    submission = Submission(
        spec=spec,
        place=str(folder),
        within=str(plan.study_dir),
        # Compiling gets its own allowance on top of the training time.
        timeout_s=time_limit_s(config, params),
        # On CUDA the worker caps its allocator at the budget; on CPU the parent watches RSS.
        memory_limit_bytes=plan.info.memory_budget_bytes if plan.device == "cpu" else None,
        placement=plan.slots[0],  # the plan of one worker: its own slot
    )
    return run_trial(executor, submission, on_progress)
