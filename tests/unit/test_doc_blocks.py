"""Every ``sh`` and ``python`` block of README.md and docs/*.md is claimed (docs are code).

A block is claimed one of three ways:

* run by the generic runner (tests/integration/test_doc_blocks.py): every block of the
  docs in ``RUNNER_DOCS``, in order, against a dev node;
* run by a named test: ``NAMED`` maps ``(doc, heading, index)`` (the nearest heading above
  the block, without its ``#``; the block's index among the runnable blocks under it, from 0)
  to the test's node ID, and that test must exist;
* declared in the doc, right before the block, with ``<!-- not run: REASON -->``, the reason
  a reader sees in the source (``<!-- not run: `make test`: REASON -->`` spares only the
  lines starting with ``make test``).

A new block that is none of these fails here with its doc, line and first command.
"""

from __future__ import annotations

import ast
from pathlib import Path

from support.docs import Block, all_doc_blocks

ROOT = Path(__file__).resolve().parents[2]

#: the docs whose blocks tests/integration/test_doc_blocks.py runs, each in order
RUNNER_DOCS = ("README.md", "docs/tour.md", "docs/jobs.md", "docs/apply.md")

_BENCH = ("tests/unit/test_bench_docs.py::"
          "test_every_documented_benchmark_command_names_options_its_script_has")

#: blocks run (or, for benchmarks, parsed and checked against their script) by a named test
NAMED: dict[tuple[str, str, int], str] = {
    ("README.md", "Performance", 0): _BENCH,
    ("docs/performance.md", "The burst", 0): _BENCH,
    ("docs/performance.md", "Storage per run", 0): _BENCH,
    ("docs/performance.md", "Storage per run", 1): _BENCH,
    ("docs/performance.md", "The audit", 0): _BENCH,
    ("docs/performance.md", "An idle deployment", 0): _BENCH,
    ("docs/performance.md", "The other benchmarks", 0): _BENCH,
    ("docs/deployment.md", "Chaos", 0): _BENCH,
    ("docs/deployment.md", "Operations", 3):
        "tests/integration/test_pruning_node.py::"
        "test_a_dev_node_prunes_behind_its_audits_archives_and_loses_nothing",
    ("docs/deployment.md", "Operations", 4):
        "tests/integration/test_replay_window.py::"
        "test_a_replay_of_the_window_equals_the_live_read_model_for_the_window",
    ("docs/deployment.md", "Operations", 5):
        "tests/integration/test_archive_cli.py::test_the_commands_of_the_deployment_guide_run",
    ("docs/deployment.md", "Signed webhooks", 0):
        "tests/integration/test_webhook_signatures.py::"
        "test_the_receiver_example_of_the_deployment_guide_verifies_real_deliveries",
    ("docs/deployment.md", "Commands from any Kafka producer", 0):
        "tests/integration/test_doc_blocks.py::test_the_kafka_producer_example_creates_a_schedule",
    **{("docs/tracing.md", heading, i):
       "tests/integration/test_tracing.py::"
       "test_the_spans_of_one_run_join_into_one_trace_across_processes"
       for heading, i in (("Your own spans in a handler", 0), ("Worked example", 0),
                          ("Worked example", 1))},
    ("docs/security.md", "The node's database and files", 0):
        "tests/integration/test_node_files.py::"
        "test_a_dev_node_keeps_other_local_users_out_of_its_files_and_database",
}


def _test_exists(node_id: str) -> bool:
    """``path::name``: ``path`` defines a test function ``name`` at its top level."""
    path, _, name = node_id.partition("::")
    file = ROOT / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text())
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
               and name.startswith("test_") for n in tree.body)


def unclaimed(blocks: list[Block], runner_docs: tuple[str, ...] = RUNNER_DOCS,
              named: dict[tuple[str, str, int], str] = NAMED) -> str:
    """What no test runs and no declaration explains: one line per block (doc, line, first
    command), empty when every block is claimed."""
    left = [b for b in blocks if b.doc not in runner_docs and b.key not in named
            and b.not_run is None]
    return "".join(f"{b!r}\n" for b in left)


def test_every_runnable_block_of_the_docs_is_run_or_says_why_not() -> None:
    blocks = all_doc_blocks(ROOT)
    assert len(blocks) >= 25  # README.md and docs/*.md are read
    assert unclaimed(blocks) == "", (
        "blocks no test runs: run them (tests/integration/test_doc_blocks.py), name the test "
        "that does in NAMED here, or say why not before the block (<!-- not run: REASON -->):"
        "\n" + unclaimed(blocks))


def test_a_new_block_nothing_claims_is_named_with_its_line_and_first_command(
        tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n\n```sh\nmake run\n```\n")
    (tmp_path / "docs" / "ops.md").write_text(
        "# Ops\n\n## Backups\n\n<!-- not run: the paths of a real deployment -->\n\n"
        "```sh\nchronolog backup /backups/x\n```\n\n```text\noutput\n```\n\n"
        "<!-- not run: `make test`: the whole suite -->\n```sh\nmake test\nmake lint\n```\n\n"
        "### Restore\n\n```python\n# a comment\nimport os\n```\n")
    blocks = all_doc_blocks(tmp_path)
    assert [(b.doc, b.heading, b.index, b.line, b.kind) for b in blocks] == [
        ("README.md", "x", 0, 3, "sh"), ("docs/ops.md", "Backups", 0, 7, "sh"),
        ("docs/ops.md", "Backups", 1, 16, "sh"), ("docs/ops.md", "Restore", 0, 23, "python")]
    assert blocks[1].not_run == "the paths of a real deployment"
    assert (blocks[2].not_run, blocks[2].exempt_prefix) == (None, "make test")
    assert unclaimed(blocks, ("README.md",), {}) == (
        "docs/ops.md:16 ('Backups' #1): make test\n"
        "docs/ops.md:23 ('Restore' #0): import os\n")
    assert unclaimed(blocks, ("README.md",), {("docs/ops.md", "Backups", 1): "t",
                                              ("docs/ops.md", "Restore", 0): "t"}) == ""


def test_each_named_test_exists_and_its_block_too() -> None:
    keys = {b.key: b for b in all_doc_blocks(ROOT)}
    missing_blocks = [k for k in NAMED if k not in keys]
    assert missing_blocks == [], f"NAMED names blocks the docs do not have: {missing_blocks}"
    missing_tests = sorted({t for t in NAMED.values() if not _test_exists(t)})
    assert missing_tests == [], f"NAMED names tests that do not exist: {missing_tests}"
    both = [keys[k] for k in NAMED if keys[k].not_run is not None]
    assert both == [], f"blocks both run by a test and declared not run: {both}"


def test_a_not_run_block_says_why() -> None:
    blocks = all_doc_blocks(ROOT)
    vague = [b for b in blocks if b.reason is not None and len(b.reason.split()) < 4]
    assert vague == [], f"a not-run declaration needs a reason of a few words: {vague}"
    spared = [b for b in blocks if b.exempt_prefix is not None
              and not any(ln.startswith(b.exempt_prefix) for ln in b.text.splitlines())]
    assert spared == [], f"a not-run command that the block does not have: {spared}"
