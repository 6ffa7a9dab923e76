"""``harness trace``: a session tree from the ledger, as data and as a drawing.

Everything comes from the ledger: sessions (``parent_id``), messages and parts (steps,
tool calls, subtask markers) and the event log (how each turn ended, every permission
decision). Nothing is inferred from logs or memory.
"""

from __future__ import annotations

from typing import Any

from harness.messages.model import (
    AssistantMessage,
    Session,
    SubtaskPart,
    TextPart,
    ToolCompleted,
    ToolError,
    ToolPart,
    ToolRunning,
)
from harness.storage.port import LedgerPort
from harness.terminal_text import printable


def build_trace(ledger: LedgerPort, session_id: str) -> dict[str, Any]:
    """The tree under ``session_id`` as plain data (what ``trace --json`` prints)."""
    session = ledger.session(session_id)
    if session is None:
        raise LookupError(f"no session {session_id}")
    return _session_node(ledger, session)


def _session_node(ledger: LedgerPort, session: Session) -> dict[str, Any]:
    events = ledger.events_after(0, session_ids=[session.id], limit=1_000_000)
    decisions: dict[str, list[dict[str, Any]]] = {}
    reason = None
    for event in events:
        if event.type == "permission.decided":
            decisions.setdefault(event.data["call_id"], []).append(event.data)
        elif event.type == "turn.finished":
            reason = event.data["reason"]
    children = {c.id: c for c in ledger.children(session.id)}
    transcript = ledger.messages(session.id)
    steps: list[dict[str, Any]] = []
    start = transcript[0].info.created if transcript else session.created
    end = start
    for entry in transcript:
        info = entry.info
        if not isinstance(info, AssistantMessage):
            continue
        end = max(end, info.completed or info.created)
        spawned: dict[str | None, list[dict[str, Any]]] = {}
        for part in entry.parts:
            if isinstance(part, SubtaskPart) and part.child_session_id in children:
                node = _session_node(ledger, children[part.child_session_id])
                spawned.setdefault(part.call_id, []).append(node)
        tools = []
        for part in entry.parts:
            if isinstance(part, ToolPart):
                tool = _tool_node(part, decisions.get(part.call_id, []))
                tool["children"] = spawned.pop(part.call_id, [])
                tools.append(tool)
                end = max(end, tool["end"] or end)
        subtasks = [node for nodes in spawned.values() for node in nodes]
        text = "".join(p.text for p in entry.parts if isinstance(p, TextPart))
        steps.append(
            {
                "step": info.step,
                "message_id": info.id,
                "duration": (info.completed or info.created) - info.created,
                "tokens": info.tokens.total,
                "cost": info.cost,
                "finish": info.finish,
                "error": info.error,
                "text": text,
                "tools": tools,
                "children": subtasks,
            }
        )
    below = [child for step in steps for tool in step["tools"] for child in tool["children"]]
    below += [child for step in steps for child in step["children"]]
    return {
        "session_id": session.id,
        # The whole tree's spending: this session's plus every descendant's.
        "tree_tokens": session.tokens.total + sum(c["tree_tokens"] for c in below),
        "tree_cost": session.cost + sum(c["tree_cost"] for c in below),
        "parent_id": session.parent_id,
        "title": session.title,
        "agent": session.agent,
        "status": session.status,
        "reason": reason,
        "duration": end - start,
        "tokens": session.tokens.total,
        "cost": session.cost,
        "steps": steps,
    }


def _tool_node(part: ToolPart, decisions: list[dict[str, Any]]) -> dict[str, Any]:
    state = part.state
    start = getattr(state, "start", None)
    end = getattr(state, "end", None)
    title = state.title if isinstance(state, ToolRunning | ToolCompleted) else ""
    return {
        "call_id": part.call_id,
        "tool": part.tool,
        "title": title or part.tool,
        "status": state.status,
        "error": state.error if isinstance(state, ToolError) else None,
        "start": start,
        "end": end,
        "duration": (end - start) if start is not None and end is not None else None,
        "permissions": [
            {
                "permission": d["permission"],
                "allowed": d["allowed"],
                "source": d["source"],
                "reply": d.get("reply"),
                # The configuration file the deciding rule was written in (DESIGN §11).
                **({"file": d["rule"]["source"]} if (d.get("rule") or {}).get("source") else {}),
            }
            for d in decisions
        ],
    }


def _tokens(count: int) -> str:
    return f"{count / 1000:.1f}k tok" if count >= 1000 else f"{count} tok"


def render_trace(node: dict[str, Any]) -> str:
    """The tree drawn for a terminal."""
    lines: list[str] = []
    _render_session(node, "", "", lines, child=False)
    return "\n".join(lines)


def _render_session(
    node: dict[str, Any], first: str, indent: str, lines: list[str], *, child: bool
) -> None:
    # A title (a child's is the model's task description) and a tool's title and error are
    # the model's words: shown, never obeyed (harness/terminal_text.py).
    title = printable(str(node["title"]), one_line=True)
    label = f"{node['session_id']} (child)" if child else f'{node["session_id"]}  "{title}"'
    width = max(8, 52 - len(first))
    tree = ""
    if not child and node["tree_tokens"] != node["tokens"]:
        tree = f"  (tree: {_tokens(node['tree_tokens'])}, ${node['tree_cost']:.3f})"
    lines.append(
        f"{first}{label:<{width}} {node['duration']:>7.2f} s  {_tokens(node['tokens']):>10}  "
        f"${node['cost']:.3f}  {node['reason'] or node['status']}{tree}"
    )
    rows = [row for step in node["steps"] for row in _step_rows(step)]
    for index, (text, children) in enumerate(rows):
        last = index == len(rows) - 1
        branch, stem = ("└─ ", "   ") if last else ("├─ ", "│  ")
        lines.append(f"{indent}{branch}{text}")
        for number, sub in enumerate(children):
            sub_last = number == len(children) - 1
            _render_session(
                sub,
                indent + stem + ("└─ " if sub_last else "├─ "),
                indent + stem + ("   " if sub_last else "│  "),
                lines,
                child=True,
            )


def _step_rows(step: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    head = f"step {step['step']}"
    if not step["tools"]:
        error = printable(str(step["error"]), one_line=True)
        what = "answer" if step["text"] else (f"error: {error}" if step["error"] else "—")
        return [(f"{head:<8} {what}", step["children"])]
    rows = []
    for tool in step["tools"]:
        asked = [p for p in tool["permissions"] if p["source"] == "reply"]
        note = f"   (asked: {asked[-1]['reply']})" if asked else ""
        if tool["status"] == "error":
            first = (str(tool["error"]).splitlines() or [""])[0]
            note += f"   ✗ {printable(first[:60], one_line=True)}"
        duration = f"{tool['duration']:.2f} s" if tool["duration"] is not None else ""
        title = printable(str(tool["title"])[:34], one_line=True)
        rows.append((f"{head:<8} {title:<34} {duration:>8}{note}", tool["children"]))
    rows[-1] = (rows[-1][0], rows[-1][1] + step["children"])
    return rows
