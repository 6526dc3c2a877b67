"""What a search found, printed at its end and by `autotune report`: the front as a table, then
in lines whether the picks were confirmed, how the search ended, the baseline and the best
found, and each pick with its caveats and what in it changes the training; or why there is
nothing to recommend. Printed through a `Reporter`, so search.log holds the same lines.
"""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from autotune.common import trial
from autotune.common.layout import WORKER_LOG, trial_dir
from autotune.common.trial import Status
from autotune.common.trial_settings import describe_params
from autotune.common.units import format_gib, plural
from autotune.outputs.confirm import picks_to_confirm
from autotune.outputs.launch import accelerate_command, launch_command
from autotune.outputs.pareto import NOTHING_TO_RECOMMEND, Picks
from autotune.outputs.report.data import shared_mfu_peak
from autotune.outputs.snapshot import StudySnapshot
from autotune.outputs.terminal import Reporter, console
from autotune.store.outcomes import Ending
from autotune.store.records import TrialRecord


def print_outcome(report: Reporter, snapshot: StudySnapshot) -> None:
    """The front table, the baseline, the picks with their caveats and what in them changes
    the training (after a search, and for `autotune report`)."""
    if snapshot.simulated_time is not None:
        report.line(f"[yellow]{escape(snapshot.simulated_time)}[/]", always=True)
    _print_front(report, snapshot)
    _print_confirmation(report, snapshot)
    _print_search(report, snapshot)
    if snapshot.picks.recommended is None:
        _print_nothing_to_recommend(report, snapshot)
        return
    _print_picks(report, snapshot)


def front_table(snapshot: StudySnapshot) -> Table:
    """The front, fastest first, a row per trial: `*` marks the recommendation, `m` the
    memory saver."""
    table = Table(title="Pareto front (fastest first)")
    for column in _columns(snapshot):
        table.add_column(
            column, justify="left" if column in ("settings", "changes training") else "right"
        )
    for record in snapshot.front:
        table.add_row(*_row(snapshot, record))
    return table


def _columns(snapshot: StudySnapshot) -> tuple[str, ...]:
    peak = shared_mfu_peak(snapshot.front)  # one denominator for every trial, named
    mfu = f"MFU of {peak:g} TFLOP/s" if peak else "MFU"
    # The trials' own samples/s, then (confirmed picks) the medians of the confirmation
    # rounds; one speedup a trial: the confirmed one where the rounds measured it.
    confirmed = snapshot.picks.confirmed is not None
    return (
        "trial",
        "settings",
        "samples/s",
        *(("confirmed samples/s",) if confirmed else ()),
        "x baseline",
        "peak GiB",
        mfu,
        "step CV",
        "changes training",
    )


def _row(snapshot: StudySnapshot, record: TrialRecord) -> tuple[str, ...]:
    picks, r = snapshot.picks, record.result
    marks = ((picks.recommended, " *"), (picks.saver, " m"))
    mark = "".join(m for pick, m in marks if pick is not None and pick.number == record.number)
    return (
        f"{record.number}{mark}",
        escape(describe_params(record.params)),
        f"{r.samples_per_s:.2f}",
        *((_confirmed_figure(picks, record),) if picks.confirmed is not None else ()),
        _speedup_cell(picks, record),
        format_gib(r.peak_memory_gib, 3).removesuffix(" GiB"),
        "n/a" if r.mfu is None else f"{r.mfu:.1%}",
        f"{r.step_time_cv:.0%}" + (" noisy" if snapshot.is_noisy(record) else ""),
        ", ".join(c.setting for c in snapshot.math_changes(record)) or "-",
    )


def _confirmed_figure(picks: Picks, record: TrialRecord) -> str:
    """The confirmed median samples/s with its interval; "-" for a trial not confirmed."""
    confirmed = picks.confirmed
    assert confirmed is not None
    median, spread = confirmed.median(record.number), confirmed.interval(record.number)
    if median is None or spread is None:
        return "-"
    return f"{median:.2f}" + escape(f" [{spread[0]:.2f}-{spread[1]:.2f}]")


def _speedup_cell(picks: Picks, record: TrialRecord) -> str:
    """The trial's one speedup: confirmed, with its interval, where the rounds measured it;
    else its own trial's, marked `(1 trial)` where confirmed ones stand beside it."""
    speedup, interval = picks.speedup(record), picks.speedup_interval(record)
    if speedup is None:
        return "n/a"
    if interval is None:
        return f"{speedup:.2f}x" + (" (1 trial)" if picks.confirmed is not None else "")
    spread = "" if record.baseline else escape(f" [{interval[0]:.2f}-{interval[1]:.2f}]")
    return f"{speedup:.2f}x{spread}"


def _print_front(report: Reporter, snapshot: StudySnapshot) -> None:
    """The front table, and with a confirmation what its two kinds of figure are; on the
    terminal only, and not without a front (all out of memory: the lines after say so)."""
    if report.quiet or not snapshot.front:
        return
    console.print(front_table(snapshot))
    if snapshot.picks.confirmed is not None:
        report.line(
            "samples/s: each trial's own short measurement; confirmed samples/s: the median "
            + escape("[lowest-highest]")
            + " of the confirmation rounds; x baseline: the median of their round-by-round "
            "ratios to the baseline where the rounds measured the trial, else its own trial's "
            "(1 trial)"
        )


