"""CPU time of other processes, from /proc: what the PostgreSQL benchmarks charge per step.

A module of its own, importing nothing of harness, so that a benchmark measuring another
tree (``pg_turns.py --base``) can use it without loading this tree's harness.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + sys of one process; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def postgres_cpu() -> float:
    """user + sys of every ``postgres`` process on the machine (every cluster counts)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            name = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
        if name.startswith("postgres"):
            total += cpu_seconds(int(entry))
    return total
