"""The explicit package list in pyproject.toml matches the folders under src/."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_package_list_matches_src_folders() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert cfg["package-dir"] == {"chronolog": "src"}
    declared = set(cfg["packages"])
    found = {"chronolog"}
    for init in (ROOT / "src").rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT / "src")
        if rel.parts:
            found.add("chronolog." + ".".join(rel.parts))
    assert declared == found


def test_no_imports_from_src() -> None:
    offenders = []
    for path in list((ROOT / "src").rglob("*.py")) + list((ROOT / "tests").rglob("*.py")):
        for line in path.read_text().splitlines():
            s = line.strip()
            if s.startswith(("from src.", "import src.", "from src import")):
                offenders.append(f"{path}: {s}")
    assert offenders == []


def test_every_module_has_a_docstring() -> None:
    import ast

    missing = [
        str(p)
        for p in (ROOT / "src").rglob("*.py")
        if ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert missing == []
