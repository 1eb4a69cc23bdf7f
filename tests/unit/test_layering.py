"""The architecture as tests.

- The import contracts of ``pyproject.toml`` (``[tool.importlinter]``) hold: the pure core
  (``chronolog.domain``, ``chronolog.commands``, ``chronolog.audit``) imports no I/O, clock
  or edge; a layer imports only the layers below it; a private module is imported only
  inside its package; the modules of a package import each other without cycles. Each
  contract is also shown to fail on a copy of the tree with a violation planted in it.
- The pure core reads no clock and draws no random number (``datetime.now()`` is a call, not
  an import: import-linter cannot see it).
- No module uses another package's private (``_underscore``) name.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
CORE = ("domain", "commands", "audit")

# (file under src/, private name) pairs allowed to cross a package boundary: none.
ALLOWED_PRIVATE_USES: frozenset[tuple[str, str]] = frozenset()

# underscore names that are public API of the standard library (namedtuple)
_PUBLIC_UNDERSCORE = frozenset({"_asdict", "_field_defaults", "_fields", "_make", "_replace"})

# what reads a clock or draws a random number
_CLOCK_METHODS = frozenset({"now", "utcnow", "today"})  # datetime.now(), date.today(), ...
_CLOCK_OR_RANDOM_MODULES = frozenset({"random", "secrets", "time", "uuid"})
_CLOCK_OR_RANDOM_CALLS = frozenset({("os", "urandom"), ("os", "getrandom")})


# ---------------------------------------------------------------------------------------
# import-linter


def _lint_imports(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()",
               "--no-cache", "--no-logo"]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def test_the_import_contracts_hold() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    for contract in _contracts():
        assert f"{contract['name']} KEPT" in " ".join(result.stdout.split())


def test_every_contract_fails_on_a_violation(tmp_path: Path) -> None:
    """A copy of the tree with one violation per contract: every contract reports BROKEN."""
    tree = tmp_path / "chronolog"
    shutil.copytree(SRC, tree, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    planted = {
        # the pure core does I/O
        "domain/ids.py": "import socket\n",
        # a lower layer imports a higher one
        "log/port.py": "import chronolog.projections.store\n",
        # a part of the processor imports its task manager
        "processors/output.py": "import chronolog.processors.runtime\n",
        # a private module imported from another package
        "api/_planted.py": "X = 1\n",
        "cli/planted.py": "from chronolog.api._planted import X\n",
        # two modules of one package import each other
        "domain/planted_a.py": "import chronolog.domain.planted_b\n",
        "domain/planted_b.py": "import chronolog.domain.planted_a\n",
    }
    for rel, line in planted.items():
        with open(tree / rel, "a") as f:
            f.write("\n" + line)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # the copy, not the installed tree
    result = _lint_imports(tmp_path, env)
    out = " ".join(result.stdout.split())
    assert result.returncode != 0, out
    for contract in _contracts():
        assert f"{contract['name']} BROKEN" in out, out


MAX_PROCESSOR_MODULE_LINES = 800


def test_no_module_of_the_processor_grows_past_800_lines() -> None:
    """The processor is a task manager over partition tasks, restore, output and config:
    none of its modules holds more than one of those (a module past the limit is a sign
    that one took another in)."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in (SRC / "processors").glob("*.py")}
    assert {"runtime.py", "partition_task.py", "restore.py", "output.py", "config.py"} <= set(sizes)
    assert {n: k for n, k in sizes.items() if k > MAX_PROCESSOR_MODULE_LINES} == {}


# ---------------------------------------------------------------------------------------
# the pure core reads no clock


