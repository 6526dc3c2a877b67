"""The Python API: `autotune.search` and `autotune.load`, as docs/python-api.md shows them."""

import csv
import json
import re
import subprocess
import sys

import pytest

import autotune
from autotune import cli
from autotune.common.errors import ConfigError
from tests.conftest import TINY_MODEL, fake_executor
from tests.docs_text import page


def documented_example() -> str:
    """The Python block of docs/python-api.md (run verbatim by test_readme_examples.py)."""
    return re.search(r"```python\n(.*?)```", page("python-api.md"), re.S).group(1)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    return autotune.search(
        model=TINY_MODEL,
        seq_len=32,
        n_trials=5,
        out=out,
        study="api",
        report_to="tensorboard",
        executor=fake_executor("ok"),
        quiet=True,
    )


def test_the_result_is_what_the_study_folder_says(result):
    recommended = json.loads((result.study_dir / "recommended.json").read_text())
    assert result.recommended.number == recommended["trial"]
    assert result.recommended.params == recommended["params"]
    assert result.recommended.speedup == recommended["speedup_vs_baseline"]
    assert [c.setting for c in result.recommended.changes_training] == [
        c["setting"] for c in recommended["changes_training"]
    ]
    assert result.baseline.number == 0 and result.baseline.speedup == 1.0
    assert [t.number for t in result.front] == [
        int(row["number"]) for row in csv.DictReader(open(result.study_dir / "pareto.csv"))
    ]
    # and, where a loaded machine stopped every trial after the baseline early, the fastest of
    # them run again to its end (a second look).
    stopped, *looked = result.stopped.split("; ")
    assert stopped == "5 of 5 trials finished"
    assert looked == [] or (looked[0].startswith("trial ") and "ran again" in looked[0])


def test_training_args_are_real_and_take_overrides(result):
    args = result.recommended.training_args(output_dir="run", learning_rate=1e-4)
    kwargs = result.recommended.training_args_kwargs
    assert type(args).__name__ == "TrainingArguments"
    assert args.per_device_train_batch_size == kwargs["per_device_train_batch_size"]
    assert args.learning_rate == 1e-4 and args.output_dir == "run"
    assert args.report_to == ["tensorboard"]  # the study's report_to


def test_to_dataframe_holds_the_rows_of_trials_csv(result):
    frame = result.to_dataframe()
    rows = list(csv.DictReader(open(result.study_dir / "trials.csv")))
    assert list(frame.columns) == list(rows[0])
    assert frame["number"].tolist() == [int(r["number"]) for r in rows]
    assert frame["samples_per_s"].round(3).tolist() == [
        round(float(r["samples_per_s"]), 3) for r in rows
    ]


def test_load_reads_a_finished_study_alike(result):
    loaded = autotune.load(result.study_dir)
    assert loaded.recommended.number == result.recommended.number
    assert [t.number for t in loaded.trials] == [t.number for t in result.trials]
    assert loaded.stopped is None
    assert {p.name for p in loaded.paths} >= {"trials.csv", "report.html", "recommended.json"}


def test_bad_settings_raise_one_error_naming_every_problem(tmp_path):
    with pytest.raises(ConfigError) as raised:
        autotune.search(model=TINY_MODEL, seq_len=-1, n_trial=3, report_to="w b", out=tmp_path)
    message = str(raised.value)
    assert "3 problems" in message
    assert "did you mean n_trials" in message and "seq_len=-1" in message
    assert "report_to=w b" in message
    assert not any(tmp_path.iterdir()), "nothing is written for a refused search"


def test_importing_autotune_loads_nothing_heavy():
    code = "import sys, autotune; print(sorted({'optuna', 'torch', 'plotly'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_report_to_reaches_the_exported_script(result, capsys):
    script = (result.study_dir / "recommended.py").read_text()
    assert "REPORT_TO = ['tensorboard']" in script
    assert cli.main(["export", str(result.study_dir), "format=py", "report_to=wandb,mlflow"]) == 0
    assert "REPORT_TO = ['wandb', 'mlflow']" in capsys.readouterr().out
    assert cli.main(["export", str(result.study_dir), "format=py", "report_to=$(x)"]) == 2
