"""The membership record a worker writes to the workers topic, and the waiting reason."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from chronolog.domain.membership import Announcement, BadAnnouncement, announcement, waiting_reason
from chronolog.queries.workers import jobs_in, waiting_for

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def test_a_membership_record_round_trips_with_its_classes_job_types_and_slots() -> None:
    a = announcement("w1", ["default", "gpu"], {"greet", "echo"}, 4, T0, T0)
    back = Announcement.decode(a.encode())
    assert back == a
    assert {c: (s.job_types, s.slots) for c, s in back.classes.items()} == {
        "default": (("echo", "greet"), 4), "gpu": (("echo", "greet"), 4)}
    assert not back.stopping
    assert Announcement.decode(announcement("w1", ["default"], (), 1, T0, T0,
                                            stopping=True).encode()).stopping


@pytest.mark.parametrize("value", [b"", b"[]", b'{"worker_id": "w"}',
                                   b'{"worker_id": "", "classes": {"d": {"job_types": [], '
                                   b'"slots": 1}}, "started_at": "2026-12-01T08:00:00Z", '
                                   b'"sent_at": "2026-12-01T08:00:00Z"}',
                                   b'{"worker_id": "w", "classes": {}, "started_at": '
                                   b'"2026-12-01T08:00:00Z", "sent_at": "2026-12-01T08:00:00Z"}',
                                   b'{"worker_id": "w", "classes": {"d": {"job_types": [], '
                                   b'"slots": 1}}, "started_at": "soon", "sent_at": "now"}'])
def test_a_record_that_is_not_a_membership_record_is_refused(value: bytes) -> None:
    with pytest.raises(BadAnnouncement):
        Announcement.decode(value)


def test_a_ready_run_waits_only_when_no_live_worker_of_its_class_serves_its_job_type() -> None:
    served = frozenset({("default", "echo"), ("gpu", "greet")})
    assert waiting_for("READY", "default", "echo", served) is None
    assert waiting_for("READY", None, "echo", served) is None  # no class: default
    assert waiting_for("READY", "default", "greet", served) == waiting_reason("greet", "default")
    assert waiting_reason("greet", "default") == \
        "no worker serves job type 'greet' in class 'default'"
    assert waiting_for("LEASED", "default", "greet", served) is None


def test_a_tenant_sees_only_the_job_types_it_may_run() -> None:
    classes = {"default": {"jobTypes": ["echo", "report"], "slots": 2}}
    assert jobs_in(classes, None) == classes
    assert jobs_in(classes, {"report"}) == {"default": {"jobTypes": ["report"], "slots": 2}}
