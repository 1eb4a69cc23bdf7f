"""Shared fixtures: the real services the suite talks to.

``make test`` (scripts/with_services.py) starts Kafka and an embedded PostgreSQL and exports
``KAFKA_BOOTSTRAP_SERVERS`` and ``CHRONOLOG_TEST_DATABASE_URL``. A test that needs one of them
FAILS when it is absent — it never skips — so a broken service start is a red build.
"""

from __future__ import annotations

import os
import uuid

import pytest


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not servers:
        pytest.fail(
            "KAFKA_BOOTSTRAP_SERVERS is not set: run the suite through `make test` "
            "(or start a broker with `make kafka-up` and export it)"
        )
    return servers


@pytest.fixture(scope="session")
def database_url() -> str:
    url = os.environ.get("CHRONOLOG_TEST_DATABASE_URL")
    if not url:
        pytest.fail(
            "CHRONOLOG_TEST_DATABASE_URL is not set: run the suite through `make test`, "
            "which starts an embedded PostgreSQL"
        )
    return url


@pytest.fixture
def topic_prefix() -> str:
    """A fresh topic prefix per test, so tests sharing one broker never see each other."""
    return f"t{uuid.uuid4().hex[:10]}."
