"""What a person watching a search sees: the plan, a line per trial, the running trial's step
and ETA, and at the end the front and the picks. Shared by the command line and the Python API
(`autotune.search` prints the same lines in a notebook); `autotune report` prints the outcome.

On a terminal a progress bar stands over a live line for the running trial; piped output (and
search.log, always) gets plain lines only, one when a trial starts and one when it ends.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from autotune.common import trial
from autotune.common.layout import SEARCH_LOG, WORKER_LOG, trial_dir
from autotune.common.trial import Status, TrialResult
from autotune.common.trial_settings import describe_params, effective_batch
from autotune.common.units import format_bytes, format_gib
from autotune.outputs.confirm import picks_to_confirm
from autotune.outputs.export import accelerate_command, launch_command
from autotune.outputs.pareto import NOTHING_TO_RECOMMEND, Picks
from autotune.outputs.report.data import shared_mfu_peak
from autotune.outputs.snapshot import StudySnapshot, trained_note
from autotune.plan.plan import SearchPlan
from autotune.plan.run_info import RunInfo
from autotune.store.records import Ending, TrialRecord
from autotune.study.cost import remaining_s
from autotune.study.observer import SearchObserver

# Piped output (logs, CI) gets long lines instead of rich's 80-column default, so names and
# settings are never cut or folded.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
errors = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)


class Reporter:
    """Prints to the terminal (unless quiet) and appends the same lines, plain, to a log."""

    def __init__(self, *, quiet: bool = False, log_path: Path | None = None) -> None:
        self.quiet = quiet
        self.log_path = log_path

    def open_log(self, path: Path) -> None:
        self.log_path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def line(self, markup: str, *, always: bool = False, log_only: bool = False) -> None:
        if (always or not self.quiet) and not log_only:
            console.print(markup, soft_wrap=True)
        if self.log_path is not None:
            self._append(self.log_path, Text.from_markup(markup).plain + "\n")

    def _append(self, path: Path, text: str) -> None:
        # O_NOFOLLOW: a link planted at the log's name is refused, not appended through.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        try:
            with open(os.open(path, flags, 0o644), "a") as log:
                log.write(text)
        except OSError as exc:  # a full disk: the search goes on, its lines on the terminal
            errors.print(
                f"[yellow]warning:[/] cannot append to {escape(str(path))}: "
                f"{exc.strerror}; the search goes on without it"
            )
            self.log_path = None


class _BarAndTrial(Progress):
    """The trials bar with a line per running trial under it (rich's documented extension
    point for extra renderables)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.running: dict[int, str] = {}  # first: rich renders while it initialises
        super().__init__(*args, **kwargs)

    def get_renderables(self) -> Any:
        yield self.make_tasks_table(self.tasks)
        for line in self.running.values():
            yield Text(line, overflow="ellipsis", no_wrap=True)


