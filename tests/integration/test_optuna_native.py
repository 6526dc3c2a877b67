"""A study is an ordinary Optuna study: Optuna's own tools see every trial's settings and
figures, the baseline's included."""

import optuna
import pytest

from autotune import cli
from autotune.common.knobs import KNOBS
from tests.conftest import TINY_MODEL, fake_executor


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    args = [
        f"model={TINY_MODEL}",
        "n_trials=5",
        "seq_len=32",
        f"out={out}",
        "study=n",
        "confirm_rounds=0",
    ]
    assert cli.main(["search", *args], executor=fake_executor("ok")) == 0
    return optuna.load_study(study_name="n", storage=f"sqlite:///{out / 'n' / 'study.db'}")


def test_the_baseline_has_its_settings_as_optuna_parameters(study):
    baseline = study.trials[0]
    assert baseline.user_attrs["baseline"]
    settings = baseline.user_attrs["params"]
    # Every knob of the baseline is a parameter, with the value it ran with; the knobs the
    # space searches keep the distributions the sampler uses for the other trials.
    assert baseline.params == settings
    for name, distribution in baseline.distributions.items():
        later = [t.distributions[name] for t in study.trials[1:] if name in t.distributions]
        assert all(d == distribution for d in later), name
    assert {"grad_accum", "batch_size", "optim"} <= set(study.trials[1].distributions)


def test_the_main_figures_are_columns_of_trials_dataframe(study):
    frame = study.trials_dataframe()
    for column in (
        "values_samples_per_s",
        "values_peak_memory_gib",
        "user_attrs_status",
        "user_attrs_samples_per_s",
        "user_attrs_tokens_per_s",
        "user_attrs_peak_memory_gib",
        "user_attrs_step_time_cv",
        "user_attrs_noisy",
        "user_attrs_mfu",
    ):
        assert column in frame.columns, column
    assert (frame["user_attrs_status"] == "ok").all()
    assert frame["user_attrs_samples_per_s"].tolist() == frame["values_samples_per_s"].tolist()
    assert not frame["user_attrs_noisy"].any()  # the fake measures a step CV of 1%
    assert {f"params_{k}" for k in ("grad_accum", "batch_size")} <= set(frame.columns)
    assert set(study.trials[0].params) <= set(KNOBS)


def test_optunas_importance_runs_on_the_study_as_stored(study):
    importance = optuna.importance.get_param_importances(study, target=lambda t: t.values[0])
    assert set(importance) <= set(KNOBS)


SEARCHED = {"precision", "batch_size", "grad_accum", "optim"}
SMALL_BATCHES = """
description: micro batches below the HF default's 8, with accumulation and checkpointing
device: any
knobs:
  batch_size: {choices: [1, 2, 4]}
  grad_accum: {choices: [4, 8]}
  gradient_checkpointing: true
  optim: {choices: [adafactor, adamw_torch]}
"""


@pytest.mark.parametrize(
    ("space", "sampler", "baseline_in_space"),
    [("small-batches", "nsga2", False), ("cpu", "gp", True)],
)
def test_no_relative_sampler_falls_back_to_random_after_the_baseline(
    tmp_path, space, sampler, baseline_in_space
):
    """GP and NSGA-II model only the parameters every COMPLETE trial has, with one
    distribution. A baseline outside the space (batch 8 where it has 1, 2 and 4, as the
    memory space has no fp32) would empty that set: it is recorded but kept out of the
    samplers' view (FAIL, `outside_space`)."""
    if space == "small-batches":
        space = tmp_path / "small-batches.yaml"
        space.write_text(SMALL_BATCHES)
    args = [
        f"model={TINY_MODEL}",
        "n_trials=4",
        "seq_len=32",
        f"out={tmp_path}",
        "study=s",
        f"space={space}",
        f"sampler={sampler}",
    ]
    assert cli.main(["search", *args], executor=fake_executor("ok")) == 0
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    baseline = study.trials[0]
    assert baseline.user_attrs["baseline"] and baseline.user_attrs["result"]["status"] == "ok"
    assert baseline.user_attrs.get("outside_space", False) is not baseline_in_space
    expected = (
        optuna.trial.TrialState.COMPLETE if baseline_in_space else optuna.trial.TrialState.FAIL
    )
    assert baseline.state is expected
    modelled = optuna.search_space.IntersectionSearchSpace().calculate(study)
    # What the space searches here (fitted to the CPU: bf16 only where it has instructions).
    searched = {k for k in study.trials[1].distributions if k in SEARCHED}
    assert len(searched) >= 2, searched
    assert searched <= set(modelled), f"{sorted(searched - set(modelled))} fall back to random"
    gp = optuna.samplers.GPSampler(seed=0)
    assert searched <= set(gp.infer_relative_search_space(study, study.trials[-1]))
