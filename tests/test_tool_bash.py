"""The bash tool against real subprocesses: output, limits, and that nothing outlives a call."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path
from typing import TYPE_CHECKING

import pydantic
import pytest
import trio
from procs import live_processes, proc_stat

from harness.tools.base import ToolContext
from harness.tools.bash import MAX_TIMEOUT_MS, BashParams, BashTool
from harness.tools.process import group_alive, kill_process_group
from harness.tools.truncate import MAX_BYTES, MAX_LINES, truncate_output

if TYPE_CHECKING:
    from conftest import ToolContextFactory


@pytest.fixture
def ctx(tmp_path: Path, tool_context: ToolContextFactory) -> ToolContext:
    return tool_context(tmp_path.resolve())


async def run(ctx: ToolContext, command: str, **kwargs: object) -> tuple[str, dict[str, object]]:
    result = await BashTool().execute(BashParams(command=command, **kwargs), ctx)
    return result.output, result.metadata


def saved(meta: dict[str, object]) -> bytes:
    return Path(str(meta["output_path"])).read_bytes()


def ignores_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (15 - 1)))
    return False


async def wait_for_marker(marker: str, count: int) -> int:
    """Wait until ``count`` processes carry ``marker``; return their (single) pgid."""
    while True:
        found = live_processes(marker)
        if len(found) >= count:
            pgids = set(found.values())
            assert len(pgids) == 1, found
            return pgids.pop()
        await trio.sleep(0.01)


# --- output -------------------------------------------------------------------------------


async def test_echo(ctx: ToolContext) -> None:
    output, meta = await run(ctx, "echo hello")
    assert output == "hello"
    assert meta == {"exit": 0, "truncated": False, "output_path": None, "timed_out": False}


async def test_no_output(ctx: ToolContext) -> None:
    output, meta = await run(ctx, "true")
    assert output == "(no output)"
    assert meta["exit"] == 0


async def test_nonzero_exit_is_a_result(ctx: ToolContext) -> None:
    output, meta = await run(ctx, "echo oops; exit 3")
    assert output == "oops\n\n[exit code 3]"
    assert meta["exit"] == 3
    assert meta["timed_out"] is False


async def test_killed_by_signal(ctx: ToolContext) -> None:
    output, meta = await run(ctx, "kill -KILL $$")
    assert output == "(no output)\n\n[killed by SIGKILL]"
    assert meta["exit"] == -9


async def test_stderr_is_merged_in_order(ctx: ToolContext) -> None:
    output, _ = await run(ctx, "echo out; echo err >&2; echo out2")
    assert output == "out\nerr\nout2"


async def test_cwd_is_session_directory(ctx: ToolContext) -> None:
    output, _ = await run(ctx, "pwd")
    assert output == str(ctx.directory)


async def test_stdin_is_empty(ctx: ToolContext) -> None:
    # A command waiting for input would hang the call; it must see EOF at once.
    with trio.fail_after(5):
        output, meta = await run(ctx, "cat; read -r line || echo eof")
    assert output == "eof"
    assert meta["exit"] == 0


async def test_invalid_utf8_is_replaced(ctx: ToolContext) -> None:
    output, _ = await run(ctx, r"printf 'a\377b'")
    assert output == "a\ufffdb"


async def test_missing_directory_is_a_tool_failure(tmp_path: Path) -> None:
    from harness.tools.base import ToolFailure

    gone = ToolContext("ses_x", "msg_x", "cal_x", tmp_path / "missing", tmp_path / "out")
    with pytest.raises(ToolFailure, match="could not start bash"):
        await BashTool().execute(BashParams(command="true"), gone)


# --- size limits --------------------------------------------------------------------------


async def test_huge_output_spills_to_file_with_flat_memory(ctx: ToolContext) -> None:
    size = 5_000_000
    tracemalloc.start()
    try:
        output, meta = await run(ctx, f"yes | head -c {size}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The whole stream is 5 MB; what is held at once is a couple of tails and read chunks.
    assert peak < 1_000_000, peak
    assert meta["truncated"] is True
    path = Path(str(meta["output_path"]))
    assert path == ctx.output_dir / "cal_x.log"
    assert saved(meta) == b"y\n" * (size // 2)
    assert str(path) in output
    assert len(output.encode()) <= MAX_BYTES
    assert output.count("\n") <= MAX_LINES
    assert output.endswith("y\ny")  # the tail is what is shown
    # Within the executor's generic limits, so its head-keeping cut leaves the tail alone.
    assert truncate_output(output, output_dir=ctx.output_dir, call_id="again") == (output, {})


async def test_medium_output_keeps_the_tail_and_saves_the_rest(ctx: ToolContext) -> None:
    # Below the in-memory cap but over the preview's line limit: saved when the command ends.
    output, meta = await run(ctx, f"seq 1 {MAX_LINES + 500}; exit 1")
    assert meta["truncated"] is True
    assert saved(meta).decode().splitlines() == [str(i) for i in range(1, MAX_LINES + 501)]
    assert output.startswith("...output truncated")
    assert output.endswith(f"{MAX_LINES + 500}\n\n[exit code 1]")
    assert "\n1\n" not in output  # the head was dropped, not the tail
    assert output.count("\n") <= MAX_LINES


async def test_output_at_the_limit_is_not_saved(ctx: ToolContext) -> None:
    output, meta = await run(ctx, "seq 1 100")
    assert meta["truncated"] is False
    assert meta["output_path"] is None
    assert not (ctx.output_dir / "cal_x.log").exists()
    assert output.splitlines()[-1] == "100"


# --- timeout and process lifetime ---------------------------------------------------------


async def test_timeout_kills_and_reports(ctx: ToolContext) -> None:
    start = trio.current_time()
    output, meta = await run(ctx, "echo started; sleep 300.201 & sleep 300.201; wait", timeout=300)
    assert trio.current_time() - start < 3
    assert meta["timed_out"] is True
    assert output.startswith("started\n\n[Command timed out after 300 ms")
    assert live_processes("300.201") == {}


async def test_background_job_does_not_hold_the_call(ctx: ToolContext) -> None:
    # The backgrounded sleep keeps the pipe open; the call ends with its command anyway.
    with trio.fail_after(5):
        output, meta = await run(ctx, "sleep 300.301 & echo started")
    assert output == "started"
    assert meta["exit"] == 0
    assert live_processes("300.301") == {}


async def test_cancel_kills_the_whole_tree(ctx: ToolContext) -> None:
    marker = "300.123"
    pgid: int | None = None

    async def watch() -> None:
        nonlocal pgid
        # bash -c, the backgrounded sleep, the foreground sleep
        pgid = await wait_for_marker(marker, 3)

    with trio.move_on_after(0.3) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await run(ctx, f"sleep {marker} & sleep {marker}; wait")
    kill_time = trio.current_time() - scope.deadline
    assert scope.cancelled_caught
    assert pgid is not None, "the command never started"
    assert not group_alive(pgid)
    assert live_processes(marker) == {}
    assert kill_time < 1.0, kill_time


async def test_cancel_kills_a_grandchild_that_ignores_sigterm(ctx: ToolContext) -> None:
    marker = "300.456"
    pgid: int | None = None

    async def watch() -> None:
        nonlocal pgid
        # bash -c and the sleep (bash execs the subshell's last command in place)
        pgid = await wait_for_marker(marker, 2)
        assert any(ignores_sigterm(pid) for pid in live_processes(marker))

    command = f"(trap '' TERM; sleep {marker}) & wait"
    with trio.move_on_after(0.3) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await run(ctx, command)
    kill_time = trio.current_time() - scope.deadline
    assert pgid is not None, "the command never started"
    assert not group_alive(pgid)
    assert live_processes(marker) == {}
    assert kill_time < 1.0, kill_time


async def test_kill_process_group_escalates_to_sigkill() -> None:
    marker = "300.789"
    proc = await trio.lowlevel.open_process(
        ["bash", "-c", f"trap '' TERM; sleep {marker} & trap '' TERM; wait"],
        start_new_session=True,
    )
    try:
        await wait_for_marker(marker, 2)
        assert group_alive(proc.pid)
        start = trio.current_time()
        await kill_process_group(proc.pid, grace=0.05)
        assert trio.current_time() - start < 1.0
        assert not group_alive(proc.pid)
    finally:
        await kill_process_group(proc.pid)
        await proc.wait()
    assert proc.returncode == -9


async def test_group_alive_ignores_zombies() -> None:
    proc = await trio.lowlevel.open_process(["true"], start_new_session=True)
    # Not reaped yet: the leader is a zombie, which killpg(pgid, 0) would still count.
    # Wait for the exit without reaping (WNOWAIT), so the leader stays a zombie.
    await trio.to_thread.run_sync(os.waitid, os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    assert proc_stat(str(proc.pid)) == ("Z", proc.pid)
    os.killpg(proc.pid, 0)
    assert not group_alive(proc.pid)
    await proc.wait()


# --- parameters, title, permissions -------------------------------------------------------


@pytest.mark.parametrize("timeout", [0, -5, MAX_TIMEOUT_MS + 1])
def test_bad_timeout_is_rejected_with_the_unit(timeout: int) -> None:
    with pytest.raises(pydantic.ValidationError, match="milliseconds"):
        BashParams(command="true", timeout=timeout)


def test_params_reject_blank_command_and_unknown_fields() -> None:
    with pytest.raises(pydantic.ValidationError, match="must not be empty"):
        BashParams(command="  ")
    with pytest.raises(pydantic.ValidationError):
        BashParams.model_validate({"command": "true", "workdir": "/"})


def test_params_reject_a_nul_character() -> None:
    # A hostile model's NUL used to reach the spawn and fail as "ValueError: embedded null
    # byte"; it is now a validation error naming the problem.
    with pytest.raises(pydantic.ValidationError, match="must not contain a NUL"):
        BashParams(command="echo a\x00b")


def test_schema_names_the_parameters() -> None:
    schema = BashParams.model_json_schema()
    assert set(schema["properties"]) == {"command", "timeout", "description"}
    assert schema["required"] == ["command"]


def test_title() -> None:
    tool = BashTool()
    assert tool.title(BashParams(command="make", description="Build the project")) == (
        "Build the project"
    )
    long = "echo " + "x" * 100
    assert tool.title(BashParams(command=long)) == long[:60]
    assert tool.title(BashParams(command="ls\n  -la")) == "ls -la"
    assert tool.read_only is False


def test_permissions_one_need_per_subcommand(ctx: ToolContext) -> None:
    needs = BashTool().permissions(BashParams(command="ls -la && git status"), ctx)
    assert [n.permission for n in needs] == ["bash", "bash"]
    assert [n.pattern for n in needs] == ["ls -la", "git status"]
