"""The commands the docs show, for the tests that run them (docs are code)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path


def _block(doc: Path, section: str, kind: str) -> str:
    """The first ``kind`` fenced block after ``section`` in ``doc``."""
    text = doc.read_text()
    block = re.search(rf"```{kind}\n(.*?)```", text[text.index(section):], re.S)
    assert block is not None, f"no {kind} block after {section!r} in {doc}"
    return block.group(1)


def sh_commands(doc: Path, section: str, prefix: str = "chronolog ") -> list[list[str]]:
    """The lines starting with ``prefix`` of the first ``sh`` block after ``section`` in
    ``doc``, each split into words, its comment dropped."""
    return [line.split("#")[0].split() for line in _block(doc, section, "sh").splitlines()
            if line.startswith(prefix)]


def sh_argvs(doc: Path, section: str, prefix: str = "chronolog ") -> list[list[str]]:
    """Like :func:`sh_commands`, but each line split as the shell would (quotes kept
    together, so a quoted ``#`` or space stays in its word)."""
    return [shlex.split(line, comments=True)
            for line in _block(doc, section, "sh").splitlines() if line.startswith(prefix)]


def text_block(doc: Path, section: str) -> str:
    """The first ``text`` block after ``section`` in ``doc``: output the docs show."""
    return _block(doc, section, "text")
