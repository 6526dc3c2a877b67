import optuna

from autotune.store.records import RUN_ATTR, run_info


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
