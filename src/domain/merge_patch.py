"""JSON merge patch (RFC 7396): how a change to a JSON document is written as the part that
changes.

A patch that is an object is merged into the target member by member: a member whose value
is ``null`` is removed from the target, a member whose value is an object is merged into
the target's member of that name (recursively; a target member that is not an object is
replaced by an empty one first), any other value (a string, number, boolean or array)
replaces the target's member. A patch that is not an object replaces the target whole. So
``{}`` changes nothing, a patch cannot set a member to ``null`` (that removes it) and an
array is always replaced, never merged item by item.

This is what ``PATCH /v1/schedules/{id}`` applies to a schedule's current definition and
what ``chronolog schedule revise`` sends from its flags (docs/design.md §11). The function
is the RFC's own pseudo-code; the few libraries that implement it add nothing and are not
typed. Pure: it never changes its arguments, it answers a new document.
"""

from __future__ import annotations

from typing import Any

__all__ = ["merge_patch"]


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with ``patch`` applied (RFC 7396 §2); neither argument is modified."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = merge_patch(merged.get(name), value)
    return merged
