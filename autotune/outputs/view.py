"""What a person watching a search sees while it runs: the plan, a line per trial, the running
trial's step and ETA. Shared by the command line and the Python API (`autotune.search` prints
the same lines in a notebook); what the search found is printed after it (`outcome.py`).

On a terminal a progress bar stands over a live line for the running trial; piped output (and
search.log, always) gets plain lines only, one when a trial starts and one when it ends.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from autotune.common import adapter, trial
from autotune.common.layout import SEARCH_LOG
from autotune.common.trial import Status, TrialResult
from autotune.common.trial_settings import describe_params, effective_batch
from autotune.common.units import format_bytes, format_gib, plural
from autotune.outputs.snapshot import trained_note
from autotune.outputs.terminal import Reporter, console, shown_path
from autotune.plan.plan import SearchPlan
from autotune.plan.run_info import RunInfo
from autotune.store.records import TrialRecord
from autotune.study.cost import remaining_s
from autotune.study.observer import SearchObserver


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
        self.searching = False
        self.space_settings = math.inf
        """At most the settings the space holds (an upper bound: the grid's product)."""
        self.unsteady: str | None = None
        """Why the baseline's pace is no pace to plan by; None: a steady one."""
        """Whether a search runs (`planned`): else `autotune confirm` or `verify`."""
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
            f"({plan.info.task}), seq_len {plan.info.seq_len}, {plan.device} "
            f"({escape(plan.info.device_name)}), space {escape(plan.space.name)}, budget "
            f"{format_bytes(plan.info.memory_budget_bytes)}, {plan.config.n_trials} trials "
            f"-> {escape(shown_path(plan.study_dir))}"
        )
        if plan.info.simulated is not None:
            self.report.line(
                f"[yellow]simulated:[/] {escape(plan.info.simulated)} answers every trial (a "
                "performance model: docs/twin.md); no figure of this study is measured",
                always=True,
            )
        self.report.line(f"batch: {plan.info.batch_mode}")
        if plan.info.adapter is not None:
            self.report.line(
                f"adapter: {escape(adapter.describe(plan.info.adapter))}, the same in every "
                "trial (the base frozen)"
            )
        for note in plan.space.notes:
            self.report.line(f"[yellow]note:[/] {escape(note)}")
        if len(plan.slots) > 1:
            owned = ", ".join(slot.describe() for slot in plan.slots)
            self.report.line(f"{len(plan.slots)} workers on this study: {owned}")
        if plan.info.gpu_link is not None:
            self.report.line(f"between a trial's GPUs: {escape(plan.info.gpu_link)}")
        elif plan.devices_per_trial > 1 and plan.device_info.gpu_links_error:
            self.report.line(
                "between a trial's GPUs: not known (NVML: "
                f"{escape(plan.device_info.gpu_links_error)})"
            )
        if done_before:
            self.report.line(f"resuming: {done_before} finished trial(s) kept")
        for line in expectations(plan):
            self.report.line(line, always=line.startswith("[yellow]warning"))
        self.confirm_rounds = plan.config.confirm_rounds
        self.searching = True
        self.trainer_info = plan.info if plan.info.trainer is not None else None
        self.total = plan.config.n_trials
        self.steps = plan.trial_steps
        self.space_batch = space_batch(plan)
        self.space_settings = math.prod(len(v) for v in plan.space.grid(plan.rules).values())
        self.floor = plan.compute_floor_s(plan.baseline)
        self.task = self.bar.add_task(
            "trials", total=self.total, completed=done_before, best="", eta=""
        )

    def _slower_than_probed(self, baseline: TrialRecord) -> str | None:
        """After the baseline: where its steps computed at under SLOW_SHARE of the rate the
        device's probe (or datasheet) promised, the note that says so; else None."""
        result = baseline.result
        if self.floor is None or not result.samples_per_s:
            return None
        floor_s, rate = self.floor
        steps_s = self.steps * effective_batch(baseline.params) / result.samples_per_s
        if floor_s >= SLOW_SHARE * steps_s:
            return None
        return (
            f"the baseline computed at {floor_s / steps_s:.1%} of the {rate:.3g} TFLOP/s this "
            "device was probed at: slower than expected (other processes on its cores, a "
            "throttled clock?); every time here is what it measures now"
        )

    def _unsteady(self, baseline: TrialRecord) -> str | None:
        """Why the baseline's pace is no pace to plan the search by: its steps' CV past
        UNSTEADY_CV (a slow spell), or slow against the probe; None for a steady one."""
        cv = baseline.result.step_time_cv
        if cv is not None and cv > UNSTEADY_CV:
            return f"its steps varied by {cv:.0%} (step CV)"
        if self._slower_than_probed(baseline) is not None:
            return "it computed far below the rate this device was probed at"
        return None

    def watching(self) -> contextlib.AbstractContextManager[Any]:
        return self.bar

    def retried(self, number: int, refused: str | None = None) -> None:
        if refused is not None:
            self.report.line(
                f"trial {number} was refused ({escape(refused)}): its settings run again first"
            )
        else:
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

    def looking_again(self, message: str) -> None:
        self.warned(message)
        self.total += 1  # one trial more than n_trials
        if self.task is not None:
            self.bar.update(self.task, total=self.total)

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
        left = remaining_s(self.records, self.steps, self.space_batch, self._left(done))
        measured = [r for r in self.records if r.status is Status.OK and r.result.samples_per_s]
        if record.baseline and record.status is Status.OK and record.result.wall_s:
            self.unsteady = self._unsteady(record)
            self.report.line(
                _pace(
                    record,
                    left[0] if left else None,
                    self._left(done),
                    self.space_batch,
                    self.confirm_rounds,
                    self.unsteady,
                )
            )
            if (slow := self._slower_than_probed(record)) is not None:
                self.report.line(f"[yellow]note:[/] {escape(slow)}", always=True)
        # An unsteady baseline alone is no pace: the ETA waits for the next trial, and then
        # follows the median of every trial's pace as they end.
        unreliable = self.unsteady is not None and len(measured) < 2
        self.bar.update(self.task, eta="ETA after the next trial" if unreliable else _eta(left))

    def _left(self, done: int) -> int:
        """The trials the search may still run: n_trials less those done, and never more than
        the space holds settings (it measures each once)."""
        return max(0, min(self.total, self.space_settings) - done)

    def ended(self, stopped: str) -> None:
        self.report.line(f"search ended: {stopped}")

    def confirming(self, picks: int, rounds: int, expected_s: float) -> None:
        self.total, self.done = picks * rounds, 0
        # A search's confirmation is its key's; `autotune confirm`'s, its own rounds=.
        key = "confirm_rounds=0 skips this" if self.searching else "rounds= sets how many"
        self.report.line(
            f"confirming: the baseline and the picks ({picks} trials) run again, "
            f"{plural(rounds, 'round')} interleaved: {plural(self.total, 'run')}, about "
            f"{expected_s:.0f} s ({key})"
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
            f"time: the baseline's {plan.trial_steps} steps need at "
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
    reference = plan.reference()
    if reference is not None and estimate_gib is not None:
        budget = format_bytes(plan.info.memory_budget_bytes)
        lines.append(
            f"the HF defaults do not fit: the baseline is estimated at {estimate_gib:.2f} GiB, "
            f"over the {budget} budget; a reference runs after it, the guides' low-memory "
            f"recipe on the defaults ({escape(reference.recipe)}), and speedups are told "
            "against it"
        )
    elif limit is not None and estimate_gib is not None and estimate_gib > limit:
        lines.append(
            f"[yellow]warning:[/] the baseline (HF defaults) is estimated at "
            f"{estimate_gib:.2f} GiB, over the {limit:.2f} GiB {plan.estimate_limit_source}: it "
            "will be skipped, and no speedup can be measured against it; lower seq_len, or "
            "search where it fits"
        )
    return lines


def _pace(
    baseline: TrialRecord,
    left_s: float | None,
    remaining: int,
    batch: float,
    confirm_rounds: int,
    unsteady: str | None = None,
) -> str:
    wall_s = baseline.result.wall_s or 0.0
    if unsteady is not None:
        return (
            f"the baseline took {wall_s:.1f} s, but {unsteady}: its pace is no measure of the "
            f"{remaining} remaining trials' time, and the bar's ETA waits for the next trial "
            "(then it follows the median pace of the trials as they end)"
        )
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
UNSTEADY_CV = 0.5
"""A baseline whose steps vary past this CV had a slow spell (the quick start's baseline once
showed 107% on an idle machine, its steady CV a few percent): its pace is not extrapolated."""
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
