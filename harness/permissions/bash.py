"""Shell commands as permission requests (DESIGN §8: a command is checked per sub-command).

``split_commands`` finds the simple commands of a shell line, including those hidden in
``$( … )``, backticks, ``( … )`` subshells and ``<( … )`` process substitutions, because
each of them runs. ``command_prefix`` (OpenCode's BashArity) names the command so that
"always allow" on ``git checkout main`` stores ``git checkout *``.

This is a scanner, not a shell parser: on input it does not understand it errs towards
more, smaller commands (more questions), never towards hiding one. It never raises.
"""

from __future__ import annotations

import os
import re
import shlex

from harness.tools.base import PermissionNeed

# Words that start or end a compound command; the command they introduce is what runs.
_LEADING_KEYWORDS = frozenset({"if", "then", "else", "elif", "do", "while", "until", "!", "{"})
_CLOSING_KEYWORDS = frozenset({"fi", "done", "esac", "}"})
_MAX_DEPTH = 64
_ENV_ASSIGNMENT = re.compile(
    r"""[A-Za-z_][A-Za-z0-9_]*=(?:'[^']*'|"(?:[^"\\]|\\.)*"|\\.|[^\s'"\\])*(?:\s+|$)""",
    re.DOTALL,
)


class _Scanner:
    def __init__(self, text: str, pos: int = 0) -> None:
        self.text = text
        self.pos = pos
        self.depth = 0

    def _nested(self, closer: str) -> list[str]:
        if self.depth >= _MAX_DEPTH:
            # Past any sane nesting, hand back the rest whole rather than recurse without
            # bound: an unfamiliar command that asks, never a RecursionError or a bypass.
            rest = self.text[self.pos :].strip()
            self.pos = len(self.text)
            return [rest] if rest else []
        self.depth += 1
        try:
            return self.commands(closer)
        finally:
            self.depth -= 1

    def commands(self, closer: str | None = None) -> list[str]:
        """Scan commands up to ``closer`` (consumed) or the end of the text."""
        text = self.text
        found: list[str] = []
        buf: list[str] = []  # source text of the current command
        inner: list[str] = []  # commands nested inside the current one
        group = False  # the current command is a ( … ) subshell: only its contents run
        heredocs: list[tuple[str, bool]] = []  # pending (delimiter, body is expanded)

        def flush() -> None:
            nonlocal group
            command = _clean("".join(buf))
            if command and not group:
                found.append(command)
            found.extend(inner)
            buf.clear()
            inner.clear()
            group = False

        while self.pos < len(text):
            start = self.pos
            c = text[start]
            nxt = text[start + 1 : start + 2]
            prev = text[start - 1] if start else ""
            if closer is not None and c == closer:
                self.pos += 1
                break
            if c == "\\":
                self.pos += 2
            elif c == "'":
                end = text.find("'", start + 1)
                self.pos = len(text) if end < 0 else end + 1
            elif c == '"':
                self._double_quoted(inner)
            elif c == "`":
                self.pos += 1
                inner.extend(self._nested("`"))
            elif c == "$" and text.startswith("$((", start):
                self._arithmetic()
            elif c == "$" and nxt == "(":
                self.pos += 2
                inner.extend(self._nested(")"))
            elif c == "(" and prev in ("<", ">"):
                self.pos += 1
                inner.extend(self._nested(")"))
            elif c == "(" and not _clean("".join(buf)):
                group = True
                self.pos += 1
                inner.extend(self._nested(")"))
            elif c == "#" and (not buf or buf[-1][-1:].isspace()):
                end = text.find("\n", start)
                self.pos = len(text) if end < 0 else end
                continue  # a comment is not part of the command
            elif c == "<" and text.startswith("<<<", start):
                self.pos += 3
            elif c == "<" and nxt == "<":
                heredoc = self._heredoc_delimiter()
                if heredoc is not None:
                    heredocs.append(heredoc)
            elif c == "\n":
                self.pos += 1
                if heredocs:
                    buf.append("\n")  # the bodies belong to the command that reads them
                for delimiter, expanded in heredocs:
                    body = self._heredoc_body(delimiter)
                    buf.append(body)
                    if expanded:
                        inner.extend(_substitutions(body))
                heredocs.clear()
                flush()
                continue
            elif c in ";&|":
                if (c == "&" and (prev in ("<", ">") or nxt == ">")) or (c == "|" and prev == ">"):
                    self.pos += 1  # part of a redirection: 2>&1, &>out, >|out
                else:
                    self.pos += 2 if (c + nxt) in ("&&", "||", "|&") else 1
                    flush()
                    continue
            else:
                self.pos += 1
            buf.append(text[start : self.pos])
        flush()
        return found

    def _double_quoted(self, inner: list[str]) -> None:
        text = self.text
        self.pos += 1
        while self.pos < len(text):
            c = text[self.pos]
            if c == "\\":
                self.pos += 2
            elif c == '"':
                self.pos += 1
                return
            elif c == "`":
                self.pos += 1
                inner.extend(self._nested("`"))
            elif text.startswith("$((", self.pos):
                self._arithmetic()
            elif text.startswith("$(", self.pos):
                self.pos += 2
                inner.extend(self._nested(")"))
            else:
                self.pos += 1

    def _arithmetic(self) -> None:
        # $(( … )) is arithmetic, not a command: skip to its balancing parenthesis.
        depth = 0
        text = self.text
        self.pos += 1
        while self.pos < len(text):
            c = text[self.pos]
            self.pos += 1
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    return

    def _heredoc_delimiter(self) -> tuple[str, bool] | None:
        text = self.text
        self.pos += 2
        if text.startswith("-", self.pos):
            self.pos += 1
        while text[self.pos : self.pos + 1] in (" ", "\t"):
            self.pos += 1
        start = self.pos
        while self.pos < len(text) and not text[self.pos].isspace():
            if text[self.pos] in ";&|<>()":
                break
            self.pos += 1
        word = text[start : self.pos]
        if not word:
            return None
        quoted = any(q in word for q in "'\"\\")
        return word.replace("'", "").replace('"', "").replace("\\", ""), not quoted

    def _heredoc_body(self, delimiter: str) -> str:
        text = self.text
        start = self.pos
        while self.pos < len(text):
            end = text.find("\n", self.pos)
            line_end = len(text) if end < 0 else end
            line = text[self.pos : line_end]
            self.pos = line_end if end < 0 else end + 1
            if line.strip() == delimiter:
                break
        return text[start : self.pos]