class TerminalView(SearchObserver):
    """Shows one search as `autotune.api.run` tells it (its trials, whichever worker runs
    them). `log_name`: the plain log in the study folder (None: none)."""

    def __init__(self, *, quiet: bool, log_name: str | None = SEARCH_LOG) -> None:
        self.report = Reporter(quiet=quiet)
        self.log_name = log_name
        self.live = not quiet and console.is_terminal  # a bar only for a person watching
        self.bar = _BarAndTrial(
            TextColumn("trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[best]}"),
            TextColumn("{task.fields[eta]}"),
            console=console,
            transient=True,
            disable=not self.live,
        )
        self.task = None
        self.total = 0
        self.confirm_rounds = 0
        self.trainer_info: RunInfo | None = None
        self.best = 0.0
        self.running_params: dict[int, str] = {}
        self.records: list[TrialRecord] = []
        self.said_at: dict[int, float] = {}
        """Trial number -> when its progress was last printed (piped output)."""
        self.steps = 0
        self.space_batch = 8.0
        self.floor: tuple[float, float] | None = None

    def busy(self, what: str) -> contextlib.AbstractContextManager[Any]:
        return console.status(what) if self.live else contextlib.nullcontext()

    def planned(self, plan: SearchPlan, done_before: int) -> None:
        if self.log_name is not None:
            self.report.open_log(plan.study_dir / self.log_name)
        self.report.line(
            f"study [bold]{escape(plan.study_name)}[/]: {escape(plan.model.name)} "
            f"({plan.info.task}), seq_len {plan.config.seq_len}, {plan.device} "
            f"({escape(plan.info.device_name)}), space {escape(plan.space.name)}, budget "
            f"{format_bytes(plan.info.memory_budget_bytes)}, {plan.config.n_trials} trials "
            f"-> {escape(_shown(plan.study_dir))}"
        )
        self.report.line(f"batch: {plan.info.batch_mode}")
        for note in plan.space.notes:
            self.report.line(f"[yellow]note:[/] {escape(note)}")
        if len(plan.slots) > 1:
            owned = ", ".join(slot.describe() for slot in plan.slots)
            self.report.line(f"{len(plan.slots)} workers on this study: {owned}")
        if done_before:
            self.report.line(f"resuming: {done_before} finished trial(s) kept")
        for line in expectations(plan):
            self.report.line(line, always=line.startswith("[yellow]warning"))
        self.confirm_rounds = plan.config.confirm_rounds
        self.trainer_info = plan.info if plan.info.trainer is not None else None
        self.total = plan.config.n_trials
        self.steps = plan.config.warmup_steps + plan.config.measure_steps
        self.space_batch = space_batch(plan)
        self.floor = plan.compute_floor_s(plan.baseline)
        self.task = self.bar.add_task(
            "trials", total=self.total, completed=done_before, best="", eta=""
        )

    def _slower_than_probed(self, baseline: TrialRecord) -> None:
        """Said once, after the baseline: its steps computed at under SLOW_SHARE of the rate
        the device's probe (or datasheet) promised."""
        result = baseline.result
        if self.floor is None or not result.samples_per_s:
            return
        floor_s, rate = self.floor
        steps_s = self.steps * effective_batch(baseline.params) / result.samples_per_s
        if floor_s < SLOW_SHARE * steps_s:
            self.report.line(
                f"[yellow]note:[/] the baseline computed at {floor_s / steps_s:.1%} of the "
                f"{rate:.3g} TFLOP/s this device was probed at: slower than expected (other "
                "processes on its cores, a throttled clock?); every time here is what it "
                "measures now",
                always=True,
            )

    def watching(self) -> contextlib.AbstractContextManager[Any]:
        return self.bar

    def retried(self, number: int) -> None:
        self.report.line(f"trial {number} was interrupted: its settings run again first")

    def trial_started(self, number: int, params: dict[str, Any]) -> None:
        self.running_params[number] = f"trial {number}: {describe_params(params)}"
        self.said_at[number] = time.monotonic()
        if self.live:
            self.bar.running[number] = self.running_params[number] + ", starting"
            self.report.line(f"trial {number} started: {describe_params(params)}", log_only=True)
        else:
            self.report.line(f"trial {number} started: {describe_params(params)}")

    def progress(self, number: int, progress: trial.Progress) -> None:
        if number not in self.running_params:
            return
        if self.live:
            self.bar.running[number] = f"{self.running_params[number]}, {_step(progress)}"
            self.bar.refresh()
        elif time.monotonic() - self.said_at.get(number, time.monotonic()) >= PIPED_EVERY_S:
            # Piped (a log, a batch job): a long trial's step and ETA now and then.
            self.report.line(escape(f"trial {number}: {_step(progress)}"))
            self.said_at[number] = time.monotonic()

    def runs_code(self, what: str) -> None:
        self.report.line(escape(what))

    def warned(self, message: str) -> None:
        self.report.line(f"[yellow]warning:[/] {escape(message)}", always=True)

    def lost(self, number: int) -> None:
        self._drop(number)
        self.report.line(
            f"[yellow]trial {number} was failed as stale by another worker while it ran here "
            "(no heartbeat for stale_after): its result is dropped, a retry runs its settings[/]"
        )

    def worker_failed(self, index: int, how: str, log_tail: str) -> None:
        self.report.line(f"[red]worker {index} ended: {how}[/]; the others go on")
        for line in log_tail.splitlines():
            self.report.line(f"  {escape(line)}")

    def _drop(self, number: int) -> None:
        self.running_params.pop(number, None)
        self.bar.running.pop(number, None)

    def trial_ended(self, record: TrialRecord) -> None:
        self._drop(record.number)
        # A skip runs nothing and uses up no trial.
        done = int(self.bar.tasks[0].completed) + (record.status is not Status.SKIPPED)
        if record.status is Status.OK and record.result.samples_per_s:
            self.best = max(self.best, record.result.samples_per_s)
        self.bar.update(self.task, completed=done, best=f"best {self.best:.2f} samples/s")
        self.report.line(_trial_line(record, done, self.total))
        if self.trainer_info is not None and record.status is Status.OK:
            note = trained_note(self.trainer_info, [record])
            self.trainer_info = None  # said once, from the first successful trial
            if note:
                self.report.line(f"[yellow]note:[/] {escape(note)}")
        self.records.append(record)
        left = remaining_s(self.records, self.steps, self.space_batch, self.total - done)
        self.bar.update(self.task, eta=_eta(left))
        if record.baseline and record.status is Status.OK and record.result.wall_s:
            self.report.line(
                _pace(
                    record,
                    left[0] if left else None,
                    self.total - done,
                    self.space_batch,
                    self.confirm_rounds,
                )
            )
            self._slower_than_probed(record)

    def ended(self, stopped: str) -> None:
        self.report.line(f"search ended: {stopped}")

    def confirming(self, picks: int, rounds: int, expected_s: float) -> None:
        self.total, self.done = picks * rounds, 0
        self.report.line(
            f"confirming: the baseline and the picks ({picks} trials) run again, {rounds} "
            f"rounds interleaved: {self.total} runs, about {expected_s:.0f} s "
            "(confirm_rounds=0 skips this)"
        )

    def confirmed_run(self, round_number: int, record: TrialRecord, result: TrialResult) -> None:
        self.done += 1
        if result.status is Status.OK:
            figure = (
                f"{result.samples_per_s:.2f} samples/s, {format_gib(result.peak_memory_gib, 3)}"
            )
        else:
            figure = f"[red]{result.status.value}[/]: {escape(result.reason)}"
        self.report.line(
            f"{escape(f'[confirm {self.done}/{self.total}]')} round {round_number}, "
            f"trial {record.number}: {figure}"
        )


