"""Everything a finished (or interrupted) search leaves in its study folder.

trials.csv        one row per trial
pareto.csv        the non-dominated successful trials
recommended.json  TrainingArguments kwargs + model kwargs + measured metrics
recommended.py    a runnable snippet building those TrainingArguments
report.html       the interactive report
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autotune import export
from autotune.pareto import GIB, memory_limit_gib, pareto_front, recommend
from autotune.plan import SearchPlan
from autotune.records import TrialRecord, load_records
from autotune.report.data import build_report_data
from autotune.report.html import write_report
from autotune.space import KNOBS

METRIC_COLUMNS = (
    "samples_per_s",
    "tokens_per_s",
    "peak_memory_gib",
    "step_time_median_ms",
    "step_time_cv",
    "wall_s",
    "overhead_s",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchOutputs:
    records: list[TrialRecord]
    front: list[TrialRecord]
    recommended: TrialRecord | None
    memory_limit_gib: float
    paths: list[Path]


def write_outputs(plan: SearchPlan, study: optuna.Study) -> SearchOutputs:
    records = load_records(study)
    front = pareto_front(study)
    limit_gib = memory_limit_gib(plan.memory_budget_bytes, plan.config.headroom)
    best = recommend(front, limit_gib)
    out = plan.study_dir
    paths = [
        write_table(out / "trials.csv", records),
        write_table(out / "pareto.csv", front),
    ]
    stale = [out / "recommended.json", out / "recommended.py"]
    for path in stale:
        path.unlink(missing_ok=True)
    if best is not None:
        paths += export.write_recommendation(out, recommendation(plan, best, limit_gib))
    data = build_report_data(
        title=f"autotune: {plan.model.name} on {plan.device_name}",
        facts={
            "study": plan.study_name,
            "model": plan.model.name,
            "task": plan.task,
            "seq_len": str(plan.config.seq_len),
            "device": f"{plan.device} ({plan.device_name})",
            "space": plan.space.name,
            "batch mode": plan.batch_mode,
            **{f"note {i + 1}": note for i, note in enumerate(plan.space.notes)},
        },
        records=records,
        front=front,
        recommended=best,
        memory_budget_gib=plan.memory_budget_bytes / GIB,
        memory_limit_gib=limit_gib,
    )
    paths.append(write_report(data, out / "report.html"))
    return SearchOutputs(
        records=records, front=front, recommended=best, memory_limit_gib=limit_gib, paths=paths
    )


def write_table(path: Path, records: list[TrialRecord]) -> Path:
    knobs = [k for k in KNOBS if any(k in r.params for r in records)]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["number", *knobs, "status", *METRIC_COLUMNS, "reason"])
        for r in records:
            metrics = [_cell(getattr(r.result, m)) for m in METRIC_COLUMNS]
            params = [r.params.get(k, "") for k in knobs]
            writer.writerow([r.number, *params, r.status.value, *metrics, r.result.reason])
    return path


def recommendation(plan: SearchPlan, record: TrialRecord, limit_gib: float) -> dict[str, Any]:
    result = record.result
    return {
        "study": plan.study_name,
        "trial": record.number,
        "model": plan.model.name,
        "task": plan.task,
        "seq_len": plan.config.seq_len,
        "device": plan.device,
        "device_name": result.device_name,
        "params": record.params,
        "training_args": result.training_args,
        "model_kwargs": result.model_kwargs,
        "metrics": {
            "samples_per_s": result.samples_per_s,
            "tokens_per_s": result.tokens_per_s,
            "peak_memory_gib": result.peak_memory_gib,
            "step_time_median_ms": result.step_time_median_ms,
            "step_time_cv": result.step_time_cv,
        },
        "memory_budget_gib": plan.memory_budget_bytes / GIB,
        "memory_limit_gib": limit_gib,
        "batch_mode": plan.batch_mode,
    }


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"
