"""Packaging: the explicit package list in pyproject.toml matches the folders under src/, a
wheel built from the tree ships the SQL migrations and builds without a setuptools warning,
the runtime dependencies hold no test tool, and ``make run`` installs only those."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
MIGRATIONS = ROOT / "src" / "projections" / "migrations"
# the tools only `make test` / `make lint` need: never a runtime dependency
TEST_TOOLS = {"pytest", "pytest-asyncio", "hypothesis", "schemathesis", "ruff", "mypy",
              "import-linter", "aiosmtpd", "testcontainers", "psutil", "setuptools",
              "playwright"}


def _name(requirement: str) -> str:
    """The normalized project name of a requirement such as ``ruff>=0.17,<0.18``."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def test_package_list_matches_src_folders() -> None:
    cfg = PYPROJECT["tool"]["setuptools"]
    assert cfg["package-dir"] == {"chronolog": "src"}
    declared = set(cfg["packages"])
    found = {"chronolog"}
    for init in (ROOT / "src").rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT / "src")
        if rel.parts:
            found.add("chronolog." + ".".join(rel.parts))
    # data-only packages (no __init__.py: the SQL migrations, the dashboard's templates and
    # static files) are declared with their data
    data = set(cfg["package-data"])
    for pkg in data:
        folder = ROOT / "src" / Path(*pkg.split(".")[1:])
        assert folder.is_dir() and not (folder / "__init__.py").exists(), pkg
    assert data == {"chronolog.projections.migrations", "chronolog.api.dashboard.templates",
                    "chronolog.api.dashboard.static", "chronolog.log.dictionaries"}
    assert declared == found | data


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """What a build needs (pyproject.toml, README.md, Makefile, src/), copied out of the
    repository so that building leaves nothing behind in it."""
    out = tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md", "Makefile"):
        shutil.copy(ROOT / name, out / name)
    shutil.copytree(ROOT / "src", out / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    yield out


@pytest.fixture(scope="module")
def wheel(tree: Path) -> tuple[Path, str]:
    """A wheel of the project built from ``tree`` (offline: the running environment's
    setuptools, which the test extra brings), and everything the build printed."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(tree / "dist"), "."],
        cwd=tree, capture_output=True, text=True, timeout=300)
    said = built.stdout + built.stderr
    assert built.returncode == 0, said
    wheels = list((tree / "dist").glob("chronolog-*.whl"))
    assert len(wheels) == 1, said
    return wheels[0], said


def test_the_wheel_ships_every_sql_migration(wheel: tuple[Path, str]) -> None:
    path, _ = wheel
    shipped = {Path(n).name: n for n in zipfile.ZipFile(path).namelist()
               if n.startswith("chronolog/projections/migrations/")}
    on_disk = {p.name for p in MIGRATIONS.glob("*.sql")}
    assert on_disk and set(shipped) == on_disk
    with zipfile.ZipFile(path) as z:
        for name in on_disk:
            assert z.read(shipped[name]) == (MIGRATIONS / name).read_bytes(), name


def test_the_wheel_ships_the_embedded_logs_record_dictionary(wheel: tuple[Path, str]) -> None:
    path, _ = wheel
    name = "chronolog/log/dictionaries/record_v1.zdict"
    with zipfile.ZipFile(path) as z:
        assert z.read(name) == (ROOT / "src" / "log" / "dictionaries" / "record_v1.zdict"
                                ).read_bytes()


def test_the_wheel_ships_the_dashboard_templates_and_static_files(
    wheel: tuple[Path, str],
) -> None:
    path, _ = wheel
    folder = ROOT / "src" / "api" / "dashboard"
    on_disk = {str(p.relative_to(folder)) for sub in ("templates", "static")
               for p in (folder / sub).iterdir() if p.is_file()}
    prefix = "chronolog/api/dashboard/"
    shipped = {n.removeprefix(prefix) for n in zipfile.ZipFile(path).namelist()
               if n.startswith(prefix) and not n.endswith(".py")}
    assert {"templates/base.html", "static/htmx.min.js", "static/dashboard.css"} <= on_disk
    assert shipped == on_disk


def test_the_build_prints_no_setuptools_warning(wheel: tuple[Path, str]) -> None:
    _, said = wheel
    for sign in ("Warning", "would be ignored", "deprecated", "!!"):
        assert sign not in said, said


def test_runtime_dependencies_have_no_test_tool(wheel: tuple[Path, str]) -> None:
    runtime = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert not runtime & TEST_TOOLS
    extra = {_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["test"]}
    assert {"pytest", "hypothesis", "schemathesis", "ruff", "mypy", "import-linter"} <= extra
    # and so says the wheel's metadata: every requirement without a marker is a runtime one
    path, _ = wheel
    with zipfile.ZipFile(path) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
    requires = [line.split(":", 1)[1].strip() for line in meta.decode().splitlines()
                if line.startswith("Requires-Dist:")]
    unconditional = {_name(r) for r in requires if ";" not in r}
    assert unconditional == runtime
    assert {_name(r) for r in requires if "extra ==" in r} == extra


def _planned_installs(tree: Path, target: str) -> list[str]:
    """The ``pip install`` command lines ``make TARGET`` would run in a fresh tree."""
    make = shutil.which("make")
    assert make, "make is not installed"
    plan = subprocess.run([make, "-n", target], cwd=tree, capture_output=True, text=True,
                          timeout=60)
    assert plan.returncode == 0, plan.stderr
    return [line for line in plan.stdout.splitlines() if "pip install" in line
            and "--upgrade pip" not in line]


def test_make_run_installs_only_the_runtime_dependencies(tree: Path) -> None:
    run = _planned_installs(tree, "run")
    assert run and all("[test]" not in line for line in run), run
    for target in ("test", "lint", "test-unit"):
        planned = _planned_installs(tree, target)
        assert any("'.[test]'" in line for line in planned), (target, planned)


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
