"""A small ACP client for tests: drives a real ``harness acp`` subprocess over its pipes.

It reads the agent's stdout in a task of its own: responses wake the request that waits
for them, ``session/update`` notifications are kept in order, and the agent's requests
(``session/request_permission``) are answered by ``choose``, a function of the request's
params that returns an option id (or None: the outcome ``cancelled``). Every line the
agent writes must be a JSON-RPC message: anything else on stdout fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

Choose = Callable[[dict[str, Any]], str | None]
NO_ANSWER = "<no answer>"  # what ``choose`` returns to leave a request unanswered


def agent_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HARNESS_HOME"] = str(home)
    env["HARNESS_SOCKET"] = str(home / "none.sock")  # no daemon of the developer's
    env["HARNESS_SANDBOX"] = "off"  # the gate is under test here, not bubblewrap
    return env


class AcpProcess:
    def __init__(self, process: trio.Process, choose: Choose) -> None:
        self.process = process
        self.choose = choose
        self.updates: list[dict[str, Any]] = []  # session/update params, in order
        self.permission_requests: list[dict[str, Any]] = []
        self.responses: dict[Any, dict[str, Any]] = {}
        self.unsolicited: list[dict[str, Any]] = []  # error responses with id null
        self._arrived = trio.Condition()
        self._next_id = 1000
        self.closed = False
        self.reading = trio.Event()  # cleared: stop reading stdout (a slow editor)
        self.reading.set()

    async def send_raw(self, data: bytes) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(data)

    async def send(self, message: dict[str, Any]) -> None:
        await self.send_raw(json.dumps(message).encode() + b"\n")

    async def request(
        self, method: str, params: Any = None, *, seconds: float = 30
    ) -> dict[str, Any]:
        """Send a request; its whole response (``result`` or ``error``)."""
        self._next_id += 1
        request_id = self._next_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return await self.response(request_id, seconds=seconds)

    async def response(self, request_id: Any, *, seconds: float = 30) -> dict[str, Any]:
        with trio.fail_after(seconds):
            async with self._arrived:
                while request_id not in self.responses:
                    assert not self.closed, "the agent closed stdout before answering"
                    await self._arrived.wait()
                return self.responses.pop(request_id)

    async def wait_for(self, test: Callable[[], bool], *, seconds: float = 30) -> None:
        with trio.fail_after(seconds):
            async with self._arrived:
                while not test():
                    assert not self.closed, "the agent closed stdout"
                    await self._arrived.wait()

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        while True:
            await self.reading.wait()
            try:
                chunk = await self.process.stdout.receive_some(65536)
            except trio.ClosedResourceError:  # the test closed our end of the agent's stdout
                break
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                await self._handle(json.loads(line))  # not JSON: the test fails here
        async with self._arrived:
            self.closed = True
            self._arrived.notify_all()

    async def _handle(self, message: dict[str, Any]) -> None:
        assert message.get("jsonrpc") == "2.0", message
        if message.get("method") == "session/update":
            self.updates.append(message["params"])
        elif message.get("method") == "session/request_permission":
            self.permission_requests.append(message["params"])
            option = self.choose(message["params"])
            if option == NO_ANSWER:
                async with self._arrived:
                    self._arrived.notify_all()
                return
            outcome = (
                {"outcome": "cancelled"}
                if option is None
                else {"outcome": "selected", "optionId": option}
            )
            await self.send({"jsonrpc": "2.0", "id": message["id"], "result": {"outcome": outcome}})
        elif "id" in message and message["id"] is None:
            self.unsolicited.append(message)
        elif "id" in message:
            self.responses[message["id"]] = message
        async with self._arrived:
            self._arrived.notify_all()

    def kinds(self) -> list[str]:
        return [update["update"]["sessionUpdate"] for update in self.updates]

    def text(self, kind: str = "agent_message_chunk") -> str:
        return "".join(
            u["update"]["content"]["text"]
            for u in self.updates
            if u["update"]["sessionUpdate"] == kind
        )


def allow_once(params: dict[str, Any]) -> str | None:
    return "allow_once"


@asynccontextmanager
async def acp_agent(
    home: Path,
    *args: str,
    cwd: Path | None = None,
    choose: Choose = allow_once,
    stderr: Path | None = None,
    exit_code: int = 0,
) -> AsyncIterator[AcpProcess]:
    """``harness acp ARGS`` under ``home``; on leaving, stdin is closed and the agent must
    exit by itself, with ``exit_code``."""
    err_path = stderr or home.parent / "acp-stderr.txt"
    home.mkdir(parents=True, exist_ok=True)
    err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "harness", "acp", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=agent_env(home),
            cwd=str(cwd or home.parent),
        )
    finally:
        os.close(err)
    agent = AcpProcess(process, choose)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.read)
            yield agent
            assert process.stdin is not None
            await process.stdin.aclose()
            with trio.fail_after(20):
                code = await process.wait()
            assert code == exit_code, err_path.read_text()[-3000:]
            nursery.cancel_scope.cancel()  # a reader told to stop reading waits no more
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()


def harness_cli(home: Path, argv: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *argv],
        capture_output=True,
        text=True,
        env=agent_env(home),
        cwd=str(cwd),
        timeout=60,
    )
