"""The limits (docs/deployment.md, "Limits") as pure functions, and their tenants-file keys."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronolog.api.limits import RateLimiter
from chronolog.domain.durations import InvalidDuration, parse_duration
from chronolog.domain.limits import (
    MAX_DOCUMENT_DEPTH,
    MAX_DURATION_SECONDS,
    json_depth,
    plainly_clean_json,
    text_violation,
)
from chronolog.domain.recurrence import RecurrenceError, compile_trigger, parse_instant, upcoming
from chronolog.settings import ConfigError
from chronolog.tenants import RateLimit, dev_tenants, load_tenants


def test_durations_are_at_most_ten_years() -> None:
    assert parse_duration(f"{MAX_DURATION_SECONDS}s") == MAX_DURATION_SECONDS
    for text in ("99999999999999999999w", 1e300, f"{MAX_DURATION_SECONDS + 1}"):
        with pytest.raises(InvalidDuration, match="at most"):
            parse_duration(text)


def test_instants_lie_between_1970_and_2999() -> None:
    assert parse_instant("2999-12-31T23:59:59Z").year == 2999
    for text in ("9999-12-31T23:59:59Z", "1969-12-31T23:59:59Z", "0001-01-01T00:00:00"):
        with pytest.raises(RecurrenceError, match="between 1970-01-01 and 2999-12-31"):
            parse_instant(text, field="from")


def test_upcoming_stops_at_the_end_of_the_calendar_instead_of_overflowing() -> None:
    start = datetime(2999, 1, 1, tzinfo=UTC)
    trigger = compile_trigger(every="3650d", anchor=start)
    got = upcoming(trigger, start, 1000)
    assert 0 < len(got) < 1000 and got[-1].year > 9000


def test_text_violation_finds_nul_depth_and_huge_integers_with_their_path() -> None:
    assert text_violation({"a": [1, "x", {"b": None}]}) is None
    assert text_violation({"a": ["x", "y\x00"]}) == ("a.1", "text must not contain NUL (\\u0000)")
    assert text_violation({"a": {"k\x00": 1}})[0] == "a"  # type: ignore[index]
    assert text_violation({"n": 2**64})[0] == "n"  # type: ignore[index]
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    assert "deeper than 32" in text_violation({"p": deep}, max_depth=32)[1]  # type: ignore[index]


def test_plainly_clean_json_passes_ordinary_commands_and_doubts_the_rest() -> None:
    assert plainly_clean_json(b'{"a": [1, "x", {"b": -123456789012345678}]}', 32)
    assert not plainly_clean_json(orjson.dumps({"a": "y\x00"}), 32)  # NUL escaped in JSON
    assert not plainly_clean_json(orjson.dumps({"n": 2**63}), 32)  # 19 digits
    assert not plainly_clean_json(b"[" * 33 + b"]" * 33, 32)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=40,
)


@given(_json_values)
def test_json_text_found_plainly_clean_passes_the_walk(value: Any) -> None:
    raw = json.dumps(value, ensure_ascii=False).encode()  # integers of any size, NUL escaped
    if plainly_clean_json(raw, MAX_DOCUMENT_DEPTH):
        assert text_violation(json.loads(raw), "", MAX_DOCUMENT_DEPTH) is None


def test_json_depth_counts_brackets_outside_strings_only() -> None:
    assert json_depth(b'{"a": "[[[[\\"[[", "b": [[1]]}', 32) == 3
    assert json_depth(b"[" * 10_000, 32) == 33  # stops as soon as the bound is passed


def test_the_rate_limiter_is_a_token_bucket_per_tenant() -> None:
    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    limit = RateLimit(per_second=0.5, burst=2)
    assert [limiter.take("a", limit) for _ in range(3)] == [None, None, 2]
    assert limiter.take("b", limit) is None  # another tenant has its own bucket
    assert limiter.take("a", None) is None  # no limit configured
    now[0] = 2.0  # one token refilled
    assert limiter.take("a", limit) is None and limiter.take("a", limit) == 2


def test_the_tenants_file_keys_of_the_limits(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_text('[operators]\ntokens = ["ops"]\n'
                 '[tenants.a]\ntokens = ["ta"]\nmin_interval = "2m"\n'
                 'rate_limit = { per_second = 5, burst = 7 }\n'
                 '[tenants.b]\ntokens = ["tb"]\nrate_limit = 3\n'
                 '[tenants.c]\ntokens = ["tc"]\n')
    t = load_tenants(f)
    assert t.operator_tokens == ("ops",)
    assert t.tenants["a"].min_interval == 120 and t.min_interval("a") == 120
    assert t.tenants["a"].rate_limit == RateLimit(5.0, 7)
    assert t.tenants["b"].rate_limit == RateLimit(3.0, 6)
    assert t.tenants["c"].rate_limit == RateLimit(50.0, 100) and t.min_interval("c") == 1.0
    for bad, key in [('min_interval = "soon"', "min_interval"),
                     ("min_interval = 0", "min_interval"),
                     ("rate_limit = -1", "rate_limit.per_second"),
                     ("rate_limit = { per_second = 1, burst = 0 }", "rate_limit.burst"),
                     ("rate_limit = { every = 1 }", "rate_limit")]:
        f.write_text(f'[tenants.a]\ntokens = ["ta"]\n{bad}\n')
        with pytest.raises(ConfigError, match=f"tenants.a.{key}"):
            load_tenants(f)
    f.write_text('[operators]\ntokens = "ops"\n[tenants.a]\ntokens = ["ta"]\n')
    with pytest.raises(ConfigError, match=r"operators.tokens"):
        load_tenants(f)


def test_tokens_find_their_tenant_and_operators_are_not_tenants(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_text('[operators]\ntokens = ["ops"]\n[tenants.a]\ntokens = ["ta", "ta2"]\n'
                 '[tenants.b]\ntokens = ["tb"]\n')
    t = load_tenants(f)
    assert t.by_token("ta2").name == "a" and t.by_token("tb").name == "b"  # type: ignore[union-attr]
    assert t.by_token("ops") is None and t.by_token("t") is None and t.by_token("") is None
    assert t.is_operator("ops") and not t.is_operator("ta") and not t.is_operator("op")
    assert dev_tenants().operator_tokens is None  # a dev node without a file: /metrics open
