"""A hostile model, file, tool output or MCP server cannot drive the terminal: every
human-readable output shows the characters a terminal obeys as text (``^[``, ``^M``,
``<U+202E>``), and ``--json`` keeps them exact. Through the real CLI where it can be."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest

from harness import printable, printable_data

HARNESS = [sys.executable, "-m", "harness"]

# name, what a model (or a file, a tool, a server) sends, what the terminal must show.
PAYLOADS: list[tuple[str, str, str]] = [
    ("CSI clear", "\x1b[2J\x1b[H", "^[[2J^[[H"),
    ("OSC 0 title", "\x1b]0;pwned\x07", "^[]0;pwned^G"),
    ("OSC 52 clipboard", "\x1b]52;c;cm0gLXJmIH4K\x07", "^[]52;c;cm0gLXJmIH4K^G"),
    (
        "OSC 8 hyperlink",
        "\x1b]8;;https://evil.example/\x1b\\docs\x1b]8;;\x1b\\",
        "^[]8;;https://evil.example/^[\\docs^[]8;;^[\\",
    ),
    ("carriage return overwrite", "rm -rf ~\rls -la  ", "rm -rf ~^Mls -la  "),
    ("backspaces", "rm -rf ~" + "\b" * 8 + "ls", "rm -rf ~" + "^H" * 8 + "ls"),
    ("bidi override", "ls \u202e~ fr- mr\u202c", "ls <U+202E>~ fr- mr<U+202C>"),
    (
        "bidi embeddings and isolates",
        "\u202aa\u202bb\u202dc\u2066d\u2067e\u2068f\u2069",
        "<U+202A>a<U+202B>b<U+202D>c<U+2066>d<U+2067>e<U+2068>f<U+2069>",
    ),
    ("C1 controls", "\x9b2J\x9d0;t\x9c\x85\x80\x9f", "\ufffd2J\ufffd0;t" + "\ufffd" * 4),
    ("DCS", "\x1bP1$qm\x1b\\", "^[P1$qm^[\\"),
    ("DEL and NUL", "a\x7fb\x00c", "a^?b^@c"),
]
# A lone ESC ending one streamed delta, its sequence starting the next.
SPLIT_DELTAS = ("done\x1b", "[2J!")

# What a terminal obeys; multi-line output may keep only its newlines (tabs are shown
# too here: no payload carries one, so any tab in the output is a leak).
_OBEYED = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _assert_inert(output: str) -> None:
    leaked = sorted({f"U+{ord(c):04X}" for c in _OBEYED.findall(output)})
    assert not leaked, f"{leaked} reached the terminal in:\n{output!r}"


def _assert_all_shown(output: str) -> None:
    _assert_inert(output)
    for name, _, shown in PAYLOADS:
        assert shown in output, f"{name}: {shown!r} not shown in:\n{output!r}"


# --- the helper ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "payload", "shown"), PAYLOADS, ids=[p[0] for p in PAYLOADS])
def test_each_payload_is_shown_as_text(name: str, payload: str, shown: str) -> None:
    assert printable(payload) == shown
    assert printable(payload, one_line=True) == shown
    _assert_inert(printable(payload))


def test_newlines_and_tabs_stay_in_text_and_are_shown_in_one_line_fields() -> None:
    assert printable("a\n\tb\r\n") == "a\n\tb^M\n"
    assert printable("a\n\tb", one_line=True) == "a^J^Ib"
    plain = "Ünïcode prose, RTL עברית and emoji 🙂 stay as they are.\n"
    assert printable(plain) is plain  # the common case: no copy


@pytest.mark.parametrize("payload", [p[1] for p in PAYLOADS] + ["".join(SPLIT_DELTAS)])
def test_a_payload_split_across_deltas_shows_as_it_does_whole(payload: str) -> None:
    """Each delta is cleaned on its own as it streams: no split can make a sequence."""
    whole = printable(payload)
    for cut in range(len(payload) + 1):
        assert printable(payload[:cut]) + printable(payload[cut:]) == whole
    first, second = SPLIT_DELTAS
    assert printable(first) + printable(second) == "done^[[2J!"


def test_every_string_in_a_payload_is_cleaned_keys_too() -> None:
    data = {"title\x1b[8m": ["\x1b]0;t\x07", {"n": 3, "x": None}], "ok": True}
    assert printable_data(data) == {"title^[[8m": ["^[]0;t^G", {"n": 3, "x": None}], "ok": True}


def test_the_chat_uses_the_same_helper() -> None:
    from harness.commands.chat import render

    assert render.clean is printable and render.clean_data is printable_data


# --- prompts and lines, as the follower prints them ---------------------------------------


def _wire(kind: str, data: dict[str, Any], session_id: str = "ses_root") -> Any:
    from harness.client import WireEvent

    body = {"type": kind, "session_id": session_id, "data": data, "seq": 1, "ts": 0.0}
    return WireEvent.parse(json.dumps(body))


def test_the_ask_prompt_shows_the_command_line_as_sent() -> None:
    from harness.commands.display import Display

    hostile = "".join(p for _, p, _ in PAYLOADS) + "\nfake line"
    asked = {"permission": "bash", "pattern": f"rm -rf ~ {hostile}", "always": hostile}
    prompt = Display("ses_root", json_mode=False).question(_wire("permission.asked", asked))
    body = prompt.removeprefix("\n")
    assert body.count("\n") == 1  # its own two lines, no line of the model's
    _assert_all_shown(body)
    assert "^Jfake line" in body


def test_question_texts_options_and_mcp_lines_are_shown_not_obeyed() -> None:
    from harness.commands.display import _mcp_line, question_prompt, todo_lines

    hostile = "".join(p for _, p, _ in PAYLOADS)
    data = {
        "questions": [
            {
                "header": hostile,
                "question": f"Which?\nsecond line {hostile}",
                "options": [{"label": hostile, "description": hostile}],
            }
        ]
    }
    prompt = question_prompt(data, 0, None)
    _assert_all_shown(prompt)
    assert "Which?\nsecond line" in prompt  # a question keeps its own lines
    for kind in ("mcp.failed", "mcp.warning"):
        line = _mcp_line(kind, {"server": hostile, "tool": hostile, "reason": hostile})
        assert "\n" not in line
        _assert_all_shown(line)
    todos = todo_lines([{"content": hostile, "status": "pending", "priority": hostile}])
    _assert_all_shown(todos)


def test_mcp_report_shows_server_names_errors_and_tools_as_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from harness.commands.mcp import _print

    hostile = "".join(p for _, p, _ in PAYLOADS)
    server = {
        "name": f"evil{hostile}",
        "state": "failed",
        "tools": 0,
        "schema_tokens": 0,
        "last_error": hostile,
        "prompts": [hostile],
        "warnings": [f"tool '{hostile}' skipped"],
    }
    report = {"servers": [server], "schema_tokens": 0, "search_threshold": 1, "tool_search": False}
    _print(report, False, None)
    _assert_all_shown(capsys.readouterr().out)
    _print(report, True, None)
    assert json.loads(capsys.readouterr().out) == report  # --json: exact


# --- through the real CLI -----------------------------------------------------------------


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env.pop("MISTRAL_API_KEY", None)
    env.update(
        HARNESS_HOME=str(tmp_path / "home"),
        HARNESS_SOCKET=str(tmp_path / "no-daemon.sock"),
        HARNESS_SANDBOX="off",
    )
    return env


def _harness(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HARNESS, *args], capture_output=True, text=True, env=_env(tmp_path), timeout=60
    )


def _hostile_run(tmp_path: Path, project: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """One turn of a hostile model: payloads in a command (its tool title), in what the
    command prints, in a child session's title and in the streamed answer."""
    hostile = "".join(p for _, p, _ in PAYLOADS)
    runnable = hostile.replace("\x00", "")  # a NUL cannot be in an exec argument
    # printf makes the raw bytes itself: the tool's output carries every payload.
    octal = "".join(f"\\{b:03o}" for b in hostile.encode())
    turns = [
        {
            "tool_calls": [
                {"name": "bash", "arguments": {"command": f"true # {runnable}"}},
                {"name": "bash", "arguments": {"command": f"printf '{octal}\\n'"}},
                {"name": "task", "arguments": {"description": hostile, "prompt": "p"}},
            ]
        },
        {"text": "".join(SPLIT_DELTAS), "chunks": 2},
    ]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": turns, "subtasks": {"p": [{"text": hostile}]}}))
    model = f"scripted:{script}"
    return _harness(tmp_path, "run", "--yes", *flags, "--model", model, "--dir", str(project), "go")


