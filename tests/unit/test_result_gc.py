"""gc's reference fold: which staged objects the log proves can never be published."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import orjson

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.log.memory import MemoryEventLog
from chronolog.log.port import OutRecord, Topics
from chronolog.workers.gc import References, fold_references
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


def test_an_unknown_object_older_than_every_pruned_partitions_history_is_of_pruned_runs() -> None:
    refs = fold({"type": "AttemptClaimed", "run_id": "r", "fence": 3})
    old, young = obj("gone", 1), dataclasses.replace(obj("gone", 2), mtime=2000.0)
    assert not refs.of_pruned_history(old)  # nothing pruned: unknown is kept
    refs.pruned_before_ms = 1_000_000  # the oldest event the pruned partitions hold: 1000 s
    assert refs.of_pruned_history(old)
    assert not refs.of_pruned_history(young)  # staged after it: a claim gc may not have read
    assert not refs.of_pruned_history(obj("r", 3))  # a run the log holds: its own rules


async def test_the_fold_learns_the_oldest_event_a_pruned_partition_still_holds() -> None:
    lg = MemoryEventLog(Topics(prefix="gc.", partitions=2))
    await lg.start()
    await lg.ensure_topics()
    event = orjson.dumps({"at": "2026-01-01T00:00:00+00:00", "tenant": "t",
                          "payload": {"type": "AttemptClaimed", "run_id": "r", "fence": 1}})
    await lg.append([OutRecord(lg.topics.events, None, event, partition=p)
                     for p in (0, 0, 0, 1)])
    assert (await fold_references(lg)).pruned_before_ms is None
    await lg.delete_before(lg.topics.events, 0, 2)
    held = (await lg.read(lg.topics.events, 0, 0))[0]
    refs = await fold_references(lg)
    assert held.offset == 2 and refs.pruned_before_ms == held.timestamp_ms
    assert refs.events_read == 2


def test_the_fold_reads_events_of_both_formats_alike() -> None:
    at = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    payloads = [m.AttemptClaimed(run_id="r", attempt=1, fence=2, worker_id="w", claimed_at=at,
                                 lease_until=at + timedelta(seconds=30)),
                m.ResultPublished(run_id="r", attempt=1, fence=2, worker_id="w", checksum="c",
                                  size=1, uri="results:r/a1-f2-0123456789abcdef",
                                  finished_at=at + timedelta(seconds=1))]
    envs = [m.EventEnvelope(event_id=f"c{i}.0", type=p.type, key="acme/s1", tenant="acme",
                            schedule_id="s1", at=at + timedelta(seconds=i), causation_id=f"c{i}",
                            payload=p) for i, p in enumerate(payloads)]
    folds = []
    for encode in (codec.encode_event_v1, codec.encode_event):
        refs = References()
        for env in envs:
            refs.apply_envelope(codec.expand_event(orjson.loads(encode(env))))
        folds.append(refs)
    first, compact = folds
    assert compact.runs == first.runs and compact.newest == first.newest
    assert compact.runs["r"].published == {"results:r/a1-f2-0123456789abcdef"}
    assert compact.runs["r"].tenant == "acme"
