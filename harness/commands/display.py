"""How a turn looks on the terminal, embedded or through the daemon: steps on stderr,
the answer on stdout; and how the user answers asks and questions there."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from harness import printable
from harness.commands.base import EXIT_BY_REASON, EXIT_ERROR, UsageError

if TYPE_CHECKING:
    from harness import Event
    from harness.client import WireEvent


class Display:
    """How a run looks, embedded or through the daemon: steps on stderr, answer on stdout.

    Every string an event carries came from the model, a tool, a file or an MCP server:
    it is printed through ``printable`` (never raw) except in ``--json`` mode.
    """

    def __init__(self, session_id: str, *, json_mode: bool) -> None:
        self.session_id = session_id
        self.json = json_mode
        self._err: TextIO = sys.stderr
        self._sandbox_noticed = False

    def show(self, event: Event | WireEvent) -> None:
        if event.type == "sandbox.unavailable" and not self._sandbox_noticed:
            # On stderr even with --json: the one line that says commands ran unsandboxed.
            self._sandbox_noticed = True
            notice = printable(str(event.data.get("notice")))
            print(f"harness: {notice}", file=self._err, flush=True)
        if self.json:
            print(event.to_json(), flush=True)
            return
        data = event.data
        if event.type == "part.updated" and data.get("type") == "tool":
            state = data["state"]
            tool = printable(str(data["tool"]), one_line=True)
            if state["status"] == "running":
                title = printable(str(state.get("title") or ""), one_line=True) or tool
                print(f"→ {title}", file=self._err, flush=True)
            elif state["status"] == "completed":
                print(f"✓ {tool} ({tool_summary(state)})", file=self._err, flush=True)
            elif state["status"] == "error":
                first = str(state.get("error", "")).splitlines()[0:1]
                line = printable(first[0], one_line=True) if first else "error"
                print(f"✗ {tool}: {line}", file=self._err, flush=True)
        elif event.type == "step.request":
            shown = printable(json.dumps(data, indent=2, ensure_ascii=False))
            print(shown, file=self._err, flush=True)
        elif event.type == "todo.updated":
            print(todo_lines(data.get("todos") or [], indent="  "), file=self._err, flush=True)
        elif event.type in ("mcp.failed", "mcp.exited", "mcp.warning"):
            if data.get("reason") != "the harness stopped":
                print(_mcp_line(event.type, data), file=self._err, flush=True)
        elif event.type == "session.retry":
            wait = max(0.0, float(data.get("next", 0)) - time.time())
            what = (
                "waiting for the provider, next request"  # a shared hold, or the pace
                if data.get("shared")
                else f"provider error, retry {data.get('attempt')}"
            )
            error = printable(str(data.get("error")), one_line=True)
            print(f"… {what} in {wait:.0f}s: {error}", file=self._err, flush=True)

    def finish(self, event: Event | WireEvent) -> int:
        reason = event.data["reason"]
        answer = printable(str(event.data.get("answer") or ""))
        error = event.data.get("error")
        if error is not None:
            error = printable(str(error))
        if not self.json:
            if answer:
                print(answer, flush=True)
            if reason == "error":
                print(f"harness: error: {error}", file=self._err)
            elif reason != "answered":
                detail = f": {error}" if error else ""
                print(f"harness: stopped ({reason}){detail}", file=self._err)
        return EXIT_BY_REASON.get(reason, EXIT_ERROR)

    def question(self, event: Event | WireEvent) -> str:
        data = event.data
        child = event.session_id != self.session_id
        # The command line above all: a ``\r``, a cursor move or a bidi override in it could
        # make ``rm -rf ~`` read ``ls`` in the very line the user answers.
        permission = printable(str(data["permission"]), one_line=True)
        pattern = printable(str(data["pattern"]), one_line=True)
        always = printable(str(data["always"]), one_line=True)
        return (
            f"\n? {permission} wants '{pattern}'"
            f"{' (session ' + printable(event.session_id, one_line=True) + ')' if child else ''}"
            f"\n  [o]nce  [a]lways ({always})  [r]eject  — or type feedback to reject: "
        )


def _mcp_line(kind: str, data: dict[str, Any]) -> str:
    """An MCP server's trouble, one line: the turn goes on without it (docs/mcp.md)."""
    server = printable(str(data.get("server", "?")), one_line=True)
    reason = printable(str(data.get("reason")), one_line=True)
    if kind == "mcp.warning":
        tool = f" tool '{printable(str(data['tool']), one_line=True)}'" if data.get("tool") else ""
        return f"! MCP server {server}:{tool} {reason}"
    what = "failed to start" if kind == "mcp.failed" else "stopped"
    return f"! MCP server {server} {what}: {reason}"


