"""The ``bash`` tool: run a shell command in the session directory (DESIGN §3, §7).

The command runs in its own session and process group with stdin from /dev/null, and the
whole group is killed on every way out of ``execute`` (success, error, timeout, cancel).
Output is read as it arrives: only a bounded tail stays in memory, and once the output is
large the full stream goes to a file the result names, so a command that prints gigabytes
costs neither memory nor context.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import BinaryIO

import trio
from pydantic import Field, field_validator

from harness.private import open_private, private_dir
from harness.tools.base import (
    PermissionNeed,
    Tool,
    ToolContext,
    ToolFailure,
    ToolOutput,
    ToolParams,
)
from harness.tools.paths import path_needs, resolve_path
from harness.tools.process import kill_process_group, spawn_group, wait_gone
from harness.tools.sandbox import Sandbox, StatusPipe
from harness.tools.truncate import MAX_BYTES, MAX_LINES

DEFAULT_TIMEOUT_MS = 120_000
MAX_TIMEOUT_MS = 600_000

# Memory held per running command: the tail is trimmed back to MAX_BYTES whenever it grows
# past twice that, so trimming is amortised rather than done on every chunk.
MEMORY_CAP = 2 * MAX_BYTES
READ_CHUNK = 64 * 1024
# The preview leaves room for the notes around it so the whole result stays under the
# executor's generic limits; otherwise its head-keeping truncation would cut the tail off
# again and drop the part of a build log that matters.
PREVIEW_BYTES = MAX_BYTES - 1024
PREVIEW_LINES = MAX_LINES - 10
# Once the group is dead, the pipe reaches EOF as soon as the kernel hands over what is
# buffered. Only a process that escaped the group (``setsid cmd &``) can hold it open; do not
# wait on such a process for long.
DRAIN_SECONDS = 0.5
# Reaping a SIGKILLed leader is immediate unless it is stuck in the kernel; do not hang the
# caller's cleanup on that.
REAP_SECONDS = 5.0
# A sandbox's PID namespace is emptied by the kernel within a millisecond of its init
# exiting; past this, something is wrong and the kill takes over.
NAMESPACE_SECONDS = 0.2
TITLE_CHARS = 60

DESCRIPTION = f"""\
Run a bash command in the session's working directory and return its combined stdout and \
stderr.

- Each call is a fresh `bash -c`: `cd`, variables and background jobs do not carry over to \
the next call. stdin is empty, so interactive prompts fail instead of waiting; pass flags \
such as `--yes` or `-y`.
- When the command exits, anything it left running in the background is killed.
- `timeout` is in milliseconds (default {DEFAULT_TIMEOUT_MS}, max {MAX_TIMEOUT_MS}). On \
timeout the command and everything it started are killed and you get the output so far.
- Long output keeps its last part; the full output is saved to a file the result names, \
which you can search with grep or page through with read.
- A non-zero exit code is reported at the end of the output.
- The command may run in a sandbox: files outside the working directory (and its `.git`) \
read-only, a private /tmp that does not carry over to the next call, no network. When the \
sandbox stopped a command, the result says so; do not try to work around it.
- Prefer the read, glob, grep, edit and write tools over cat, find, grep, sed and echo \
redirects.
- `description`: say what the command does in 5–10 words, e.g. "Run the unit tests"."""


class BashParams(ToolParams):
    command: str = Field(description="The command to run with `bash -c`.")
    timeout: int | None = Field(
        default=None,
        description=(
            f"Timeout in milliseconds (default {DEFAULT_TIMEOUT_MS}, max {MAX_TIMEOUT_MS})."
        ),
    )
    description: str | None = Field(
        default=None,
        description="What the command does in 5–10 words, e.g. 'Install project dependencies'.",
    )

    @field_validator("command")
    @classmethod
    def _command_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("command must not be empty")
        if "\x00" in value:
            # No program's argument can hold one (execve ends a string there); said here, as
            # an error the model reads, rather than as the spawn's ValueError.
            raise ValueError("command must not contain a NUL character")
        return value

    @field_validator("timeout")
    @classmethod
    def _timeout_in_range(cls, value: int | None) -> int | None:
        # A model that thinks in seconds sends 30 or 3600; say the unit in the error.
        if value is not None and not 1 <= value <= MAX_TIMEOUT_MS:
            raise ValueError(
                f"timeout is in milliseconds and must be between 1 and {MAX_TIMEOUT_MS} "
                f"(10 minutes), got {value}"
            )
        return value


def _open_spill(path: Path) -> BinaryIO:
    private_dir(path.parent)
    return open_private(path, "wb")  # type: ignore[return-value]


class _OutputBuffer:
    """The tail of the output in memory; the whole stream in ``path`` once it is large."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.total = 0
        self.tail = bytearray()
        self.saved = False  # the file holds the complete output
        self.save_error: str | None = None
        self._file: BinaryIO | None = None

    async def feed(self, chunk: bytes | bytearray) -> None:
        self.total += len(chunk)
        self.tail += chunk
        if self._file is not None:
            await trio.to_thread.run_sync(self._file.write, chunk)
        elif self.total > MEMORY_CAP and self.save_error is None:
            # Nothing has been trimmed yet, so the tail is still the whole stream.
            await self._start_file()
        if len(self.tail) > MEMORY_CAP:
            del self.tail[: len(self.tail) - MAX_BYTES]

    async def _start_file(self) -> None:
        try:
            self._file = await trio.to_thread.run_sync(_open_spill, self.path)
            await trio.to_thread.run_sync(self._file.write, self.tail)
        except OSError as error:
            # A full disk must not fail the command: the model still gets the tail.
            self.save_error = error.strerror or str(error)
            await self.close()

    def needs_cut(self) -> bool:
        return len(self.tail) > PREVIEW_BYTES or self.tail.count(b"\n") > PREVIEW_LINES

    async def finish(self) -> None:
        """Save the output to the file if the preview will not show all of it."""
        if self._file is None and self.save_error is None and self.needs_cut():
            await self._start_file()
        if self._file is not None:
            await self.close()
            self.saved = self.save_error is None

    async def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            await trio.to_thread.run_sync(file.close)


