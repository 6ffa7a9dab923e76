"""The chat's slash commands (DESIGN §13): ``/help /new /sessions /resume ID /model M
/agent A /diff /undo /compact /cost /quit``.

Each command is one coroutine taking the chat and its argument. Those that change the
session (a new one, another model, files put back, a compaction) wait for the turn in
flight to end: the daemon refuses them while the session is busy anyway.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from harness.commands.base import EXIT_OK
from harness.commands.chat.backend import Backend, BackendError
from harness.commands.chat.render import Renderer, clean

T = TypeVar("T")


class ChatLike(Protocol):
    """What the commands use of ``conversation.Chat``."""

    backend: Backend
    renderer: Renderer
    session: dict[str, Any]
    undo_floor: str | None

    @property
    def session_id(self) -> str: ...
    @property
    def busy(self) -> bool: ...
    def say(self, text: str) -> None: ...
    def markdown(self, text: str) -> None: ...
    async def call(self, fn: Callable[..., T], *args: Any) -> T: ...
    async def switch(self, session: dict[str, Any]) -> None: ...
    async def send(self, text: str, *, compact: bool = False) -> None: ...
    async def quit(self, code: int | None = None) -> None: ...
    def width(self) -> int: ...


Command = Callable[[ChatLike, str], Awaitable[None]]


async def run(chat: ChatLike, line: str) -> None:
    name, _, argument = line.partition(" ")
    found = COMMANDS.get(name.lower())
    if found is None:
        chat.say(f"unknown command {name}: /help lists them")
        return
    command, needs_idle, _ = found
    if needs_idle and chat.busy:
        chat.say(f"{name}: a turn is running; wait for it, or Ctrl-C to cancel it")
        return
    try:
        await command(chat, argument.strip())
    except BackendError as error:
        chat.say(f"harness: {error}")


async def _help(chat: ChatLike, argument: str) -> None:
    lines = [f"  {usage:<14} {text}" for usage, (_, _, text) in _usages()]
    lines.append("  Ctrl-C cancels a turn; twice quits. Ctrl-D quits.")
    chat.say("\n".join(["commands:", *lines]))


def _usages() -> list[tuple[str, tuple[Command, bool, str]]]:
    arguments = {"/resume": " ID", "/model": " M", "/agent": " A"}
    return [(name + arguments.get(name, ""), spec) for name, spec in COMMANDS.items()]


async def _new(chat: ChatLike, argument: str) -> None:
    old = chat.session
    session = await chat.call(
        chat.backend.create_session, str(old["directory"]), str(old["model"]), str(old["agent"])
    )
    await chat.switch(session)
    chat.say(f"new session {session['id']}")


async def _sessions(chat: ChatLike, argument: str) -> None:
    sessions = [s for s in await chat.call(chat.backend.sessions) if not s.get("parent_id")]
    sessions.sort(key=lambda s: float(s.get("updated") or 0), reverse=True)
    if not sessions:
        chat.say("no sessions")
        return
    lines = []
    for s in sessions[:20]:
        mark = "*" if s["id"] == chat.session_id else " "
        title = clean(str(s.get("title") or "")[:50])
        where = clean(str(s.get("directory")))
        lines.append(f"{mark} {s['id']}  {s.get('status', ''):5}  {title}  ({where})")
    if len(sessions) > 20:
        lines.append(f"  … and {len(sessions) - 20} more (harness sessions)")
    chat.say("\n".join(lines))


async def _resume(chat: ChatLike, argument: str) -> None:
    if not argument:
        chat.say("usage: /resume ses_… (/sessions lists them)")
        return
    session = await chat.call(chat.backend.session, argument)
    await chat.switch(session)
    messages = await chat.call(chat.backend.messages, session["id"])
    title = clean(str(session.get("title") or "(untitled)"))
    chat.say(f"resumed {session['id']}: {title}, {len(messages)} messages")
    last = _last_answer(messages)
    if last:
        chat.markdown(clean(last))


def _last_answer(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        info = message["info"]
        if info.get("role") == "assistant" and info.get("mode") != "compaction":
            text = "".join(
                p.get("text", "") for p in message["parts"]
                if p.get("type") == "text" and not p.get("synthetic")
            )
            if text.strip():
                return text
    return ""


async def _model(chat: ChatLike, argument: str) -> None:
    if not argument:
        chat.say(f"model: {chat.session.get('model')} (/model M changes it)")
        return
    chat.session = await chat.call(_update(chat.backend, model=argument), chat.session_id)
    chat.say(f"model: {chat.session.get('model')}, from the next turn")


async def _agent(chat: ChatLike, argument: str) -> None:
    if not argument:
        chat.say(f"agent: {chat.session.get('agent')} (/agent A changes it)")
        return
    chat.session = await chat.call(_update(chat.backend, agent=argument), chat.session_id)
    chat.say(f"agent: {chat.session.get('agent')}, from the next turn")


def _update(backend: Backend, **fields: str) -> Callable[[str], dict[str, Any]]:
    return lambda session_id: backend.update_session(session_id, **fields)


async def _diff(chat: ChatLike, argument: str) -> None:
    answer = await chat.call(chat.backend.diff, chat.session_id)
    text = clean(str(answer.get("diff") or ""))
    chat.say(chat.renderer.diff(text, chat.width()) if text else "no file changes")


async def _undo(chat: ChatLike, argument: str) -> None:
    """Put the files back as before the last turn (before the one undone last, when
    repeated): ``revert`` to that turn's user message."""
    messages = await chat.call(chat.backend.messages, chat.session_id)
    prompts = [
        m["info"]["id"] for m in messages
        if m["info"].get("role") == "user" and not m["info"].get("synthetic")
        and not m["info"].get("compact")
    ]
    if chat.undo_floor in prompts:
        prompts = prompts[: prompts.index(chat.undo_floor)]
    if not prompts:
        chat.say("nothing to undo")
        return
    target = prompts[-1]
    result = await chat.call(chat.backend.revert, chat.session_id, target)
    chat.undo_floor = target
    changed = [f for f in result.get("files") or [] if f.get("action") != "unchanged"]
    if not changed:
        chat.say("the last turn changed no files")
        return
    lines = [f"undone: {len(changed)} file(s) as before that turn"]
    lines += [f"  {f['action']:9} {clean(str(f['shown']))}" for f in changed]
    chat.say("\n".join(lines))


