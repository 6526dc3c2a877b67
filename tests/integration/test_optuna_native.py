"""A study is an ordinary Optuna study: Optuna's own tools see every trial's settings and
figures, the baseline's included."""

import optuna
import pytest

from autotune import cli
from autotune.knobs import KNOBS
from tests.conftest import TINY_MODEL, fake_launcher


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    args = [f"model={TINY_MODEL}", "n_trials=5", "seq_len=32", f"out={out}", "study=n"]
    assert cli.main(["search", *args], launcher=fake_launcher("ok")) == 0
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
    assert {"precision", "batch_size", "optim"} <= set(study.trials[1].distributions)


def test_the_main_figures_are_columns_of_trials_dataframe(study):
    frame = study.trials_dataframe()
    for column in (
        "values_samples_per_s", "values_peak_memory_gib", "user_attrs_status",
        "user_attrs_samples_per_s", "user_attrs_tokens_per_s", "user_attrs_peak_memory_gib",
        "user_attrs_step_time_cv", "user_attrs_noisy", "user_attrs_mfu",
    ):  # fmt: skip
        assert column in frame.columns, column
    assert (frame["user_attrs_status"] == "ok").all()
    assert frame["user_attrs_samples_per_s"].tolist() == frame["values_samples_per_s"].tolist()
    assert not frame["user_attrs_noisy"].any()  # the fake measures a step CV of 1%
    assert {f"params_{k}" for k in ("precision", "batch_size")} <= set(frame.columns)
    assert set(study.trials[0].params) <= set(KNOBS)


def test_optunas_importance_runs_on_the_study_as_stored(study):
    importance = optuna.importance.get_param_importances(study, target=lambda t: t.values[0])
    assert set(importance) <= set(KNOBS)