def _tail_preview(data: bytes) -> bytes:
    """The last PREVIEW_BYTES / PREVIEW_LINES of ``data``, starting on a clean boundary."""
    if len(data) > PREVIEW_BYTES:
        data = data[-PREVIEW_BYTES:]
        newline = data.find(b"\n")
        if 0 <= newline < 4096 and newline < len(data) - 1:
            data = data[newline + 1 :]  # drop the partial first line
        else:
            # One huge line: at least do not start in the middle of a UTF-8 sequence.
            data = data.lstrip(bytes(range(0x80, 0xC0)))
    if data.count(b"\n") > PREVIEW_LINES:
        cut = len(data)
        for _ in range(PREVIEW_LINES + (1 if data.endswith(b"\n") else 0)):
            cut = data.rfind(b"\n", 0, cut)
        data = data[cut + 1 :]
    return data


def _exit_note(code: int, *, sandboxed: bool = False) -> str:
    if sandboxed and 128 < code < 128 + 65:
        # bwrap reports a command killed by signal N as exit code 128 + N, as a shell does.
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            return f"[exit code {code}]"
        return f"[exit code {code}, which usually means killed by {name}]"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"[killed by {name}]"
    return f"[exit code {code}]"


async def _pump(stream: trio.abc.ReceiveStream, output: _OutputBuffer, done: trio.Event) -> None:
    try:
        while chunk := await stream.receive_some(READ_CHUNK):
            await output.feed(chunk)
    finally:
        done.set()


def _write_needs(command: str, ctx: ToolContext) -> list[PermissionNeed]:
    """A redirection target or ``tee`` file is a write: the needs the write tool would have
    for it (``edit``, and ``external_directory`` outside the session directory)."""
    from harness.permissions.shell import Word, analyze  # on the first bash call: see below

    analysis = analyze(command)
    needs: list[PermissionNeed] = []
    targets = list(analysis.writes)
    if analysis.unparseable or any(c.opaque for c in analysis.commands):
        # A line not understood (`1<> f` is not in the grammar) or a command that could be
        # anything (`$X ../f` with X=tee) may write anywhere: a target nobody knows.
        targets.append(Word(None, command, "*"))
    for target in targets:
        raw = target.value
        # The path is judged now, as it resolves now. After a `cd`, `ln` or `mv` in the
        # same line it may resolve elsewhere when opened; and a parent directory that does
        # not exist yet is made by the line itself, maybe as a symlink.
        path = resolve_path(raw, ctx) if raw is not None else None
        if path is not None and not analysis.paths_may_move and path.parent.is_dir():
            needs += path_needs("edit", path, ctx)
            continue
        # Nobody knows where `> $F` writes: it could be outside, and it could be anything.
        where, metadata = target.source, {"path": target.source, "unknown": True}
        needs += [
            PermissionNeed("external_directory", where, where, metadata, opaque=True),
            PermissionNeed("edit", where, where, metadata, opaque=True),
        ]
    unique = {(n.permission, n.pattern, n.opaque): n for n in reversed(needs)}
    return list(reversed(unique.values()))


