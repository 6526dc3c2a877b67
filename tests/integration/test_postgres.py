"""A study on a real PostgreSQL server (`storage=postgresql://...`): the search runs on it, and
`autotune report` and `autotune.load` rebuild the same outputs from the server alone."""

import csv
import socket
import sys

import optuna
import pytest
import sqlalchemy

import autotune
from autotune import cli
from autotune.common.errors import StudyError
from autotune.store.storage import open_storage
from tests.conftest import TINY_MODEL, fake_executor, postgres_database

OUTPUTS = ("trials.csv", "pareto.csv", "recommended.json", "recommended.py", "report.html")


@pytest.fixture(scope="module")
def searched(tmp_path_factory, postgres_server_url):
    """A 4-trial search stored on PostgreSQL: (its storage URL, its study folder)."""
    out = tmp_path_factory.mktemp("reports")
    with postgres_database(postgres_server_url) as url:
        args = [
            f"model={TINY_MODEL}",
            "n_trials=4",
            "seq_len=32",
            f"out={out}",
            "study=pg",
            "confirm_rounds=0",
            f"storage={url}",
        ]
        assert cli.main(["search", *args], executor=fake_executor("ok")) == 0
        yield url, out / "pg"


def test_the_search_runs_on_postgresql(searched):
    url, study_dir = searched
    assert not (study_dir / "study.db").exists()  # the trials are on the server, not in a file
    with open(study_dir / "trials.csv") as f:
        assert [row["status"] for row in csv.DictReader(f)] == ["ok"] * 4
    study = optuna.load_study(study_name="pg", storage=url)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 4


@pytest.mark.parametrize("driver", ["postgresql+psycopg", "postgresql"])
def test_report_rebuilds_the_same_outputs_from_the_server_alone(searched, driver, tmp_path):
    """Into an empty folder, so nothing can come from the search's files; a plain
    `postgresql://` URL (libpq's form) works as well as SQLAlchemy's."""
    url, study_dir = searched
    url = sqlalchemy.engine.make_url(url).set(drivername=driver)
    rebuilt = tmp_path / "rebuilt"
    storage = url.render_as_string(hide_password=False)
    assert cli.main(["report", str(rebuilt), f"storage={storage}", "study=pg"]) == 0
    for name in OUTPUTS:
        assert (rebuilt / name).read_bytes() == (study_dir / name).read_bytes(), name


def test_load_reads_the_study_from_the_server(searched):
    url, study_dir = searched
    result = autotune.load(study_dir, storage=url, study="pg")
    assert [t.number for t in result.trials] == [0, 1, 2, 3]
    with open(study_dir / "pareto.csv") as f:
        assert [t.number for t in result.front] == [int(row["number"]) for row in csv.DictReader(f)]
    assert result.recommended is not None and result.baseline.number == 0


def test_a_server_that_is_not_there_is_named_without_its_password(tmp_path, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://autotune:s3cret@127.0.0.1:{port}/studies"
    out = tmp_path / "reports"
    args = [
        f"model={TINY_MODEL}",
        "n_trials=1",
        "seq_len=32",
        f"out={out}",
        "study=x",
        f"storage={url}",
    ]
    assert cli.main(["search", *args], executor=fake_executor("ok")) == 2
    error = capsys.readouterr().err
    assert f"storage=postgresql://autotune:***@127.0.0.1:{port}/studies: cannot open it" in error
    assert "Connection refused" in error and "s3cret" not in error
    assert not (out / "x").exists()  # nothing was left behind
    assert cli.main(["report", str(tmp_path / "r"), f"storage={url}", "study=x"]) == 2
    assert "s3cret" not in capsys.readouterr().err


def test_a_missing_driver_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` now fails
    with pytest.raises(StudyError, match=r'pip install "autotune\[postgres\]"') as raised:
        open_storage("postgresql://autotune:s3cret@127.0.0.1:5432/studies")
    assert "postgresql://autotune:***@127.0.0.1:5432/studies" in str(raised.value)


def test_an_attribute_that_is_not_json_is_named_on_postgresql_too(postgres_server_url):
    """Optuna's tables are read directly on PostgreSQL as on SQLite, from the URL a user has
    (`postgresql://`, given the driver the storage uses): the damaged attribute is named."""
    from autotune.store.storage import undecodable

    with postgres_database(postgres_server_url) as url:
        bare = url.replace("postgresql+psycopg://", "postgresql://", 1)
        study = optuna.create_study(storage=open_storage(bare), study_name="s")
        study.ask().set_user_attr("result", {"status": "ok"})
        engine = sqlalchemy.create_engine(url)
        with engine.begin() as connection:
            connection.execute(
                sqlalchemy.text("UPDATE trial_user_attributes SET value_json = '{not json'")
            )
        engine.dispose()
        assert undecodable(bare) == ["study s trial 0's 'result'"]
