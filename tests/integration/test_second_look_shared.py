"""The second look (`study.second_look`) where the study is shared and processes die: cut off
however often, taken by another process's loop, against an out-of-memory trial met since, and
a study resumed after it ran. Trials are answered by the simulated executor on a SQLite
study: no process, no training."""

import dataclasses

import pytest

from autotune.common.trial import Status, TrialResult
from autotune.execute.simulated import SimulatedExecutor
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.store.records import SECOND_LOOK_ATTR, load_records, trials_run
from autotune.study import second_look
from autotune.study.loop import run_search
from autotune.study.observer import SearchObserver
from autotune.study.opening import open_study
from tests.conftest import TINY_MODEL
from tests.unit.study.test_effects import CPU

SPACE = """
device: cpu
knobs:
  batch_size: {choices: [8, 16, 32, 64]}
  optim: {choices: [adamw_torch, adamw_torch_fused, adafactor]}
  attn_implementation: {choices: [sdpa, eager]}
"""


def search(tmp_path, n_trials):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    settings = [f"model={TINY_MODEL}", f"space={space}", f"out={tmp_path}",
                f"n_trials={n_trials}", "memory_budget=8GiB", "confirm_rounds=0"]  # fmt: skip
    plan = make_plan(load_config(settings), CPU)
    plan.study_dir.mkdir(parents=True)
    return open_study(plan)


class Busy:
    """A machine grown busy after the baseline: every later trial under half its pace (stopped
    early where the loop asks), the small batches out of memory (another job's), or, for
    the trial numbers in `cut_off`, the search stopped while it ran."""

    def __init__(self, cut_off=()):
        self.cut_off = set(cut_off)
        self.ran = []

    def __call__(self, spec):
        self.ran.append(spec)
        if spec.trial_number in self.cut_off:
            raise KeyboardInterrupt
        ok = {"peak_memory_gib": 1.0, "wall_s": 2.0}
        if spec.trial_number == 0:
            return TrialResult(status=Status.OK, samples_per_s=100.0, measured_steps=10, **ok)
        if spec.params["batch_size"] < 32:
            return TrialResult(status=Status.OOM, wall_s=1.0, reason="CUDA out of memory")
        if spec.stop_below_samples_per_s:
            return TrialResult(status=Status.STOPPED, samples_per_s=30.0, measured_steps=1, **ok)
        return TrialResult(status=Status.OK, samples_per_s=30.0, measured_steps=10, **ok)


def looks(study):
    return [t for t in study.get_trials() if SECOND_LOOK_ATTR in t.user_attrs]


def test_a_look_cut_off_twice_runs_when_the_search_is_resumed_and_counts_toward_nothing(
    tmp_path,
):
    # A look runs past timeout=: a scheduler's time limit may end it, and its retry too.
    study, plan = search(tmp_path, n_trials=6)
    run_search(plan, study, executor=SimulatedExecutor(Busy()))
    stopped = second_look.to_look_at(load_records(study), plan.info.memory_budget_gib)
    first = len(study.get_trials())
    for number in (first, first + 1):
        with pytest.raises(KeyboardInterrupt):
            second_look.run(
                plan, study, SearchObserver(), SimulatedExecutor(Busy([number])), may_start=True
            )
    busy = Busy()
    said = second_look.run(plan, study, SearchObserver(), SimulatedExecutor(busy), may_start=False)

    (look,) = [t for t in looks(study) if t.state.is_finished() and t.values]
    assert said == (
        f"trial {stopped.number}'s settings ran again to the end as trial {look.number}, at "
        "30.00 samples/s (no other trial after the baseline had ended ok under the memory limit)"
    )
    assert [s.stop_below_samples_per_s for s in busy.ran] == [None], "to its end"
    # Trials that run out of memory since (at smaller batches than it) skip nothing of it.
    assert look.user_attrs["result"]["status"] == "ok"
    # One trial over n_trials, counted toward none: a resume with room for 2 more runs 2.
    assert trials_run(study) == 6
    assert second_look.run(plan, study, SearchObserver(), None, may_start=True) is None
    more = dataclasses.replace(plan, config=plan.config.model_copy(update={"n_trials": 8}))
    busy = Busy()
    assert run_search(more, study, executor=SimulatedExecutor(busy)).reason.startswith("8 of 8")
    assert len(busy.ran) == 2


def test_a_look_another_process_s_loop_takes_runs_to_its_end_there_and_counts_toward_nothing(
    tmp_path,
):
    # The search's loop ended (its timeout) and it queued the look; an `autotune worker` of
    # the study, with trials left to run, asks next: Optuna hands it the queued look.
    study, plan = search(tmp_path, n_trials=4)
    run_search(plan, study, executor=SimulatedExecutor(Busy()))
    record = second_look.to_look_at(load_records(study), plan.info.memory_budget_gib)
    second_look.enqueue(study, study.get_trials(), record)
    worker = dataclasses.replace(plan, config=plan.config.model_copy(update={"n_trials": 6}))
    busy = Busy()
    run_search(worker, study, executor=SimulatedExecutor(busy))

    (look,) = looks(study)
    assert look.user_attrs["result"]["status"] == "ok", "early stopping off for it there too"
    assert len(busy.ran) == 3, "the look and the worker's own 2 trials"
    assert trials_run(study) == 6
    # The search, back from its loops, finds the look recorded: nothing more to run.
    assert second_look.run(plan, study, SearchObserver(), None, may_start=True) is None