def clock_reads(source: str) -> list[str]:
    """Each clock read or random draw in ``source``, as ``line: code``."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name.split(".")[0] in _CLOCK_OR_RANDOM_MODULES]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            bad = [node.module] if (node.module or "").split(".")[0] in _CLOCK_OR_RANDOM_MODULES \
                else []
        elif isinstance(node, ast.Attribute):
            receiver = node.value.id if isinstance(node.value, ast.Name) else None
            bad = [node.attr] if (node.attr in _CLOCK_METHODS
                                  or (receiver, node.attr) in _CLOCK_OR_RANDOM_CALLS) else []
        else:
            continue
        if bad:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def _core_files() -> Iterator[Path]:
    for package in CORE:
        yield from sorted((SRC / package).rglob("*.py"))


def test_the_pure_core_reads_no_clock_and_draws_no_random_number() -> None:
    offenders = [f"{path.relative_to(SRC)}:{hit}" for path in _core_files()
                 for hit in clock_reads(path.read_text())]
    assert offenders == [], "time enters the core as an argument (now): " + "; ".join(offenders)


@pytest.mark.parametrize("code", [
    "from datetime import datetime\nx = datetime.now()\n",
    "import datetime\nx = datetime.datetime.utcnow()\n",
    "from datetime import date\nx = date.today()\n",
    "import time\n",
    "from random import random\n",
    "import os\nx = os.urandom(8)\n",
    "import uuid\n",
])
def test_the_clock_check_sees(code: str) -> None:
    assert clock_reads(code) != []


def test_the_clock_check_lets_time_as_data_pass() -> None:
    code = ("from datetime import datetime, timedelta, timezone\n"
            "def due(now: datetime) -> datetime:\n"
            "    return now.astimezone(timezone.utc) + timedelta(seconds=1)\n")
    assert clock_reads(code) == []


# ---------------------------------------------------------------------------------------
# private names stay in their package


def _package(rel: Path) -> str:
    """``api`` for src/api/app.py, ``settings`` for src/settings.py, ``""`` for the root."""
    if len(rel.parts) > 1:
        return rel.parts[0]
    return "" if rel.stem == "__init__" else rel.stem


def _module_package(module: str) -> str | None:
    """The package of a ``chronolog`` module name (None outside chronolog)."""
    parts = module.split(".")
    if parts[0] != "chronolog":
        return None
    return parts[1] if len(parts) > 1 else ""


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in _PUBLIC_UNDERSCORE


_Scan = tuple[frozenset[str], tuple[ast.stmt, ...], tuple[ast.Attribute, ...]]


@cache
def _scan(tree: ast.Module) -> _Scan:
    """One walk over a module: the names it defines (functions, classes, variables, attributes
    it assigns), its imports, and its uses of private attributes."""
    names = set()
    imports: list[ast.stmt] = []
    attributes: list[ast.Attribute] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            if isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif _is_private(node.attr):
                attributes.append(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
    return frozenset(names), tuple(imports), tuple(attributes)


def defined_names(tree: ast.Module) -> frozenset[str]:
    """Every name a module defines: functions, classes, variables, attributes it assigns."""
    return _scan(tree)[0]


def private_uses(tree: ast.Module, module: str, is_package: bool,
                 defined_elsewhere: dict[str, str]) -> list[tuple[int, str, str]]:
    """``(line, private name, its package)`` for each private name of another chronolog
    package that ``tree`` (the module ``module``) uses:

    - ``from chronolog.x.y import _name``;
    - ``y._name`` where ``y`` is imported from another chronolog package;
    - ``obj._name`` on any object but ``self``/``cls`` where ``_name`` is defined only in other
      packages (``defined_elsewhere``: private name -> the package defining it): a private
      attribute of another package's object.
    """
    own = _module_package(module)
    imported: dict[str, str] = {}  # local name -> the chronolog module or object it names
    found: list[tuple[int, str, str]] = []
    _, imports, attributes = _scan(tree)
    for node in imports:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            package = _module_package(origin)
            if package is None:
                continue
            for alias in node.names:
                full = f"{origin}.{alias.name}"
                imported[alias.asname or alias.name] = full
                if _is_private(alias.name) and _module_package(full) != own:
                    found.append((node.lineno, alias.name, package))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _module_package(alias.name) is not None and alias.asname:
                    imported[alias.asname] = alias.name
    for node in attributes:
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in imported:
            package = _module_package(imported[node.value.id])
            if package != own:
                found.append((node.lineno, node.attr, str(package)))
        elif node.attr in defined_elsewhere:
            found.append((node.lineno, node.attr, defined_elsewhere[node.attr]))
    return found


@cache
def _trees() -> tuple[tuple[Path, ast.Module], ...]:
    return tuple((path.relative_to(SRC), ast.parse(path.read_text()))
                 for path in sorted(SRC.rglob("*.py")))


def _module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["chronolog", *parts])


@cache
def _private_uses_in_src() -> frozenset[tuple[str, str, int, str]]:
    definers: dict[str, set[str]] = {}  # private name -> the packages that define it
    for rel, tree in _trees():
        for name in defined_names(tree):
            if _is_private(name):
                definers.setdefault(name, set()).add(_package(rel))
    uses = set()
    for rel, tree in _trees():
        own = _package(rel)
        elsewhere = {name: sorted(pkgs)[0] for name, pkgs in definers.items() if own not in pkgs}
        for line, name, package in private_uses(tree, _module_name(rel), rel.stem == "__init__",
                                                elsewhere):
            uses.add((rel.as_posix(), name, line, package))
    return frozenset(uses)


def test_no_module_uses_another_packages_private_names() -> None:
    offenders = sorted(f"src/{path}:{line}: {name} of chronolog.{package}"
                       for path, name, line, package in _private_uses_in_src()
                       if (path, name) not in ALLOWED_PRIVATE_USES)
    assert offenders == [], ("make the name public in its package (or move the code next to "
                             "it): " + "; ".join(offenders))


def test_the_private_name_allow_list_has_no_stale_entry() -> None:
    used = {(path, name) for path, name, _, _ in _private_uses_in_src()}
    assert sorted(ALLOWED_PRIVATE_USES - used) == []


@pytest.mark.parametrize(("code", "expected"), [
    ("from chronolog.log.sqlite import _ensure_topics\n", [(1, "_ensure_topics", "log")]),
    ("from chronolog.api import app as api\nx = api._json\n", [(2, "_json", "api")]),
    ("import chronolog.api.app as api\nx = api._json\n", [(2, "_json", "api")]),
    ("def f(log_):\n    return log_._w\n", [(2, "_w", "log")]),
    ("from chronolog.cli.errors import _own\nx = self._w\n", []),  # same package; self
    ("from chronolog.log import port\nx = port.Topics._replace\n", []),  # public API
])
def test_the_private_name_check_sees(code: str, expected: list[tuple[int, str, str]]) -> None:
    assert private_uses(ast.parse(code), "chronolog.cli.example", False, {"_w": "log"}) == expected


# ---------------------------------------------------------------------------------------
# imports inside functions (docs/architecture.md §5.3)

# packages whose functions may import what they run: the command line's start-up stays light
LAZY_PACKAGES = ("cli", "devnode")
# (file under src/, imported module): why it is imported inside its function
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("lifecycle.py", "asyncpg"): "processes on the embedded log never load asyncpg",
    ("log/kafka_acls.py", "aiokafka.protocol.admin"): "printing the ACLs needs no broker",
    ("embedded_postgres.py", "pwd"): "the server's system user is looked up only when run as root",
    ("settings.py", "chronolog.log.sqlite"): "a process imports the adapter of its own log",
    ("settings.py", "chronolog.log.kafka"): "a process imports the adapter of its own log",
    ("telemetry/tracing.py", "chronolog.telemetry.setup"):
        "the OpenTelemetry SDK and exporter load only when tracing is on",
}
# what `chronolog --help` must not load
HEAVY_MODULES = ("aiokafka", "asyncpg", "fastapi", "uvicorn", "httpx", "sqlite3")


def _under_import_error(handlers: list[ast.ExceptHandler]) -> bool:
    names = {h.type.id for h in handlers if isinstance(h.type, ast.Name)}
    return "ImportError" in names or "ModuleNotFoundError" in names


def imports_inside_functions(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import inside a function, except an optional dependency's
    (inside ``try:`` with an ``except ImportError`` handler)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Try) and _under_import_error(node.handlers):
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child, in_function)
            return
        if in_function and isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif in_function and isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "." * node.level + (node.module or "")))
        inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def _lazy_imports_in_src() -> list[tuple[str, int, str]]:
    return [(rel.as_posix(), line, module)
            for rel, tree in _trees() if not rel.as_posix().startswith(LAZY_PACKAGES)
            for line, module in imports_inside_functions(tree)]


def test_imports_inside_functions_follow_the_rule() -> None:
    offenders = sorted(f"src/{path}:{line}: {module}" for path, line, module
                       in _lazy_imports_in_src() if (path, module) not in LAZY_IMPORTS)
    assert offenders == [], ("import at the top of the module (docs/architecture.md §5.3): "
                             + "; ".join(offenders))


def test_the_lazy_import_list_has_no_stale_entry() -> None:
    used = {(path, module) for path, _, module in _lazy_imports_in_src()}
    assert sorted(set(LAZY_IMPORTS) - used) == []


@pytest.mark.parametrize(("code", "expected"), [
    ("import orjson\ndef f():\n    return orjson\n", []),
    ("def f():\n    import orjson\n    return orjson\n", [(2, "orjson")]),
    ("async def f():\n    from aiokafka import x\n", [(2, "aiokafka")]),
    ("class C:\n    def m(self):\n        from . import y\n", [(3, ".")]),
    ("def f():\n    try:\n        import tzdata\n    except ImportError:\n        pass\n", []),
    ("def f():\n    try:\n        import tzdata\n    except OSError:\n        pass\n",
     [(3, "tzdata")]),
])
def test_the_lazy_import_check_sees(code: str, expected: list[tuple[int, str]]) -> None:
    assert imports_inside_functions(ast.parse(code)) == expected


def test_the_command_line_starts_without_heavy_drivers() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, chronolog.cli.main; print(*sorted(sys.modules))"],
        capture_output=True, text=True, check=True).stdout.split()
    heavy = sorted(name for name in loaded if name.split(".")[0] in HEAVY_MODULES)
    assert heavy == []


@pytest.mark.parametrize("module", ["chronolog.processors.runtime", "chronolog.cli.processor",
                                    "chronolog.cli.worker", "chronolog.cli.projector",
                                    "chronolog.cli.schedules", "chronolog.api.app"])
def test_a_process_on_the_embedded_log_does_not_load_the_kafka_client(module: str) -> None:
    """Only ``open_log`` of a Kafka log imports aiokafka (docs/architecture.md §5.3)."""
    assert [name for name in _loaded_by(module) if name.split(".")[0] == "aiokafka"] == []


def test_the_clis_schedule_commands_load_no_postgres_driver_and_no_structlog() -> None:
    """Through the API (the usual way) the CLI needs neither asyncpg nor structlog (the log's
    client logs through it); direct access imports them in its command bodies."""
    assert [name for name in _loaded_by("chronolog.cli.schedules")
            if name.split(".")[0] in ("asyncpg", "structlog")] == []


def _loaded_by(module: str) -> list[str]:
    """The modules a fresh interpreter has loaded after importing ``module``."""
    return subprocess.run(
        [sys.executable, "-c", f"import sys, {module}; print(*sorted(sys.modules))"],
        capture_output=True, text=True, check=True).stdout.split()


def test_each_command_is_found_in_the_module_that_registers_it() -> None:
    import argparse
    import importlib

    from chronolog.cli.main import COMMAND_MODULES, COMMANDS, build_parser

    registered: dict[str, str] = {}
    for name in COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(name).register(sub)
        registered |= dict.fromkeys(sub.choices, name)
    assert registered == COMMANDS
    whole = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert list(whole) == list(COMMANDS)  # `chronolog --help` lists them in this order


def test_a_command_loads_only_its_own_module() -> None:
    script = ("import sys\nfrom chronolog.cli.main import main\n"
              "rc = main(['preview', '--cron', '0 9 * * *', '-n', '1', '--json'])\n"
              "print(rc, *sorted(sys.modules))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert len(out) == 2  # preview's JSON, then ours
    rc, *loaded = out[1].split()
    assert rc == "0"
    assert "chronolog.cli.preview" in loaded
    others = sorted(n for n in loaded if n.startswith("chronolog.cli.")
                    and n not in ("chronolog.cli.main", "chronolog.cli.preview",
                                  "chronolog.cli.errors"))
    heavy = sorted(name for name in loaded if name.split(".")[0] in HEAVY_MODULES)
    assert (others, heavy) == ([], [])
