"""The commands the docs show, for the tests that run them (docs are code)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path


def _blocks(doc: Path, section: str, kind: str) -> list[str]:
    """The ``kind`` fenced blocks after ``section`` in ``doc``."""
    text = doc.read_text()
    return [str(b) for b in re.findall(rf"```{kind}\n(.*?)```", text[text.index(section):], re.S)]


def sh_block(doc: Path, section: str, after: int = 0) -> str:
    """The text of the first ``sh`` block after ``section`` in ``doc`` (``after``: skip
    that many blocks first)."""
    blocks = _blocks(doc, section, "sh")
    assert len(blocks) > after, f"no sh block {after} after {section!r} in {doc}"
    return blocks[after]


def sh_commands(doc: Path, section: str, prefix: str = "chronolog ",
                after: int = 0) -> list[list[str]]:
    """The lines starting with ``prefix`` of the first ``sh`` block after ``section`` in
    ``doc`` (``after``: skip that many blocks first), each split into words as the shell
    does (quotes removed, so a quoted ``#`` or space stays in its word; its comment
    dropped)."""
    return [shlex.split(line, comments=True) for line in sh_block(doc, section, after)
            .splitlines() if line.startswith(prefix)]


def text_block(doc: Path, section: str) -> str:
    """The first ``text`` block after ``section`` in ``doc``: output the docs show."""
    blocks = _blocks(doc, section, "text")
    assert blocks, f"no text block after {section!r} in {doc}"
    return blocks[0]
