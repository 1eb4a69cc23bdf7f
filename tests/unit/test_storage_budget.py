"""A tenant's storage budget (``chronolog.domain.storage_budget``): the rule, the sliding
hour's window and its edges on an injected clock (seconds), what a write counts, and the
``storage_budget`` setting of the tenants file (parsed and refused in chronolog.tenants)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronolog.domain import messages as m
from chronolog.domain.limits import MAX_PARAMS_BYTES
from chronolog.domain.storage_budget import (
    WINDOW_S,
    StorageBudgets,
    StorageWindow,
    fits,
    params_bytes,
    refusal_reason,
    result_bytes,
    retry_after,
)
from chronolog.settings import ConfigError
from chronolog.tenants import DEFAULT_STORAGE_BUDGET, Tenants, dev_tenants, load_tenants

CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
T0 = 1_000_000.0


def test_a_write_fits_when_the_hours_bytes_plus_its_own_do_not_exceed_the_budget() -> None:
    assert fits(used=60, size=40, budget=100)  # exactly the budget: accepted
    assert not fits(used=60, size=41, budget=100)  # one byte over: refused
    assert fits(used=0, size=100, budget=100)
    assert not fits(used=0, size=101, budget=100)


def test_an_exact_fit_is_accepted_one_byte_over_waits_for_the_hour_to_free_it() -> None:
    w = StorageWindow()
    assert w.wait(600, 1000, T0) is None
    w.take(600, T0)
    assert w.wait(400, 1000, T0 + 10) is None  # 600 + 400 = the budget exactly
    w.take(400, T0 + 10)
    # one byte over: it fits once the first write (600 bytes at T0) leaves the window
    assert w.wait(1, 1000, T0 + 20) == WINDOW_S - 20
    assert w.wait(1, 1000, T0 + WINDOW_S - 0.5) == 0.5  # still in the window: refused
    assert w.wait(1, 1000, T0 + WINDOW_S) is None  # the window freed it: accepted again
    # 601 bytes need the second write gone too
    assert w.wait(601, 1000, T0 + WINDOW_S) == 10
    assert w.wait(601, 1000, T0 + WINDOW_S + 10) is None


def test_a_write_at_a_fraction_of_a_second_counts_until_its_whole_hour_has_passed() -> None:
    w = StorageWindow()
    w.take(1000, T0 + 0.25)  # counted in the bucket of second T0 + 1
    assert w.wait(1, 1000, T0 + WINDOW_S + 0.25) == 0.75  # never left before t + 1 h
    assert w.wait(1, 1000, T0 + WINDOW_S + 1) is None


def test_a_write_larger_than_the_whole_budget_never_fits() -> None:
    w = StorageWindow()
    assert w.wait(1001, 1000, T0) == math.inf
    assert StorageBudgets().wait("acme", 1001, 1000, T0) == math.inf
    assert "larger than the whole budget" in refusal_reason("acme", "the result", 1001, 1000,
                                                            math.inf)


def test_each_tenant_has_its_own_window() -> None:
    b = StorageBudgets()
    b.take("acme", 1000, T0)
    assert b.wait("acme", 1, 1000, T0) == WINDOW_S
    assert b.wait("globex", 1000, 1000, T0) is None


def test_the_refusal_names_the_setting_the_budget_and_when_to_retry() -> None:
    text = refusal_reason("acme", "the params of TriggerRun", 70, 1000, 12.2)
    assert text == ("over the storage budget of tenant 'acme' (storage_budget = 1000 bytes an "
                    "hour): the params of TriggerRun, 70 bytes, does not fit this hour; retry "
                    "in 13s")


@settings(max_examples=60, deadline=None)
@given(budget=st.integers(1, 5000),
       writes=st.lists(st.tuples(st.floats(0, 1800, allow_nan=False), st.integers(0, 3000)),
                       max_size=60))
def test_the_bytes_accepted_in_any_hour_never_exceed_the_budget(
        budget: int, writes: list[tuple[float, int]]) -> None:
    w = StorageWindow()
    now = T0
    accepted: list[tuple[float, int]] = []
    for gap, size in writes:
        now += gap
        wait = w.wait(size, budget, now)
        if wait is None:
            w.take(size, now)
            accepted.append((now, size))
        elif not math.isinf(wait):  # Retry-After is honest: the write fits once it passed
            probe = StorageWindow(w.buckets.copy(), w.used)
            assert wait > 0 and probe.wait(size, budget, now + retry_after(wait)) is None
    # any hour [start, start + 1 h): the worst ones start at an accepted write
    for start, _ in accepted:
        assert sum(n for t, n in accepted if start <= t < start + WINDOW_S) <= budget


def test_a_write_counts_its_params_and_its_result() -> None:
    spec = m.ScheduleSpec.model_validate({"every": "1h", "job": {"type": "echo",
                                                                  "params": {"a": "xy"}}})
    assert params_bytes(m.CreateSchedule(spec=spec)) == len(b'{"a":"xy"}')
    assert params_bytes(m.ReviseSchedule(spec=spec, expected_revision=1)) == 10
    assert params_bytes(m.TriggerRun(request_key="k", params={"b": 1})) == len(b'{"b":1}')
    assert params_bytes(m.TriggerRun(request_key="k")) == 0
    assert params_bytes(m.PauseSchedule()) == 0
    assert result_bytes(70_000, None) == 70_000  # a staged result: the size declared
    assert result_bytes(1, {"k": "v" * 100}) == len('{"k":""}') + 100  # inline: never less


def _load(tmp_path: Path, body: str) -> Tenants:
    """The tenants file ``body``, loaded."""
    (tmp_path / "tenants.toml").write_text(body)
    return load_tenants(tmp_path / "tenants.toml")


def test_the_tenants_file_sets_the_storage_budget_and_the_default_applies(
        tmp_path: Path) -> None:
    tenants = _load(tmp_path, (
        '[tenants.a]\ntokens = ["t-a"]\nstorage_budget = "512MiB"\n'
        '[tenants.b]\ntokens = ["t-b"]\nstorage_budget = 100000\n'
        '[tenants.c]\ntokens = ["t-c"]\nstorage_budget = "2 GB"\n'
        '[tenants.d]\ntokens = ["t-d"]\n'))
    assert [tenants.storage_budget(t) for t in "abcd"] == [
        512 * 2**20, 100_000, 2 * 10**9, DEFAULT_STORAGE_BUDGET]
    assert DEFAULT_STORAGE_BUDGET == 256 * 2**20
    assert dev_tenants().storage_budget("default") is None  # no tenants file: no budget


def test_the_docs_tenants_files_set_the_storage_budget_they_show(tmp_path: Path) -> None:
    """docs/deployment.md ("Tenants") and docs/security.md ("Storage a tenant writes"): their
    tenants-file examples load with the budget their comments give."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    shown = {"deployment.md": ("### Tenants", 256 * 2**20),
             "security.md": ("## Storage a tenant writes", 512 * 2**20)}
    for name, (heading, budget) in shown.items():
        text = (docs / name).read_text()
        toml = re.search(r"```toml\n(.*?)```", text[text.index(heading):], re.S)
        assert toml is not None, name
        assert _load(tmp_path, toml.group(1)).storage_budget("acme") == budget, name


@pytest.mark.parametrize("value", ['"lots"', "-1", "1.5", "true", '"10TB"',
                                   str(MAX_PARAMS_BYTES - 1), '"63KiB"'])
def test_a_bad_storage_budget_is_refused_naming_tenant_and_field(
        tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match=r"^invalid tenants\.a\.storage_budget '.*': bytes an "
                                          r"hour, .* at least 65536 \(the largest params\)$"):
        _load(tmp_path, f'[tenants.a]\ntokens = ["t"]\nstorage_budget = {value}\n')


def test_a_bad_storage_budget_stops_the_processor_with_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "budget.toml"
    path.write_text('[tenants.acme]\ntokens = ["t"]\nstorage_budget = "lots"\n')
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    done = subprocess.run([CHRONOLOG, "processor", "--tenants", str(path)], capture_output=True,
                          text=True, timeout=60, env={**clean, "CHRONOLOG_DATA_DIR": str(tmp_path)})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("error: tenants.acme.storage_budget: 'lots': ")
    assert done.stderr.count("\n") == 1
