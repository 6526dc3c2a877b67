"""Everything a finished (or interrupted) search leaves in its study folder.

trials.csv        one row per trial
pareto.csv        the non-dominated feasible trials
recommended.json  TrainingArguments kwargs + model kwargs + measured metrics + baseline
recommended.py    a runnable snippet building those TrainingArguments
report.html       the interactive report

Each is written whole or not at all, never through a link (`autotune.common.output_files`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path
from typing import Any

from autotune.common.knobs import KNOBS, active, left_out
from autotune.common.layout import (
    ACCELERATE_YAML,
    DEEPSPEED_JSON,
    PARETO_CSV,
    RECOMMENDED_JSON,
    RECOMMENDED_PY,
    REPORT_HTML,
    TRIALS_CSV,
)
from autotune.common.output_files import check_owner, write_atomic
from autotune.outputs.export import render_cli, write_recommendation
from autotune.outputs.launch import accelerate_command, launch_command
from autotune.outputs.pareto import Picks
from autotune.outputs.report.data import build_report_data
from autotune.outputs.report.html import write_report
from autotune.outputs.script import render_script
from autotune.outputs.snapshot import StudySnapshot
from autotune.plan import conditions
from autotune.store.records import TrialRecord

METRIC_COLUMNS = (
    "samples_per_s",
    "tokens_per_s",
    "padding_share",
    "peak_memory_gib",
    "estimate_gib",
    "peak_allocated_gib",
    "nvml_used_gib",
    "alloc_retries",
    "mfu",
    "mfu_peak_tflops",
    "step_time_median_ms",
    "step_time_cv",
    "compile_s",
    "trained_seq_len",
    "wall_s",
    "overhead_s",
    "process_s",
    "imports_s",
    "cuda_init_s",
    "model_build_s",
    "data_s",
    "trainer_init_s",
    "warmup_s",
    "finish_s",
    "cpu_threads",
)
RANK_COLUMNS = ("rank_peak_memory_gib", "rank_params", "rank_model_state_bytes")
"""Each rank's figures, `;`-separated in rank order: columns only where a trial had ranks."""


def write_study_folder(snapshot: StudySnapshot, out: Path) -> list[Path]:
    """Every output file, from a snapshot of the study storage (also for `autotune report`);
    returns the paths written."""
    info, picks = snapshot.info, snapshot.picks
    check_owner(out)
    paths = [
        write_table(out / TRIALS_CSV, snapshot.records, snapshot),
        write_table(out / PARETO_CSV, snapshot.front, snapshot),
    ]
    script = flags = ""
    if picks.recommended is not None:
        script = render_script(info, picks.recommended)
        result = picks.recommended.result
        flags = render_cli(result.training_args, result.model_kwargs, result.environment, result)
        paths += write_recommendation(out, recommendation(snapshot), script)
    else:  # no trial to recommend now: a recommendation left from before would mislead
        for stale in (
            out / RECOMMENDED_JSON,
            out / RECOMMENDED_PY,
            out / DEEPSPEED_JSON,
            out / ACCELERATE_YAML,
        ):
            stale.unlink(missing_ok=True)
    data = build_report_data(snapshot, code=script, cli_flags=flags)
    paths.append(write_report(data, out / REPORT_HTML))
    return paths


def write_table(path: Path, records: list[TrialRecord], snapshot: StudySnapshot) -> Path:
    columns, rows = table(records, snapshot)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    return write_atomic(path, text.getvalue())


