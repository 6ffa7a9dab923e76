"""Running the real ``harness`` command in a test: an environment of its own, and the run.

Shared by the tests that drive the CLI with configuration files, so each does not carry
its own copy of what "isolated" means (no HARNESS_* variable, no key, no daemon, its own
XDG config folder).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def isolated_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without anything harness would read from the user's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env.pop("MISTRAL_API_KEY", None)
    env["HARNESS_HOME"] = str(tmp_path / "home")
    env["HARNESS_SOCKET"] = str(tmp_path / "no-daemon.sock")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    env.update(extra)
    return env


def run_harness(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m harness ARGS`` with no terminal on stdin, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