class BashTool(Tool[BashParams]):
    name = "bash"
    description = DESCRIPTION
    params = BashParams

    def permissions(self, args: BashParams, ctx: ToolContext) -> list[PermissionNeed]:
        # The checker (its tables and patterns) loads with the first bash call, not with
        # the tool registry: a session that never runs a command never pays for it.
        from harness.permissions.bash import bash_needs

        return [*bash_needs(args.command), *_write_needs(args.command, ctx)]

    def title(self, args: BashParams) -> str:
        if args.description and args.description.strip():
            return args.description.strip()
        return " ".join(args.command.split())[:TITLE_CHARS]

    async def execute(self, args: BashParams, ctx: ToolContext) -> ToolOutput:
        timeout_ms = args.timeout if args.timeout is not None else DEFAULT_TIMEOUT_MS
        # Not trio.run_process: its deliver_cancel only runs while the leader is alive, so
        # a cancel that lands after the leader exited leaves the group alone, and it only
        # signals, so a grandchild that ignores SIGTERM survives. We own the kill instead
        # (and the start: see spawn_group).
        sandbox = ctx.sandbox or Sandbox()
        # Asked of the rules alone, never of a person: "ask" (the default) means no network.
        network = sandbox.mode == "off" or ctx.allows("bash_network", args.command)
        status = StatusPipe() if sandbox.mode != "off" else None
        launch = sandbox.command(
            ["bash", "-c", args.command], ctx.directory, network=network, status=status
        )
        try:
            proc = spawn_group(
                launch.argv, cwd=ctx.directory, env=launch.env, pass_fds=launch.pass_fds
            )
        except OSError as error:
            if status is not None:
                status.close()
            raise ToolFailure(
                f"could not start bash in {ctx.directory}: {error.strerror or error}"
            ) from error
        if status is not None:
            status.close_write_end()
        stdout = proc.stdout
        pgid = proc.pid  # start_new_session makes the leader's pid the group id
        output = _OutputBuffer(ctx.output_dir / f"{ctx.call_id}.log")
        timed_out = False
        try:
            if ctx.report_process is not None:
                await ctx.report_process(pgid)
            async with trio.open_nursery() as nursery:
                drained = trio.Event()
                nursery.start_soon(_pump, stdout, output, drained)
                with trio.move_on_after(timeout_ms / 1000) as deadline:
                    await proc.wait()
                timed_out = deadline.cancelled_caught
                init = status.init_pid() if status is not None and not timed_out else None
                if init is not None:
                    # The namespace is being emptied: wait for that rather than signal it.
                    with trio.move_on_after(NAMESPACE_SECONDS):
                        await wait_gone(init)
                # Background jobs hold the pipe open; the call ends with its command, so
                # they go now, and then the pipe reaches EOF with everything they wrote.
                await kill_process_group(pgid)
                with trio.move_on_after(DRAIN_SECONDS):
                    await drained.wait()
                nursery.cancel_scope.cancel()
            await output.finish()
        finally:
            # Shielded so a cancelled or failed call still kills the group and reaps the
            # leader; after a normal exit this is a cheap no-op (the group is already gone).
            with trio.CancelScope(shield=True):
                await kill_process_group(pgid)
                with trio.move_on_after(REAP_SECONDS):
                    await proc.wait()
                await stdout.aclose()
                await output.close()
                if status is not None:
                    status.close()
        # The tail is what the model sees, and where the errno text of a failure is.
        why = None if timed_out else sandbox.explain(
            bytes(output.tail[-8192:]).decode("utf-8", "replace"), ctx.directory, network=network
        )
        result = self._result(args, output, proc.returncode, timeout_ms, timed_out, sandbox, why)
        if sandbox.mode != "off":
            result.metadata.update(sandbox=sandbox.mode, network=network)
        return result

    def _result(
        self,
        args: BashParams,
        output: _OutputBuffer,
        code: int | None,
        timeout_ms: int,
        timed_out: bool,
        sandbox: Sandbox,
        why: str | None,
    ) -> ToolOutput:
        truncated = output.needs_cut()
        body = (_tail_preview(bytes(output.tail)) if truncated else bytes(output.tail)).decode(
            "utf-8", errors="replace"
        )
        text = body.rstrip("\n") or "(no output)"
        if truncated:
            shown = len(body.encode("utf-8"))
            if output.saved:
                where = (
                    f"Full output saved to: {output.path}\n"
                    "Use grep to search it or read with offset/limit to see parts of it."
                )
            else:
                where = f"The full output could not be saved: {output.save_error}"
            text = (
                f"...output truncated: showing the last {shown} of {output.total} bytes...\n"
                f"{where}\n\n{text}"
            )
        notes: list[str] = []
        if timed_out:
            notes.append(
                f"[Command timed out after {timeout_ms} ms; it and every process it started "
                "were killed]"
            )
        elif code is None:
            notes.append("[the command could not be reaped; its exit code is unknown]")
        elif code != 0:
            notes.append(_exit_note(code, sandboxed=sandbox.mode != "off"))
        if why is not None:
            notes.append(why)
        if notes:
            text += "\n\n" + "\n".join(notes)
        return ToolOutput(
            output=text,
            title=self.title(args),
            metadata={
                "exit": code,
                "truncated": truncated,
                "output_path": str(output.path) if output.saved else None,
                "timed_out": timed_out,
            },
        )