def parse_answer(line: str) -> tuple[str, str | None]:
    """A typed answer to a permission ask: the reply, and feedback when it is free text."""
    answer = line.strip()
    if answer.lower() in ("o", "once", "y", "yes"):
        return "once", None
    if answer.lower() in ("a", "always"):
        return "always", None
    if answer.lower() in ("", "r", "reject", "n", "no"):
        return "reject", None
    return "reject", answer


def ask_at_terminal(data: dict[str, Any], child: str | None) -> list[list[str]] | None:
    """Ask each question of a ``question.asked`` event; None when the user dismisses them."""
    texts: list[str] = []
    for index in range(len(data["questions"])):
        print(question_prompt(data, index, child), end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline().strip()
        if not line:
            return None
        texts.append(line)
    return shape_answers(data["questions"], texts)


def todo_lines(todos: list[dict[str, Any]], indent: str = "") -> str:
    """A task list as ``show`` and ``run`` print it: ``[x] write tests (high)``."""
    marks = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]", "cancelled": "[-]"}
    done = sum(t.get("status") == "completed" for t in todos)
    lines = [f"todos: {done}/{len(todos)} completed"]
    for todo in todos:
        mark = marks.get(todo.get("status", ""), "[?]")
        content = printable(str(todo.get("content")), one_line=True)
        priority = printable(str(todo.get("priority", "medium")), one_line=True)
        lines.append(f"{indent}{mark} {content} ({priority})")
    return "\n".join(lines)


def tool_summary(state: dict[str, Any]) -> str:
    metadata = state.get("metadata") or {}
    if "todos" in metadata or "answers" in metadata:
        # "3 todos", "asked 2 questions"
        return printable(str(state.get("title") or "done"), one_line=True)
    if "lines" in metadata:
        return printable(f"{metadata['lines']} lines", one_line=True)
    if "exit" in metadata:
        return printable(f"exit {metadata['exit']}", one_line=True)
    output = state.get("output") or ""
    count = output.count("\n") + 1 if output else 0
    return f"{count} lines"


def shape_answers(questions: list[dict[str, Any]], texts: Sequence[str]) -> list[list[str]]:
    """Typed answers, one per question, as the labels the API takes.

    A number picks that option; a label is matched without regard to case; a question
    that allows several answers takes them separated by commas; anything else is the
    user's own answer, kept as typed.
    """
    if len(texts) != len(questions):
        raise UsageError(
            f"{len(questions)} question(s) asked and {len(texts)} answer(s) given: "
            "give one ANSWER per question, in order (quote an answer that has spaces)"
        )
    shaped: list[list[str]] = []
    for info, text in zip(questions, texts, strict=True):
        labels = [str(o["label"]) for o in info.get("options") or []]
        pieces = text.split(",") if info.get("multiple") else [text]
        chosen: list[str] = []
        for piece in (p.strip() for p in pieces):
            if not piece:
                continue
            if piece.isdigit() and 1 <= int(piece) <= len(labels):
                piece = labels[int(piece) - 1]
            else:
                piece = next((label for label in labels if label.lower() == piece.lower()), piece)
            chosen.append(piece)
        shaped.append(chosen)
    return shaped


def question_prompt(data: dict[str, Any], index: int, child: str | None) -> str:
    """One question of a ``question.asked`` event, as the terminal shows it."""
    info = data["questions"][index]
    count = len(data["questions"])
    head = f"[{printable(str(info['header']), one_line=True)}] " if info.get("header") else ""
    where = f" (session {child})" if child else ""
    number = f" ({index + 1}/{count})" if count > 1 else ""
    lines = [f"\n? {head}{printable(str(info['question']))}{number}{where}"]
    for n, option in enumerate(info.get("options") or [], 1):
        description = printable(str(option.get("description")), one_line=True)
        detail = f" — {description}" if option.get("description") else ""
        lines.append(f"  {n}. {printable(str(option['label']), one_line=True)}{detail}")
    several = "numbers or labels, comma-separated" if info.get("multiple") else "a number or label"
    lines.append(f"  answer with {several}, or your own words (empty line dismisses): ")
    return "\n".join(lines)
