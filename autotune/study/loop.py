"""The search loop over an Optuna multi-objective study (max samples/s, min memory), in named
phases: refresh (the study read afresh, dead searches' trials recovered), the reasons to stop,
propose (ask, publish the settings), check (not to run, pre-trial checks), run (submitted to
the trial executor: `execute/`) and tell.

Re-running the same study resumes it: recorded trials are kept and count toward `n_trials`.
Other searches may write the same study: every iteration reads the records afresh.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import Any

import optuna
import psutil
from optuna.trial import FrozenTrial, TrialState

from autotune.common.errors import UnsafePath
from autotune.common.layout import set_aside_result, trial_dir
from autotune.common.trial import MEMORY_STATUSES, Progress, Status, TrialResult
from autotune.execute.base import TrialExecutor
from autotune.plan.plan import Reference, SearchPlan
from autotune.store import storage_file
from autotune.store.outcomes import Ending, Stop
from autotune.store.records import (
    BASELINE_ATTR,
    NOT_RUN_ATTR,
    OWNER_ATTR,
    PARAMS_ATTR,
    REFERENCE_ATTR,
    REFUSED_ATTR,
    RETRY_OF_ATTR,
    SECOND_LOOK_ATTR,
    VERSIONS_ATTR,
    TrialRecord,
    counts_toward_n_trials,
    is_recorded,
    record_of,
    tell_repeat,
    tell_result,
)
from autotune.study import checks
from autotune.study.launch import launch, stop_threshold
from autotune.study.not_run import NotRun, not_to_run
from autotune.study.observer import SearchObserver
from autotune.study.opening import enqueue_reference, reference_params
from autotune.study.recovery import (
    heartbeat,
    note_interruption,
    queue_again,
    recover,
    shares_with,
    this_process,
)
from autotune.study.sampling.sampler import AskTellGridSampler, says_enough, suggest

MAX_REPEATS = 50
RUNNING_BACKOFF_S = 0.5
"""Pause before asking again when a proposal is being run by another process."""
WAIT_FOR_OTHERS_S = 1.0
"""Pause between looks at the study while its last trials run in other processes."""
"""How `run_search` says that `timeout=` ended it (also in `workers`' joined words)."""


def run_search(
    plan: SearchPlan,
    study: optuna.Study,
    *,
    executor: TrialExecutor,
    observer: SearchObserver | None = None,
    show_others: bool = False,
) -> Stop:
    """Run trials until the study has `n_trials` run (skipped ones run nothing and do not
    count) or `timeout` has passed; says why it stopped. Other processes may run the same
    study at the same time (`workers=N`, `autotune worker`): `n_trials` counts the whole
    study's trials, not this loop's.

    The first trial of a study is the baseline (HF defaults), queued when the study was opened
    (`opening.enqueue_baseline`). Before each trial, every record is read afresh, trials whose
    search died are failed (a dead process on this host at once, any other after
    `stale_after` without a heartbeat) and their settings queued to run again once
    (`recovery.recover`), and the pre-trial checks run (`checks.PRE_TRIAL_CHECKS`): settings
    already run are told, not run again, and settings at least as memory-hungry as a known
    OOM, whichever process met it, or estimated over the budget by more than
    `estimate_margin`, are skipped.

    A SQLite study file deleted or replaced meanwhile stops the loop after the running trial
    (`StudyFileLost`): SQLite would go on writing to the deleted file, and a resume would find
    nothing.

    `show_others`: the trials other processes record (an `autotune worker` that joined) are
    told to the observer as they are found, as this loop's own are (a search of one worker;
    with several, the process that started them watches the study itself).
    """
    loop = _Loop.start(plan, study, observer or SearchObserver(), executor)
    loop.told = (
        None
        if not show_others
        else {t.number for t in study.get_trials(deepcopy=False) if is_recorded(t)}
    )
    while True:
        trials = loop.refresh()
        stopped = loop.stop_reason()
        if stopped is not None:
            return stopped
        if loop.others_finish(trials):
            time.sleep(WAIT_FOR_OTHERS_S)
            continue
        trial = loop.ask()
        try:
            with heartbeat(trial):
                stopped = loop.one_trial(trial)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            if not loop.lost(trial):
                raise
            continue
        if stopped is not None:
            return stopped


def run_queued(
    plan: SearchPlan,
    study: optuna.Study,
    wanted: Callable[[FrozenTrial], bool],
    *,
    observer: SearchObserver,
    executor: TrialExecutor,
) -> None:
    """Run the study's queued trials, oldest first, while one that `wanted` accepts waits:
    a second look after the search's loops ended (`study.second_look`), whatever `n_trials`,
    `timeout=` or a used-up grid say. Each runs as a trial of the loop (refresh, checks, run,
    tell). One another process took (its loop asks for queued trials first) is its to run:
    this waits for it to end, or for its process to be found dead (it is then queued again);
    a proposal asked for here when another process took the last wanted one between the
    refresh and the ask is handed back, not run."""
    loop = _Loop.start(plan, study, observer, executor)
    while True:
        trials = loop.refresh()  # an interrupted one is queued again here
        if not any(t.state is TrialState.WAITING and wanted(t) for t in trials):
            if not any(t.state is TrialState.RUNNING and wanted(t) for t in trials):
                return
            time.sleep(WAIT_FOR_OTHERS_S)
            continue
        queued = {t.number for t in trials if t.state is TrialState.WAITING}
        trial = loop.ask()
        if trial.number not in queued:  # a new proposal: the queue was emptied meanwhile
            trial.set_user_attr(NOT_RUN_ATTR, "another process took the queued trials first")
            study.tell(trial, state=TrialState.FAIL)
            continue
        try:
            with heartbeat(trial):
                loop.one_trial(trial)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            if not loop.lost(trial):
                raise


@dataclasses.dataclass(kw_only=True)
class _Loop:
    """What the loop keeps from one iteration to the next, and its phases."""

    plan: SearchPlan
    study: optuna.Study
    observer: SearchObserver
    executor: TrialExecutor
    watch: storage_file.FileWatch | None
    """The SQLite study file, watched for deletion; None on a database server."""
    deadline: float
    baseline: dict[str, tuple[optuna.distributions.BaseDistribution, Any]]
    """The baseline as Optuna parameters (`SearchSpace.optuna_params`)."""
    baseline_in_space: bool
    pre_trial: tuple[checks.Check, ...]
    repeats: int = 0
    """Proposals in a row that ran nothing (repeats, skips, settings running elsewhere)."""
    done: int = 0
    """Trials of the study that count toward n_trials, at the last refresh."""
    told: set[int] | None = None
    """The trials the observer knows of (this loop's, and others' found recorded); None: it is
    told of this loop's alone."""
    warned_sharing: bool = False

    @classmethod
    def start(
        cls,
        plan: SearchPlan,
        study: optuna.Study,
        observer: SearchObserver,
        executor: TrialExecutor,
    ) -> _Loop:
        config = plan.config
        return cls(
            plan=plan,
            study=study,
            observer=observer,
            executor=executor,
            watch=storage_file.FileWatch.of(plan.storage_url),
            deadline=time.monotonic() + config.timeout if config.timeout else float("inf"),
            baseline=plan.space.optuna_params(plan.baseline, plan.rules),
            baseline_in_space=plan.space.holds(plan.baseline, plan.rules),
            pre_trial=checks.for_plan(plan),
        )

    # --- refresh and the reasons to stop ---------------------------------------------------

    def refresh(self) -> list[FrozenTrial]:
        """The study's trials, read afresh (other processes record trials too), once the
        trials of dead searches are failed and their settings queued again."""
        if self.watch is not None and self.watch.lost():
            trials = self.study.get_trials(deepcopy=False)
            raise self.watch.error(sum(is_recorded(t) for t in trials))
        trials, retried = recover(self.study, self.plan.study_dir, self.baseline)
        for number in retried:
            self.observer.retried(number, trials[number].user_attrs.get(REFUSED_ATTR))
        self.done = sum(counts_toward_n_trials(t) for t in trials)
        if self.told is not None:
            for trial in trials:
                if is_recorded(trial) and trial.number not in self.told:
                    self.told.add(trial.number)
                    self.observer.trial_ended(record_of(trial))
        return trials

    def reference(self) -> Reference | None:
        """The reference's settings: by the estimate, else (the baseline measured over the
        budget) as queued after it."""
        return self.plan.reference() or self.plan.reference(baseline_fits=False)

    def stop_reason(self) -> Stop | None:
        n_trials = self.plan.config.n_trials
        if self.done >= n_trials:
            return Stop(f"{self.done} of {n_trials} trials finished")
        if time.monotonic() > self.deadline:
            return Stop(f"timeout: {self.done} of {n_trials} trials finished", Ending.TIMEOUT)
        sampler = self.study.sampler
        if isinstance(sampler, AskTellGridSampler) and sampler.is_exhausted(self.study):
            return Stop(f"every grid point has run: {self.done} trials finished")
        return None

    def others_finish(self, trials: list[FrozenTrial]) -> bool:
        """The study's last trials run in other processes: wait for them; one whose process
        dies is failed by `recover` and run again here."""
        running = sum(t.state is TrialState.RUNNING for t in trials)
        return self.done + running >= self.plan.config.n_trials

    # --- propose ---------------------------------------------------------------------------

    def ask(self) -> optuna.Trial:
        with warnings.catch_warnings():
            # Optuna warns that heartbeats are meant for study.optimize: this loop beats itself.
            warnings.filterwarnings("ignore", "Heartbeat of storage", UserWarning)
            return self.study.ask()

    def propose(self, trial: optuna.Trial) -> dict[str, Any]:
        """The trial's settings, published with its owner: the queued baseline's (by
        `enqueue_baseline` or a retry), or the sampler's."""
        trial.set_user_attr(OWNER_ATTR, this_process(self.plan.slots[0]))
        trial.set_user_attr(VERSIONS_ATTR, self.plan.versions)  # measured under (conditions)
        if trial.user_attrs.get(BASELINE_ATTR):
            for name, (distribution, _) in self.baseline.items():
                suggest(trial, name, distribution)  # the queued values: Optuna sees them
            params = dict(self.plan.baseline)
        elif trial.user_attrs.get(REFERENCE_ATTR) and (reference := self.reference()):
            for name, (distribution, _) in reference_params(self.plan, reference).items():
                suggest(trial, name, distribution)
            params = dict(reference.params)
        else:
            params = self.plan.space.sample(trial, self.plan.rules)
        # Published before looking at the others, so that of two processes proposing the same
        # settings at once, at least one sees the other's.
        trial.set_user_attr(PARAMS_ATTR, params)
        return params

    # --- one trial: propose, check, run, tell ------------------------------------------------

    def one_trial(self, trial: optuna.Trial) -> Stop | None:
        """Propose, check, run and tell one trial; a reason when the loop must stop."""
        if self.told is not None:
            self.told.add(trial.number)
        enough = says_enough(self.study.sampler, trial)
        if enough is not None:  # before any parameter is set: a later run may still try it
            trial.set_user_attr(NOT_RUN_ATTR, enough)
            self.study.tell(trial, state=TrialState.FAIL)
            return Stop(f"{enough}: {self.done} trials finished")
        params = self.propose(trial)
        # Read again, after publishing: a trial another process recorded since the refresh
        # (before `ask`) must count as measured here, or these settings would run twice (seen
        # on PostgreSQL, whose reads are not serialized with the other processes' writes as
        # SQLite's are).
        trials = self.study.get_trials(deepcopy=False)
        refused = not_to_run(trial, params, self.plan.config.n_trials, trials)
        if refused is not None:
            return self.not_run(trial, refused)
        records = [record_of(t) for t in trials if is_recorded(t)]
        self.warn_sharing(trials, trial.number)
        # Once: the check and the record. A factory's model is known from a trial of it.
        factory = next((r.result for r in records if r.result.trained_config), None)
        estimate_gib = self.plan.estimate_gib(params, factory)
        # A second look runs a stopped trial's settings again, to its end, whatever the checks
        # say: they trained (an out-of-memory trial since, on a machine grown busy, says
        # nothing against them), and that trial is no repeat of it.
        if SECOND_LOOK_ATTR in trial.user_attrs:
            skip = None
        else:
            skip = checks.first_skip(params, records, self.pre_trial, estimate_gib)
        stopped = self.count_repeat(trial, skip)
        if stopped is not None:
            return stopped
        if skip is not None and skip.repeat_of is not None:
            tell_repeat(self.study, trial, skip.repeat_of, self.plan.info.memory_budget_gib)
            return None
        if skip is not None:
            result = TrialResult(status=Status.SKIPPED, reason=skip.reason)
        else:
            result = self.run(trial, params, records)
        self.tell(trial, params, dataclasses.replace(result, estimate_gib=estimate_gib))
        return None

    def warn_sharing(self, trials: list[FrozenTrial], number: int) -> None:
        """Say once when another process of this study runs a trial on this host's cores (or
        GPUs) that this one's trials use too: both measure less than either would alone, and
        each may take the whole memory budget (`workers=` splits a host among its workers)."""
        if self.warned_sharing:
            return
        me = this_process(self.plan.slots[0])
        for other in trials:
            owner = other.user_attrs.get(OWNER_ATTR)
            if (
                other.state is not TrialState.RUNNING
                or other.number == number
                or not owner
                or owner.get("host") != me["host"]
                or owner.get("pid") == me["pid"]
                or not psutil.pid_exists(owner["pid"])
            ):
                continue
            shared = shares_with(owner, me, cuda=self.plan.device == "cuda")
            if shared:
                self.warned_sharing = True
                self.observer.warned(
                    f"trial {other.number} of this study runs on this host now (pid "
                    f"{owner['pid']}), on {shared} that this search's trials use too: both "
                    "measure less than either would alone, and each may take the whole memory "
                    "budget. Run one search or worker of a study per host (workers= splits a "
                    "host's cores or GPUs among its workers), or give each process its own "
                    "(taskset, CUDA_VISIBLE_DEVICES)"
                )
                return

    def not_run(self, trial: optuna.Trial, not_run: NotRun) -> Stop | None:
        """Record why a proposal does not run; a reason to stop when too many in a row were
        running elsewhere."""
        trial.set_user_attr(NOT_RUN_ATTR, not_run.reason)
        self.study.tell(trial, state=TrialState.FAIL)
        if not not_run.same_as_running:
            return None
        # Their result will be in the records soon; ask again rather than measure the same
        # settings twice.
        self.repeats += 1
        if self.repeats >= MAX_REPEATS:
            return Stop(f"the last {MAX_REPEATS} proposals were running or run already")
        time.sleep(RUNNING_BACKOFF_S)
        return None

    def count_repeat(self, trial: optuna.Trial, skip: checks.Skip | None) -> Stop | None:
        """Repeats and skips run nothing and use up no trial: too many of them in a row and
        the space is exhausted."""
        if skip is None:
            self.repeats = 0
            return None
        self.repeats += 1
        if self.repeats < MAX_REPEATS:
            return None
        trial.set_user_attr(NOT_RUN_ATTR, "the space looks exhausted")
        self.study.tell(trial, state=TrialState.FAIL)
        return Stop(
            f"the last {MAX_REPEATS} proposals repeated settings already run or were "
            f"skipped: the space looks exhausted after {self.done} trials"
        )

    # --- run and tell ------------------------------------------------------------------------

    def run(
        self, trial: optuna.Trial, params: dict[str, Any], records: list[TrialRecord]
    ) -> TrialResult:
        self.observer.trial_started(trial.number, params)
        try:
            progress = _watching(self.observer, trial.number, self.watch)
            queued = trial.user_attrs.get(BASELINE_ATTR) or trial.user_attrs.get(REFERENCE_ATTR)
            runs_to_end = queued or SECOND_LOOK_ATTR in trial.user_attrs
            stop_below = None if runs_to_end else stop_threshold(self.plan, records)
            return launch(
                self.plan,
                trial.number,
                params,
                self.executor,
                on_progress=progress,
                stop_below=stop_below,
            )
        except UnsafePath as exc:
            # A link planted in the trial's folder (or a folder others may write into): the
            # search stops on it; its trial is said to be refused, not interrupted, and runs
            # again once the folder is safe (a later run queues it as it does an interrupted
            # one).
            with contextlib.suppress(Exception):
                trial.set_user_attr(REFUSED_ATTR, str(exc))
            with contextlib.suppress(ValueError):
                self.study.tell(trial, state=TrialState.FAIL)
            raise
        except BaseException as exc:
            # Ctrl-C or a bug in the parent: the trial ends FAIL without a result, which is
            # how a later run of the study recognises it as interrupted (its executor has
            # cancelled it, and set aside any result it left).
            note_interruption(trial, exc)
            with contextlib.suppress(ValueError):  # failed as stale meanwhile
                self.study.tell(trial, state=TrialState.FAIL)
            raise

    def tell(self, trial: optuna.Trial, params: dict[str, Any], result: TrialResult) -> None:
        if result.rerun:  # it ended for no fault of its settings (its node left): once more
            if RETRY_OF_ATTR in trial.user_attrs:
                result = dataclasses.replace(
                    result, rerun=False, reason=f"{result.reason}; a rerun already: not again"
                )
            else:
                queue_again(self.study, trial, self.baseline)
        baseline = bool(trial.user_attrs.get(BASELINE_ATTR))
        in_space = self.baseline_in_space or not baseline
        if trial.user_attrs.get(REFERENCE_ATTR):
            in_space = self.plan.space.holds(params, self.plan.rules)
        tell_result(
            self.study,
            trial,
            result,
            self.plan.info.memory_budget_gib,
            noise_cv=self.plan.info.noise_cv,
            in_space=in_space,
        )
        budget = self.plan.info.memory_budget_gib
        over = result.status is Status.OK and not result.feasible(budget)
        if baseline and (result.status in MEMORY_STATUSES or over):
            # The defaults did not fit after all (the estimate said they would): speedups are
            # told against the reference, queued now. (Not after a timeout or a crash: those
            # say nothing of memory.)
            if (reference := self.plan.reference(baseline_fits=False)) is not None:
                values = reference_params(self.plan, reference)
                enqueue_reference(self.study, self.study.get_trials(deepcopy=False), values)
        record = TrialRecord(
            number=trial.number,
            params=params,
            result=result,
            baseline=baseline,
            versions=self.plan.versions,
        )
        self.observer.trial_ended(record)

    def lost(self, trial: optuna.Trial) -> bool:
        """Whether another process finished this trial under it (a tell failed): failed as
        stale (no heartbeat for `stale_after`: this process was stopped or cut off from the
        storage), and its settings queued again; the retry's result is the one kept."""
        if self.study.get_trials(deepcopy=False)[trial.number].state is TrialState.RUNNING:
            return False  # still ours: the error is another
        set_aside_result(trial_dir(self.plan.study_dir, trial.number))
        self.observer.lost(trial.number)
        return True


def _watching(
    observer: SearchObserver, number: int, watch: storage_file.FileWatch | None
) -> Callable[[Progress], None]:
    """Passes the running trial's progress on, and warns once, while it runs, when the study
    file is gone (the loop stops when the trial ends)."""
    warned = False

    def on_progress(progress: Progress) -> None:
        nonlocal warned
        observer.progress(number, progress)
        if watch is not None and not warned and watch.lost():
            warned = True
            observer.warned(
                f"{watch.path} was deleted or replaced: this search stops when "
                f"trial {number} ends, and the study cannot be resumed"
            )

    return on_progress