def test_run_show_trace_and_sessions_show_the_payloads_as_text(
    tmp_path: Path, project: Path
) -> None:
    run = _hostile_run(tmp_path, project)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "done^[[2J!\n"
    _assert_inert(run.stderr)
    assert "→ true # ^[[2J^[[H^[]0;pwned^G" in run.stderr  # the title, cut to its width
    sessions = json.loads(_harness(tmp_path, "sessions", "--json").stdout)
    root = next(s for s in sessions if s["parent_id"] is None)
    child = next(s for s in sessions if s["parent_id"] == root["id"])
    assert child["title"].startswith("\x1b[2J")  # stored as sent; only the display changes
    for args in (["show", root["id"]], ["show", child["id"]], ["trace", root["id"]]):
        shown = _harness(tmp_path, *args)
        assert shown.returncode == 0, shown.stderr
        _assert_inert(shown.stdout)
    assert "^[]0;pwned^G" in _harness(tmp_path, "trace", root["id"]).stdout
    tool_output = _harness(tmp_path, "show", root["id"]).stdout
    # Its lines are split as splitlines() splits (\r, \x85 too): the rest is shown.
    for shown in ("^[[2J^[[H^[]0;pwned^G", "^[]52;c;", "ls <U+202E>~", "^H^Hls", "\ufffd2J"):
        assert shown in tool_output, tool_output
    _assert_all_shown(_harness(tmp_path, "show", child["id"]).stdout)  # the child's answer
    listed = _harness(tmp_path, "sessions")
    _assert_inert(listed.stdout)
    assert "^[[2J^[[H^[]0;pwned^G" in listed.stdout


