"""The ``sh`` and ``python`` blocks of README.md, docs/tour.md, docs/jobs.md and docs/apply.md,
run as a reader runs them (docs are code; tests/unit/test_doc_blocks.py checks every block is
claimed).

The reader's directory is a temporary copy of the repository's top (links to ``.venv``,
``src``, ``Makefile``, ...), so ``./.chronolog`` is this module's own. Its node is the one
README.md's ``make run`` line starts, once for the module, on a free port (``ARGS="--port
N"``, as a reader passes ``make run`` flags) and this module's PostgreSQL database
(``CHRONOLOG_DATABASE_URL``, instead of the embedded one a reader gets). Each doc's blocks
then run in order against it, each command as the doc shows it, in ``bash -euo pipefail``
with ``.venv/bin`` first on ``PATH``, and ``API`` set to the node's address — the variable
the tour tells a reader to set for another node than ``make run``'s default.

Conventions, read from the docs themselves:

* a line (its trailing comment) saying ``exit N`` must exit N; every other command must
  exit 0;
* long-running commands — ``make run``, ``chronolog dev``, ``chronolog worker`` — start in
  the background, in a process group of their own, and the rest of the block runs once
  they are ready: a node when its ``node.json`` names it and ``/healthz`` answers (a node
  line where this directory's node serves already is that node: the doc's terminals share
  it), a worker when a new live worker shows in ``GET /v1/workers`` (the node's own
  worker is live before any block runs). They are stopped with
  SIGTERM, by process group, at the end of their block, and must exit 0. A background
  command ends the bash script of the lines before it: shell variables do not outlive it;
* a ``python`` block whose first line is ``# NAME.py`` is a file the doc asks the reader to
  write: it is written there (and run, to show it imports); a ``python`` block that says
  ``until SIGTERM`` is a process that runs until stopped: a worker, started and stopped as
  above; any other ``python`` block runs with the venv's Python and must exit 0;
* benchmark commands (README.md "Performance", docs/performance.md) run with their sizes
  made small, every other flag as shown;
* a block declared ``<!-- not run: REASON -->`` is not run; with ``<!-- not run:
  `CMD`: REASON -->`` only its lines starting with CMD are not.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.docs import Block, all_doc_blocks, doc_blocks
from support.net import free_port
from support.polling import wait_until_sync

from .conftest import ROOT
from .pgdb import create_database, drop_database, module_database
from .test_wire_contract import _wait_for_topic
from .test_wire_contract import processor as processor  # a fixture

pytestmark = [pytest.mark.postgres]

VENV_BIN = ROOT / ".venv" / "bin"
#: what the reader's directory holds of the repository
LINKED = (".venv", "src", "bench", "scripts", "schemas", "docs", "Makefile", "pyproject.toml",
          "README.md")
TOKEN = "dev"  # the dev node's token without a tenants file (README.md, "Two commands")
EXIT = re.compile(r"#.*\bexit (\d+)\b")
BACKGROUND = re.compile(
    r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:make run\b|\S*chronolog (?:dev|worker)\b)")
TIMEOUT = 120  # one block's bound: a hang fails the test, not the suite's timeout
# and a further bound for each command of a shell block: each starts a chronolog process
# (most of a second of CPU alone, several seconds with the whole suite on two cores; the
# tour's block of 19 commands took over 120 s in one CI run)
PER_COMMAND_S = 15


class Reader:
    """A reader's directory and shell, with this module's node."""

    def __init__(self, work: Path, env: dict[str, str], api: str) -> None:
        self.work = work
        self.env = env
        self.api = api
        self.logs = work.parent / "logs"
        self.logs.mkdir(exist_ok=True)
        self.count = 0
        self.assigned: dict[str, set[str]] = {}  # doc -> the shell variables it sets

    # --- the node and the workers

    def node_serves(self) -> bool:
        try:
            doc = json.loads((self.work / ".chronolog" / "node.json").read_text())
            os.kill(int(doc["pid"]), 0)
            return httpx.get(f"{doc['url']}/healthz", timeout=5).status_code == 200
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            return False

    def live_workers(self) -> set[str]:
        r = httpx.get(f"{self.api}/v1/workers", params={"live": "true", "limit": 500},
                      headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        r.raise_for_status()
        return {w["workerId"] for w in r.json()["items"]}

    def background(self, argv: list[str], what: str) -> subprocess.Popen[bytes]:
        """Start a long-running command; return once it is ready."""
        node = _starts_a_node(what)
        before = set() if node else self.live_workers()
        self.count += 1
        log = self.logs / f"background-{self.count}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=self.work, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)

        def ready() -> bool:
            assert proc.poll() is None, f"{what!r} exited {proc.returncode}: {_tail(log)}"
            return self.node_serves() if node else bool(self.live_workers() - before)

        wait_until_sync(ready, TIMEOUT, what=f"{what!r} ready", interval=0.2,
                        errors=(httpx.HTTPError,))
        return proc

    # --- blocks

    def run(self, block: Block) -> str:
        """Run one block as its doc shows it; its output."""
        assert block.not_run is None, block
        if block.kind == "python":
            return self._python(block)
        self._check_variables(block)
        out: list[str] = []
        script: list[str] = []
        started: list[tuple[str, subprocess.Popen[bytes]]] = []
        try:
            for command in _commands(block.text):
                first = command.strip()
                if block.exempt_prefix and first.startswith(block.exempt_prefix):
                    continue
                if BACKGROUND.match(first):
                    out.append(self._bash(block, script))
                    script = []
                    if _starts_a_node(first) and self.node_serves():
                        continue  # the doc's terminals share this directory's node
                    started.append((first, self.background(["bash", "-c", first], first)))
                    continue
                script.append(_checked(command))
            out.append(self._bash(block, script))
        finally:
            for what, proc in reversed(started):
                code = _stop(proc)
                assert code == 0, f"{block!r}: {what!r} exited {code} on SIGTERM"
        return "".join(out)

    def _check_variables(self, block: Block) -> None:
        """Each variable a block uses is one its doc sets before (``NAME=``, ``for NAME
        in``): the runner's environment (``API``) stands in only for a value the doc lets
        a reader override, never for one it forgets to set."""
        assigned = self.assigned.setdefault(block.doc, set())
        for command in _commands(block.text):
            code = re.sub(r"'[^']*'", "''", command)  # no expansion inside single quotes
            code = re.sub(r"\s#[^\n]*", "", code)
            used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", code)) - assigned - {"PATH", "HOME"}
            assigned |= set(re.findall(r"(?:^|[\s;(])([A-Za-z_]\w*)=", code))
            assigned |= set(re.findall(r"\bfor (\w+) in\b", code))
            used -= assigned  # ${API:-...} in its own assignment
            assert not used, f"{block!r} uses ${sorted(used)[0]}, which its doc never sets"

    def _bash(self, block: Block, script: list[str]) -> str:
        if not script:
            return ""
        r = subprocess.run(["bash", "-euo", "pipefail", "-xc", "\n".join(script)],
                           cwd=self.work, env=self.env, capture_output=True, text=True,
                           timeout=TIMEOUT + PER_COMMAND_S * len(script))
        assert r.returncode == 0, (
            f"{block!r} failed (exit {r.returncode}):\n{r.stderr[-4000:]}\n{r.stdout[-2000:]}")
        return r.stdout

    def _python(self, block: Block) -> str:
        named = re.match(r"# (\S+\.py)\n", block.text)
        self.count += 1
        path = self.work / (named.group(1) if named else f".block-{self.count}.py")
        path.write_text(block.text)
        argv = [str(VENV_BIN / "python"), path.name]
        if "until SIGTERM" in block.text:
            code = _stop(self.background(argv, f"{block!r}"))
            assert code == 0, f"{block!r} exited {code} on SIGTERM"
            return ""
        r = subprocess.run(argv, cwd=self.work, env=self.env, capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert r.returncode == 0, f"{block!r} failed (exit {r.returncode}):\n{r.stderr[-4000:]}"
        return r.stdout


def _starts_a_node(command: str) -> bool:
    return bool(re.match(r"(?:make run\b|\S*chronolog dev\b)", command))


def _commands(text: str) -> Iterator[str]:
    """The block's commands: a line, with the lines a backslash or an open quote joins to it
    (blank lines and comment lines left out)."""
    pending = ""
    for line in text.splitlines():
        pending += line + "\n"
        if pending.rstrip().endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        if pending.strip() and not pending.lstrip().startswith("#"):
            yield pending.rstrip("\n")
        pending = ""
    assert not pending.strip(), f"an unfinished command: {pending!r}"


def _checked(command: str) -> str:
    """The command, made to check the exit status its comment states (``# exit N``)."""
    m = EXIT.search(command)
    if not m:
        return command
    bare = re.sub(r"\s+#[^'\"]*$", "", command)
    want = m.group(1)
    return (f"if {bare}; then echo 'exit 0, the doc says exit {want}' >&2; exit 90; "
            f"else rc=$?; [ $rc -eq {want} ] || {{ echo \"exit $rc, the doc says exit {want}\""
            f" >&2; exit 90; }}; fi")


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the process group of a command started here; its exit status."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return proc.returncode


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def module_dsn(database_url: str) -> Iterator[str]:
    yield from module_database(database_url, "test_doc_blocks")


@pytest.fixture(scope="module")
def reader(module_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    """The reader's directory, with the node README.md's ``make run`` starts."""
    work = tmp_path_factory.mktemp("reader") / "chronolog"
    work.mkdir()
    for name in LINKED:
        (work / name).symlink_to(ROOT / name)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", ARGS=f"--port {port}",
               CHRONOLOG_DATABASE_URL=module_dsn, API=f"http://127.0.0.1:{port}")
    env.pop("MAKEFLAGS", None)
    r = Reader(work, env, f"http://127.0.0.1:{port}")
    (two,) = [b for b in doc_blocks(ROOT, "README.md") if b.heading == "Two commands"]
    (line,) = [ln for ln in two.text.splitlines() if ln.startswith("make run")]
    node = r.background(["bash", "-c", line], line)
    # its own worker live first, so that a worker a block starts is the one seen coming
    wait_until_sync(r.live_workers, TIMEOUT, what="the node's own worker live", interval=0.2)
    yield r
    code = _stop(node)
    assert not (work / ".chronolog" / "node.json").exists(), (
        f"the node did not stop cleanly ({code}): {_tail(r.logs / 'background-1.log')}")


def _blocks(doc: str) -> list[Block]:
    return [b for b in all_doc_blocks(ROOT) if b.doc == doc and b.not_run is None]


def test_the_readmes_blocks_run(reader: Reader) -> None:
    blocks = _blocks("README.md")
    assert [b.heading for b in blocks] == ["Two commands", "Performance"]
    # "Two commands": make run is the node already serving; make test is declared not run.
    # "Performance" is the full-size benchmark: tests/unit/test_bench_docs.py checks it,
    # and it runs small here
    reader.run(blocks[0])
    # Celery (--compare) needs a broker of its own
    reader.run(_small(blocks[1], "bench/burst.py", {"--n": "200", "--runs": "1",
                                                    "--compare": None}))


def _small(block: Block, script: str, sizes: dict[str, str | None], nth: int = 0) -> Block:
    """The ``nth`` line of ``block`` running ``script`` on the SQLite log, with the sizes
    made small (``None``: the flag left out); every other flag as the doc gives it."""
    lines = [ln for ln in block.text.splitlines()
             if f" {script} " in ln and "--log kafka" not in ln]
    words = shlex.split(lines[nth], comments=True)
    assert words[:2] == [".venv/bin/python", script], words
    flags = dict(zip(words[2::2], words[3::2], strict=True))
    assert flags.get("--log", "sqlite") == "sqlite" and set(sizes) <= set(flags), (flags, sizes)
    flags.update(sizes)
    text = shlex.join(words[:2] + [w for k, v in flags.items() if v is not None for w in (k, v)])
    return Block(block.doc, block.heading, block.index, block.line, "sh", text + "\n", None)


def test_the_performance_guides_audit_and_failover_commands_run_small(reader: Reader) -> None:
    """docs/performance.md's SQLite commands of bench/audit.py, bench/failover.py and
    bench/scale.py, their sizes made small (the full sizes take hours;
    tests/unit/test_bench_docs.py checks every flag of every benchmark command against its
    script)."""
    blocks = {b.heading: b for b in all_doc_blocks(ROOT) if b.doc == "docs/performance.md"}
    reader.run(_small(blocks["The audit"], "bench/audit.py",
                      {"--schedules": "10", "--events": "1000", "--runs": "1"}))
    reader.run(_small(blocks["The burst"], "bench/failover.py",
                      {"--schedules": "100", "--events": "1000", "--runs": "1"}))
    # the wave comes 45 s after the build began; restored later, it is a catch-up (the
    # bench says so and still counts every run)
    reader.run(_small(blocks["The burst"], "bench/scale.py",
                      {"--schedules": "2000", "--wave": "200", "--quiet": "45",
                       "--after": "5", "--processors": "2", "--workers": "1"}))


@pytest.mark.long(30)
def test_the_tours_blocks_run_in_order(reader: Reader) -> None:
    blocks = _blocks("docs/tour.md")
    assert len(blocks) == 8
    out = [reader.run(b) for b in blocks]
    created, _ = json.JSONDecoder().raw_decode(out[0])  # curl's body, then the CLI's lines
    assert created["scheduleId"] == "report" and created["revision"] == 1, out[0]
    assert json.loads(out[2])["revision"] == 5, out[2]
    digest = httpx.get(f"{reader.api}/v1/schedules/digest", timeout=10,
                       headers={"Authorization": f"Bearer {TOKEN}"}).json()["definition"]
    assert "end" not in digest and digest["job"]["params"] == {"to": "ops"}, digest
    assert "waiting for a permit of concurrency key 'customer-acme' (limit 1)" in out[3], out[3]
    assert re.search(r"triggered run \S+ of sync-invoices: READY", out[3]), out[3]
    assert "backfilled nightly: 3 run(s) of 3 instant(s)" in out[4], out[4]
    assert "was made before: 3 run(s) of 3 instant(s)" in out[4], out[4]
    week = json.loads(out[4][out[4].index("{"):])
    assert (week["instants"], week["runs"]) == (7, 4), week
    assert [i.get("reason") for i in week["items"]][:3] == ["backfilled"] * 3, week
    assert "excluded" in out[5] and "maintenance" in out[5], out[5]
    assert '"revision":2' in out[5].replace(" ", ""), out[5]
    assert out[6].startswith("#  UTC"), out[6]


def test_the_jobs_blocks_run_and_the_runs_succeed(reader: Reader) -> None:
    blocks = _blocks("docs/jobs.md")
    assert [b.kind for b in blocks] == ["python", "python", "sh", "sh"]
    for block in blocks:
        reader.run(block)

    def run_of(schedule: str) -> Any:
        r = httpx.get(f"{reader.api}/v1/schedules/{schedule}/runs",
                      headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        r.raise_for_status()
        items = r.json()["items"]
        return items[0] if items and items[0]["state"] == "SUCCEEDED" else None

    for schedule in ("b-noop", "b-echo", "b-sleep", "b-fail"):
        assert wait_until_sync(lambda s=schedule: run_of(s), 60, what=f"{schedule} succeeded")


def test_the_apply_guides_blocks_run(reader: Reader) -> None:
    """docs/apply.md: its example files applied, applied again (nothing to do), one field
    changed, one file removed and pruned; the YAML the guide shows is its example's."""
    text = (ROOT / "docs" / "apply.md").read_text()
    shown = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert shown is not None
    assert shown.group(1) in (ROOT / "docs" / "examples" / "apply" / "billing.yaml").read_text()
    (block,) = _blocks("docs/apply.md")
    out = reader.run(block)
    assert "plan (set default): 4 to add, 0 to change, 0 to remove, 0 unchanged" in out, out
    assert "created schedule billing-nightly (revision 1)" in out, out
    assert "plan (set default): 0 to add, 0 to change, 0 to remove, 4 unchanged" in out, out
    assert "    retry.maxAttempts: 5 -> 7\n" in out, out
    assert "revised schedule billing-nightly (revision 2)" in out, out
    assert "deleted schedule billing-heartbeat" in out, out

    def definition(schedule: str) -> Any:
        r = httpx.get(f"{reader.api}/v1/schedules/{schedule}", timeout=10,
                      headers={"Authorization": f"Bearer {TOKEN}"})
        return r.json() if r.status_code == 200 else None

    nightly = definition("billing-nightly")
    assert nightly["revision"] == 2, nightly
    assert nightly["definition"]["labels"] == {"team": "billing",
                                               "chronolog.dev/applied-by": "default"}
    assert nightly["definition"]["exclude"] == ["billing-holidays"]
    assert definition("billing-heartbeat")["state"] == "DELETED"
    assert definition("billing-reminders")["revision"] == 1


@pytest.mark.kafka
async def test_the_kafka_producer_example_creates_a_schedule(processor: str,
                                                            kafka_bootstrap: str) -> None:
    """docs/deployment.md, "Commands from any Kafka producer": the example, run with the
    venv's Python against a real processor, with the variables it reads set."""
    (block,) = [b for b in all_doc_blocks(ROOT)
                if b.key == ("docs/deployment.md", "Commands from any Kafka producer", 0)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    env.update(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, CHRONOLOG_TOPIC_PREFIX=processor)
    await _wait_for_topic(kafka_bootstrap, f"{processor}commands")
    r = subprocess.run([str(VENV_BIN / "python"), "-c", block.text], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    reply = ast.literal_eval(r.stdout.strip())  # the example prints the reply as a dict
    assert reply["status"] == "ok" and reply["command_id"].startswith("cmd-"), reply


def test_the_idle_benchmark_runs_small(database_url: str) -> None:
    """docs/performance.md, "An idle deployment": its SQLite command without the services
    wrapper (the suite's are up), on a database of its own, its sizes made small; it reports
    every process's share of a core."""
    (block,) = [b for b in all_doc_blocks(ROOT)
                if b.key == ("docs/performance.md", "An idle deployment", 0)]
    (line,) = [ln for ln in block.text.splitlines() if "--log sqlite" in ln]
    words = shlex.split(line)
    command = words[words.index("--") + 1:]
    assert command[:2] == [".venv/bin/python", "bench/idle.py"], command
    flags = dict(zip(command[2::2], command[3::2], strict=True))
    # 5 s: long enough for each process's idle share (about 1 %) to be seen in CPU ticks
    flags.update({"--warm": "3", "--seconds": "5", "--runs": "1"})
    dsn = asyncio.run(create_database(database_url, "test_idle"))
    try:
        r = subprocess.run([str(VENV_BIN / "python"), "bench/idle.py",
                            *[w for kv in flags.items() for w in kv], "--database-url", dsn],
                           cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    finally:
        asyncio.run(drop_database(database_url, dsn))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    header, *rows = [ln.split() for ln in r.stdout.splitlines()[1:]]
    assert header == ["processor", "projector", "worker", "api", "total"], r.stdout
    shares = [float(v.rstrip("%")) for v in rows[-1][:5]]
    assert rows[-1][-1] == "median" and all(0 < s < 100 for s in shares[:4]), r.stdout
    assert abs(sum(shares[:4]) - shares[4]) < 0.5, r.stdout
