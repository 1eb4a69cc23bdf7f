"""The commands the docs show, for the tests that run them (docs are code)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path


def _blocks(doc: Path, section: str, kind: str) -> list[str]:
    """The ``kind`` fenced blocks after ``section`` in ``doc``."""
    text = doc.read_text()
    return [str(b) for b in re.findall(rf"```{kind}\n(.*?)```", text[text.index(section):], re.S)]


def fenced_blocks(doc: Path, section: str, kind: str) -> list[str]:
    """The ``kind`` fenced blocks (``toml``, ``python``, ...) after ``section`` in ``doc``."""
    return _blocks(doc, section, kind)


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


# --- every runnable block of the docs (tests/unit/test_doc_blocks.py claims each) ---

#: the fenced kinds a reader runs: shell commands and Python programs
RUNNABLE = ("sh", "python")
#: ``<!-- not run: REASON -->`` right before a block (blank lines between allowed): the block
#: is shown, not run, and why. A REASON starting with a backquoted command (``<!-- not run:
#: `make test`: the whole suite -->``) spares only the lines starting with that command.
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->", re.S)
_LINE_EXEMPTION = re.compile(r"`([^`]+)`:\s*(\S.*)", re.S)


class Block:
    """One ``sh`` or ``python`` fenced block of a doc."""

    def __init__(self, doc: str, heading: str, index: int, line: int, kind: str, text: str,
                 not_run: str | None) -> None:
        self.doc = doc  # relative to the repository, e.g. docs/tour.md
        self.heading = heading  # the nearest heading above it, without its #s
        self.index = index  # among the runnable blocks under that heading, from 0
        self.line = line  # of the opening fence, from 1
        self.kind = kind
        self.text = text
        self.exempt_prefix: str | None = None  # only lines starting with it are not run
        self.not_run: str | None = None  # the whole block is not run, and why
        if not_run is not None:
            m = _LINE_EXEMPTION.fullmatch(not_run)
            if m:
                self.exempt_prefix = m.group(1)
            else:
                self.not_run = not_run
        self.reason = not_run

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.doc, self.heading, self.index)

    @property
    def first_command(self) -> str:
        return next((ln.strip() for ln in self.text.splitlines()
                     if ln.strip() and not ln.lstrip().startswith("#")), "")

    def __repr__(self) -> str:
        return f"{self.doc}:{self.line} ({self.heading!r} #{self.index}): {self.first_command}"


def doc_blocks(root: Path, doc: str) -> list[Block]:
    """The ``sh`` and ``python`` blocks of ``root/doc``, in order."""
    lines = (root / doc).read_text().split("\n")
    blocks: list[Block] = []
    heading, counts = "", {}  # type: ignore[var-annotated]
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"```(\S*)\s*$", line)
        if fence and fence.group(1):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            kind = fence.group(1)
            if kind in RUNNABLE:
                j = i - 1
                while j >= 0 and not lines[j].strip():
                    j -= 1
                before = "\n".join(lines[max(0, j - 3):j + 1]) if j >= 0 else ""
                marks = NOT_RUN.findall(before) if j >= 0 and lines[j].rstrip().endswith(
                    "-->") else []
                index = counts.get(heading, 0)
                counts[heading] = index + 1
                blocks.append(Block(doc, heading, index, i + 1, kind,
                                    "\n".join(lines[i + 1:end]) + "\n",
                                    marks[-1] if marks else None))
            i = end + 1
            continue
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        i += 1
    return blocks


def all_doc_blocks(root: Path) -> list[Block]:
    """The runnable blocks of README.md and docs/*.md."""
    docs = ["README.md", *sorted(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))]
    return [b for d in docs for b in doc_blocks(root, d)]
