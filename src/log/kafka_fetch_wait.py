"""An idle consumer's long poll: the fetch wait a Kafka consumer asks of the broker, short only
while records flow.

chronolog's consumers ask for a short fetch wait (``fetch.max.wait.ms``, 10-25 ms): aiokafka
keeps one fetch request in flight per broker, and a partition drained while that request was
built without it is fetched again only when the request returns (``chronolog.log.kafka``,
"Group consumers and latency"). The short wait bounds that delay, but it is paid every
``fetch_max_wait_ms`` by every consumer whether or not anything moves: an idle processor,
projector and worker sent some 700 empty fetches a second and spent 40 % of a core on them,
and the broker its share answering.

The delay only arises while records flow: an idle consumer has nothing buffered, so its
request in flight names every partition it reads, and the broker answers it as soon as
records arrive in any of them, however long the wait asked. So a consumer that has fetched
no record for ``IDLE_AFTER_S`` asks for ``IDLE_WAIT_MS`` instead (aiokafka's own default), and
goes back to its short wait with the first response that brings records — before it builds
the next request. What a long wait can still delay is a ``seek`` on an idle consumer, which
waits for the request in flight: at most ``IDLE_WAIT_MS``.
"""

from __future__ import annotations

import time
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.fetcher import Fetcher

IDLE_AFTER_S = 1.0  # no record fetched for this long: the consumer is idle
IDLE_WAIT_MS = 500  # the fetch wait an idle consumer asks for


class _IdleAwareFetcher(Fetcher):  # type: ignore[misc]
    """aiokafka's fetcher, asking for its configured wait only while records flow."""

    _records_at = float("-inf")  # monotonic time of the last response with records

    @property
    def _fetch_max_wait_ms(self) -> int:
        busy: int = self.__dict__["_fetch_max_wait_ms"]
        if time.monotonic() - self._records_at < IDLE_AFTER_S:
            return busy
        return max(busy, IDLE_WAIT_MS)

    @_fetch_max_wait_ms.setter
    def _fetch_max_wait_ms(self, value: int) -> None:
        self.__dict__["_fetch_max_wait_ms"] = value

    async def _proc_fetch_request(self, assignment: Any, node_id: int, request: Any) -> bool:
        brought: bool = await super()._proc_fetch_request(assignment, node_id, request)
        if brought:  # records (or an error) for the consumer: it is busy again
            self._records_at = time.monotonic()
        return brought


def wait_long_when_idle(consumer: AIOKafkaConsumer) -> None:
    """Make a started consumer's fetch wait adaptive (module docstring)."""
    fetcher = getattr(consumer, "_fetcher", None)
    if type(fetcher) is Fetcher:
        fetcher.__class__ = _IdleAwareFetcher


def fetch_wait_ms(consumer: AIOKafkaConsumer) -> int | None:
    """The fetch wait a started consumer's next request asks for (None: not started)."""
    fetcher = getattr(consumer, "_fetcher", None)
    return None if fetcher is None else int(fetcher._fetch_max_wait_ms)