def test_run_json_keeps_every_payload_exact(tmp_path: Path, project: Path) -> None:
    run = _hostile_run(tmp_path, project, "--json")
    assert run.returncode == 0, run.stderr
    events = [json.loads(line) for line in run.stdout.rstrip("\n").split("\n")]
    for line, event in zip(run.stdout.rstrip("\n").split("\n"), events, strict=True):
        # The bytes Event.to_json writes: JSON's own escapes, nothing of ours.
        assert line == json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    assert "\x1b" not in run.stdout  # JSON escapes C0 itself
    deltas = [e["data"].get("delta") for e in events if e["type"] == "part.delta"]
    at = deltas.index(SPLIT_DELTAS[0])
    assert deltas[at + 1] == SPLIT_DELTAS[1], deltas
    finished = [e for e in events if e["type"] == "turn.finished"][-1]  # the root's, last
    assert finished["data"]["answer"] == "".join(SPLIT_DELTAS)


def test_the_ask_prompt_at_a_terminal_shows_the_hidden_command(
    tmp_path: Path, project: Path
) -> None:
    command = "rm -rf '~/\x1b[2K\x1b[1G\rls \u202e~ fr- mr\u202c'"
    script = tmp_path / "script.json"
    turns = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
        {"text": "stopped"},
    ]
    script.write_text(json.dumps(turns))
    child = pexpect.spawn(
        HARNESS[0],
        [*HARNESS[1:], "run", "--model", f"scripted:{script}", "--dir", str(project), "go"],
        env=_env(tmp_path),
        encoding="utf-8",
        timeout=30,
        dimensions=(40, 200),
    )
    child.expect_exact("or type feedback to reject: ")
    prompt = child.before
    child.send("r\r")
    child.expect(pexpect.EOF)
    child.close()
    screen = prompt.replace("\r\n", "\n")
    _assert_inert(screen)
    assert "^[[2K^[[1G^Mls <U+202E>~ fr- mr<U+202C>" in screen, screen
    assert "? bash wants 'rm -rf " in screen


def test_config_values_and_a_bad_files_error_are_shown_as_text(
    tmp_path: Path, project: Path
) -> None:
    settings = project / ".harness" / "config.toml"
    settings.parent.mkdir()
    # A checked-in file is as hostile as the model: TOML escapes make the raw characters.
    settings.write_text('[permission]\nbash = { "rm \\u001b[2J\\u202e*" = "allow" }\n')
    shown = _harness(tmp_path, "config", "--dir", str(project))
    assert shown.returncode == 0, shown.stderr
    _assert_inert(shown.stdout)
    assert "permission.bash.rm ^[[2J<U+202E>*" in shown.stdout
    as_json = json.loads(_harness(tmp_path, "config", "--json", "--dir", str(project)).stdout)
    assert as_json["config"]["permission"]["bash"] == {"rm \x1b[2J\u202e*": "allow"}
    settings.write_text('[mcp."evil\\u001b]0;pwned\\u0007"]\ncommand = ["true"]\n')
    bad = _harness(tmp_path, "config", "--dir", str(project))
    assert bad.returncode == 1
    _assert_inert(bad.stderr)
    assert "mcp.evil^[]0;pwned^G" in bad.stderr


def test_diff_is_shown_on_a_terminal_and_exact_in_a_pipe(tmp_path: Path, project: Path) -> None:
    hostile = "title \x1b]0;pwned\x07 \x1b[2J\x9b ok\n"
    script = tmp_path / "script.json"
    write = {"name": "write", "arguments": {"path": "evil.txt", "content": hostile}}
    script.write_text(json.dumps([{"tool_calls": [write]}, {"text": "written"}]))
    model = f"scripted:{script}"
    run = _harness(tmp_path, "run", "--yes", "--model", model, "--dir", str(project), "go")
    assert run.returncode == 0, run.stderr
    session = json.loads(_harness(tmp_path, "sessions", "--json").stdout)[0]["id"]
    piped = _harness(tmp_path, "diff", session)
    assert "+" + hostile in piped.stdout  # byte for byte: `harness diff S > fix.patch` applies
    argv = [*HARNESS[1:], "diff", session]
    child = pexpect.spawn(HARNESS[0], argv, env=_env(tmp_path), encoding="utf-8", timeout=30)
    child.expect(pexpect.EOF)
    child.close()
    screen = str(child.before).replace("\r\n", "\n")
    _assert_inert(screen)
    assert "+title ^[]0;pwned^G ^[[2J\ufffd ok" in screen


def test_an_events_line_shows_the_payload_as_text() -> None:
    from harness.commands.events import _event_line

    hostile = "".join(p for _, p, _ in PAYLOADS)
    line = _event_line(_wire("part.delta", {"delta": hostile[:40] + "\n" + hostile[-60:]}))
    assert "\n" not in line
    _assert_inert(line)
    assert '"delta": "\\u001b[2J' in line  # JSON's own escapes where JSON makes them
    assert "<U+202E>" in _event_line(_wire("part.delta", {"delta": "ls \u202e~"}))
