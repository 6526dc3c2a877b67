"""An interrupted search in the outputs: its trials as rows, how it ended in words, and the
exit code `autotune report` gives back; a study of the user's own Trainer (`trainer=`) says
what the factory really trains. Studies are in memory; nothing runs."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autotune.cli.results import _exit_code
from autotune.common.device import DeviceInfo
from autotune.common.trial import Status, TrialResult
from autotune.outputs.outcome import print_outcome
from autotune.outputs.report.data import build_report_data
from autotune.outputs.snapshot import read_snapshot, trained_note
from autotune.outputs.study_folder import table
from autotune.outputs.terminal import Reporter
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.store.outcomes import Ending, RunEnd, store_run_end
from autotune.store.records import (
    BASELINE_ATTR,
    INTERRUPTED_BY_ATTR,
    PARAMS_ATTR,
    RETRY_OF_ATTR,
    TrialRecord,
    store_run_info,
    tell_result,
)
from tests.conftest import TINY_MODEL
from tests.unit.outputs.report.test_data import INFO

OK = TrialResult(status=Status.OK, samples_per_s=100.0, peak_memory_gib=4.0, step_time_cv=0.01)


OOM = TrialResult(status=Status.OOM, reason="out of memory")


def make_study(*outcomes, end: RunEnd | None = None) -> optuna.Study:
    """Trial k has batch size 8 * (k + 1) and the k-th outcome: a TrialResult, `interrupted`
    (failed while its search stopped on SIGTERM), `running` (another live search's), or
    `("retry", n)`: interrupted trial n's settings run again, measured ok."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    store_run_info(study, INFO)
    for k, outcome in enumerate(outcomes):
        trial = study.ask()
        trial.set_user_attr(PARAMS_ATTR, {"batch_size": 8 * (k + 1)})
        trial.set_user_attr(BASELINE_ATTR, k == 0)
        if outcome == "running":
            continue
        if outcome == "interrupted":
            trial.set_user_attr(INTERRUPTED_BY_ATTR, "SIGTERM")
            study.tell(trial, state=TrialState.FAIL)
            continue
        if isinstance(outcome, tuple):
            trial.set_user_attr(RETRY_OF_ATTR, outcome[1])
            outcome = OK
        tell_result(study, trial, outcome, budget_gib=INFO.memory_budget_gib, noise_cv=0.1)
    if end is not None:
        store_run_end(study, end)
    return study


def interrupted(done: int, planned: int) -> RunEnd:
    return RunEnd(how=Ending.INTERRUPTED, done=done, planned=planned, signal="SIGTERM")


def test_an_interrupted_trial_is_a_row_with_its_status_and_never_on_the_front():
    snapshot = read_snapshot(make_study(OK, "interrupted", "running"))
    # The running trial is another live search's: not interrupted, and no row yet.
    assert [(r.number, r.status) for r in snapshot.records] == [
        (0, Status.OK),
        (1, Status.INTERRUPTED),
    ]
    assert snapshot.records[1].result.reason == "the search was interrupted (SIGTERM) while it ran"
    assert [r.number for r in snapshot.front] == [0]
    assert snapshot.picks.recommended.number == 0
    _, rows = table(snapshot.records, snapshot)  # trials.csv
    assert [(row["number"], row["status"], row["batch_size"]) for row in rows] == [
        (0, "ok", 8),
        (1, "interrupted", 16),
    ]
    assert rows[1]["samples_per_s"] is None


def test_an_interrupted_trial_run_again_appears_once_pointing_at_its_retry():
    snapshot = read_snapshot(make_study(OK, "interrupted", ("retry", 1)))
    assert [(r.number, r.status) for r in snapshot.records] == [
        (0, Status.OK),
        (1, Status.INTERRUPTED),
        (2, Status.OK),
    ]
    assert snapshot.records[1].result.reason.endswith("; trial 2 runs its settings again")


def test_how_a_search_ended_in_words_and_stored_with_the_study():
    assert interrupted(1, 4).describe() == "interrupted after 1 of 4 trials (SIGTERM)"
    timeout = RunEnd(how=Ending.TIMEOUT, done=2, planned=6, stopped="timeout: 2 of 6 ...")
    assert timeout.describe() == "stopped by timeout after 2 of 6 trials"
    complete = RunEnd(how=Ending.COMPLETE, done=6, planned=6, stopped="6 of 6 trials finished")
    assert complete.describe() == "6 of 6 trials finished"
    study = make_study(OK, end=timeout)
    assert read_snapshot(study).ended == timeout
    store_run_end(study, None)  # a search started again: the earlier end no longer holds
    assert read_snapshot(study).ended is None


def test_an_interrupted_search_with_nothing_to_recommend_never_says_exit_code_3(tmp_path):
    snapshot = read_snapshot(make_study(OOM, "interrupted", end=interrupted(1, 4)))
    summary = build_report_data(snapshot).summary
    assert summary["search ended"] == "interrupted after 1 of 4 trials (SIGTERM)"
    assert summary["trials"] == "1 interrupted, 1 oom"
    assert summary["recommended"].startswith("nothing to recommend yet")
    assert "interrupted after 1 of 4 trials" in summary["recommended"]
    assert not any("code 3" in text for text in summary.values())
    log = tmp_path / "out.log"
    print_outcome(Reporter(quiet=True, log_path=log), snapshot)
    said = log.read_text()
    assert "the search was interrupted after 1 of 4 trials (SIGTERM)" in said
    assert "exit code 3" not in said
    assert _exit_code(snapshot) == 143  # what the search exited with, for SIGTERM


def test_a_timeout_says_so_and_keeps_the_exit_code_of_a_complete_search(tmp_path):
    timeout = RunEnd(how=Ending.TIMEOUT, done=1, planned=6)
    snapshot = read_snapshot(make_study(OOM, end=timeout))
    summary = build_report_data(snapshot).summary
    assert summary["search ended"] == "stopped by timeout after 1 of 6 trials"
    assert "exits with code 3" in summary["recommended"]
    log = tmp_path / "out.log"
    print_outcome(Reporter(quiet=True, log_path=log), snapshot)
    assert "the search was stopped by timeout after 1 of 6 trials" in log.read_text()
    assert _exit_code(snapshot) == 3
    measured = read_snapshot(make_study(OK, end=timeout))
    assert _exit_code(measured) == 0


def test_a_complete_search_is_not_called_interrupted_nor_timed_out(tmp_path):
    complete = RunEnd(how=Ending.COMPLETE, done=1, planned=1, stopped="1 of 1 trials finished")
    snapshot = read_snapshot(make_study(OK, end=complete))
    assert build_report_data(snapshot).summary["search ended"] == "1 of 1 trials finished"
    log = tmp_path / "out.log"
    print_outcome(Reporter(quiet=True, log_path=log), snapshot)
    assert "the search was" not in log.read_text()
    assert _exit_code(snapshot) == 0
    assert _exit_code(read_snapshot(make_study(OOM, end=complete))) == 3


CPU = DeviceInfo(
    cuda_available=False,
    name="cpu",
    total_memory_bytes=2**34,
    free_memory_bytes=2**34,
    cpu_name="cpu",
    host_available_memory_bytes=2**34,
)


def trained(model: str | None, seq_len: int | None, status: Status = Status.OK) -> TrialRecord:
    result = TrialResult(
        status=status,
        samples_per_s=10.0,
        peak_memory_gib=1.0,
        trained_model=model,
        trained_seq_len=seq_len,
    )
    return TrialRecord(number=0, params={}, result=result, baseline=True)


def test_what_the_factory_trains_is_said_when_it_is_not_what_the_study_is_named_for(tmp_path):
    factory = tmp_path / "f.py"
    factory.write_text("def make(args, model_kwargs):\n    pass\n")
    settings = [f"model={TINY_MODEL}", "seq_len=128", f"out={tmp_path}", f"trainer={factory}:make"]
    plan = make_plan(load_config(settings), CPU)
    assert plan.estimate_gib(plan.baseline) is None  # no estimate of a model it may not train
    info = plan.info
    assert trained_note(info, [trained("bert", 128)]) is None  # the config's model_type
    assert trained_note(info, [trained(TINY_MODEL, 128)]) is None
    assert trained_note(info, [trained("bert", 57)]) == (
        f"the factory trains bert on batches of up to 57 tokens, not model={TINY_MODEL} at "
        "seq_len=128: those name the study only, and no memory estimate is made for a "
        "factory's model"
    )
    assert "trains gpt2 on" in trained_note(info, [trained("gpt2", 128)])
    assert trained_note(info, [trained("gpt2", 64, Status.OOM)]) is None  # nothing trained
    ours = make_plan(load_config(settings[:3]), CPU)
    assert ours.estimate_gib(ours.baseline) is not None


def test_the_best_found_and_how_soon_on_the_trials_clock():
    from autotune.outputs.snapshot import anytime

    def ran(number, speed, wall_s, status=Status.OK, peak=4.0):
        return TrialRecord(
            number=number,
            params={"batch_size": 8 * (number + 1)},
            result=TrialResult(
                status=status, samples_per_s=speed, peak_memory_gib=peak, wall_s=wall_s
            ),
        )

    records = [
        ran(0, 39.4, 22.0),
        ran(1, 300.0, 25.0),
        ran(2, None, 20.0, Status.OOM),
        ran(3, 500.0, 30.0, peak=90.0),  # past the budget: found nothing
        TrialRecord(number=4, params={}, result=TrialResult(status=Status.SKIPPED)),
        ran(5, 320.0, 26.0),
    ]
    found = anytime(records, budget_gib=80.0)
    assert (found.best.number, found.best_s) == (5, 22.0 + 25.0 + 20.0 + 30.0 + 26.0)
    assert (found.near.number, found.near_s) == (1, 47.0)  # 300 >= 0.9 x 320
    assert found.describe("8.12x the baseline in one short trial") == (
        "best 320.00 samples/s (8.12x the baseline in one short trial) by trial 5, 2.0 min of "
        "trials into the search; 90% of it by trial 1, 47 s"
    )
    assert anytime(records[2:3], budget_gib=80.0) is None


def test_a_compiled_trial_says_after_how_many_steps_its_compile_pays_off():
    from autotune.outputs.snapshot import StudySnapshot

    eager = {"batch_size": 64, "precision": "bf16", "torch_compile": "off"}
    compiled = {**eager, "torch_compile": "inductor", "compile_mode": "default"}

    def ran(number, params, step_ms, compile_s=None, peak_gib=4.0):
        return TrialRecord(
            number=number,
            params=params,
            result=TrialResult(
                status=Status.OK,
                samples_per_s=params["batch_size"] * 1e3 / step_ms,
                step_time_median_ms=step_ms,
                compile_s=compile_s,
                peak_memory_gib=peak_gib,
            ),
        )

    def snapshot(*records):
        return StudySnapshot(info=INFO, records=list(records), front=[], picks=None, search_s=None)

    faster = ran(2, compiled, 200.0, compile_s=77.0)
    said = snapshot(ran(1, eager, 205.0), faster).compile_payoff(faster)
    assert said == (
        "compiling took 77 s; it pays off after 15,400 training steps (each 5 ms "
        "faster than trial 1's eager steps)"
    )
    slower = ran(2, compiled, 272.0, compile_s=77.0)  # bert-large bf16 bs 64 on the H100
    assert (
        snapshot(ran(1, eager, 205.0), slower)
        .compile_payoff(slower)
        .endswith(
            "its steps are slower than trial 1's eager ones (272 vs 205 ms): it never pays off"
        )
    )
    assert (
        snapshot(slower).compile_payoff(slower) == "compiling took 77 s (no eager trial to compare)"
    )
    # Compiled at a smaller batch (its activations take more memory): against the fastest
    # feasible eager trial, sample for sample. 32 samples in 100 ms is 320 samples/s against
    # 300: each step trains what takes the eager trial 106.7 ms.
    at_32 = ran(3, {**compiled, "batch_size": 32}, 100.0, compile_s=80.0)
    fastest = ran(1, {**eager, "batch_size": 128}, 128e3 / 300.0)
    over_budget = ran(4, {**eager, "batch_size": 256}, 256e3 / 400.0, peak_gib=200.0)
    assert snapshot(ran(2, eager, 250.0), fastest, over_budget, at_32).compile_payoff(at_32) == (
        "compiling took 80 s; it pays off after 12,000 training steps (each trains its "
        "samples 7 ms faster than trial 1, the fastest eager one)"
    )
    slow_32 = ran(3, {**compiled, "batch_size": 32}, 128.0, compile_s=80.0)
    assert (
        snapshot(fastest, slow_32)
        .compile_payoff(slow_32)
        .endswith(
            "it trains slower than trial 1, the fastest eager one (250.0 vs 300.0 samples/s): it "
            "never pays off"
        )
    )
    assert snapshot(ran(1, eager, 205.0)).compile_payoff(ran(1, eager, 205.0)) is None
