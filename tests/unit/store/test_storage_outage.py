import pytest

from autotune.common.errors import ConfigError
from autotune.store.storage_outage import OUTAGE_RETRY_S, RETRY_ENV, outage_retry_s


def test_a_search_waits_a_minute_for_its_database_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv(RETRY_ENV, raising=False)
    assert outage_retry_s() == OUTAGE_RETRY_S == 60
    monkeypatch.setenv(RETRY_ENV, "300")
    assert outage_retry_s() == 300


@pytest.mark.parametrize("given", ["soon", "-1", "nan", "inf", ""])
def test_a_wait_that_is_not_a_number_of_seconds_is_refused_naming_it(monkeypatch, given):
    monkeypatch.setenv(RETRY_ENV, given)
    with pytest.raises(ConfigError, match=f"{RETRY_ENV}='{given}': expected a number of seconds"):
        outage_retry_s()


def test_a_bad_wait_is_refused_when_the_storage_opens_before_any_connection(monkeypatch):
    from autotune.store.storage import open_storage

    monkeypatch.setenv(RETRY_ENV, "soon")
    # Port 9 (discard) on this host: a connection would fail another way, after its timeout.
    with pytest.raises(ConfigError, match=RETRY_ENV):
        open_storage("postgresql://nobody@127.0.0.1:9/none")