def _print_confirmation(report: Reporter, snapshot: StudySnapshot) -> None:
    """Whether the picks were measured again, and how, or why not."""
    confirmed = snapshot.picks.confirmed
    if confirmed is not None:
        report.line(
            f"confirmed: the baseline and the picks ran again {plural(confirmed.rounds, 'time')}, "
            f"interleaved, in {confirmed.wall_s:.0f} s; their figures below are medians "
            + escape("[lowest-highest round]")
        )
        if (unsteady := confirmed.unsteady()) is not None:
            report.line(f"[yellow]warning:[/] {escape(unsteady)}", always=True)
    elif snapshot.front and picks_to_confirm(snapshot):
        report.line(
            "[yellow]not confirmed: each figure is one short measurement[/] "
            "(autotune confirm STUDY_DIR measures the picks again)"
        )
    elif snapshot.front:
        report.line("not confirmed: a single trial measured ok, nothing to compare it with")


def _print_search(report: Reporter, snapshot: StudySnapshot) -> None:
    """How the search ended where it did not complete, how sure it is, the baseline, and the
    best it found and when."""
    picks = snapshot.picks
    if (ended := snapshot.ended) is not None and ended.how is not Ending.COMPLETE:
        resume = "; the same command resumes it" if ended.how is Ending.INTERRUPTED else ""
        report.line(f"[yellow]the search was {escape(ended.describe())}{resume}[/]")
    if snapshot.confidence is not None:
        report.line(f"search confidence: {escape(snapshot.confidence.describe())}")
    report.line(f"baseline (HF defaults): {escape(picks.describe_baseline())}")
    if picks.reference is not None:
        report.line(
            f"reference ({escape(reference_recipe(picks))}): {escape(picks.describe_reference())}"
        )
    if (found := snapshot.anytime()) is not None:
        report.line(f"found: {escape(found.describe(picks.speedup_note(found.best)))}")
    if snapshot.info.simulated is not None and picks.recommended is not None:
        report.line(
            f"[yellow]simulated[/]: the pick is trial {picks.recommended.number} on "
            f"{escape(snapshot.info.simulated)}; measure it on the GPU before training with it"
        )
    if picks.baseline is not None and picks.baseline.result.samples_per_s is None:
        if picks.yardstick is not None:
            report.line(
                f"the HF defaults do not fit here: every speedup is against the reference, "
                f"trial {picks.yardstick.number}"
            )
        else:
            report.line(
                "[yellow]the HF defaults did not run here, so there is no speedup figure[/]"
            )


def reference_recipe(picks: Picks) -> str:
    """What the reference changes of the HF defaults: `the HF defaults with gc=on bs=1 ga=8
    base=bf16`."""
    return f"the HF defaults with {describe_params(picks.reference_changes())}"


def _print_nothing_to_recommend(report: Reporter, snapshot: StudySnapshot) -> None:
    why = escape(_why_nothing_to_recommend(snapshot))
    ended = snapshot.ended
    if ended is not None and ended.how is Ending.INTERRUPTED:  # its exit code is the signal's
        report.line(f"[yellow]{why}: nothing to recommend yet[/]")
    else:
        report.line(f"[yellow]{why}: nothing to recommend (exit code {NOTHING_TO_RECOMMEND})[/]")


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


def _print_picks(report: Reporter, snapshot: StudySnapshot) -> None:
    """Each pick with its settings, compile payoff and changes to the training; a pick that is
    an earlier one's trial is named as that one. Then, where a pick changes the effective
    batch, how a real run keeps it."""
    picks = snapshot.picks
    said: dict[int, str] = {}
    for label, record in _shown_picks(picks):
        if record.number in said:
            if label.startswith("memory") and record is picks.recommended:
                report.line(f"{label}: {picks.describe_saver()}")
            else:
                report.line(f"{label}: the same trial as {said[record.number]}")
            continue
        said[record.number] = label.removesuffix(" (*)").removesuffix(" (m)")
        report.line(f"{label}: {picks.describe(record)}: {escape(describe_params(record.params))}")
        if record is picks.recommended:
            _print_why_and_how_to_run(report, snapshot, record)
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


def _shown_picks(picks: Picks) -> list[tuple[str, TrialRecord]]:
    """The picks in the order they are printed, each with its label (the table's mark)."""
    labelled = (
        ("recommended (*)", picks.recommended),
        ("same-training pick", picks.same_training),
        ("fastest", picks.fastest),
        ("memory saver (m)", picks.saver),
    )
    return [(label, record) for label, record in labelled if record is not None]


def _print_why_and_how_to_run(
    report: Reporter, snapshot: StudySnapshot, record: TrialRecord
) -> None:
    """Under the recommendation: why it is the one, what `autotune verify` found of it, its
    scaling efficiency on several devices, and how to launch it as its trials ran."""
    report.line(f"  why: {escape(snapshot.picks.why)}")
    if (verified := snapshot.verifications.get(record.number)) is not None:
        report.line(f"  verified: {escape(verified.describe())}")
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
