"""The commands the docs show, for the tests that run them (docs are code)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path


def sh_block(doc: Path, section: str, after: int = 0) -> str:
    """The text of the first ``sh`` block after ``section`` in ``doc`` (``after``: skip
    that many blocks first)."""
    text = doc.read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text[text.index(section):], re.S)
    assert len(blocks) > after, f"no sh block {after} after {section!r} in {doc}"
    return str(blocks[after])


def sh_commands(doc: Path, section: str, prefix: str = "chronolog ",
                after: int = 0) -> list[list[str]]:
    """The lines starting with ``prefix`` of the first ``sh`` block after ``section`` in
    ``doc`` (``after``: skip that many blocks first), each split into words as the shell
    does (quotes removed, its comment dropped)."""
    return [shlex.split(line, comments=True) for line in sh_block(doc, section, after)
            .splitlines() if line.startswith(prefix)]
