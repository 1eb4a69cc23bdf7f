"""``chronolog apply``'s pure parts: reading and validating the files, the plan (what is added,
changed field by field, removed with --prune, left alone), without a node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chronolog.cli.apply import (
    APPLIED_BY,
    Current,
    diff,
    load_documents,
    make_plan,
)
from chronolog.cli.errors import UsageError

JOBS = """\
kind: schedule
id: nightly
cron: "0 2 * * *"
timezone: Europe/Paris
job: {type: echo, params: {report: daily}}
retry: {maxAttempts: 5, initialBackoff: 30s}
exclude: [holidays]
labels: {team: billing}
---
---
kind: schedule
id: once
at: 2030-01-01T09:00:00Z
job: {type: echo}
"""
CALENDAR = """\
kind = "calendar"
name = "holidays"
timezone = "Europe/Paris"
dates = [2026-12-25, 2027-01-01]
"""


def _files(tmp_path: Path, **files: str) -> Path:
    for name, text in files.items():
        (tmp_path / name.replace("_", ".")).write_text(text)
    return tmp_path


def _line(exc: pytest.ExceptionInfo[UsageError]) -> str:
    return str(exc.value)


def test_a_directory_is_read_in_name_order_each_document_validated_and_labelled(
        tmp_path: Path) -> None:
    _files(tmp_path, jobs_yaml=JOBS, cal_toml=CALENDAR, notes_txt="not read")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.yaml").write_text("kind: nonsense")  # not recursive
    docs = load_documents([str(tmp_path)], "ci")
    assert [(d.kind, d.key, d.where.rsplit("/", 1)[-1]) for d in docs] == [
        ("calendar", "holidays", "cal.toml, document 1"),
        ("schedule", "nightly", "jobs.yaml, document 1"),
        ("schedule", "once", "jobs.yaml, document 3")]  # the empty document counts
    cal, nightly, once = docs
    assert cal.body["dates"] == ["2026-12-25", "2027-01-01"]  # TOML dates as text
    assert nightly.body["labels"] == {"team": "billing", APPLIED_BY: "ci"}
    # normalised as the API shows it: durations in seconds, defaults filled, UTC instants
    assert nightly.normal["retry"]["initialBackoff"] == 30.0
    assert nightly.normal["misfire"]["policy"] == "latest"
    assert once.body["at"] == "2030-01-01T09:00:00Z"  # a YAML timestamp stays text
    assert once.normal["at"] == "2030-01-01T09:00:00Z"


@pytest.mark.parametrize(("text", "line"), [
    ("kind: schedule\nid: a\nevery: 1h\njob: {type: echo}\nretry: {maxAttempts: 0}\n",
     "error: bad.yaml, document 1: retry.maxAttempts: '0': must be at least 1"),
    ("kind: schedule\nid: a\nevery: 1h\njob: {type: echo}\n---\nkind: schedule\nid: b\n"
     "every: 1h\njob: {type: echo}\nbogus: 1\n",
     "error: bad.yaml, document 2: bogus: '1': unknown field"),
    ("kind: schedule\nid: a\ncron: '61 * * * *'\njob: {type: echo}\n",
     "error: bad.yaml, document 1: cron: '61 * * * *': minute 61 out of range 0-59"),
    ("kind: schedule\nid: a\nevery: 1h\n", "error: bad.yaml, document 1: job: is required"),
    ("kind: job\nid: a\n", "error: bad.yaml, document 1: kind: 'job': must be schedule or "
     "calendar"),
    ("kind: schedule\nevery: 1h\njob: {type: echo}\n",
     "error: bad.yaml, document 1: id: is required"),
    ("kind: schedule\nid: a b\nevery: 1h\njob: {type: echo}\n",
     "error: bad.yaml, document 1: id: 'a b': letters, digits and _ . : @ - only, not only "
     "dots, 1-200 characters"),
    ("kind: schedule\nid: a\nevery: 1h\njob: {type: echo}\nlabels: {Team: x}\n",
     "error: bad.yaml, document 1: labels: label key 'Team': lower-case letters, digits and "
     ". - / only, starting and ending with a letter or digit, 1-63 characters"),
    (f"kind: schedule\nid: a\nevery: 1h\njob: {{type: echo}}\nlabels: {{{APPLIED_BY}: x}}\n",
     f"error: bad.yaml, document 1: labels.{APPLIED_BY}: set by apply itself (--set NAME)"),
    ("kind: calendar\nname: c\nwindows: [{start: '25:00', end: '02:00'}]\n",
     "error: bad.yaml, document 1: windows[0].start: '25:00' is not a wall time HH:MM (00:00 "
     "to 24:00)"),
    ("- a list\n", "error: bad.yaml, document 1: a document is a mapping with kind: schedule "
     "or kind: calendar"),
    ("kind: schedule\nid: a\njob: {type: echo\n",
     "error: bad.yaml: not valid YAML (line 4): expected ',' or '}', but got '<stream end>'"),
])
def test_an_invalid_document_names_its_file_document_and_field(tmp_path: Path, text: str,
                                                               line: str) -> None:
    _files(tmp_path, good_yaml=JOBS, bad_yaml=text)
    with pytest.raises(UsageError) as exc:
        load_documents([str(tmp_path)], "default")
    assert _line(exc).replace(f"{tmp_path}/", "") == line


def test_an_id_twice_across_files_is_refused(tmp_path: Path) -> None:
    _files(tmp_path, a_yaml=JOBS, b_yaml="kind: schedule\nid: once\nevery: 1h\njob: {type: x}\n")
    with pytest.raises(UsageError) as exc:
        load_documents([str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")], "default")
    assert _line(exc).replace(f"{tmp_path}/", "") == (
        "error: b.yaml, document 1: id: 'once' is also in a.yaml, document 3")


def test_paths_that_hold_nothing_or_are_not_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for paths, line in (([str(tmp_path / "missing")], "no such file or directory"),
                        ([str(tmp_path / "empty")], "no .yaml, .yml or .toml file")):
        with pytest.raises(UsageError) as exc:
            load_documents(paths, "default")
        assert _line(exc).endswith(line), _line(exc)
    _files(tmp_path, x_json="{}")
    with pytest.raises(UsageError, match=r"not a \.yaml, \.yml or \.toml file"):
        load_documents([str(tmp_path / "x.json")], "default")


def test_diff_names_each_field_and_compares_arrays_whole() -> None:
    old = {"every": 60.0, "retry": {"maxAttempts": 3, "maxAge": 10.0}, "exclude": ["a"],
           "end": "2030-01-01T00:00:00Z"}
    new = {"every": 60, "retry": {"maxAttempts": 5, "maxAge": 10.0}, "exclude": ["a", "b"],
           "labels": {"x": "1"}}
    assert diff(old, new) == [
        ("retry.maxAttempts", 3, 5), ("exclude", ["a"], ["a", "b"]),
        ("end", "2030-01-01T00:00:00Z", diff.__globals__["_MISSING"]),
        ("labels", diff.__globals__["_MISSING"], {"x": "1"})]


def _current(docs: list[Any], **overrides: Any) -> dict[str, dict[str, Any]]:
    """The schedules of ``docs`` as the API lists them (revision 1), with ``overrides``
    (ID -> definition) in their place."""
    out = {d.key: {"scheduleId": d.key, "revision": 1, "state": "ACTIVE",
                   "definition": d.normal} for d in docs if d.kind == "schedule"}
    for sid, definition in overrides.items():
        out[sid] = {"scheduleId": sid, "revision": 4, "state": "ACTIVE",
                    "definition": definition}
    return out


def test_the_plan_adds_changes_by_field_and_prunes_only_its_own_set(tmp_path: Path) -> None:
    _files(tmp_path, jobs_yaml=JOBS, cal_toml=CALENDAR)
    docs = load_documents([str(tmp_path)], "default")
    cal = {"holidays": {"name": "holidays", "revision": 2, "definition": docs[0].normal}}
    # everything as the files say: nothing to do
    same = make_plan(docs, Current(_current(docs), cal), "default", prune=True)
    assert same.empty and len(same.unchanged) == 3

    changed = dict(docs[1].normal, retry={**docs[1].normal["retry"], "maxAttempts": 3})
    other_set = {"every": 60.0, "job": {"type": "echo"}, "labels": {APPLIED_BY: "other"}}
    gone = {"every": 60.0, "job": {"type": "echo"}, "labels": {APPLIED_BY: "default"}}
    by_hand = {"every": 60.0, "job": {"type": "echo"}}
    current = _current(docs, nightly=changed, theirs=other_set, gone=gone, manual=by_hand)
    del current["once"]
    plan = make_plan(docs, Current(current, {"holidays": None}), "default", prune=True)
    assert [(c.kind, c.key, c.action, c.revision) for c in plan.changes] == [
        ("calendar", "holidays", "add", None), ("schedule", "nightly", "change", 4),
        ("schedule", "once", "add", None), ("schedule", "gone", "remove", 4)]
    assert plan.changes[1].fields == [("retry.maxAttempts", 3, 5)]
    assert plan.counts() == {"add": 2, "change": 1, "remove": 1, "unchanged": 0}
    # without --prune nothing is removed; another set's schedule is never touched
    assert [c.action for c in make_plan(docs, Current(current, {"holidays": None}), "default",
                                        prune=False).changes] == ["add", "change", "add"]


def test_a_schedule_of_another_set_in_the_files_is_a_conflict(tmp_path: Path) -> None:
    _files(tmp_path, jobs_yaml=JOBS)
    docs = load_documents([str(tmp_path)], "default")
    theirs = dict(docs[0].normal, labels={APPLIED_BY: "other"})
    plan = make_plan(docs, Current(_current(docs, nightly=theirs), {}), "default", prune=True)
    assert len(plan.conflicts) == 1 and "belongs to set 'other'" in plan.conflicts[0]
    # a hand-made one (no label) is taken into the set: its labels change
    mine = dict(docs[0].normal)
    del mine["labels"]
    plan = make_plan(docs, Current(_current(docs, nightly=mine), {}), "default", prune=True)
    assert [(c.key, [f[0] for f in c.fields]) for c in plan.changes] == [
        ("nightly", ["labels"])]
