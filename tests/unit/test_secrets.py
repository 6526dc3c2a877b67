"""A storage URL's credentials are masked wherever a URL is shown, in every form SQLAlchemy and
libpq accept; a URL whose password would be misread is refused before any driver sees it."""

import pytest

from autotune import cli
from autotune.common.errors import StudyError
from autotune.common.urls import safe_url
from autotune.store.storage import open_storage

SECRET = "s3cret"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://me:s3cret@db/autotune", "postgresql://me:***@db/autotune"),
        ("postgresql://me:%40s3cret@db/autotune", "postgresql://me:***@db/autotune"),
        ("postgresql://me@db/autotune?password=s3cret", "postgresql://me@db/autotune?password=***"),
        (
            "postgresql://me@db/autotune?sslmode=require&sslpassword=s3cret&passfile=/home/me/.pgpass",
            "postgresql://me@db/autotune?sslmode=require&sslpassword=***&passfile=/home/me/.pgpass",
        ),
        ("postgresql:///autotune?host=/run/pg&password=s3cret", "postgresql:///autotune?host=/run/pg&password=***"),
        ("host=db password=s3cret dbname=autotune", "host=db password=*** dbname=autotune"),
        ("mysql://me@db/autotune?PWD=s3cret", "mysql://me@db/autotune?PWD=***"),
        ("sqlite:////home/me@lab/reports/s/study.db", "sqlite:////home/me@lab/reports/s/study.db"),
    ],
)  # fmt: skip
def test_safe_url_masks_userinfo_and_query_passwords_and_keeps_paths(url, shown):
    assert safe_url(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://me:s3@cret@db:5432/autotune",
        "postgresql://me:s3/cret@db/autotune",
        "postgresql://me:s3@c/ret@db:5432/autotune",
        "postgresql://me:s3:cr@et@db/autotune",
    ],
)
def test_safe_url_masks_a_password_holding_an_unencoded_at_or_slash_whole(url):
    shown = safe_url(url)
    assert shown.startswith("postgresql://me:***@db")
    for part in ("s3", "cret", "ret", "et"):
        assert part not in shown


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


def test_a_bad_storage_url_leaves_no_empty_out_folder_behind(tmp_path):
    from autotune.common.device import DeviceInfo
    from autotune.plan.config import load_config
    from autotune.plan.plan import make_plan
    from autotune.search.opening import locked_study
    from tests.conftest import TINY_MODEL

    cpu = DeviceInfo(cuda_available=False, name="cpu", total_memory_bytes=2**34,
                     free_memory_bytes=2**34, cpu_name="cpu",
                     host_available_memory_bytes=2**34)  # fmt: skip
    out = tmp_path / "new" / "reports"
    settings = [f"model={TINY_MODEL}", f"out={out}", "study=s", "storage=nosuchdb://x/y"]
    with (
        pytest.raises(StudyError, match="cannot open it"),
        locked_study(make_plan(load_config(settings), cpu)),
    ):
        pass
    assert list(tmp_path.iterdir()) == []
