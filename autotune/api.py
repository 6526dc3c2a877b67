"""The Python API: `autotune.search(model=..., **settings)` runs a search as `autotune search`
does and returns a `SearchResult`; `autotune.load(study_dir)` reads a finished one.

    import autotune
    result = autotune.search(model="google/bert_uncased_L-2_H-128_A-2", seq_len=64, n_trials=4)
    args = result.recommended.training_args()      # a transformers.TrainingArguments
    result.to_dataframe()                           # a row per trial, as trials.csv

The command line is a thin layer over `run` (parse, run, print); settings are the same keys
with the same defaults and checks (`autotune.plan.config.RunConfig`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
from pathlib import Path
from typing import Any

import optuna

from autotune import workers
from autotune.common.device import DeviceInfo
from autotune.common.errors import (
    AutotuneError,
    ConfigError,
    DataError,
    OutputsNotWritten,
    StudyError,
)
from autotune.common.layout import OUTPUTS, STUDY_DB
from autotune.common.output_files import check_owner, make_folder
from autotune.common.trial import Status
from autotune.common.urls import safe_url
from autotune.common.user_data import read_ready
from autotune.execute.base import TrialExecutor
from autotune.execute.local import LocalExecutor
from autotune.execute.ray_executor import RayExecutor
from autotune.execute.simulated import SimulatedExecutor
from autotune.outputs import confirm, verify
from autotune.outputs.snapshot import StudySnapshot, read_snapshot
from autotune.outputs.study_folder import write_study_folder
from autotune.plan import conditions, factories, software_cache, user_data
from autotune.plan.config import RunConfig, WorkerConfig
from autotune.plan.factory_trust import describe
from autotune.plan.overrides import make_config
from autotune.plan.plan import SearchPlan, check_before_probe, make_plan
from autotune.search_result import SearchResult
from autotune.store.outcomes import (
    Ending,
    RunEnd,
    Stop,
    Verification,
    store_confidence,
    store_run_end,
)
from autotune.store.records import (
    CONFIRMATION_ATTR,
    SETTINGS_ATTR,
    TrialRecord,
    end_run,
    load_records,
    run_info,
    start_run,
    trials_run,
)
from autotune.store.storage import load_study_dir, write_back
from autotune.store.storage_file import StudyFileLost
from autotune.study import second_look
from autotune.study.interrupts import SearchInterrupted, stop_signals
from autotune.study.loop import run_search
from autotune.study.observer import SearchObserver
from autotune.study.opening import join_config, locked_study, open_study
from autotune.study.sampling import model as effects_model
from autotune.study.sampling.sampler import quiet_optuna
from autotune.twin import answer as twin_answer
from autotune.twin import model as twin_model


def search(
    model: str, *, quiet: bool = False, executor: TrialExecutor | None = None, **settings: Any
) -> SearchResult:
    """Run a search and return its result; prints progress as `autotune search` does (unless
    `quiet=True`). Settings are `autotune search`'s keys (`seq_len=`, `n_trials=`, `out=`,
    `memory_budget="24GiB"`, ...); bad ones raise `ConfigError` naming every problem."""
    from rich.markup import escape

    from autotune.outputs.outcome import print_outcome
    from autotune.outputs.terminal import print_paths
    from autotune.outputs.view import TerminalView

    quiet_optuna()
    config = make_config({"model": model, "quiet": quiet, **settings})
    view = TerminalView(quiet=config.quiet)
    called = {"model": model, **settings} | ({"quiet": quiet} if quiet else {})
    command = conditions.api_call("autotune.search", called)
    try:
        result = run(config, observer=view, executor=executor, command=command)
    except SearchInterrupted as exc:
        if exc.ended:
            view.report.line(escape(exc.ended), always=True)
        print_paths(view.report, exc.paths)  # what finished is written: say where
        raise
    print_outcome(view.report, result.snapshot)
    print_paths(view.report, result.paths)
    return result


def load(
    study_dir: str | Path, *, storage: str | None = None, study: str | None = None
) -> SearchResult:
    """A finished (or running) study, read from its storage: STUDY_DIR/study.db by default."""
    quiet_optuna()
    study_dir = Path(study_dir)
    snapshot = read_snapshot(load_study_dir(study_dir, storage, study))
    paths = [p for p in (study_dir / n for n in OUTPUTS) if p.exists()]
    return SearchResult(snapshot=snapshot, study_dir=study_dir, paths=paths)


def run(
    config: RunConfig,
    *,
    observer: SearchObserver | None = None,
    executor: TrialExecutor | None = None,
    device_info: DeviceInfo | None = None,
    command: str | None = None,
) -> SearchResult:
    """Probe the device, plan, run the study under its lock (with `workers=` worker processes),
    and write the study folder (also when interrupted: what finished is written before the
    exception goes on). `command` is what started it, for the study's provenance (the command
    line, or the API call); None: this call. `executor` runs the trials (default: worker
    processes of this host) on the device `device_info` describes (default: probed), which
    together may simulate another machine (`autotune.execute.simulated`)."""
    observer, executor = observer or SearchObserver(), _executor(executor, config)
    check_before_probe(config)
    cluster = None
    if config.executor == "twin" and device_info is None:
        with observer.busy("reading the installed software's facts"):
            device_info = _twin_device(config)
    if isinstance(executor, RayExecutor):  # the plan is the cluster's: its nodes, their device
        with observer.busy(f"reaching the Ray cluster (ray_address={config.ray_address})"):
            cluster = executor.cluster()
            if device_info is None:
                gpus = config.device != "cpu" and any(n.gpus for n in cluster.nodes)
                device_info = executor.probe("cuda" if gpus else "cpu")
    if device_info is None:
        with observer.busy("probing the device"):
            device_info = software_cache.probe_device()
    plan = make_plan(config, device_info, cluster)
    _refuse_certain_timeouts(plan)
    prepare_inputs(plan, observer)
    with locked_study(plan) as (study, plan), stop_signals() as signals:
        done_before = trials_run(study)
        if (beside := _other_studies(study, plan, done_before)) is not None:
            observer.warned(beside)
        store_run_end(study, None)  # running: an earlier search's end no longer holds
        observer.planned(plan, done_before=done_before)
        this_run = _start_run(study, plan, "search", command, observer)
        try:
            stopped = _run_workers(plan, study, observer, executor)
            # Not under other versions than the study's: its trial would be kept out of the
            # picks, and the confirmation does not run (`_confirm`).
            may_look = trials_run(study) > done_before and not conditions.other_versions(
                plan.versions, plan.info.versions
            )
            looked = second_look.run(plan, study, observer, executor, may_start=may_look) or ""
            if trials_run(study) > done_before or CONFIRMATION_ATTR not in study.user_attrs:
                _confirm(plan, study, config.confirm_rounds, observer, executor)
            else:  # a finished search run again: its confirmed figures stand
                observer.warned(_nothing_to_run(plan, done_before))
        except KeyboardInterrupt as exc:
            # Ctrl-C, SIGTERM or SIGHUP: the running trial was recorded as interrupted; what
            # finished is written, and the paths go with the exception to be said.
            interrupted = signals.interrupted(exc)
            with signals.deferred():
                # On the way out: a storage that fails this write must not stop the outputs.
                with contextlib.suppress(Exception):
                    end = _store_end(study, plan, Ending.INTERRUPTED, interrupted.signal_name)
                    interrupted.ended = end.describe()
                _, interrupted.paths = _write_outputs(study, plan, _clocked(this_run, executor))
            raise interrupted from None
        except StudyFileLost as exc:
            # This process still reads the deleted file (SQLite keeps it open): the outputs
            # are written from it, the last record of the study there will be.
            with signals.deferred():
                _, exc.paths = _write_outputs(study, plan)
            raise
        except BaseException:
            with signals.deferred():
                _write_outputs(study, plan, _clocked(this_run, executor))
            raise
        with signals.deferred():  # a signal now stops the search once the outputs are whole
            _store_end(study, plan, stopped.ending, stopped=stopped.reason, then=looked)
            snapshot, paths = _write_outputs(study, plan, _clocked(this_run, executor))
    words = f"{stopped.reason}; {looked}" if looked else stopped.reason
    return SearchResult(snapshot=snapshot, study_dir=plan.study_dir, paths=paths, stopped=words)


def _other_studies(study: optuna.Study, plan: SearchPlan, done_before: int) -> str | None:
    """For a new study made in a SQLite file that holds others (`storage=` naming another
    study's study.db): that it now holds one more, in words; None otherwise (a server's
    storage holds many studies by design)."""
    if done_before or not plan.storage_url.startswith("sqlite"):
        return None
    names = [
        s.study_name for s in study._storage.get_all_studies() if s.study_name != plan.study_name
    ]
    if not names:
        return None
    shown = ", ".join(sorted(names)[:5]) + (" ..." if len(names) > 5 else "")
    return (
        f"{safe_url(plan.storage_url)} holds study {shown} too: this search makes "
        f"study={plan.study_name} beside it in the same file (its outputs in "
        f"{plan.study_dir}). To resume that one, give its study= name"
    )


def _clocked(
    this_run: tuple[str, dict[str, Any]], executor: TrialExecutor
) -> tuple[str, dict[str, Any]]:
    """A simulated run's record with the time its GPU would have spent: the search's clock
    (the workers side by side) and the device time (each trial's wall time x its GPUs)."""
    if not isinstance(executor, SimulatedExecutor):
        return this_run
    key, run = this_run
    return key, run | {
        "simulated_clock_s": executor.clock_s,
        "simulated_device_s": executor.device_s,
    }


def _nothing_to_run(plan: SearchPlan, done: int) -> str:
    folder = shlex.quote(str(plan.study_dir))
    return (
        f"nothing to run: study={plan.study_name} has {done} trials finished and no new one ran "
        f"here (n_trials={plan.config.n_trials}); its confirmation stands. Raise n_trials to "
        f"search further; `autotune confirm {folder}` measures its picks again, `autotune "
        f"report {folder}` rewrites its outputs"
    )


def _store_end(
    study: optuna.Study,
    plan: SearchPlan,
    how: Ending,
    signal: str | None = None,
    stopped: str = "",
    then: str = "",
) -> RunEnd:
    """How this search ended, kept in the study for the outputs and `autotune report`."""
    end = RunEnd(
        how=how,
        done=trials_run(study),
        planned=plan.config.n_trials,
        signal=signal,
        stopped=stopped,
        then=then,
    )
    store_run_end(study, end)
    store_confidence(study, effects_model.confidence(plan, load_records(study)))
    return end


def _executor(given: TrialExecutor | None, config: RunConfig | None = None) -> TrialExecutor:
    """What runs the trials: the one given, else (the one place it is made) the one `executor=`
    names: this host's worker processes, each forked from a fork server of its placement, or
    a Ray cluster's nodes."""
    if given is not None:
        return given
    if config is not None and config.executor == "ray":
        return RayExecutor(config.ray_address)
    if config is not None and config.executor == "twin":
        return SimulatedExecutor(twin_answer.TwinAnswer(_twin_gpu(config), seed=config.seed))
    return LocalExecutor()


def _twin_gpu(config: RunConfig) -> twin_model.Gpu:
    """`gpu=` as the twin models it; a ConfigError naming the ones it models."""
    try:
        return twin_model.gpu(config.gpu or "")
    except KeyError:
        known = ", ".join(twin_model.constants()["gpus"])
        raise ConfigError(f"gpu={config.gpu}: not a GPU the twin models ({known})") from None


def _twin_device(config: RunConfig) -> DeviceInfo:
    """`gpu_count` of `gpu=` on one host, with the installed software's facts (torch,
    transformers, the optimizers and kernels this host's probe finds)."""
    gpu = _twin_gpu(config)
    return twin_answer.device_info(gpu, software_cache.probe_device(), config.gpu_count)


def _confirm(
    plan: SearchPlan,
    study: optuna.Study,
    rounds: int,
    observer: SearchObserver,
    executor: TrialExecutor,
) -> None:
    """The picks measured again (`autotune.outputs.confirm`), on the cores the trials had; not under
    other versions than the study's (`_start_run` said so)."""
    if rounds < 1 or conditions.other_versions(plan.versions, plan.info.versions):
        return
    if isinstance(executor, RayExecutor) and plan.slots[0].nodes == 1:
        # On one node of the cluster: the baseline and the picks measured on the same one.
        plan = dataclasses.replace(plan, slots=[executor.one_node(plan.slots[0])])
    # On the cores (or devices) the trials had: each run's submission carries the slot.
    confirm.confirm(plan, study, read_snapshot(study), rounds, observer=observer, executor=executor)


def _plan_of_stored(
    study_dir: Path,
    storage: str | None,
    study: str | None,
    observer: SearchObserver,
    device_info: DeviceInfo | None = None,
) -> tuple[optuna.Study, SearchPlan]:
    """A stored study and the plan of its settings on the cores (or devices) its trials had,
    the measurement conditions of the study, with its inputs prepared: for measuring its
    trials' settings again (`autotune confirm`, `autotune verify`), on the device
    `device_info` describes (default: probed)."""
    stored = load_study_dir(study_dir, storage, study)
    if (simulated := run_info(stored).simulated) is not None:
        raise StudyError(
            f"study={stored.study_name} is simulated by {simulated}: this command "
            "measures its picks on this host's device, beside no measured trial. Its picks "
            "were confirmed on the twin with the search (confirm_rounds=); measure them on "
            "the GPU with a search there"
        )
    same = {
        k: v
        for k, v in stored.user_attrs.get(SETTINGS_ATTR, {}).items()
        if k in ("workers", "devices")
    }
    # The folder as given, and its study.db: a study folder may have been copied or renamed
    # since the search made it under out/STUDY_NAME.
    url = storage or f"sqlite:///{(study_dir / STUDY_DB).resolve()}"
    config = join_config(
        WorkerConfig(out=study_dir.parent, study=stored.study_name, storage=url, **same)
    )
    if device_info is None:
        with observer.busy("probing the device"):
            device_info = software_cache.probe_device()
    plan = make_plan(config, device_info)
    check_owner(study_dir)
    plan = dataclasses.replace(plan, study_dir=study_dir.resolve())
    if config.trainer is not None:  # the study's factory (join_config checked its sha256)
        runs = describe(config.trainer, Path.cwd())  # where join_config looked it up
        observer.runs_code(f"trainer={config.trainer}: runs {runs}")
    prepare_inputs(plan, observer)
    return stored, plan


def confirm_study(
    study_dir: str | Path,
    *,
    rounds: int = 3,
    storage: str | None = None,
    study: str | None = None,
    observer: SearchObserver | None = None,
    executor: TrialExecutor | None = None,
    command: str | None = None,
    device_info: DeviceInfo | None = None,
) -> SearchResult:
    """Measure a study's picks again (`autotune confirm`), under the settings it was searched
    with and its lock, and write its outputs anew."""
    observer, executor = observer or SearchObserver(), _executor(executor)
    _, plan = _plan_of_stored(Path(study_dir), storage, study, observer, device_info)
    with locked_study(plan, "confirm") as (optuna_study, plan), stop_signals() as signals:
        this_run = _start_run(optuna_study, plan, "confirm", command, observer)
        try:
            _confirm(plan, optuna_study, rounds, observer, executor)
        except KeyboardInterrupt as exc:
            raise signals.interrupted(exc) from None
        with signals.deferred():
            snapshot, paths = _write_outputs(optuna_study, plan, this_run)
    return SearchResult(snapshot=snapshot, study_dir=plan.study_dir, paths=paths)


def verify_study(
    study_dir: str | Path,
    *,
    trial: int | None = None,
    steps: int = 200,
    storage: str | None = None,
    study: str | None = None,
    observer: SearchObserver | None = None,
    executor: TrialExecutor | None = None,
    command: str | None = None,
    device_info: DeviceInfo | None = None,
) -> tuple[Verification, SearchResult]:
    """Train the recommended trial's settings (or trial `trial`'s) for `steps` optimizer steps
    in a trial process (`autotune verify`), under the settings the study was searched with
    and its lock; store the comparison and write the outputs anew."""
    observer, executor = observer or SearchObserver(), _executor(executor)
    stored, plan = _plan_of_stored(Path(study_dir), storage, study, observer, device_info)
    record = _record_to_verify(read_snapshot(stored), trial)
    with locked_study(plan, "verify") as (optuna_study, plan), stop_signals() as signals:
        this_run = _start_run(optuna_study, plan, "verify", command, observer)
        try:
            # On the cores (or devices) the trials had: its submission carries the slot.
            verified = verify.verify(
                plan, optuna_study, record, steps, observer=observer, executor=executor
            )
        except KeyboardInterrupt as exc:
            raise signals.interrupted(exc) from None
        with signals.deferred():
            snapshot, paths = _write_outputs(optuna_study, plan, this_run)
    return verified, SearchResult(snapshot=snapshot, study_dir=plan.study_dir, paths=paths)


def _record_to_verify(snapshot: StudySnapshot, trial: int | None) -> TrialRecord:
    if trial is None:
        if snapshot.picks.recommended is None:
            raise StudyError("no trial to recommend in this study; pick one with trial=N")
        return snapshot.picks.recommended
    record = snapshot.record(trial)
    if record is None or record.status is not Status.OK:
        raise StudyError(f"trial={trial}: no successful trial with that number")
    return record


def _write_outputs(
    study: optuna.Study, plan: SearchPlan, this_run: tuple[str, dict[str, Any]] | None = None
) -> tuple[StudySnapshot, list[Path]]:
    if this_run is not None:  # its end time goes into the outputs' provenance
        # On the way out of a storage outage the write fails: the outputs still come first.
        with contextlib.suppress(AutotuneError, optuna.exceptions.StorageInternalError):
            end_run(study, *this_run)
    snapshot = read_snapshot(study)
    try:
        return snapshot, write_study_folder(snapshot, plan.study_dir)
    except StudyError as exc:
        if not snapshot.records:
            raise
        folder = shlex.quote(str(plan.study_dir))
        raise OutputsNotWritten(
            f"{exc}. The study's {len(snapshot.records)} trials are kept in its storage: "
            f"`autotune report {folder}` writes its outputs once it can"
        ) from exc


def join(
    worker: WorkerConfig,
    *,
    observer: SearchObserver | None = None,
    executor: TrialExecutor | None = None,
    command: str | None = None,
    device_info: DeviceInfo | None = None,
) -> tuple[SearchPlan, str]:
    """Join a study another search made (`autotune worker`): its settings come from the study;
    run its loop here (with `workers=` processes) until it has its trials, on the device
    `device_info` describes (default: probed). Returns the plan and why it stopped; the
    outputs are the search's (or `autotune report`'s) to write."""
    observer, executor = observer or SearchObserver(), _executor(executor)
    config = join_config(worker)
    if device_info is None:
        with observer.busy("probing the device"):
            device_info = software_cache.probe_device()
    plan = make_plan(config, device_info)
    prepare_inputs(plan, observer)
    study, plan = open_study(plan, joining=True)
    observer.planned(plan, done_before=trials_run(study))
    this_run = _start_run(study, plan, "worker", command, observer)
    with stop_signals() as signals:
        try:
            return plan, _run_workers(plan, study, observer, executor)
        except KeyboardInterrupt as exc:
            raise signals.interrupted(exc) from None
        finally:
            try:
                end_run(study, *this_run)
            finally:  # a storage that fails the last write still gets its log written back
                write_back(plan.storage_url)


_CALLED_AS = {"search": "run", "worker": "join", "confirm": "confirm_study",
              "verify": "verify_study"}  # fmt: skip


def _start_run(
    study: optuna.Study,
    plan: SearchPlan,
    kind: str,
    command: str | None,
    observer: SearchObserver,
) -> tuple[str, dict[str, Any]]:
    """Store this run's provenance with the study; say once when its versions are not the
    study's (its trials are then marked and kept out of the front)."""
    if note := conditions.versions_note(plan.study_name, plan.info.versions, plan.versions):
        observer.warned(note)
    # Every string through safe_url: a storage= URL's password is never stored.
    settings = {
        k: safe_url(v) if isinstance(v, str) else v
        for k, v in plan.config.model_dump(mode="json").items()
    }
    if command is None:  # called as a function of this module: `settings` hold its config
        command = f"autotune.api.{_CALLED_AS[kind]}(...)"
    record = conditions.run_record(
        kind=kind, command=command, settings=settings, info=plan.info, versions=plan.versions
    )
    return start_run(study, record), record


def prepare_inputs(plan: SearchPlan, observer: SearchObserver) -> None:
    """Before the first trial: tokenize the user's data once (a lookup when this study folder
    has it already), or check the user's Trainer factory; each in a subprocess, as both
    import torch. Problems are AutotuneErrors, raised before the study is touched."""
    if plan.data is not None and plan.data_dir is not None:
        if plan.study_dir.exists():  # a resumed study: its data folder checked, the trials read it
            make_folder(plan.data_dir.parent, plan.study_dir)
        with observer.busy(f"preparing data={plan.data.data}") as status:
            show = getattr(status, "update", lambda text: None)  # a live terminal's spinner
            folder = user_data.prepare_in_subprocess(plan.data, plan.data_dir.parent, show)
        if folder != plan.data_dir:
            raise DataError(
                f"data={plan.data.data}: its files changed while it was prepared; run again"
            )
        vocab_size = plan.model.config.get("vocab_size")
        max_token_id = read_ready(folder)["max_token_id"]
        if vocab_size and max_token_id >= vocab_size:
            raise DataError(
                f"tokenizer={plan.data.tokenizer}: the data holds token id {max_token_id}, "
                f"but model={plan.model.name} has a vocabulary of {vocab_size}; use the "
                "model's own tokenizer"
            )
    if plan.info.trainer is not None:
        with observer.busy(f"checking trainer={plan.info.trainer_factory}"):
            factories.check_in_subprocess(
                plan.info.trainer["factory"], Path(plan.info.trainer["search_dir"])
            )


def _refuse_certain_timeouts(plan: SearchPlan) -> None:
    """Refuse a search whose every trial would time out: the least work any trial of the
    space does needs more compute, at the fastest this device computes, than trial_timeout
    allows (`force=true` runs it anyway)."""
    least, config = plan.least_trial_s(), plan.config
    if least is None or least[0] <= config.trial_timeout or config.force:
        return
    seconds, rate = least
    steps = plan.trial_steps
    raise ConfigError(
        f"every trial would time out: the least work a trial of this space does ({steps} steps "
        f"at its smallest batch) needs at least {_minutes(seconds)} of compute at "
        f"{rate:.3g} TFLOP/s, the fastest this {plan.device} computes, over "
        f"trial_timeout={_minutes(config.trial_timeout)}. Raise trial_timeout, lower "
        "seq_len, measure_steps or warmup_steps, search a smaller model or on a faster device; "
        "force=true runs it anyway"
    )


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _run_workers(
    plan: SearchPlan, study: optuna.Study, observer: SearchObserver, executor: TrialExecutor
) -> Stop:
    """The study's loop here, on the one worker's device or cores, or in worker processes."""
    with observer.watching():
        if len(plan.slots) == 1:  # each trial's submission carries the slot
            stopped = run_search(
                plan, study, observer=observer, executor=executor, show_others=True
            )
        else:
            stopped = workers.run_workers(plan, study, observer, executor)
    observer.ended(stopped.reason)
    return stopped