def space_batch(plan: SearchPlan) -> float:
    """The median samples a step of the space's settings: its batch sizes times its
    accumulation steps (or the fixed effective batch)."""
    if plan.rules.effective_batch_size:
        return float(plan.rules.effective_batch_size)
    knobs = plan.space.knobs

    def median(name: str, default: int) -> float:
        knob = knobs.get(name)
        return statistics.median(knob.choices) if knob is not None else default

    return median("batch_size", 8) * median("grad_accum", 1)


def expectations(plan: SearchPlan) -> list[str]:
    """Before the first trial: the least time a trial and the search can take at the fastest
    this device computes, and a warning when the baseline cannot fit or cannot finish."""
    lines = []
    baseline, config = plan.baseline, plan.config
    floor = plan.compute_floor_s(baseline)
    if floor is not None:
        seconds, rate = floor
        source = "this CPU's fp32 matmul rate, measured"
        if config.peak_tflops or plan.device == "cuda":
            source = "peak_tflops=" if config.peak_tflops else "the GPU's datasheet peak"
        lines.append(
            f"time: the baseline's {config.warmup_steps + config.measure_steps} steps need at "
            f"least {_duration(seconds)} of compute at {rate:.3g} TFLOP/s ({source}; training "
            f"reaches a fraction of it); {config.n_trials} trials, at least "
            f"{_duration(seconds * config.n_trials)}; the baseline's own time will tell"
        )
        if seconds > config.trial_timeout:
            lines.append(
                f"[yellow]warning:[/] the baseline needs at least {_duration(seconds)} of "
                f"compute, over trial_timeout={_duration(config.trial_timeout)}: it and every "
                "larger trial will time out; raise trial_timeout, or lower measure_steps or "
                "seq_len"
            )
    limit, estimate_gib = plan.estimate_limit_gib, plan.estimate_gib(baseline)
    if limit is not None and estimate_gib is not None and estimate_gib > limit:
        lines.append(
            f"[yellow]warning:[/] the baseline (HF defaults) is estimated at "
            f"{estimate_gib:.2f} GiB, over the {limit:.2f} GiB {plan.estimate_limit_source}: it "
            "will be skipped, and no speedup can be measured against it; lower seq_len, or "
            "search where it fits"
        )
    return lines


