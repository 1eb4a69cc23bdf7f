"""A ``--database-url`` is checked before anything connects (``checked_database_url``)."""

from __future__ import annotations

import pytest

from chronolog.cli.errors import UsageError
from chronolog.cli.flags import checked_database_url


@pytest.mark.parametrize("url", [
    "postgresql://chronolog:secret@127.0.0.1:5432/chronolog",
    "postgres://db.example.com/chronolog?sslmode=require",
    "postgresql://u@h1:5432,h2:5433/chronolog",  # several hosts
    "postgresql://u@[::1]:5432/chronolog",
    "postgresql:///chronolog?host=/var/run/postgresql",  # a socket directory
])
def test_a_well_formed_url_is_given_back_as_it_is(url: str) -> None:
    assert checked_database_url(url) == url


@pytest.mark.parametrize("url, reason", [
    ("mysql://x", "expected postgresql://"),
    ("postgresql://u:p@[bad/x", "Invalid IPv6 URL"),
    ("postgresql://a@a..b/db", "host 'a..b' is not a host name"),
    (f"postgresql://{'x' * 70}.example/db", "is not a host name"),
    ("postgresql://h:99999/db", "port '99999'"),
    ("postgresql://h:abc/db", "port 'abc'"),
    ("postgresql://h1:1,h2:x/db", "port 'x'"),
])
def test_a_malformed_url_is_a_usage_error_naming_the_flag(url: str, reason: str) -> None:
    with pytest.raises(UsageError) as refused:
        checked_database_url(url)
    said = str(refused.value)
    assert said.startswith(f"error: --database-url: '{url}'") and reason in said
    assert "\n" not in said