async def _compact(chat: ChatLike, argument: str) -> None:
    chat.say(chat.renderer.dim("compacting…"))
    await chat.send("", compact=True)


async def _cost(chat: ChatLike, argument: str) -> None:
    session = await chat.call(chat.backend.session, chat.session_id)
    chat.session = session
    tokens = session.get("tokens") or {}
    parts = ", ".join(f"{k.replace('_', ' ')} {int(v):,}" for k, v in tokens.items() if v)
    total = sum(int(v) for v in tokens.values())
    chat.say(f"{total:,} tokens ({parts or 'none yet'}) · ${float(session.get('cost') or 0):.4f}"
             f" · {session.get('model')}")


async def _quit(chat: ChatLike, argument: str) -> None:
    await chat.quit(EXIT_OK)


# name -> (command, whether it waits for an idle session, help)
COMMANDS: dict[str, tuple[Command, bool, str]] = {
    "/help": (_help, False, "this list"),
    "/new": (_new, True, "start a new session here"),
    "/sessions": (_sessions, False, "list the sessions"),
    "/resume": (_resume, True, "continue a session"),
    "/model": (_model, True, "use another model from the next turn"),
    "/agent": (_agent, True, "use another agent (build, plan, …) from the next turn"),
    "/diff": (_diff, False, "what this session changed in the files"),
    "/undo": (_undo, True, "put back the files the last turn changed"),
    "/compact": (_compact, True, "summarize the history to free the context"),
    "/cost": (_cost, False, "tokens and cost of this session"),
    "/quit": (_quit, False, "leave (also Ctrl-D)"),
}
