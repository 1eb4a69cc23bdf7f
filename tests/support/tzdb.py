"""A modified time-zone database compiled with ``zic``: New York keeps daylight-saving time
until the end of 2026, then stays on EST (-05:00) for good — the kind of change a tzdata
release makes when a country drops DST. Point ``PYTHONTZPATH`` at the directory and a
process's ``zoneinfo`` reads it instead of the system's zones."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

VERSION = "2099z"
SOURCE = """\
Rule US 2007 max - Mar Sun>=8 2:00 1:00 D
Rule US 2007 max - Nov Sun>=1 2:00 0 S
Zone America/New_York -5:00 US E%sT 2027 Jan 1
                      -5:00 - EST
Zone Etc/UTC 0 - UTC
Link Etc/UTC UTC
"""


def compile_no_dst_new_york(root: Path) -> Path:
    """Compile the zones into ``root/zoneinfo`` (with a ``+VERSION`` file naming VERSION)."""
    zic = shutil.which("zic") or "/usr/sbin/zic"
    src = root / "no-dst.zi"
    src.write_text(SOURCE)
    out = root / "zoneinfo"
    subprocess.run([zic, "-d", str(out), str(src)], check=True, capture_output=True)
    (out / "+VERSION").write_text(VERSION + "\n")
    return out
