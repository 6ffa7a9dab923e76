"""Waiting for a real ``harness serve`` subprocess to answer: one helper, not six copies."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from harness.client import Client


def wait_for_daemon(
    process: subprocess.Popen[bytes], socket: Path, log: Path, timeout: float = 15.0
) -> Client:
    """A client of the daemon on ``socket`` once it answers; fails with its log if it died."""
    client = Client(socket)
    deadline = time.monotonic() + timeout
    while not client.alive():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the daemon never answered"
        time.sleep(0.02)
    return client
