import atexit
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Tests never reach the model hub: names outside the catalogue fail fast instead of retrying.
os.environ["HF_HUB_OFFLINE"] = "1"
# Tests never read or write the user's cache of software facts (autotune.plan.software_cache).
# Each test process has its own, removed when it exits (nothing left in $TMPDIR).
os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune-test-cache-")
atexit.register(shutil.rmtree, os.environ["AUTOTUNE_CACHE_DIR"], ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """The timing benchmarks (`-m benchmark`) run one at a time: the default run's two test
    processes at once (`-n 2` in pyproject.toml) would time each against the other."""
    marks = config.option.markexpr or ""
    if "benchmark" in marks and "not benchmark" not in marks:
        config.option.numprocesses = 0


LONGEST_FIRST = ("tests/integration/test_readme_examples.py::test_the_readme_and_docs_examples",)
"""Tests that run for many minutes alone (every docs example verbatim, in reading order):
collected first, so that one test process starts on them while the other takes the rest; last
in file order they would run alone at the end, the other process idle."""


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST_FIRST))


TINY_MODEL = "google/bert_uncased_L-2_H-128_A-2"
FAKE_WORKER = str(Path(__file__).parent / "fakes" / "worker.py")
"""A stand-in worker: `python FAKE_WORKER MODE SPEC RESULT` behaves as MODE says."""


def fake_executor(mode: str):
    from autotune.execute.launchers import CommandLauncher
    from autotune.execute.local import LocalExecutor

    return LocalExecutor(CommandLauncher((sys.executable, FAKE_WORKER, mode)))


# --- PostgreSQL: a real server for `storage=postgresql://...` ------------------------------
# CI (.ci/run) starts a throwaway cluster and exports its URL; without one, the session starts
# its own (tests/postgres_server.py) where PostgreSQL is installed. No server: a skip, but in
# CI a failure.
POSTGRES_URL_VAR = "AUTOTUNE_TEST_POSTGRES_URL"


@pytest.fixture(scope="session")
def postgres_server_url():
    """URL of a PostgreSQL server on which the tests may create databases."""
    from tests import postgres_server

    if url := os.environ.get(POSTGRES_URL_VAR):
        yield url
        return
    try:
        cluster = postgres_server.start()
    except postgres_server.Unavailable as exc:
        reason = f"no PostgreSQL server (set {POSTGRES_URL_VAR}, or install postgresql): {exc}"
        if os.environ.get("CI"):
            pytest.fail(reason)  # CI starts one (.ci/run): a skip there would hide a failure
        pytest.skip(reason)
    try:
        yield cluster.url
    finally:
        postgres_server.stop(cluster.root)


@contextlib.contextmanager
def postgres_database(server_url: str):
    """A new, empty database on SERVER_URL's server, as a `postgresql+psycopg://` URL; dropped
    afterwards. One per test module or test keeps studies of different tests apart."""
    import uuid

    import psycopg  # here, not above: only these tests need the `postgres` extra
    import sqlalchemy

    server = sqlalchemy.engine.make_url(server_url).set(drivername="postgresql")
    admin = server.render_as_string(hide_password=False)  # libpq's form, for psycopg itself
    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f"CREATE DATABASE {name}")
    try:
        url = server.set(drivername="postgresql+psycopg", database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as db:
            db.execute(f"DROP DATABASE {name} WITH (FORCE)")  # Optuna's pool may still hold one


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """Text data for `data=` (tests/text_data.py) and the tokenizer trained on it, made once."""
    from tests.text_data import train_tokenizer, write_corpus

    folder = tmp_path_factory.mktemp("text")
    data = write_corpus(folder / "train.jsonl")
    return data, train_tokenizer(data, folder / "tokenizer")


@pytest.fixture(scope="module")
def device_info():
    """The real device probe, run once per test module."""
    from autotune.plan import hardware

    return hardware.probe()


@pytest.fixture
def probe_once(monkeypatch, device_info):
    """Searches in the test reuse the module's probe (`pytestmark = usefixtures(...)`)."""
    from autotune.plan import hardware

    monkeypatch.setattr(hardware, "probe", lambda **known: device_info)
