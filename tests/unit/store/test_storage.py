import sqlite3

import pytest

from autotune import cli
from autotune.common.errors import StudyError
from autotune.store.storage import open_storage
from tests.unit.stand_ins import SECRET


def test_the_embedded_storage_is_wal_with_begin_immediate_and_heartbeats(tmp_path):
    db = tmp_path / "study.db"
    storage = open_storage(f"sqlite:///{db}", stale_after_s=30)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert storage.get_heartbeat_interval() == 5 and storage.grace_period == 30
    statements = []
    with storage.engine.connect() as conn:
        conn.connection.driver_connection.set_trace_callback(statements.append)
        with conn.begin():
            conn.exec_driver_sql("SELECT 1")
    assert statements[0] == "BEGIN IMMEDIATE"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://me:pa@ss-s3cret@127.0.0.1:1/autotune",
        "postgresql://me:pa@ss:s3cret@127.0.0.1:1/autotune",
        "postgresql://me:pa@ss/s3cret@127.0.0.1:1/autotune",
    ],
)
def test_a_password_with_an_unencoded_at_is_refused_before_a_driver_shows_part_of_it(url):
    with pytest.raises(StudyError, match=r"percent-encoded \(%40") as refused:
        open_storage(url)
    assert SECRET not in str(refused.value) and "pa@ss" not in str(refused.value)
    assert "postgresql://me:***@127.0.0.1:1/autotune" in str(refused.value)


def test_an_error_naming_the_storage_masks_a_query_password(tmp_path, capsys):
    url = f"nosuchdb://me@db/autotune?password={SECRET}"
    code = cli.main(["worker", f"storage={url}", "study=s", f"out={tmp_path}"])
    said = capsys.readouterr()
    assert code == 2
    assert "storage=nosuchdb://me@db/autotune?password=***: cannot open it" in said.err
    assert SECRET not in said.out + said.err
