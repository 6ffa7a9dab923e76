"""Process-group helpers: make sure nothing a tool started outlives the call (DESIGN §3).

Every subprocess a tool starts runs in its own session, so its process group holds the
command and everything it forks. Killing the group (not just the leader) is what stops a
``sleep 300 &`` grandchild or a dev server a script left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

import trio

# How often liveness is re-read while waiting for a signalled group to die. Short, because a
# cooperative group is usually gone within a few ms of SIGTERM and the caller is waiting.
POLL_INTERVAL = 0.005
FIRST_POLL_INTERVAL = 0.0005
# After SIGKILL the kernel still has to tear the processes down (longer under load or for a
# process in uninterruptible sleep); wait this long for that before giving up.
KILL_WAIT = 1.0


class GroupProcess:
    """A command started by ``spawn_group``: its pid (= its process group), its output."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout: trio.lowlevel.FdStream) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdout = stdout  # stdout and stderr, merged in order

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        """Wait for the leader to exit and reap it; cancellable."""
        while self._popen.poll() is None:
            try:
                pidfd = os.pidfd_open(self.pid)
            except OSError:  # no pidfd here (an old kernel): poll instead
                await trio.sleep(POLL_INTERVAL)
                continue
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        return self._popen.returncode


def spawn_group(
    argv: Sequence[str], *, cwd: Path, env: dict[str, str], pass_fds: Sequence[int] = ()
) -> GroupProcess:
    """Start ``argv`` as the leader of a new session and process group, stdin empty.

    Started from the calling thread itself, not a worker thread as ``trio.run_process``
    does: a sandboxed command dies with its parent *thread* (bwrap's ``--die-with-parent``
    is ``PR_SET_PDEATHSIG``), and Trio's idle worker threads exit after 10 s, which killed
    every command running longer than that. The event loop's thread lives as long as the
    harness. The fork and exec block the loop for about a millisecond.
    """
    read_end, write_end = os.pipe()
    try:
        popen = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            start_new_session=True,  # own process group: one killpg reaches every child
            stdin=subprocess.DEVNULL,  # a prompt fails at once instead of hanging
            stdout=write_end,
            stderr=write_end,
            pass_fds=tuple(pass_fds),
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return GroupProcess(popen, trio.lowlevel.FdStream(read_end))


async def wait_gone(pid: int) -> None:
    """Wait for process ``pid`` (not necessarily our child) to exit; cancellable."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # gone already (or no pidfd here: the caller's kill polls instead)
        return
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is still in process group ``pgid``.

    Read from /proc because ``os.killpg(pgid, 0)`` also succeeds for a group whose members
    are all zombies (an unreaped leader, say), which would make a dead group look alive.
    """
    wanted = str(pgid).encode()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return False
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # exited between listdir and open, or not ours to read
            continue
        # The command name (field 2) is in parentheses and may itself contain spaces or
        # parentheses, so the fixed fields are read after the *last* closing parenthesis.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 3:
            continue
        state, pgrp = fields[0], fields[2]
        if pgrp == wanted and state not in (b"Z", b"X"):
            return True
    return False


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to the group; False when there is no group left to signal."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # A member changed credentials (setuid binary): we cannot signal it, and retrying
        # will not help. Report the group as unsignallable rather than crash the caller.
        return False
    return True


async def _wait_dead(pgid: int) -> None:
    # Polling is the only option: the kernel offers no notification for "every member of a
    # process group has exited" (a pidfd covers one process, not a group). The first polls
    # come quickly: a group already on its way out (a sandbox's PID namespace being torn
    # down after its command exited) is gone within a millisecond.
    interval = FIRST_POLL_INTERVAL
    while group_alive(pgid):
        await trio.sleep(interval)
        interval = min(interval * 2, POLL_INTERVAL)


async def kill_process_group(pgid: int, *, grace: float = 0.2) -> None:
    """SIGTERM group ``pgid``, give it ``grace`` seconds, then SIGKILL what is left.

    Safe to await from a ``finally`` while the caller is being cancelled: the whole body is
    shielded, so the kill always completes (bounded by ``grace`` + ``KILL_WAIT``).
    """
    with trio.CancelScope(shield=True):
        if not group_alive(pgid):
            return
        if not _signal_group(pgid, signal.SIGTERM):
            return
        # A stopped member (SIGTSTP, a debugger) would hold SIGTERM pending until resumed.
        _signal_group(pgid, signal.SIGCONT)
        with trio.move_on_after(grace):
            await _wait_dead(pgid)
            return
        if not _signal_group(pgid, signal.SIGKILL):
            return
        with trio.move_on_after(KILL_WAIT):
            await _wait_dead(pgid)


def _stat_fields(pid: int | str) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def process_identity(pid: int) -> dict[str, object] | None:
    """What tells this process group apart from a later one that reuses its number.

    The leader's start time (clock ticks since boot) and the boot id: a group found after
    a restart is ours only if the machine has not rebooted and its members started no
    earlier than our leader did.
    """
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return {"pgid": pid, "started": int(fields[19]), "boot": _boot_id()}


def same_machine(identity: dict[str, object]) -> bool:
    """Whether an identity was taken on this machine since its last boot."""
    return identity.get("boot") == _boot_id()


def process_alive(identity: dict[str, object]) -> bool:
    """Whether the process an identity names (``process_identity``) is still running.

    The number alone could have been reused; the start time tells the original apart.
    Only meaningful for an identity of this machine (``same_machine``).
    """
    pid, started = identity.get("pgid"), identity.get("started")
    if not isinstance(pid, int) or not isinstance(started, int) or not same_machine(identity):
        return False
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return False
    return int(fields[19]) == started


def kill_orphans(identity: dict[str, object]) -> int:
    """SIGKILL what is left of a group a crashed harness started; returns how many.

    Nobody waits on these processes any more (their harness died), so there is no grace
    period to give. Members are checked one by one against the recorded identity, so a
    group number that was reused by someone else's processes is left alone.
    """
    pgid, started, boot = identity.get("pgid"), identity.get("started"), identity.get("boot")
    if not isinstance(pgid, int) or not isinstance(started, int) or boot != _boot_id():
        return 0
    killed = 0
    wanted = str(pgid).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is None or len(fields) < 20 or fields[2] != wanted:
            continue
        if fields[0] in (b"Z", b"X") or int(fields[19]) < started:
            continue
        try:
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            continue
    return killed
