"""The stdio transport: an MCP server as the leader of its own process group.

The SDK's ``stdio_client`` starts the server in a new session too, but does not say which
process group it is, and takes 4 s to stop a server that ignores its closed stdin. Harness
needs the group's identity before the first message (it goes to the ledger, so that a
harness restarted after ``kill -9`` can reap the server: harness/tools/process.py), and a
stop bounded the way every tool's processes are: stdin closed, a short wait, then SIGTERM
and SIGKILL of the whole group (``kill_process_group``). Messages are newline-delimited
JSON-RPC, as the spec says, read and written by two tasks between the pipes and the
SDK's memory streams.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import mcp.types as mt
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from harness.tools.process import GroupProcess, kill_process_group, process_identity

# How long a server gets to exit by itself once its stdin is closed (the spec's first
# step of shutdown) before its group is signalled.
EXIT_GRACE = 0.3
TERM_GRACE = 0.5  # SIGTERM → SIGKILL
MAX_LINE = 64 * 1024 * 1024  # one message; a server that never ends a line is cut off
STDERR_TAIL = 2000


@dataclass
class StdioServer:
    """A running server: its process group, how it ended, and the SDK's streams."""

    process: GroupProcess
    identity: dict[str, object] | None
    read: MemoryObjectReceiveStream[SessionMessage | Exception]
    write: MemoryObjectSendStream[SessionMessage]
    stderr_path: Path
    exited: trio.Event = field(default_factory=trio.Event)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr_tail(self) -> str:
        """The end of what the server wrote to stderr: why it failed, usually."""
        try:
            with self.stderr_path.open("rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - STDERR_TAIL))
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return text.strip()


def _spawn(
    argv: Sequence[str], cwd: Path, env: dict[str, str], stderr: Path
) -> tuple[GroupProcess, trio.lowlevel.FdStream]:
    # From the event loop's thread, as spawn_group explains (a worker thread's exit would
    # take a --die-with-parent child with it); stdin is a pipe here, which spawn_group's
    # commands must not have.
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    try:
        with stderr.open("wb") as err:
            popen = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=env,
                start_new_session=True,  # own process group: one killpg reaches its children
                stdin=stdin_read,
                stdout=stdout_write,
                stderr=err,
            )
    except BaseException:
        for fd in (stdin_write, stdout_read):
            os.close(fd)
        raise
    finally:
        os.close(stdin_read)
        os.close(stdout_write)
    return GroupProcess(popen, trio.lowlevel.FdStream(stdout_read)), trio.lowlevel.FdStream(
        stdin_write
    )


@asynccontextmanager
async def open_stdio(
    argv: Sequence[str], *, cwd: Path, env: dict[str, str], stderr: Path
) -> AsyncIterator[StdioServer]:
    """Start ``argv``; on exit (or a cancel), stop it and everything it started."""
    stderr.parent.mkdir(parents=True, exist_ok=True)
    process, stdin = _spawn(argv, cwd, env, stderr)
    read_send, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
    server = StdioServer(process, process_identity(process.pid), read, write, stderr)

    async def read_stdout() -> None:
        buffer = b""
        async with read_send:
            with contextlib.suppress(trio.ClosedResourceError, anyio.BrokenResourceError):
                while True:
                    chunk = await process.stdout.receive_some(1 << 16)
                    if not chunk:
                        return
                    buffer += chunk
                    if b"\n" not in buffer:
                        if len(buffer) > MAX_LINE:
                            await read_send.send(ValueError("a message longer than 64 MiB"))
                            return
                        continue
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            await read_send.send(_parse(line))

    async def write_stdin() -> None:
        async with write_receive:
            try:
                async for message in write_receive:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send_all(data.encode() + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await read_send.aclose()  # the server stopped reading: the session ends

    async def watch_exit() -> None:
        await process.wait()
        server.exited.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_stdout)
            nursery.start_soon(write_stdin)
            nursery.start_soon(watch_exit)
            try:
                yield server
            finally:
                with trio.CancelScope(shield=True):
                    await _stop(process, stdin, server.exited)
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await kill_process_group(process.pid, grace=0)  # a survivor of the above
            with trio.move_on_after(1.0):
                await process.wait()  # reap the leader
            for stream in (stdin, process.stdout):
                with contextlib.suppress(trio.ClosedResourceError, OSError):
                    await stream.aclose()


async def _stop(process: GroupProcess, stdin: trio.lowlevel.FdStream, exited: trio.Event) -> None:
    with contextlib.suppress(trio.ClosedResourceError, trio.BusyResourceError, OSError):
        await stdin.aclose()
    with trio.move_on_after(EXIT_GRACE):
        await exited.wait()
    # Also when the leader has exited: what it forked may still hold the group.
    await kill_process_group(process.pid, grace=TERM_GRACE)


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        message = mt.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as error:
        return error
    return SessionMessage(message)
