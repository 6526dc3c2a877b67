import pytest

from autotune.common.urls import safe_url


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
        (
            "postgresql:///autotune?host=/run/pg&password=s3cret",
            "postgresql:///autotune?host=/run/pg&password=***",
        ),
        ("host=db password=s3cret dbname=autotune", "host=db password=*** dbname=autotune"),
        ("mysql://me@db/autotune?PWD=s3cret", "mysql://me@db/autotune?PWD=***"),
        ("sqlite:////home/me@lab/reports/s/study.db", "sqlite:////home/me@lab/reports/s/study.db"),
        # A command line, as provenance stores it: a tokenizer is no secret, a token is.
        (
            "autotune search data=d.csv tokenizer=bert-base-uncased",
            "autotune search data=d.csv tokenizer=bert-base-uncased",
        ),
        (
            "postgresql://db/a?auth_token=abc&max_tokens=5",
            "postgresql://db/a?auth_token=***&max_tokens=5",
        ),
        ("autotune worker hf_token=hf_abc", "autotune worker hf_token=***"),
    ],
)
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
