"""`autotune search`: plan, run the study with progress, write and show the outputs."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import optuna
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from autotune import hardware
from autotune.cli._console import Reporter, console
from autotune.config import help_rows, load_config
from autotune.knobs import describe_params
from autotune.plan import SearchPlan, make_plan
from autotune.records import StudySnapshot, TrialRecord, load_records, read_snapshot
from autotune.runner import Launcher
from autotune.storage import locked_study
from autotune.study import run_search
from autotune.study_folder import write_study_folder
from autotune.trial import Status
from autotune.units import format_bytes, format_gib


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "search",
        help="tune training settings with short real training runs",
        description="Run an Optuna study over training settings; each trial is a short real "
        "training run in a process of its own. Settings are key=value.",
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="autotune search model=NAME [key=value ...]",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.set_defaults(handler=run)


def _settings_help() -> str:
    rows = help_rows()
    key_width = max(len(r[0]) for r in rows) + 2
    kind_width = min(max(len(r[1]) for r in rows), 24) + 2
    lines = ["settings (key=value; default in brackets):"]
    for key, kind, default, meaning in rows:
        head = f"  {key:<{key_width}}{kind:<{kind_width}}"
        if len(head) > key_width + kind_width + 2:
            head += "\n" + " " * (key_width + kind_width + 2)
        text = textwrap.fill(f"{meaning} [{default}]", width=100 - key_width - kind_width - 2)
        lines.append(head + text.replace("\n", "\n" + " " * (key_width + kind_width + 2)))
    lines += ["", "example:", "  autotune search model=bert-large-uncased seq_len=512 n_trials=30"]
    return "\n".join(lines)


NOTHING_TO_RECOMMEND = 3
"""Exit code of a search that finished but has no trial to recommend."""


def run(args: argparse.Namespace) -> int:
    config = load_config(args.overrides)
    report = Reporter(quiet=config.quiet)
    with console.status("probing the device"):
        device_info = hardware.probe()
    plan = make_plan(config, device_info)
    with locked_study(plan) as (study, plan):
        snapshot, paths = _search(report, plan, study, args.launcher)
    _print_outputs(report, plan, snapshot, paths)
    return 0 if snapshot.picks.fastest is not None else NOTHING_TO_RECOMMEND


def _search(
    report: Reporter, plan: SearchPlan, study: optuna.Study, launcher: Launcher | None
) -> tuple[StudySnapshot, list[Path]]:
    config = plan.config
    report.open_log(plan.study_dir / "search.log")
    _print_plan(report, plan)
    done_before = len(load_records(study))
    if done_before:
        report.line(f"resuming: {done_before} finished trial(s) kept")

    progress = Progress(
        TextColumn("trials"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[best]}"),
        console=console,
        transient=True,
        disable=config.quiet or not console.is_terminal,  # a bar only for a person watching
    )
    task = progress.add_task("trials", total=config.n_trials, completed=done_before, best="")
    best = [0.0]

    def on_trial_end(record: TrialRecord) -> None:
        done = int(progress.tasks[0].completed) + 1
        if record.status is Status.OK:
            best[0] = max(best[0], record.result.samples_per_s)
        progress.update(task, completed=done, best=f"best {best[0]:.2f} samples/s")
        report.line(_trial_line(record, done, config.n_trials))

    try:
        with progress:
            stopped = run_search(
                plan,
                study,
                on_trial_end=on_trial_end,
                on_retry=lambda n: report.line(
                    f"trial {n} was interrupted: its settings run again first"
                ),
                launcher=launcher,
            )
        report.line(f"search ended: {stopped}")
    finally:
        # Ctrl-C included: what finished is written before the process ends.
        snapshot = read_snapshot(study)
        paths = write_study_folder(snapshot, plan.study_dir)
    return snapshot, paths


def _print_plan(report: Reporter, plan: SearchPlan) -> None:
    report.line(
        f"study [bold]{escape(plan.study_name)}[/]: {escape(plan.model.name)} ({plan.info.task}), "
        f"seq_len {plan.config.seq_len}, {plan.device} ({escape(plan.info.device_name)}), space "
        f"{escape(plan.space.name)}, budget {format_bytes(plan.info.memory_budget_bytes)}, "
        f"{plan.config.n_trials} trials -> {escape(str(plan.study_dir))}"
    )
    report.line(f"batch: {plan.info.batch_mode}")
    for note in plan.space.notes:
        report.line(f"[yellow]note:[/] {note}")


def _trial_line(record: TrialRecord, done: int, total: int) -> str:
    r = record.result
    status = r.status.value if r.status is Status.OK else f"[red]{r.status.value}[/]"
    head = f"[{done}/{total}] trial {record.number:>3} {status:<7} {describe_params(record.params)}"
    if r.status is Status.OK:
        return (
            f"{head}: {r.samples_per_s:.2f} samples/s, {format_gib(r.peak_memory_gib, 3)}, "
            f"step CV {r.step_time_cv:.0%}, {r.wall_s:.1f} s"
        )
    return f"{head}: {escape(r.reason)}"


def _print_outputs(
    report: Reporter, plan: SearchPlan, snapshot: StudySnapshot, paths: list[Path]
) -> None:
    picks = snapshot.picks
    table = Table(title="Pareto front (fastest first)")
    for column in ("trial", "settings", "samples/s", "x baseline", "peak GiB", "MFU", "step CV"):
        table.add_column(column, justify="left" if column == "settings" else "right")
    for record in snapshot.front:
        r = record.result
        marks = ((picks.fastest, " *"), (picks.saver, " m"))
        mark = "".join(m for pick, m in marks if pick is not None and pick.number == record.number)
        table.add_row(
            f"{record.number}{mark}",
            describe_params(record.params),
            f"{r.samples_per_s:.2f}",
            _times(picks.speedup(record)),
            format_gib(r.peak_memory_gib, 3).removesuffix(" GiB"),
            "n/a" if r.mfu is None else f"{r.mfu:.1%}",
            f"{r.step_time_cv:.0%}" + (" noisy" if r.step_time_cv > plan.config.noise_cv else ""),
        )
    if not report.quiet:
        console.print(table)
    report.line(f"baseline (HF defaults): {picks.describe_baseline()}")
    if picks.baseline is not None and picks.baseline.result.samples_per_s is None:
        report.line("[yellow]the HF defaults did not run here, so there is no speedup figure[/]")
    if picks.fastest is None:
        report.line(
            f"[yellow]no successful trial stays below {format_gib(snapshot.info.memory_limit_gib)} "
            f"(budget less headroom): nothing to recommend (exit code {NOTHING_TO_RECOMMEND})[/]"
        )
    else:
        fastest, saver = picks.fastest, picks.saver
        report.line(
            f"recommended (*): {picks.describe(fastest)}: {describe_params(fastest.params)}"
        )
        if saver.number == fastest.number:
            report.line(f"memory saver (m): {picks.describe_saver()}")
        else:
            report.line(
                f"memory saver (m): {picks.describe(saver)}: {describe_params(saver.params)}"
            )
    report.line(always=True, markup="wrote " + ", ".join(str(p) for p in paths))


def _times(speedup: float | None) -> str:
    return "n/a" if speedup is None else f"{speedup:.2f}x"
