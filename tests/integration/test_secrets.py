"""What a study shares with the workers that join it, with real processes: a storage URL's
password is never written into the study folder nor printed (a real PostgreSQL server, which
trusts every local connection, so any password is accepted: what is checked is where the URL
goes); a joining worker shows the factory file it runs, the one the search checked."""

import hashlib
from pathlib import Path

import pytest
import sqlalchemy

from autotune import api, cli
from autotune.plan.overrides import load_config
from tests.conftest import TINY_MODEL, fake_executor, postgres_database

pytestmark = pytest.mark.slow
PASSWORD = "s3cret-Pw-91"


def with_password(url: str) -> str:
    """The URL with PASSWORD as its user's password (user info form)."""
    return sqlalchemy.engine.make_url(url).set(password=PASSWORD).render_as_string(False)


def files_holding(folder: Path, text: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_two_workers_write_no_storage_password_into_the_study_folder(
    tmp_path, postgres_server_url, monkeypatch
):
    # Two workers without cores of their own (fake trials use none; the machine may have 2).
    from autotune.common.placement import Placement

    monkeypatch.setattr(
        "autotune.plan.plan.assign", lambda workers, *_: ([Placement()] * workers, [])
    )
    with postgres_database(postgres_server_url) as url:
        settings = [
            f"model={TINY_MODEL}",
            "seq_len=32",
            "n_trials=4",
            f"out={tmp_path}",
            "study=pw",
            "workers=2",
            f"storage={with_password(url)}",
            "confirm_rounds=0",
        ]
        result = api.run(load_config(settings), executor=fake_executor("ok"))
        assert result.stopped == "4 of 4 trials finished"  # the workers reached the server
        assert list((tmp_path / "pw" / "workers").glob("*/spec.json")), "the workers ran"
        assert files_holding(tmp_path, PASSWORD) == []


def test_autotune_worker_prints_no_password_in_its_errors_nor_its_report_hint(
    tmp_path, postgres_server_url, capsys
):
    with postgres_database(postgres_server_url) as url:
        # libpq's query form of the password, which SQLAlchemy's own masking shows as it is.
        secret_url = f"{url}?password={PASSWORD}"
        settings = [
            f"model={TINY_MODEL}",
            "seq_len=32",
            "n_trials=2",
            f"out={tmp_path}",
            "study=pw",
            f"storage={secret_url}",
            "quiet=true",
        ]
        api.run(load_config(settings), executor=fake_executor("ok"))
        capsys.readouterr()

        joined = ["worker", f"storage={secret_url}", "study=pw", f"out={tmp_path}"]
        assert cli.main(joined, executor=fake_executor("ok")) == 0
        said = capsys.readouterr()
        assert "the study's outputs: autotune report" in said.out
        assert "password=***" in said.out
        assert "put the password back" in said.out

        missing = ["worker", f"storage={secret_url}", "study=nope", f"out={tmp_path}"]
        assert cli.main(missing, executor=fake_executor("ok")) == 2
        refused = capsys.readouterr()
        assert "study=nope is not in storage=" in refused.err
        assert PASSWORD not in said.out + said.err + refused.out + refused.err
        assert files_holding(tmp_path, PASSWORD) == []


def test_autotune_worker_shows_the_factory_file_it_runs_and_its_sha256(tmp_path, capsys):
    factory = tmp_path / "train.py"
    factory.write_text("def make(args, model_kwargs):\n    raise NotImplementedError\n")
    settings = [
        f"model={TINY_MODEL}",
        "seq_len=32",
        "n_trials=2",
        f"out={tmp_path}",
        "study=t",
        f"trainer={factory}:make",
        "quiet=true",
    ]
    api.run(load_config(settings), executor=fake_executor("ok"))  # fake trials: no factory
    capsys.readouterr()
    assert cli.main(["worker", "study=t", f"out={tmp_path}"], executor=fake_executor("ok")) == 0
    sha256 = hashlib.sha256(factory.read_bytes()).hexdigest()
    assert f"trainer={factory}:make: runs {factory} (sha256 {sha256})" in capsys.readouterr().out
