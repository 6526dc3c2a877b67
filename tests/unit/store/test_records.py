import optuna

from autotune.store.records import RUN_ATTR, Ending, Stop, run_info


def test_run_info_of_a_study_that_stored_the_batch_mode_sentence():
    study = optuna.create_study(directions=["maximize", "minimize"])
    info = {
        "study": "s",
        "model": "m",
        "model_config": {},
        "task": "t",
        "seq_len": 8,
        "device": "cpu",
        "device_name": "cpu",
        "space": "cpu",
        "space_notes": [],
        "batch_mode": "effective batch 32 (grad_accum derived)",
        "memory_budget_bytes": 1,
        "headroom": 0.1,
        "noise_cv": 0.1,
    }
    study.set_user_attr(RUN_ATTR, info)
    assert run_info(study).effective_batch_size == 32


def test_loops_that_stopped_together_say_each_reason_once_and_a_timeout_wins():
    done = Stop("6 of 6 trials finished")
    late = Stop("timeout: 5 of 6 trials finished", Ending.TIMEOUT)
    assert Stop.of_all([done, done]) == done
    assert Stop.of_all([done, late]) == Stop(
        "6 of 6 trials finished; timeout: 5 of 6 trials finished", Ending.TIMEOUT
    )
