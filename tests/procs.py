"""What is running, read from /proc: how tests prove that no process was left behind."""

from __future__ import annotations

import os
from pathlib import Path


def proc_stat(pid: int | str) -> tuple[str, int] | None:
    """(state, process group) of a process, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: read after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[2])


def live_processes(marker: str) -> dict[int, int]:
    """pid -> process group of every live (not zombie) process whose command line holds
    ``marker``, this test process excluded."""
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        stat = proc_stat(entry)
        if marker.encode() in cmdline and stat is not None and stat[0] not in ("Z", "X"):
            found[int(entry)] = stat[1]
    return found


def alive_with(marker: str) -> list[int]:
    """Pids of the live processes whose command line holds ``marker``."""
    return list(live_processes(marker))