def _pace(
    baseline: TrialRecord, left_s: float | None, remaining: int, batch: float, confirm_rounds: int
) -> str:
    wall_s = baseline.result.wall_s or 0.0
    confirming = (
        (f", the confirmation about {_duration(wall_s * confirm_rounds * 4)} at most")
        if confirm_rounds
        else ""
    )
    return (
        f"the baseline took {wall_s:.1f} s: at its pace a sample, the {remaining} remaining "
        f"trials (the space's median batch: {batch:g} samples a step) take about "
        f"{_duration(left_s or 0.0)}{confirming}; less where they train faster a sample, as "
        "16-bit and larger batches often do (the bar's ETA follows the trials, with its range "
        "at the fastest and slowest pace measured)"
    )


PIPED_EVERY_S = 60.0
"""How often a running trial's progress is printed when the output is not a terminal."""
SLOW_SHARE = 0.02
"""A baseline computing at under this share of the device's probed rate is said to be slow:
training reaches 5-50% of it (the quick start's baseline on an idle 2-core Xeon: 25%)."""


def _eta(left: tuple[float, float, float] | None) -> str:
    """`ETA 40 s (25-60 s)`: the trials left at the median, fastest and slowest pace."""
    if left is None:
        return ""
    likely, least, most = left
    spread = f" ({_duration(least)}-{_duration(most)})" if most > least * 1.1 else ""
    return f"ETA {_duration(likely)}{spread}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _step(progress: trial.Progress) -> str:
    """`step 3/13 (warm-up), ETA 8 s`, or the stage before training."""
    if progress.stage is trial.Stage.BUILDING:
        return "building the model and the Trainer"
    eta = "" if progress.eta_s is None else f", ETA {progress.eta_s:.0f} s"
    return f"step {progress.step}/{progress.total_steps} ({progress.stage}){eta}"


def _trial_line(record: TrialRecord, done: int, total: int) -> str:
    r = record.result
    status = r.status.value if r.status is Status.OK else f"[red]{r.status.value}[/]"
    head = f"[{done}/{total}] trial {record.number:>3} {status:<7} {describe_params(record.params)}"
    if r.status is Status.OK:
        # Each figure where the record has it (one another process recorded may lack some).
        padding = f" ({r.padding_share:.0%} padding)" if r.padding_share else ""
        figures = [
            f"{r.samples_per_s:.2f} samples/s{padding}" if r.samples_per_s else None,
            format_gib(r.peak_memory_gib, 3) if r.peak_memory_gib is not None else None,
            f"step CV {r.step_time_cv:.0%}" if r.step_time_cv is not None else None,
            f"{r.wall_s:.1f} s" if r.wall_s is not None else None,
        ]
        return f"{head}: {', '.join(f for f in figures if f)}"
    return f"{head}: {escape(r.reason)}"


