"""Trials as the user sees them: one `TrialRecord` per Optuna trial, read back from storage.

The study loop stores each trial's complete knob values and its `TrialResult` as user attrs, so
every output (tables, recommendation, report) can be rebuilt from the storage alone.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import optuna

from autotune.errors import StudyError
from autotune.trial import Status, TrialResult

PARAMS_ATTR = "params"
RESULT_ATTR = "result"
BASELINE_ATTR = "baseline"
RUN_ATTR = "run"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunInfo:
    """What a study was run for, stored with it so outputs can be rebuilt from storage alone."""

    study: str
    model: str
    model_config: dict[str, Any]
    task: str
    seq_len: int
    device: str
    device_name: str
    space: str
    space_notes: list[str]
    effective_batch_size: int | None
    """batch_size x grad_accum when fixed by `effective_batch_size=`; None when it varies."""
    memory_budget_bytes: int
    """Resolved once when the study was made; every trial is judged against it."""
    headroom: float
    noise_cv: float

    @property
    def batch_mode(self) -> str:
        return batch_mode(self.effective_batch_size)

    @classmethod
    def of(cls, study: optuna.Study) -> RunInfo:
        if RUN_ATTR not in study.user_attrs:
            raise StudyError(f"study {study.study_name} was not made by autotune search")
        stored = dict(study.user_attrs[RUN_ATTR])
        if "batch_mode" in stored:  # studies made before the setting itself was stored
            fixed = re.match(r"effective batch (\d+)", stored.pop("batch_mode"))
            stored["effective_batch_size"] = int(fixed.group(1)) if fixed else None
        return cls(**stored)


def batch_mode(effective_batch_size: int | None) -> str:
    """How a study treats the effective batch, in words."""
    if effective_batch_size:
        return f"effective batch {effective_batch_size} (grad_accum derived)"
    return "grad_accum as the space says (effective batch varies)"


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRecord:
    number: int
    params: dict[str, Any]
    result: TrialResult
    baseline: bool = False
    """The HF-defaults trial every speedup is measured against."""

    @property
    def status(self) -> Status:
        return self.result.status


def store_run_info(study: optuna.Study, info: RunInfo) -> None:
    study.set_user_attr(RUN_ATTR, asdict(info))


def load_records(study: optuna.Study) -> list[TrialRecord]:
    """Finished trials that carry a result, oldest first."""
    return [
        record_of(t)
        for t in study.get_trials(deepcopy=False)
        if t.state.is_finished() and RESULT_ATTR in t.user_attrs
    ]


def record_of(trial: optuna.trial.FrozenTrial) -> TrialRecord:
    return TrialRecord(
        number=trial.number,
        params=dict(trial.user_attrs[PARAMS_ATTR]),
        result=TrialResult.from_dict(trial.user_attrs[RESULT_ATTR]),
        baseline=bool(trial.user_attrs.get(BASELINE_ATTR)),
    )


_SHORT_NAMES = {
    "batch_size": "bs",
    "grad_accum": "ga",
    "gradient_checkpointing": "gc",
    "dataloader_num_workers": "workers",
    "attn_implementation": "attn",
    "dataloader_pin_memory": "pin",
    "torch_compile": "compile",
    "compile_mode": "mode",
}


def describe_params(params: dict[str, Any]) -> str:
    """`bs=16 ga=2 gc=on bf16 adamw_torch`: a trial's settings in one short line."""
    parts = []
    for key, value in params.items():
        if key in ("precision", "optim"):
            parts.append(str(value))
        elif isinstance(value, bool):
            parts.append(f"{_SHORT_NAMES.get(key, key)}={'on' if value else 'off'}")
        else:
            parts.append(f"{_SHORT_NAMES.get(key, key)}={value}")
    return " ".join(parts)