def _substitutions(body: str) -> list[str]:
    """Commands substituted into an unquoted heredoc body, which the shell expands."""
    found: list[str] = []
    scanner = _Scanner(body)
    while scanner.pos < len(body):
        if body.startswith("\\", scanner.pos):
            scanner.pos += 2
        elif body.startswith("$((", scanner.pos):
            scanner._arithmetic()
        elif body.startswith("$(", scanner.pos):
            scanner.pos += 2
            found.extend(scanner._nested(")"))
        elif body.startswith("`", scanner.pos):
            scanner.pos += 1
            found.extend(scanner._nested("`"))
        else:
            scanner.pos += 1
    return found


def _clean(command: str) -> str:
    """Strip a command and the compound-command keywords around it ("" if nothing runs)."""
    while words := command.split(None, 1):
        if words[0] in _CLOSING_KEYWORDS:
            return ""  # `done`, `fi`, `}` (and any redirection on them) run nothing new
        if words[0] not in _LEADING_KEYWORDS:
            return command.strip()
        command = words[1] if len(words) > 1 else ""
    return ""


def split_commands(command: str) -> list[str]:
    """The simple commands of a shell line, each command before those nested inside it."""
    return _Scanner(command).commands()


# --- arity ------------------------------------------------------------------------------

# How many words name the command: the longest listed prefix wins, unlisted means 1.
# Only entries that differ from what their shorter prefix implies are listed.
_ARITY: dict[str, int] = {
    # one word
    "cat": 1, "cd": 1, "chmod": 1, "chown": 1, "cp": 1, "diff": 1, "echo": 1, "export": 1,
    "grep": 1, "head": 1, "kill": 1, "ln": 1, "ls": 1, "mkdir": 1, "mv": 1, "ps": 1,
    "pwd": 1, "rg": 1, "rm": 1, "rmdir": 1, "sleep": 1, "tail": 1, "touch": 1,
    "unset": 1, "wc": 1, "which": 1, "pytest": 1, "mypy": 1,
    # tool + subcommand
    "bazel": 2, "brew": 2, "bun": 2, "bun run": 3, "bun x": 3,
    "cargo": 2, "cargo add": 3, "cargo run": 3, "cmake": 2, "composer": 2,
    "deno": 2, "deno task": 3,
    "docker": 2, "docker builder": 3, "docker compose": 3, "docker container": 3,
    "docker image": 3, "docker network": 3, "docker volume": 3,
    "gcloud": 3, "gh": 3,
    "git": 2, "git config": 3, "git remote": 3, "git stash": 3,
    "go": 2, "go mod": 3, "gradle": 2, "helm": 2,
    "kubectl": 2, "kubectl rollout": 3,
    "aws": 3, "az": 3,
    # make's first word is a target, and targets are unrelated actions (test vs deploy):
    # "always" on `make test` must not cover every target, so the target is part of it.
    "make": 2,
    "mvn": 2, "npm": 2, "npm exec": 3, "npm init": 3, "npm run": 3, "npm view": 3,
    "npx": 2, "pip": 2, "pip3": 2, "pipenv": 2, "pnpm": 2, "pnpm dlx": 3, "pnpm exec": 3,
    "pnpm run": 3, "poetry": 2, "poetry run": 3, "podman": 2, "ruff": 2, "rustup": 2,
    "swift": 2, "systemctl": 2, "terraform": 2, "terraform workspace": 3,
    "uv": 2, "uv pip": 3, "uv run": 3, "yarn": 2, "yarn dlx": 3, "yarn run": 3,
}  # fmt: skip

