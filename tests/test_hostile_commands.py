"""The hostile battery (tests/hostile_commands.py), each row through the real loop.

A real harness (actors, a SQLite ledger under tmp_path), the real bash tool on a real
project directory, the scripted provider making the one bash call. There is no terminal,
so every ask is rejected. ``run_row`` runs one row and returns what happened, so that the
same table can be run under other settings (``**config`` goes to ``Config``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from hostile_commands import ROWS, Outcome, Row

from harness.config import Config
from harness.messages.model import Rule, ToolPart
from harness.permissions.ruleset import parse_rule_flag
from harness.providers.scripted import ScriptedProvider
from harness.runtime import open_harness

PRECIOUS = "precious, do not lose\n"
TURN_TIMEOUT = 20.0


@dataclass
class Ran:
    outcome: Outcome
    project: Path
    outside: Path
    decisions: list[dict[str, Any]]
    status: str  # the tool part's final status


def _rules(row: Row) -> list[Rule]:
    return [
        *(parse_rule_flag(text, "allow") for text in row.allow),
        *(parse_rule_flag(text, "deny") for text in row.deny),
    ]


def _place(text: str, outside: Path) -> str:
    return text.replace("{outside}", str(outside))


async def run_row(row: Row, root: Path, **config: Any) -> Ran:
    """Run ``row``'s command line as one bash call of a session on a fresh project."""
    project, outside = root / "project", root / "outside"
    project.mkdir()
    outside.mkdir()
    (project / "victim.txt").write_text(PRECIOUS)
    (outside / "keep.txt").write_text(PRECIOUS)
    command = _place(row.line, outside)
    provider = ScriptedProvider.from_turns(
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
            {"text": "done"},
        ]
    )
    cfg = Config(
        home=root / "home",
        model=f"scripted:{root / 'unused.json'}",
        provider_factory=lambda model: provider,
        interactive=False,
        agent=row.agent,
        rules=_rules(row),
        yes=row.yes,
        **config,
    )
    async with open_harness(cfg) as h:
        session = await h.create_session(project)
        with trio.fail_after(TURN_TIMEOUT):
            result = await h.run(session.id, "go")
        events = h.ledger.events_after(0, session_ids=[session.id], limit=100_000)
        decisions = [e.data for e in events if e.type == "permission.decided"]
        parts = [
            p for m in await h.messages(session.id) for p in m.parts if isinstance(p, ToolPart)
        ]
    refused = [d for d in decisions if not d["allowed"]]
    status = parts[0].state.status if parts else "none"
    outcome: Outcome
    if refused:
        outcome = "asks" if refused[0]["source"] == "no-terminal" else "denied"
    elif status != "completed" and result.reason == "denied":
        outcome = "denied"  # a blanket deny hid the tool: the call was refused unasked
    else:
        outcome = "runs"
    return Ran(outcome, project, outside, decisions, status)


def check_row(row: Row, ran: Ran) -> None:
    """What must hold after ``row`` ran: its outcome, and the files it must not touch."""
    assert ran.outcome == row.expect, ran.decisions
    survivor = ran.project / _place(row.survives, ran.outside)
    if row.expect == "runs":
        assert ran.status == "completed", ran.decisions
        assert row.made is None or (ran.project / row.made).exists(), "it did not run"
        return
    assert ran.status == "error"
    assert survivor.read_text() == PRECIOUS, f"{survivor} was changed"
    if row.absent is not None:
        assert not (ran.project / _place(row.absent, ran.outside)).exists()


# The gate must hold on its own: with the sandbox off, a row that slipped past the rules
# would really delete the file; with it on, the same rows show the two layers agree.
@pytest.mark.parametrize("sandbox", ["workspace-write", "off"])
@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
async def test_hostile_row(row: Row, sandbox: str, tmp_path: Path) -> None:
    check_row(row, await run_row(row, tmp_path, sandbox=sandbox))


def test_the_battery_has_what_the_issue_lists() -> None:
    lines = {row.line for row in ROWS}
    for spelling in ["/bin/rm", "\\rm", "'rm'", "r''m", "command rm", "env rm", "FOO=1 rm",
                     "rm\t", "xargs rm", "-delete", "-exec rm", "bash -c", "sh -c", "eval",
                     "$X", "exec rm", "nice", "timeout", "$'rm'", "rm${IFS}", "r\\\nm",
                     "$(echo rm)"]:  # fmt: skip
        assert any(spelling in line for line in lines), spelling
    assert len([r for r in ROWS if r.expect == "denied" and r.deny == ("bash:rm *",)]) >= 36
