"""Shared fixtures: the real services the suite talks to.

``make test`` (scripts/with_services.py) starts Kafka and an embedded PostgreSQL and exports
``KAFKA_BOOTSTRAP_SERVERS`` and ``CHRONOLOG_TEST_DATABASE_URL``. A test that needs one of them
FAILS when it is absent — it never skips — so a broken service start is a red build.
Optional path: where neither is set but a Docker engine answers, testcontainers starts a
throwaway Kafka / PostgreSQL (no machine this project is developed on has one, so that path
is not exercised here).
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.ordering import order_for_workers


def _docker_reachable() -> bool:
    """True when a Docker engine answers (the optional testcontainers path)."""
    if os.environ.get("CHRONOLOG_NO_TESTCONTAINERS"):
        return False
    try:
        import docker  # type: ignore[import-untyped]  # comes with testcontainers

        docker.from_env(timeout=3).ping()
    except Exception:  # noqa: BLE001 - no engine (the usual case here): no container path
        return False
    return True


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if servers:
        yield servers
        return
    if _docker_reachable():  # optional path: a throwaway broker from testcontainers
        from testcontainers.community.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    pytest.fail(
        "KAFKA_BOOTSTRAP_SERVERS is not set: run the suite through `make test` "
        "(or start a broker with `make kafka-up` and export it)"
    )


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    url = os.environ.get("CHRONOLOG_TEST_DATABASE_URL")
    if url:
        yield url
        return
    if _docker_reachable():  # optional path: a throwaway PostgreSQL from testcontainers
        from testcontainers.community.postgres import PostgresContainer

        with PostgresContainer("postgres:16", driver=None) as pg:
            yield pg.get_connection_url()
        return
    pytest.fail(
        "CHRONOLOG_TEST_DATABASE_URL is not set: run the suite through `make test`, "
        "which starts an embedded PostgreSQL"
    )


# A broker keeps several open files per partition; the suite's tests create thousands of
# partitions, past a process's open-file limit (20,000 here). Topics of finished tests are
# deleted in batches.
_DELETE_EVERY = 20
_used_prefixes: list[str] = []


async def _delete_topics(servers: str, prefixes: tuple[str, ...]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:
        doomed = [t for t in await admin.list_topics() if t.startswith(prefixes)]
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()


def _delete_used_topics() -> None:
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    prefixes, _used_prefixes[:] = tuple(_used_prefixes), []
    if not servers or not prefixes:
        return
    errors: list[BaseException] = []

    def run() -> None:  # its own event loop: a test's loop may still be around
        try:
            asyncio.run(_delete_topics(servers, prefixes))
        except Exception as exc:  # noqa: BLE001 - cleanup: reported, never fails a test
            errors.append(exc)

    worker = threading.Thread(target=run, name="delete-test-topics")
    worker.start()
    worker.join(60)
    if errors:
        print(f"could not delete the topics of finished tests: {errors[0]!r}")


@pytest.fixture
def topic_prefix() -> Iterator[str]:
    """A fresh topic prefix per test, so tests sharing one broker never see each other;
    its topics are deleted after the test (in batches)."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    yield prefix
    _used_prefixes.append(prefix)
    if len(_used_prefixes) >= _DELETE_EVERY:
        _delete_used_topics()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _delete_used_topics()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In the parallel phase, the tests marked ``long(seconds)`` start first, one worker each
    (``support.ordering``)."""
    order_for_workers(items)


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to test an installed chronolog that differs from src/ (``make`` installs the
    project editable, so src/ is what is imported; a regular install — ``pip install .`` —
    is a copy, which would otherwise test the code of its day after an edit)."""
    import chronolog

    src = Path(__file__).resolve().parents[1] / "src"
    installed = Path(chronolog.__file__).resolve().parent
    if installed == src:  # an editable install, or src on the path
        return
    stale = [p.relative_to(src) for p in sorted(src.rglob("*"))
             if p.suffix in (".py", ".sql", ".html", ".css", ".js", ".txt")
             and "__pycache__" not in p.parts
             and not _same_file(p, installed / p.relative_to(src))]
    if stale:
        raise pytest.UsageError(
            f"chronolog is imported from {installed}, which differs from src/ in "
            f"{len(stale)} files (such as {stale[0]}): run `make test`, or reinstall it "
            f"with `.venv/bin/pip install .`")


def _same_file(a: Path, b: Path) -> bool:
    return b.is_file() and a.read_bytes() == b.read_bytes()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """With ``CHRONOLOG_TEST_CPU_LOG`` set: a JSON line per test appended there — its wall
    time and the CPU seconds of this process and of the processes it started (reaped), setup
    to teardown — to find what loads the machine during the suite."""
    path = os.environ.get("CHRONOLOG_TEST_CPU_LOG")
    if not path:
        yield
        return
    import json
    import resource
    import time

    def cpu() -> float:
        own, kids = (resource.getrusage(resource.RUSAGE_SELF),
                     resource.getrusage(resource.RUSAGE_CHILDREN))
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    t0, c0 = time.monotonic(), cpu()
    yield
    line = json.dumps({"test": item.nodeid, "wall": round(time.monotonic() - t0, 2),
                       "cpu": round(cpu() - c0, 2)})
    with open(path, "a") as f:
        f.write(line + "\n")