# These run whatever follows them (or code given inline), so a prefix like `sudo *` would
# allow anything: "always" for them only re-allows the exact command.
_RUNS_OTHER_COMMANDS = frozenset(
    {
        "sudo", "doas", "su", "env", "xargs", "timeout", "nice", "nohup", "time", "watch",
        "stdbuf", "ionice", "exec", "command", "builtin", "eval", "source", ".", "ssh",
        "chroot", "find",
    }
)  # fmt: skip
# Interpreters name their program in the second word; `-c`/`-e` means inline code.
_INTERPRETERS = frozenset({"python", "python3", "node", "bash", "sh", "zsh", "perl", "ruby", "php"})
_INLINE_CODE_FLAGS = frozenset({"-c", "-e", "--eval", "-p", "--print"})


def _words(command: str) -> list[str]:
    # posix=False keeps quotes, so a prefix is the command's own text.
    try:
        return shlex.split(command, posix=False)
    except ValueError:
        return command.split()


def _unquote(word: str) -> str:
    return word[1:-1] if len(word) >= 2 and word[0] == word[-1] and word[0] in "'\"" else word


def _strip_env(command: str) -> str:
    command = command.strip()
    # A bare assignment (`FOO=1`) is itself the command, so keep the last one.
    while (m := _ENV_ASSIGNMENT.match(command)) and command[m.end() :].strip():
        command = command[m.end() :]
    return command


def _arity(words: list[str]) -> int | None:
    """How many words name the command; None when only the whole command will do."""
    program = os.path.basename(_unquote(words[0]))
    second = _unquote(words[1]) if len(words) > 1 else ""
    if program in _RUNS_OTHER_COMMANDS:
        return None
    if program in _INTERPRETERS:
        if second in _INLINE_CODE_FLAGS:
            return None
        if second == "-m" and program.startswith("python"):
            return 3  # python -m pytest
        # The script is the command; `python *` would allow any code at all.
        return 2 if not second.startswith("-") else None
    keys = [program, *(_unquote(w) for w in words[1:3])]
    for length in range(len(keys), 0, -1):
        arity = _ARITY.get(" ".join(keys[:length]))
        if arity is not None:
            break
    else:
        arity = 1
    # A flag before the subcommand (git -C dir push) hides which subcommand it is.
    if any(w.startswith("-") for w in words[1:arity]):
        return None
    return arity


def command_prefix(command: str) -> str:
    """The words that name a command: ``git checkout`` for ``git checkout main``.

    Leading ``NAME=value`` assignments are skipped. Commands that run other commands
    (``sudo``, ``bash -c``, ``find``) or hide their subcommand behind a flag give the whole
    command back, so an "always" answer never covers more than was shown.
    """
    words = _words(_clean(_strip_env(command)))
    if not words:
        return ""
    arity = _arity(words)
    if arity is None:
        return _clean(_strip_env(command))
    return " ".join(words[:arity])


def bash_needs(command: str) -> list[PermissionNeed]:
    """One ``bash`` permission need per distinct sub-command of ``command``."""
    needs: list[PermissionNeed] = []
    seen: set[str] = set()
    for sub in split_commands(command):
        if sub in seen:
            continue
        seen.add(sub)
        prefix = command_prefix(sub) or sub
        needs.append(
            PermissionNeed(
                permission="bash", pattern=sub, always=f"{prefix} *", metadata={"command": sub}
            )
        )
    return needs
