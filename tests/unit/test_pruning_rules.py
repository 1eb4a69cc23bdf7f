"""The rule of the log's pruning (docs/design.md §20): an event goes only when every reader
that may still need it is past it — ``events_bound``."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from chronolog.processors.pruning import EventNeeds, events_bound

offsets = st.integers(min_value=0, max_value=10_000)
maybe = st.none() | offsets


@st.composite
def needs(draw: st.DrawFn) -> EventNeeds:
    start = draw(offsets)
    end = start + draw(offsets)
    return EventNeeds(start=start, end=end, snapshot=draw(maybe), checkpoint=draw(maybe),
                      projector=draw(maybe), effects=draw(maybe), archive=draw(maybe),
                      window=draw(offsets))


@given(needs())
def test_pruning_never_removes_an_event_a_reader_still_needs(n: EventNeeds) -> None:
    bound, why = events_bound(n)
    assert bound >= n.start  # nothing comes back
    if bound == n.start:
        return
    assert bound <= n.end and bound <= n.window
    # a takeover from the latest snapshot, the projectors, the effect runners, the archive
    assert n.snapshot is not None and bound <= n.snapshot
    assert n.projector is not None and bound <= n.projector
    assert n.effects is None or bound <= n.effects
    assert n.archive is None or bound <= n.archive
    # the audit: its checkpoint, or — with none saved — an archive that holds what goes
    assert (n.checkpoint is not None and bound <= n.checkpoint) or n.archive is not None
    assert why


@given(needs())
def test_the_bound_is_the_tightest_need_and_names_it(n: EventNeeds) -> None:
    bound, why = events_bound(n)
    named = {"end": n.end, "retention window": n.window, "snapshot": n.snapshot or 0,
             "projector": n.projector or 0, "audit checkpoint": n.checkpoint or 0,
             "effect runners": n.effects, "archive": n.archive}
    assert max(named[why] or 0, n.start) == bound


def test_without_a_checkpoint_nothing_goes_unless_an_archive_holds_it() -> None:
    base = EventNeeds(start=0, end=100, snapshot=80, checkpoint=None, projector=100,
                      effects=None, archive=None, window=100)
    assert events_bound(base) == (0, "audit checkpoint")
    archived = replace(base, archive=50)
    assert events_bound(archived) == (50, "archive")
    audited = replace(base, checkpoint=60)
    assert events_bound(audited) == (60, "audit checkpoint")


def test_without_a_snapshot_or_a_published_projector_offset_nothing_goes() -> None:
    n = EventNeeds(start=5, end=100, snapshot=None, checkpoint=90, projector=100,
                   effects=None, archive=None, window=100)
    assert events_bound(n) == (5, "snapshot")
    n = replace(n, snapshot=70, projector=None)
    assert events_bound(n) == (5, "projector")
