"""How a tool does blocking file work: in a worker thread, never on the event loop.

Every session's actors share one Trio thread, so a tool that reads or writes files on it
stalls all of them for as long as the disk takes (a large file, a slow or network disk,
a tree of 100,000 files). grep, glob, write, edit and apply_patch therefore all run their
file work in a worker thread, through one of the two functions here; they differ only in
what a cancel does, because a search may be dropped half way and a change may not.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")


async def run_scan(fn: Callable[[threading.Event], T]) -> T:
    """Run a blocking scan (grep, glob) that stops early if the call is cancelled.

    A cancel abandons the thread at once: a scan changes nothing, so its unfinished
    answer can simply be dropped.
    """
    stop = threading.Event()
    try:
        return await trio.to_thread.run_sync(fn, stop, abandon_on_cancel=True)
    finally:
        # On cancellation the abandoned thread sees this and stops at the next file.
        stop.set()


async def run_file_change(fn: Callable[[], T]) -> T:
    """Run a tool's file changes (write, edit, apply_patch) to the end, even on a cancel.

    Never abandoned: a cancel waits until ``fn`` returns. The tool executor reads every
    touched file again once the call ends, also after a cancel, to record what it
    became; an abandoned write still running then would be recorded half done, and
    apply_patch's all-or-nothing swap could be cut between two files.
    """
    return await trio.to_thread.run_sync(fn)