def table(
    records: list[TrialRecord], snapshot: StudySnapshot
) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns, and a row per trial: settings, status, figures, `noisy`, and
    `changes_training` (settings that change the training itself compared with the baseline,
    `;`-separated), and `other_versions` (measured under other versions than the study's: kept
    out of the front). trials.csv, pareto.csv and `SearchResult.to_dataframe()` hold these."""
    knobs = [k for k in KNOBS if any(k in r.params for r in records)]
    ranks = [c for c in RANK_COLUMNS if any(getattr(r.result, c) for r in records)]
    # On a cluster: the node(s) each trial ran on (a column only where one did).
    nodes = ["node"] if any(r.result.node for r in records) else []
    columns = [
        "number",
        "baseline",
        *knobs,
        "status",
        *METRIC_COLUMNS,
        *ranks,
        *nodes,
        "noisy",
        "changes_training",
        "reason",
        "other_versions",
    ]
    rows = [
        {
            "number": r.number,
            "baseline": r.baseline,
            **{k: _value(k, r.params) for k in knobs},
            "status": r.status.value,
            **{m: getattr(r.result, m) for m in METRIC_COLUMNS},
            **{c: _per_rank(getattr(r.result, c)) for c in ranks},
            **{c: r.result.node for c in nodes},
            "noisy": None if r.result.step_time_cv is None else snapshot.is_noisy(r),
            "changes_training": ";".join(c.setting for c in snapshot.math_changes(r)),
            "reason": r.result.reason,
            "other_versions": snapshot.other_versions(r),
        }
        for r in records
    ]
    return columns, rows


def _confidence(snapshot: StudySnapshot) -> dict[str, Any] | None:
    found = snapshot.confidence
    return None if found is None else {**dataclasses.asdict(found), "says": found.describe()}


def recommendation(snapshot: StudySnapshot) -> dict[str, Any]:
    """recommended.json: the recommended trial's settings and figures and how to launch it,
    the baseline and the other picks, the confirmation, and where the study came from."""
    info, picks = snapshot.info, snapshot.picks
    fastest = picks.recommended
    assert fastest is not None
    verified = snapshot.verifications.get(fastest.number)
    return {
        "study": info.study,
        # Where no figure was measured (executor=twin): what answered the trials.
        "simulated": snapshot.simulated_time,
        "trial": fastest.number,
        "model": info.model,
        "task": info.task,
        "seq_len": info.seq_len,
        "device": info.device,
        "device_name": fastest.result.device_name,
        # On a cluster: the node(s) it ran on.
        **({"node": fastest.result.node} if fastest.result.node else {}),
        "devices_per_trial": info.devices_per_trial or 1,
        # How recommended.py runs as the trial did: one process per device.
        "launch": launch_command(info, fastest.params),
        "accelerate_launch": accelerate_command(info, fastest.params),
        # Its settings trained for many steps (`autotune verify`), against its trial's figures.
        "verification": None if verified is None else verified.to_json(),
        # How many untried settings the search's model thinks could still beat this one.
        "search_confidence": _confidence(snapshot),
        **_settings_and_metrics(fastest, snapshot),
        "baseline": _baseline(picks.baseline, snapshot),
        # Where the HF defaults do not fit: the trial every speedup is against instead.
        "reference": _baseline(picks.reference, snapshot),
        "speedups_against": picks.yardstick_name.removeprefix("the "),
        "why": picks.why,
        "same_training": _pick(picks.same_training, snapshot),
        "fastest": _pick(picks.fastest, snapshot),
        "memory_saver": _pick(picks.saver, snapshot),
        "confirmation": confirmation(picks),
        "math_change_min_gain": info.math_change_min_gain,
        "memory_budget_gib": info.memory_budget_gib,
        "memory_limit_gib": info.memory_limit_gib,
        "batch_mode": info.batch_mode,
        "report_to": info.report_to,
        # Where the study came from: its command line, settings, versions, device, host, times.
        "provenance": conditions.provenance(list(snapshot.runs)),
    }


def _baseline(baseline: TrialRecord | None, snapshot: StudySnapshot) -> dict[str, Any] | None:
    if baseline is None:
        return None
    return {
        "trial": baseline.number,
        "status": baseline.status.value,
        "reason": baseline.result.reason,
        "params": baseline.params,
        "metrics": _metrics(baseline),
        "noisy": snapshot.is_noisy(baseline),
    }


def _pick(record: TrialRecord | None, snapshot: StudySnapshot) -> dict[str, Any] | None:
    if record is None:
        return None
    return {"trial": record.number, **_settings_and_metrics(record, snapshot)}


def _settings_and_metrics(record: TrialRecord, snapshot: StudySnapshot) -> dict[str, Any]:
    return {
        "params": record.params,
        "training_args": record.result.training_args,
        "model_kwargs": record.result.model_kwargs,
        # The adapter (LoraConfig kwargs) and the quantized base (BitsAndBytesConfig kwargs)
        # the trial trained; None: every weight trained, the base as built.
        "peft_config": record.result.peft_config,
        "quantization_config": record.result.quantization_config,
        "environment": record.result.environment,
        "metrics": _metrics(record),
        "noisy": snapshot.is_noisy(record),
        # samples/s over N times the best one-device (`single`) trial's; None without one.
        "scaling_efficiency": snapshot.scaling_efficiency(record),
        "speedup_vs_baseline": snapshot.picks.speedup(record),
        # The lowest and highest round's ratio when confirmed; None: one measurement each.
        "speedup_interval": snapshot.picks.speedup_interval(record),
        "confirmed": snapshot.picks.is_confirmed(record),
        "speedup_caveat": (
            None
            if snapshot.picks.is_confirmed(record)
            else snapshot.picks.noise_caveat(record) or None
        ),
        # Differences from the baseline that change the training, not only its speed.
        "changes_training": [dataclasses.asdict(c) for c in snapshot.math_changes(record)],
    }


def _value(knob: str, params: dict[str, Any]) -> Any:
    """The knob's value in a trial: as set, else what training did about it where it applies
    (the baseline's loader workers: 0), else nothing (blank)."""
    if knob in params:
        return params[knob]
    return left_out(knob) if active(knob, params) else None


def confirmation(picks: Picks) -> dict[str, Any] | None:
    """Each confirmed trial's figures round by round, their median and interval, and its
    ratio to the baseline; None when the picks were not confirmed."""
    confirmed = picks.confirmed
    if confirmed is None:
        return None
    roles = {
        "baseline": picks.baseline,
        "recommended": picks.recommended,
        "same_training": picks.same_training,
        "fastest": picks.fastest,
        "memory_saver": picks.saver,
    }
    trials = {}
    for number, rounds in sorted(confirmed.samples_per_s.items()):
        speedup = None
        if picks.baseline is not None and (ratio := confirmed.ratio(number, picks.baseline.number)):
            speedup = {"median": ratio[0], "interval": [ratio[1], ratio[2]]}
        trials[str(number)] = {
            "roles": [role for role, r in roles.items() if r is not None and r.number == number],
            "samples_per_s": list(rounds),
            "median_samples_per_s": confirmed.median(number),
            "interval_samples_per_s": list(confirmed.interval(number) or ()) or None,
            "peak_memory_gib": list(confirmed.peak_memory_gib.get(number, ())),
            "speedup_vs_baseline": speedup,
            "tied_with": [r.number for r in picks.ties(r)] if (r := _record(picks, number)) else [],
        }
    return {
        "rounds": confirmed.rounds,
        "order": "A B C D, D C B A, ... (each a fresh trial process)",
        "wall_s": confirmed.wall_s,
        "trials": trials,
    }


def _record(picks: Picks, number: int) -> TrialRecord | None:
    chosen = (picks.baseline, picks.recommended, picks.same_training, picks.fastest, picks.saver)
    return next((r for r in chosen if r is not None and r.number == number), None)


RECOMMENDATION_METRICS = (
    "samples_per_s", "tokens_per_s", "padding_share", "peak_memory_gib", "step_time_median_ms",
    "step_time_cv", "mfu", "n_params", "trainable_params", "rank_peak_memory_gib", "rank_params",
    "rank_model_state_bytes",
)  # fmt: skip
"""`rank_*`: each rank's own peak and parameters on several devices a trial; None on one.
`trainable_params`: those that trained (an adapter's, on a frozen base)."""


def _metrics(record: TrialRecord) -> dict[str, Any]:
    return {m: getattr(record.result, m) for m in RECOMMENDATION_METRICS}


def _per_rank(values: list[Any] | None) -> str | None:
    if not values:
        return None
    return ";".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in values)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else value
