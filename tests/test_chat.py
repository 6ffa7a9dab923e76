"""`harness chat` as a person uses it: a real process in a real pseudo-terminal (pexpect),
the scripted model, and either an embedded harness or a real `harness serve` daemon.

The screen is prompt_toolkit's, so what is matched is text that reaches the terminal
(answers, tool lines, the status line's state), never a layout detail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest
from daemons import wait_for_daemon

HARNESS = [sys.executable, "-m", "harness"]


def _script(tmp_path: Path, turns: list[dict[str, Any]]) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


def _env(tmp_path: Path, socket: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env.pop("MISTRAL_API_KEY", None)
    env.pop("NO_COLOR", None)
    env.update(
        HARNESS_HOME=str(tmp_path / "home"),
        HARNESS_SOCKET=str(socket),
        HARNESS_SANDBOX="off",
        TERM="xterm-256color",
        # Nobody answers prompt_toolkit's cursor-position requests in a test.
        PROMPT_TOOLKIT_NO_CPR="1",
    )
    return env


class Chat:
    """A running `harness chat` and what it printed."""

    def __init__(
        self,
        tmp_path: Path,
        socket: Path,
        *args: str,
        command: str = "chat",
        env: dict[str, str] | None = None,
    ) -> None:
        argv = [*HARNESS[1:], *([command] if command else []), *args]
        self.child = pexpect.spawn(
            HARNESS[0],
            argv,
            env={**_env(tmp_path, socket), **(env or {})},
            encoding="utf-8",
            timeout=20,
            dimensions=(40, 120),
        )
        self.log = tmp_path / "screen.log"
        self.child.logfile_read = self.log.open("w")
        self.expect("/help for commands")

    def expect(self, text: str, timeout: float = 20) -> None:
        try:
            self.child.expect_exact(text, timeout=timeout)
        except (pexpect.TIMEOUT, pexpect.EOF) as error:
            self.child.logfile_read.flush()
            raise AssertionError(f"{text!r} never shown; the screen:\n{self.screen()}") from error

    def finished(self, reason: str = "answered") -> None:
        """The line that ends each turn."""
        self.expect(f"── {reason} ·")

    def type(self, line: str) -> None:
        self.child.send(line + "\r")

    def screen(self) -> str:
        return self.log.read_text(errors="replace")

    def exit_code(self) -> int:
        self.child.expect(pexpect.EOF, timeout=20)
        self.child.close()
        assert self.child.exitstatus is not None, self.screen()
        return int(self.child.exitstatus)


@pytest.fixture(params=["embedded", "daemon"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def socket(socket_dir: Path) -> Path:
    return socket_dir / "harness.sock"


@pytest.fixture
def daemon(mode: str, tmp_path: Path, socket: Path) -> Iterator[None]:
    """A real `harness serve` on ``socket`` in daemon mode; nothing in embedded mode."""
    if mode == "embedded":
        yield
        return
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*HARNESS, "serve"], env=_env(tmp_path, socket), stdout=out, stderr=out
        )
    try:
        wait_for_daemon(process, socket, log)
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)


def _status_mode(chat: Chat, mode: str) -> None:
    assert f"ready · {mode} ·" in chat.screen()


def test_a_prompt_is_answered_and_quit_exits_0(
    tmp_path: Path, project: Path, socket: Path, mode: str, daemon: None
) -> None:
    model = _script(tmp_path, [{"text": "The answer is **forty-two**.", "chunks": 4}])
    chat = Chat(tmp_path, socket, "--model", model, "--dir", str(project))
    _status_mode(chat, mode)
    chat.type("what is the answer?")
    chat.expect("forty-two")
    chat.finished()
    chat.type("/cost")
    chat.expect("tokens (")
    chat.type("/quit")
    assert chat.exit_code() == 0


def test_an_ask_is_answered_once_inline(
    tmp_path: Path, project: Path, socket: Path, mode: str, daemon: None
) -> None:
    model = _script(
        tmp_path,
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo marker-$((6*7))"}}]},
            {"text": "The command printed the marker."},
        ],
    )
    chat = Chat(tmp_path, socket, "--model", model, "--dir", str(project))
    chat.type("run it")
    chat.expect("allow? [o]nce [a]lways [r]eject:")
    chat.type("o")
    chat.expect("✓ bash (exit 0, 1 lines)")
    chat.expect("printed the marker")
    chat.finished()
    chat.type("/quit")
    assert chat.exit_code() == 0


def test_ctrl_c_mid_stream_cancels_the_turn_and_the_chat_goes_on(
    tmp_path: Path, project: Path, socket: Path, mode: str, daemon: None
) -> None:
    slow = " ".join(f"word{n}" for n in range(200))
    model = _script(
        tmp_path,
        [{"text": slow, "chunks": 200, "chunk_delay": 0.05}, {"text": "second turn answered"}],
    )
    chat = Chat(tmp_path, socket, "--model", model, "--dir", str(project))
    chat.type("talk slowly")
    chat.expect("word5")  # streaming: shown as it arrives
    chat.child.sendcontrol("c")
    chat.finished("cancelled")
    assert "word199" not in chat.screen()
    chat.type("and now?")
    chat.expect("second turn answered")
    chat.finished()
    chat.child.sendcontrol("c")  # at an idle prompt: a hint...
    chat.expect("Ctrl-C again")
    chat.child.sendcontrol("c")  # ...and the second one quits
    assert chat.exit_code() == 130


def test_undo_restores_the_file_the_last_turn_edited(
    tmp_path: Path, project: Path, socket: Path, mode: str, daemon: None
) -> None:
    notes = project / "notes.txt"
    before = notes.read_text()
    edit = {"path": "notes.txt", "old_string": "line one", "new_string": "LINE ONE EDITED"}
    model = _script(
        tmp_path,
        [{"tool_calls": [{"name": "edit", "arguments": edit}]}, {"text": "edited the notes"}],
    )
    chat = Chat(tmp_path, socket, "--model", model, "--dir", str(project))
    chat.type("edit the notes")
    chat.expect("allow? [o]nce")
    chat.type("o")
    chat.expect("edited the notes")
    chat.finished()
    assert "LINE ONE EDITED" in notes.read_text()
    chat.type("/diff")
    chat.expect("+LINE ONE EDITED")
    chat.type("/undo")
    chat.expect("restored  notes.txt")
    assert notes.read_text() == before
    chat.type("/quit")
    assert chat.exit_code() == 0


def test_plain_harness_on_a_terminal_is_a_chat(
    tmp_path: Path, project: Path, socket: Path
) -> None:
    model = _script(tmp_path, [{"text": "hello from the plain command"}])
    chat = Chat(tmp_path, socket, command="", env={"HARNESS_MODEL": model})
    chat.type("hi")
    chat.expect("hello from the plain command")
    chat.child.sendcontrol("d")
    assert chat.exit_code() == 0


def test_plain_harness_in_a_pipe_prints_usage(tmp_path: Path, socket: Path) -> None:
    result = subprocess.run(
        HARNESS, input="", capture_output=True, text=True, env=_env(tmp_path, socket), timeout=30
    )
    assert result.returncode == 2
    assert "usage: harness" in result.stderr
    assert "chat" in result.stderr


def test_chat_without_a_terminal_is_a_usage_error(tmp_path: Path, socket: Path) -> None:
    result = subprocess.run(
        [*HARNESS, "chat"],
        input="",
        capture_output=True,
        text=True,
        env=_env(tmp_path, socket),
        timeout=30,
    )
    assert result.returncode == 2
    assert "needs a terminal" in result.stderr


def test_a_dumb_terminal_gets_plain_lines_and_the_same_chat(
    tmp_path: Path, project: Path, socket: Path
) -> None:
    slow = " ".join(f"word{n}" for n in range(200))
    model = _script(
        tmp_path,
        [
            {"text": "Some **bold** words.", "chunks": 3},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo hi"}}]},
            {"text": "ran it"},
            {"text": slow, "chunks": 200, "chunk_delay": 0.05},
        ],
    )
    chat = Chat(tmp_path, socket, "--model", model, "--dir", str(project), env={"TERM": "dumb"})
    chat.type("hello")
    chat.expect("Some **bold** words.")  # the Markdown as written: nothing rendered
    chat.finished()
    chat.type("run it")
    chat.expect("allow? [o]nce [a]lways [r]eject:")
    chat.type("o")
    chat.expect("✓ bash (exit 0, 1 lines)")
    chat.finished()
    chat.type("slowly now")
    chat.expect("word5")
    chat.child.sendcontrol("c")  # SIGINT here: the terminal is in cooked mode
    chat.finished("cancelled")
    chat.type("/quit")
    assert chat.exit_code() == 0
    assert "\x1b" not in chat.screen()


def test_a_question_is_answered_inline_and_history_is_kept_per_project(
    tmp_path: Path, project: Path, socket: Path, mode: str, daemon: None
) -> None:
    question = {
        "question": "Which database?",
        "options": [
            {"label": "Postgres", "description": "the server"},
            {"label": "SQLite", "description": "a file"},
        ],
    }
    model = _script(
        tmp_path,
        [
            {"tool_calls": [{"name": "question", "arguments": {"questions": [question]}}]},
            {"text": "Going with your choice."},
        ],
    )
    chat = Chat(tmp_path, socket, "--model", model, "--dir", str(project))
    chat.type("pick a database")
    chat.expect("Which database?")
    chat.expect("answer:")
    chat.type("2")
    chat.expect("Going with your choice.")
    chat.finished()
    chat.type("/quit")
    assert chat.exit_code() == 0
    files = list((tmp_path / "home" / "chat-history").iterdir())
    assert len(files) == 1
    assert files[0].stat().st_mode & 0o777 == 0o600
    history = files[0].read_text()
    assert "pick a database" in history and "\n+2\n" not in history  # answers are not kept
    # The answer reached the ledger as the option's label.
    show = subprocess.run(
        [*HARNESS, "sessions", "--json"],
        capture_output=True,
        text=True,
        env=_env(tmp_path, socket),
        timeout=30,
    )
    session_id = json.loads(show.stdout)[0]["id"]
    transcript = subprocess.run(
        [*HARNESS, "show", session_id],
        capture_output=True,
        text=True,
        env=_env(tmp_path, socket),
        timeout=30,
    )
    assert '"SQLite"' in transcript.stdout, transcript.stdout


def test_model_agent_and_compact_change_the_session(
    tmp_path: Path, project: Path, socket: Path, mode: str, daemon: None
) -> None:
    model = _script(
        tmp_path,
        [
            {"text": "first answer " * 50},
            {"text": "## Goal\nsummary of it all"},
            {"text": "after the compaction"},
        ],
    )
    chat = Chat(tmp_path, socket, "--model", model, "--dir", str(project))
    chat.type("say something long")
    chat.expect("first answer")
    chat.finished()
    chat.type("/agent plan")
    chat.expect("agent: plan, from the next turn")
    chat.type("/agent nobody")
    chat.expect("nobody")
    chat.type("/model nowhere/x")
    chat.expect("harness: ")
    chat.type("/compact")
    chat.expect("compacted: about")
    chat.finished()
    chat.type("and now")
    chat.expect("after the compaction")
    chat.finished()
    chat.type("/sessions")
    chat.expect("* ses_")
    chat.type("/new")
    chat.expect("new session ses_")
    chat.type("/quit")
    assert chat.exit_code() == 0


def test_ctrl_c_twice_quickly_quits_and_leaves_no_turn_running(
    tmp_path: Path, project: Path, socket: Path, mode: str, daemon: None
) -> None:
    slow = " ".join(f"word{n}" for n in range(400))
    model = _script(tmp_path, [{"text": slow, "chunks": 400, "chunk_delay": 0.05}])
    chat = Chat(tmp_path, socket, "--model", model, "--dir", str(project))
    chat.type("talk slowly")
    chat.expect("word5")
    chat.child.sendcontrol("c")
    chat.child.sendcontrol("c")
    assert chat.exit_code() == 130
    # The turn was cancelled, not left running in the daemon (or resumed next time).
    deadline = time.monotonic() + 10
    while True:
        listed = subprocess.run(
            [*HARNESS, "sessions", "--json"],
            capture_output=True,
            text=True,
            env=_env(tmp_path, socket),
            timeout=30,
        )
        (session,) = json.loads(listed.stdout)
        if session["status"] == "idle" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert session["status"] == "idle", session
    assert "word399" not in chat.screen()


def test_resuming_an_unknown_session_is_a_usage_error(tmp_path: Path, socket: Path) -> None:
    child = pexpect.spawn(
        HARNESS[0],
        [*HARNESS[1:], "chat", "--session", "ses_nope", "--model", "scripted:/dev/null"],
        env=_env(tmp_path, socket),
        encoding="utf-8",
        timeout=20,
    )
    child.expect_exact("no session ses_nope")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2
    assert "Traceback" not in (child.before or "")


@pytest.mark.parametrize("mode", ["daemon"])
def test_a_project_file_the_daemon_cannot_apply_is_refused_as_run_refuses_it(
    tmp_path: Path, project: Path, socket: Path, mode: str, daemon: None
) -> None:
    # The daemon will not apply a project's sandbox; embedded, this process would, but the
    # daemon holds the ledger: one clear line, as `harness run` gives, and exit 1.
    (project / ".harness").mkdir()
    (project / ".harness" / "config.toml").write_text('sandbox = "off"\n')
    model = _script(tmp_path, [{"text": "never"}])
    child = pexpect.spawn(
        HARNESS[0],
        [*HARNESS[1:], "chat", "--model", model, "--dir", str(project)],
        env=_env(tmp_path, socket),
        encoding="utf-8",
        timeout=20,
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1, child.before
    assert "daemon" in (child.before or "") and "Traceback" not in (child.before or "")


def test_a_session_is_continued_with_session_and_its_agent_changed(
    tmp_path: Path, project: Path, socket: Path, mode: str, daemon: None
) -> None:
    model = _script(tmp_path, [{"text": "first visit"}, {"text": "second visit"}])
    chat = Chat(tmp_path, socket, "--model", model, "--dir", str(project))
    chat.type("hello")
    chat.expect("first visit")
    chat.finished()
    chat.type("/quit")
    assert chat.exit_code() == 0
    listed = subprocess.run(
        [*HARNESS, "sessions", "--json"],
        capture_output=True,
        text=True,
        env=_env(tmp_path, socket),
        timeout=30,
    )
    (session,) = json.loads(listed.stdout)
    again = Chat(tmp_path, socket, "--session", session["id"], "--agent", "plan")
    again.type("/agent")
    again.expect("agent: plan (")
    again.type("hello again")
    again.expect("second visit")  # the same conversation: its second reply
    again.finished()
    again.type("/quit")
    assert again.exit_code() == 0


def test_esc_enter_makes_a_prompt_of_several_lines(
    tmp_path: Path, project: Path, socket: Path
) -> None:
    model = _script(tmp_path, [{"text": "got both lines"}])
    chat = Chat(tmp_path, socket, "--model", model, "--dir", str(project))
    chat.child.send("first line")
    chat.child.send("\x1b\r")
    chat.child.send("second line\r")
    chat.expect("got both lines")
    chat.finished()
    chat.type("/quit")
    assert chat.exit_code() == 0
    env = _env(tmp_path, socket)
    listed = subprocess.run(
        [*HARNESS, "sessions", "--json"], capture_output=True, text=True, env=env, timeout=30
    )
    session_id = json.loads(listed.stdout)[0]["id"]
    shown = subprocess.run(
        [*HARNESS, "show", session_id, "--json"], capture_output=True, text=True, env=env,
        timeout=30,
    )
    texts = [p.get("text") for m in json.loads(shown.stdout)["messages"] for p in m["parts"]]
    assert "first line\nsecond line" in texts, texts


def test_escape_sequences_from_the_model_are_shown_not_obeyed(
    tmp_path: Path, project: Path, socket: Path
) -> None:
    hostile = "before\x1b]0;pwned\x07\x1b[2J after"
    command = "printf 'x' # \x1b]52;c;ZXZpbA==\x07"
    model = _script(
        tmp_path,
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
            {"text": hostile},
        ],
    )
    chat = Chat(tmp_path, socket, "--model", model, "--dir", str(project))
    chat.type("go")
    chat.expect("? bash 'printf x'")
    chat.type("o")
    chat.expect("→ bash printf 'x' # ^[]52;c;ZXZpbA==^G")
    chat.expect("before^[]0;pwned^G^[[2J after")
    chat.finished()
    chat.type("/quit")
    assert chat.exit_code() == 0
    screen = chat.screen()
    assert "\x1b]0;pwned" not in screen and "\x1b]52" not in screen and "\x1b[2J" not in screen


def test_tab_completes_a_slash_command(tmp_path: Path, project: Path, socket: Path) -> None:
    model = _script(tmp_path, [{"text": "unused"}])
    chat = Chat(tmp_path, socket, "--model", model, "--dir", str(project))
    chat.child.send("/he\t")
    chat.expect("lp")  # completed on the screen (drawn as what changed)
    chat.child.send("\r")
    chat.expect("commands:")
    chat.expect("/undo")
    chat.child.send("/qu\t")
    chat.expect("it")
    chat.child.send("\r")
    assert chat.exit_code() == 0


def test_undo_again_goes_a_turn_further_back_until_a_new_prompt(
    tmp_path: Path, project: Path, socket: Path
) -> None:
    notes = project / "notes.txt"
    original = notes.read_text()

    def edit(old: str, new: str) -> list[dict[str, Any]]:
        arguments = {"path": "notes.txt", "old_string": old, "new_string": new}
        return [{"tool_calls": [{"name": "edit", "arguments": arguments}]}, {"text": f"now {new}"}]

    turns = [*edit("line one", "ONE"), *edit("ONE", "TWO"), *edit("line two", "THREE")]
    chat = Chat(tmp_path, socket, "--model", _script(tmp_path, turns), "--dir", str(project))
    chat.type("make it ONE")
    chat.expect("allow? [o]nce")
    chat.type("a")  # always: the next edits are not asked
    chat.expect("now ONE")
    chat.finished()
    chat.type("make it TWO")
    chat.expect("now TWO")
    chat.finished()
    after_one = original.replace("line one", "ONE")
    chat.type("/undo")
    chat.expect("undone: 1 file(s)")
    assert notes.read_text() == after_one
    chat.type("/undo")
    chat.expect("undone: 1 file(s)")
    assert notes.read_text() == original
    chat.type("make it THREE")
    chat.expect("now THREE")
    chat.finished()
    assert "THREE" in notes.read_text()
    chat.type("/undo")  # this turn, not one before the earlier undo
    chat.expect("undone: 1 file(s)")
    assert notes.read_text() == original
    chat.type("/quit")
    assert chat.exit_code() == 0


def test_help_loads_neither_prompt_toolkit_nor_rich(tmp_path: Path, socket: Path) -> None:
    probe = (
        "import sys\nfrom harness.cli import main\ntry:\n    main(['--help'])\n"
        "except SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('prompt_toolkit', 'rich')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=_env(tmp_path, socket),
        timeout=30,
    )
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout
