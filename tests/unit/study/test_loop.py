import optuna


def test_settings_another_process_is_running_are_not_run_again():
    from autotune.store.records import NOT_RUN_ATTR, PARAMS_ATTR, is_interrupted

    study = optuna.create_study(directions=["maximize", "minimize"])
    theirs = study.ask()
    theirs.set_user_attr(PARAMS_ATTR, {"batch_size": 16, "precision": "bf16"})
    mine = study.ask()
    # The same settings in another key order are the same settings.
    same = not_to_run(study, mine, {"precision": "bf16", "batch_size": 16}, 10)
    assert same.same_as_running and same.reason == "trial 0 was running these settings"
    assert not_to_run(study, mine, {"precision": "fp32", "batch_size": 16}, 10) is None
    mine.set_user_attr(NOT_RUN_ATTR, same.reason)
    study.tell(mine, state=optuna.trial.TrialState.FAIL)
    # Ended without running on purpose: never mistaken for a trial a dead search left behind.
    assert not is_interrupted(study.trials[mine.number])


def test_the_baseline_running_elsewhere_is_the_guess_that_fills_its_left_out_knobs():
    """Two workers on PostgreSQL: the second asked while the baseline ran and got the guess,
    which in an fp32-only space is the baseline's settings with `dataloader_num_workers=0`
    filled in; the baseline leaves that knob out, and it trains with 0."""
    from autotune.common.trial_settings import baseline_params
    from autotune.store.records import PARAMS_ATTR

    study = optuna.create_study(directions=["maximize", "minimize"])
    baseline = study.ask()
    baseline.set_user_attr(PARAMS_ATTR, baseline_params("adamw_torch_fused", None))
    guess = study.ask()
    same = not_to_run(
        study,
        guess,
        {**baseline_params("adamw_torch_fused", None), "dataloader_num_workers": 0},
        10,
    )
    assert same is not None and same.reason == "trial 0 was running these settings"
    other = {**baseline_params("adamw_torch_fused", None), "dataloader_num_workers": 2}
    assert not_to_run(study, guess, other, 10) is None


def test_of_two_retries_queued_at_once_the_earlier_runs_whichever_is_asked_first():
    from autotune.store.records import PARAMS_ATTR, RETRY_OF_ATTR

    study = optuna.create_study(directions=["maximize", "minimize"])
    settings = {"batch_size": 16}
    for _ in range(2):  # two processes found trial 5 dead and each queued its settings
        study.enqueue_trial({}, user_attrs={RETRY_OF_ATTR: 5})
    earlier, later = study.ask(), study.ask()
    for trial in (later, earlier):  # the later copy was asked for, and published, first
        trial.set_user_attr(PARAMS_ATTR, settings)
    assert not_to_run(study, later, settings, 10).reason.startswith(
        "trial 0 was queued for the same"
    )
    assert not_to_run(study, earlier, settings, 10) is None, "neither would run"


def test_trials_asked_for_earlier_go_first_up_to_n_trials():

    study = optuna.create_study(directions=["maximize", "minimize"])
    first, second, third = study.ask(), study.ask(), study.ask()
    # Two slots: the two smaller numbers run, the third was one too many.
    assert not_to_run(study, first, {"batch_size": 8}, 2) is None
    assert not_to_run(study, second, {"batch_size": 16}, 2) is None
    too_many = not_to_run(study, third, {"batch_size": 32}, 2)
    assert too_many.reason == "n_trials=2 were finished or running when it was asked for"
    assert not too_many.same_as_running
    study.tell(first, state=optuna.trial.TrialState.FAIL)  # interrupted: its slot is free again
    assert not_to_run(study, third, {"batch_size": 32}, 2) is None


def test_of_two_retries_queued_for_one_trial_only_the_first_runs():
    from autotune.store.records import RETRY_OF_ATTR

    study = optuna.create_study(directions=["maximize", "minimize"])
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # trial 0, interrupted
    for _ in range(2):  # two processes recovering at the same moment each queue a retry
        study.enqueue_trial({}, user_attrs={RETRY_OF_ATTR: 0})
    first, second = study.ask(), study.ask()
    assert (first.number, second.number) == (1, 2)
    assert not_to_run(study, first, {"batch_size": 8}, 10) is None
    again = not_to_run(study, second, {"batch_size": 8}, 10)
    assert again.reason == "trial 1 was queued for the same: trial 0's settings again"


def test_of_two_baselines_queued_at_once_only_the_first_runs():
    from autotune.store.records import BASELINE_ATTR
    from autotune.study.opening import enqueue_baseline

    study = optuna.create_study(directions=["maximize", "minimize"])
    for _ in range(2):  # two workers starting on a new study at the same moment
        study.enqueue_trial({}, user_attrs={BASELINE_ATTR: True})
    enqueue_baseline(study, study.get_trials(deepcopy=False), {})  # one is queued: no third
    first, second = study.ask(), study.ask()
    assert not_to_run(study, first, {"batch_size": 8}, 10) is None
    again = not_to_run(study, second, {"batch_size": 8}, 10)
    assert again.reason == "trial 0 was queued for the same: the baseline"


def not_to_run(study, trial, params, n_trials):
    from autotune.study.not_run import not_to_run

    return not_to_run(trial, params, n_trials, study.get_trials(deepcopy=False))


def test_a_trial_stops_early_under_half_the_fastest_feasible_trials_pace(tmp_path):
    import dataclasses

    from autotune.common.device import DeviceInfo
    from autotune.common.trial import Status, TrialResult
    from autotune.plan.overrides import load_config
    from autotune.plan.plan import make_plan
    from autotune.store.records import TrialRecord
    from autotune.study.launch import stop_threshold
    from tests.conftest import TINY_MODEL

    cpu = DeviceInfo(
        cuda_available=False,
        name="cpu",
        total_memory_bytes=2**34,
        free_memory_bytes=2**34,
        cpu_name="cpu",
        host_available_memory_bytes=2**34,
    )
    plan = make_plan(
        load_config([f"model={TINY_MODEL}", f"out={tmp_path}", "memory_budget=8GiB"]), cpu
    )

    def ran(number, speed, peak, status=Status.OK):
        return TrialRecord(
            number=number,
            params={},
            result=TrialResult(status=status, samples_per_s=speed, peak_memory_gib=peak),
        )

    assert stop_threshold(plan, []) is None, "nothing to compare with yet"
    records = [
        ran(0, 40.0, 1.0),
        ran(1, 300.0, 9.0),  # past the 8 GiB budget: not counted
        ran(2, 100.0, 2.0),
        ran(3, 30.0, 1.0, Status.STOPPED),
    ]
    assert stop_threshold(plan, records) == 50.0
    off = dataclasses.replace(plan, config=plan.config.model_copy(update={"early_stop": False}))
    assert stop_threshold(off, records) is None


def test_another_process_training_on_this_searchs_cores_is_said_once(tmp_path):
    """An `autotune worker` started on the search's host without cores of its own trains on
    the same cores: each trial then measures less than it would alone. Said once; a process
    on other cores (a sibling of workers=N) is not."""
    import os
    import socket

    from autotune.common.device import DeviceInfo
    from autotune.execute.local import LocalExecutor
    from autotune.plan.overrides import load_config
    from autotune.plan.plan import make_plan
    from autotune.store.records import OWNER_ATTR
    from autotune.study.loop import _Loop
    from autotune.study.observer import SearchObserver
    from autotune.study.recovery import shares_with, this_process
    from tests.conftest import TINY_MODEL

    cpu = DeviceInfo(
        cuda_available=False,
        name="cpu",
        total_memory_bytes=2**34,
        free_memory_bytes=2**34,
        cpu_name="cpu",
        host_available_memory_bytes=2**34,
    )
    plan = make_plan(load_config([f"model={TINY_MODEL}", f"out={tmp_path}"]), cpu)

    said: list[str] = []

    class Heard(SearchObserver):
        def warned(self, message):
            said.append(message)

    study = optuna.create_study(directions=["maximize", "minimize"])
    loop = _Loop.start(plan, study, Heard(), LocalExecutor())
    me = this_process()
    theirs = {**me, "pid": os.getppid()}  # alive, on this host, not this process
    elsewhere = {**theirs, "cpus": [max(me["cpus"]) + 1]}
    assert shares_with(elsewhere, me, cuda=False) is None
    assert shares_with(theirs, me, cuda=False).startswith("core")
    assert shares_with({"cuda": "0,1"}, {"cuda": "1"}, cuda=True) == "GPU 1"
    assert shares_with({"cuda": "0"}, {"cuda": "1"}, cuda=True) is None
    running = study.ask()
    running.set_user_attr(OWNER_ATTR, elsewhere)
    loop.warn_sharing(study.get_trials(deepcopy=False), number=99)
    assert said == []
    running.set_user_attr(OWNER_ATTR, theirs)
    for _ in range(2):
        loop.warn_sharing(study.get_trials(deepcopy=False), number=99)
    (warning,) = said
    assert warning.startswith(
        f"trial 0 of this study runs on this host now (pid {os.getppid()}), on core"
    )
    assert socket.gethostname() == me["host"]
