"""A PostgreSQL server stopped in the middle of a real `autotune search` (a cluster of this
test's own, stopped and started again; fake trials of a second each)."""

import csv
import os
import shlex
import subprocess
import sys
import time

import optuna
import pytest

from autotune.store.records import is_recorded
from autotune.store.storage_outage import OUTAGE_EXIT_CODE, RETRY_ENV
from tests import postgres_server
from tests.conftest import TINY_MODEL

pytestmark = pytest.mark.slow
SAFETY_NET_S = 600
N_TRIALS = 6
RETRY_S = os.environ.get(RETRY_ENV, "5")
"""The search's wait for the server: 5 s here (the default, 60 s, is what a user gets; set
AUTOTUNE_STORAGE_RETRY_S=60 to measure it)."""


@pytest.fixture
def cluster():
    try:
        cluster = postgres_server.start()  # a folder of its own the server user may enter
    except postgres_server.Unavailable as exc:
        pytest.skip(str(exc))
    yield cluster
    postgres_server.stop(cluster.root)


def pg_ctl(cluster: postgres_server.Cluster, *args: str) -> None:
    postgres_server._run(postgres_server.bin_dir() / "pg_ctl", "-D", cluster.root / "data", *args)


def restart(cluster: postgres_server.Cluster) -> None:
    """Start the stopped server again, on its port: as `postgres_server.start` started it."""
    options = (
        f"-p {cluster.port} -k {shlex.quote(str(cluster.root))} "
        "-c listen_addresses=127.0.0.1 -c fsync=off"
    )
    pg_ctl(cluster, "-l", str(cluster.root / "server.log"), "-w", "-o", options, "start")


def search(tmp_path, url: str) -> list[str]:
    code = (
        "import sys; from autotune import cli; from tests.conftest import fake_executor; "
        "sys.exit(cli.main(sys.argv[1:], executor=fake_executor('sleep:1')))"
    )
    return [
        sys.executable,
        "-c",
        code,
        "search",
        f"model={TINY_MODEL}",
        "seq_len=32",
        f"n_trials={N_TRIALS}",
        f"out={tmp_path}",
        "study=o",
        f"storage={url}",
        "confirm_rounds=0",
    ]


def test_a_database_server_stopped_mid_search_ends_it_with_one_message_outputs_and_a_resume(
    tmp_path, cluster
):
    argv = search(tmp_path, cluster.url)
    env = {**os.environ, RETRY_ENV: RETRY_S}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    deadline = time.monotonic() + SAFETY_NET_S
    try:
        while not (tmp_path / "o" / "trials" / "0002" / "spec.json").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        pg_ctl(cluster, "-m", "immediate", "-w", "stop")
        stopped = time.monotonic()
        _, stderr = proc.communicate(timeout=SAFETY_NET_S)
        print(
            f"waited {time.monotonic() - stopped:.1f} s for the stopped server "
            f"({RETRY_ENV}={RETRY_S})"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == OUTAGE_EXIT_CODE, stderr
    assert "Traceback" not in stderr
    assert stderr.count("error:") == 1, stderr
    assert f"127.0.0.1:{cluster.port}" in stderr, stderr
    assert f"did not answer for {float(RETRY_S):.0f} s" in stderr, stderr
    with open(tmp_path / "o" / "trials.csv") as f:
        finished = [row["number"] for row in csv.DictReader(f)]
    assert finished[:2] == ["0", "1"], finished
    assert (tmp_path / "o" / "report.html").is_file()

    restart(cluster)
    again = subprocess.run(argv, capture_output=True, text=True, timeout=SAFETY_NET_S, env=env)
    assert again.returncode == 0, again.stderr
    study = optuna.load_study(
        study_name="o", storage=cluster.url.replace("postgresql://", "postgresql+psycopg://")
    )
    assert sum(is_recorded(t) for t in study.trials) == N_TRIALS
