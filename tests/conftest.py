"""Shared fixtures: the real services the suite talks to.

``make test`` (scripts/with_services.py) starts Kafka and an embedded PostgreSQL and exports
``KAFKA_BOOTSTRAP_SERVERS`` and ``CHRONOLOG_TEST_DATABASE_URL``. A test that needs one of them
FAILS when it is absent — it never skips — so a broken service start is a red build.
Optional path: where neither is set but a Docker engine answers, testcontainers starts a
throwaway Kafka / PostgreSQL (no machine this project is developed on has one, so that path
is not exercised here).
"""

from __future__ import annotations

import os
import uuid
from typing import Iterator

import pytest


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


@pytest.fixture
def topic_prefix() -> str:
    """A fresh topic prefix per test, so tests sharing one broker never see each other."""
    return f"t{uuid.uuid4().hex[:10]}."
