"""The system Chromium for the browser tests (Debian's ``chromium``), driven by Playwright.

``scripts/with_services.py`` (``make test``) installs it when it is missing
(``apt-get install -y chromium chromium-driver``); ``chromium_path()`` finds it, and fails
the test with the reason when it is not there — a browser test never skips.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

__all__ = ["CHROMIUM", "chromium_path"]

CHROMIUM = Path("/usr/bin/chromium")


def chromium_path() -> str:
    """The Chromium executable (the test fails, naming why, without one)."""
    if CHROMIUM.exists():
        return str(CHROMIUM)
    found = shutil.which("chromium")
    if found:
        return found
    pytest.fail("no Chromium for the browser tests: /usr/bin/chromium is missing. `make "
                "test` installs it (scripts/with_services.py: apt-get install -y chromium "
                "chromium-driver, as root); its output says why that failed")
