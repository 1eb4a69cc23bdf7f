"""gc's reference fold: which staged objects the log proves can never be published."""

from __future__ import annotations

from chronolog.workers.gc import References
from chronolog.workers.results import StagedObject


def obj(run_id: str, fence: int, attempt: int = 1) -> StagedObject:
    return StagedObject(uri=f"results:{run_id}/a{attempt}-f{fence}-0123456789abcdef",
                        run_id=run_id, attempt=attempt, fence=fence,
                        sha_prefix="0123456789abcdef", size=1, mtime=0.0)


def fold(*events: dict) -> References:
    refs = References()
    for e in events:
        refs.apply(e)
    return refs


def test_an_open_claim_may_still_publish() -> None:
    refs = fold({"type": "AttemptClaimed", "run_id": "r", "fence": 3})
    assert not refs.can_never_publish(obj("r", 3))


def test_unknown_runs_and_fences_are_kept() -> None:
    refs = fold({"type": "AttemptClaimed", "run_id": "r", "fence": 3},
                {"type": "LeaseExpired", "run_id": "r", "fence": 3})
    assert not refs.can_never_publish(obj("other", 3))
    assert not refs.can_never_publish(obj("r", 9))  # a claim gc has not read yet


def test_expired_failed_and_superseded_claims_are_closed() -> None:
    refs = fold({"type": "AttemptClaimed", "run_id": "r", "fence": 1},
                {"type": "LeaseExpired", "run_id": "r", "fence": 1},
                {"type": "AttemptClaimed", "run_id": "r", "fence": 2},
                {"type": "AttemptFailed", "run_id": "r", "fence": 2},
                {"type": "AttemptClaimed", "run_id": "r", "fence": 4})
    assert refs.can_never_publish(obj("r", 1))
    assert refs.can_never_publish(obj("r", 2))
    assert not refs.can_never_publish(obj("r", 4))


def test_a_late_expiry_of_an_older_fence_does_not_close_the_current_claim() -> None:
    refs = fold({"type": "AttemptClaimed", "run_id": "r", "fence": 5},
                {"type": "LeaseExpired", "run_id": "r", "fence": 4})
    assert not refs.can_never_publish(obj("r", 5))


def test_publication_references_its_uri_and_closes_the_run() -> None:
    o = obj("r", 2)
    refs = fold({"type": "AttemptClaimed", "run_id": "r", "fence": 1},
                {"type": "AttemptClaimed", "run_id": "r", "fence": 2},
                {"type": "ResultPublished", "run_id": "r", "fence": 2, "uri": o.uri})
    assert refs.referenced(o.uri, "r")
    assert refs.can_never_publish(obj("r", 1))


def test_terminal_events_close_the_open_claim() -> None:
    for ending in ("OccurrenceCancelled", "OccurrenceDeadLettered"):
        refs = fold({"type": "AttemptClaimed", "run_id": "r", "fence": 1},
                    {"type": ending, "run_id": "r"})
        assert refs.can_never_publish(obj("r", 1))


def test_a_published_result_expires_only_past_its_tenants_window_by_event_time() -> None:
    o = obj("r", 1)
    refs = References()
    for env in ({"tenant": "t", "at": "2026-03-01T12:00:00+00:00",
                 "payload": {"type": "AttemptClaimed", "run_id": "r", "fence": 1}},
                {"tenant": "t", "at": "2026-03-01T12:00:10+00:00",
                 "payload": {"type": "ResultPublished", "run_id": "r", "fence": 1,
                             "uri": o.uri, "finished_at": "2026-03-01T12:00:10+00:00"}},
                {"tenant": "t", "at": "2026-03-01T12:01:10+00:00", "payload": {}}):
        refs.apply_envelope(env)
    # the newest event is 60 s after the finish, whatever the wall clock says
    assert refs.expired(o.uri, "r", lambda tenant: 59.0)
    assert not refs.expired(o.uri, "r", lambda tenant: 60.0)
    assert not refs.expired(obj("r", 2).uri, "r", lambda tenant: 0.0)  # never published
    seen: list[str] = []
    refs.expired(o.uri, "r", lambda tenant: seen.append(tenant) or 1.0)
    assert seen == ["t"]  # the window is the run's tenant's