def _why_nothing_to_recommend(snapshot: StudySnapshot) -> str:
    """The budget, unless every trial that ran failed the same way for another reason (bad
    data, a broken factory): then that reason, which no other budget would change."""
    ran = [r for r in snapshot.records if r.status not in (Status.SKIPPED, Status.INTERRUPTED)]
    kinds = {(r.status, r.result.reason.split(":", 1)[0]) for r in ran}
    if len(kinds) == 1 and ran[0].status not in {Status.OK, *trial.OUT_OF_MEMORY}:
        first = ran[0]
        reason = (first.result.reason.strip().splitlines() or ["no reason given"])[0][:200]
        log = trial_dir(Path(), first.number) / WORKER_LOG
        return (
            f"every trial that ran ended {first.status} ({reason}); see {log} in the study folder"
        )
    limit = format_gib(snapshot.info.memory_limit_gib)
    return f"no successful trial stays below {limit} (budget less headroom)"


def _confirmed_cells(picks: Picks, record: TrialRecord) -> tuple[str, str]:
    """The confirmed median samples/s and ratio to the baseline, each with its interval; "-"
    for a trial not confirmed."""
    confirmed = picks.confirmed
    assert confirmed is not None
    median, spread = confirmed.median(record.number), confirmed.interval(record.number)
    if median is None or spread is None:
        return "-", "-"
    figure = f"{median:.2f}" + escape(f" [{spread[0]:.2f}-{spread[1]:.2f}]")
    speedup, interval = picks.speedup(record), picks.speedup_interval(record)
    if speedup is None or interval is None:
        return figure, "-"
    times = f"{speedup:.2f}x" + (
        "" if record.baseline else escape(f" [{interval[0]:.2f}-{interval[1]:.2f}]")
    )
    return figure, times


