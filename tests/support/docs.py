"""The commands the docs show, for the tests that run them (docs are code)."""

from __future__ import annotations

import re
from pathlib import Path


def sh_commands(doc: Path, section: str, prefix: str = "chronolog ") -> list[list[str]]:
    """The lines starting with ``prefix`` of the first ``sh`` block after ``section`` in
    ``doc``, each split into words, its comment dropped."""
    text = doc.read_text()
    block = re.search(r"```sh\n(.*?)```", text[text.index(section):], re.S)
    assert block is not None, f"no sh block after {section!r} in {doc}"
    return [line.split("#")[0].split() for line in block.group(1).splitlines()
            if line.startswith(prefix)]
