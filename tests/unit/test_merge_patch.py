"""JSON merge patch (RFC 7396): ``chronolog.domain.merge_patch`` and a stored definition
patched as ``PATCH /v1/schedules/{id}`` patches it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from chronolog.domain import messages as m
from chronolog.domain.merge_patch import merge_patch
from chronolog.queries.documents import definition_document, patched_definition

_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
# JSON documents without null members (a patch cannot set one: null removes)
_values = st.recursive(
    st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner | st.none(), max_size=3)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10)
_documents = st.dictionaries(st.text(max_size=3), _values, max_size=4)
_patches = st.recursive(
    _scalars | st.lists(_scalars, max_size=3),
    lambda inner: st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=10)


@given(_documents)
def test_patching_a_document_with_its_own_members_is_the_identity(doc: dict[str, Any]) -> None:
    assert merge_patch(doc, doc) == doc


@given(_documents)
def test_an_empty_patch_changes_nothing(doc: dict[str, Any]) -> None:
    assert merge_patch(doc, {}) == doc


@given(_documents, st.data())
def test_null_removes_the_member_and_leaves_the_others(doc: dict[str, Any],
                                                       data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(doc)) if doc else st.text(max_size=3))
    out = merge_patch(doc, {name: None})
    assert name not in out
    assert out == {k: v for k, v in doc.items() if k != name}


@given(_documents, _patches)
def test_a_patch_changes_neither_argument_and_applying_it_twice_is_once(
    doc: dict[str, Any], patch: Any,
) -> None:
    before, patch_before = copy.deepcopy(doc), copy.deepcopy(patch)
    once = merge_patch(doc, patch)
    assert doc == before and patch == patch_before
    assert merge_patch(once, patch) == once


def test_the_rfc_examples() -> None:
    # RFC 7396 appendix A, a selection
    assert merge_patch({"a": "b"}, {"a": "c"}) == {"a": "c"}
    assert merge_patch({"a": "b"}, {"b": "c"}) == {"a": "b", "b": "c"}
    assert merge_patch({"a": "b", "b": "c"}, {"a": None}) == {"b": "c"}
    assert merge_patch({"a": ["b"]}, {"a": "c"}) == {"a": "c"}
    assert merge_patch({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}) == {"a": {"b": "d"}}
    assert merge_patch({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}
    assert merge_patch({"e": None}, {"a": 1}) == {"e": None, "a": 1}
    assert merge_patch([1, 2], {"a": "b", "c": None}) == {"a": "b"}
    assert merge_patch({}, {"a": {"bb": {"ccc": None}}}) == {"a": {"bb": {}}}
    assert merge_patch({"a": "foo"}, ["x"]) == ["x"]


_STORED = m.ScheduleSpec(cron="0 9 * * 1-5", timezone="Europe/Paris",
                         job=m.JobSpec(type="report", params={"region": "eu", "full": True}),
                         end="2031-01-01T00:00:00Z", max_count=10).model_dump(mode="json")


def test_a_patched_definition_keeps_what_the_patch_does_not_name() -> None:
    d = patched_definition(_STORED, {"job": {"params": {"full": None, "n": 2}},
                                     "nothingThere": None})
    assert d.job.type == "report" and d.job.params == {"region": "eu", "n": 2}
    assert d.cron == "0 9 * * 1-5" and d.timezone == "Europe/Paris" and d.max_count == 10
    assert patched_definition(_STORED, {}) == patched_definition(_STORED, definition_document(
        _STORED))
    d = patched_definition(_STORED, {"cron": None, "every": "30s", "end": None})
    assert (d.cron, d.every, d.end) == (None, 30.0, None)


def test_a_patched_definition_is_validated_as_a_put_body() -> None:
    with pytest.raises(ValidationError) as exc:
        patched_definition(_STORED, {"maxCount": 0})
    assert exc.value.errors()[0]["loc"] == ("maxCount",)
    with pytest.raises(ValidationError) as exc:
        patched_definition(_STORED, {"job": {"type": None}})
    assert exc.value.errors()[0]["loc"] == ("job", "type")