def print_outcome(report: Reporter, snapshot: StudySnapshot) -> None:
    """The front table, the baseline, the picks with their caveats and what in them changes
    the training (after a search, and for `autotune report`)."""
    picks = snapshot.picks
    table = Table(title="Pareto front (fastest first)")
    peak = shared_mfu_peak(snapshot.front)  # one denominator for every trial, named
    mfu = f"MFU of {peak:g} TFLOP/s" if peak else "MFU"
    # One kind of figure a column: the trials' own measurements, then (confirmed picks) the
    # medians of the confirmation rounds.
    confirmed = picks.confirmed
    again = ("confirmed samples/s", "confirmed x baseline") if confirmed is not None else ()
    columns = (
        "trial",
        "settings",
        "samples/s",
        "x baseline",
        *again,
        "peak GiB",
        mfu,
        "step CV",
        "changes training",
    )
    for column in columns:
        table.add_column(
            column, justify="left" if column in ("settings", "changes training") else "right"
        )
    for record in snapshot.front:
        r = record.result
        marks = ((picks.recommended, " *"), (picks.saver, " m"))
        mark = "".join(m for pick, m in marks if pick is not None and pick.number == record.number)
        measured = picks.measured_speedup(record)
        table.add_row(
            f"{record.number}{mark}",
            escape(describe_params(record.params)),
            f"{r.samples_per_s:.2f}",
            "n/a" if measured is None else f"{measured:.2f}x",
            *(_confirmed_cells(picks, record) if confirmed is not None else ()),
            format_gib(r.peak_memory_gib, 3).removesuffix(" GiB"),
            "n/a" if r.mfu is None else f"{r.mfu:.1%}",
            f"{r.step_time_cv:.0%}" + (" noisy" if snapshot.is_noisy(record) else ""),
            ", ".join(c.setting for c in snapshot.math_changes(record)) or "-",
        )
    if not report.quiet and snapshot.front:  # all out of memory: the lines below say so
        console.print(table)
        if confirmed is not None:
            report.line(
                "samples/s and x baseline: each trial's own measurement (over the "
                "baseline trial's); confirmed: the median "
                + escape("[lowest-highest]")
                + " of the confirmation rounds, and of "
                "their round-by-round ratios to the baseline"
            )
    if confirmed is not None:
        report.line(
            f"confirmed: the baseline and the picks ran again {confirmed.rounds} times, "
            f"interleaved, in {confirmed.wall_s:.0f} s; their figures below are medians "
            + escape("[lowest-highest round]")
        )
    elif snapshot.front and picks_to_confirm(snapshot):
        report.line(
            "[yellow]not confirmed: each figure is one short measurement[/] "
            "(autotune confirm STUDY_DIR measures the picks again)"
        )
    elif snapshot.front:
        report.line("not confirmed: a single trial measured ok, nothing to compare it with")
    if (ended := snapshot.ended) is not None and ended.how is not Ending.COMPLETE:
        resume = "; the same command resumes it" if ended.how is Ending.INTERRUPTED else ""
        report.line(f"[yellow]the search was {escape(ended.describe())}{resume}[/]")
    if snapshot.confidence is not None:
        report.line(f"search confidence: {escape(snapshot.confidence.describe())}")
    report.line(f"baseline (HF defaults): {escape(picks.describe_baseline())}")
    if (found := snapshot.anytime()) is not None:
        baseline = picks.baseline.result.samples_per_s if picks.baseline is not None else None
        report.line(f"found: {escape(found.describe(baseline))}")
    if picks.baseline is not None and picks.baseline.result.samples_per_s is None:
        report.line("[yellow]the HF defaults did not run here, so there is no speedup figure[/]")
    if picks.recommended is None:
        if ended is not None and ended.how is Ending.INTERRUPTED:  # its exit code is the signal's
            report.line(
                f"[yellow]{escape(_why_nothing_to_recommend(snapshot))}: nothing to "
                "recommend yet[/]"
            )
            return
        report.line(
            f"[yellow]{escape(_why_nothing_to_recommend(snapshot))}: nothing to "
            f"recommend (exit code {NOTHING_TO_RECOMMEND})[/]"
        )
        return
    shown = [("recommended (*)", picks.recommended)]
    if picks.same_training is not None:
        shown.append(("same-training pick", picks.same_training))
    if picks.fastest is not None:
        shown.append(("fastest", picks.fastest))
    shown.append(("memory saver (m)", picks.saver))
    said: dict[int, str] = {}
    for label, record in shown:
        if record is None:
            continue
        if record.number in said:
            if label.startswith("memory") and record is picks.recommended:
                report.line(f"{label}: {picks.describe_saver()}")
            else:
                report.line(f"{label}: the same trial as {said[record.number]}")
            continue
        said[record.number] = label.removesuffix(" (*)").removesuffix(" (m)")
        report.line(f"{label}: {picks.describe(record)}: {escape(describe_params(record.params))}")
        if record is picks.recommended:
            report.line(f"  why: {escape(picks.why)}")
            if (efficiency := snapshot.scaling_efficiency(record)) is not None:
                report.line(
                    f"  scaling efficiency {efficiency:.0%}: its samples/s over "
                    f"{snapshot.info.devices_per_trial} times the best single-device "
                    "trial's"
                )
            if (accelerate := accelerate_command(snapshot.info, record.params)) is not None:
                launch = launch_command(snapshot.info, record.params)
                report.line(f"  run it as its trials ran, in the study folder: {escape(launch)}")
                report.line(f"  or through accelerate: {escape(accelerate)}")
        if (payoff := snapshot.compile_payoff(record)) is not None:
            report.line(f"  {escape(payoff)}")
        for change in snapshot.math_changes(record):
            report.line(f"  [yellow]changes the training:[/] {escape(change.describe())}")
    shown_picks = (picks.recommended, picks.fastest)
    changes = {c.setting for r in shown_picks if r for c in snapshot.math_changes(r)}
    if "effective_batch_size" in changes:
        report.line(
            "for a real run, search with effective_batch_size=N (the batch your learning rate "
            "was tuned for): every trial then keeps it"
        )


def print_paths(report: Reporter, paths: list[Path]) -> None:
    report.line(always=True, markup="wrote " + escape(shown_paths(paths)))


def shown_paths(paths: list[Path]) -> str:
    """`reports/s/trials.csv, ...`: as the end of a search names what it wrote."""
    return ", ".join(_shown(p) for p in paths)


def _shown(path: Path) -> str:
    """Relative to the working folder when inside it (`reports/...`), else absolute."""
    path = path.resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)
