"""Shell commands as permission requests (DESIGN §8: a command is checked per sub-command).

``bash_needs`` turns a shell line into one ``bash`` need per command it can run, read by a
real parser (harness/permissions/shell.py): sub-commands, command substitutions wherever
they sit, the commands inside wrappers (``sudo``, ``xargs``, ``sh -c``, ``eval``,
``find -exec``). Each need's pattern is the normalized command (quotes and escapes removed,
assignments stripped); deny rules are also tried against the command word's basename with
every unknown part a wildcard (``covers``). A command whose name is not a literal, and a
line the parser does not fully understand, are ``opaque``: no allow rule but ``*`` matches
them, and every deny rule does. ``command_prefix`` (OpenCode's BashArity) names the command
so that "always allow" on ``git checkout main`` stores ``git checkout *``.
"""

from __future__ import annotations

import os
import re
import shlex

from harness.messages.permission import PermissionNeed
from harness.permissions.shell import analyze

# Words that start or end a compound command; what prefixes are computed from is a
# normalized command, but a bare keyword can still reach command_prefix from a caller.
_LEADING_KEYWORDS = frozenset({"if", "then", "else", "elif", "do", "while", "until", "!", "{"})
_CLOSING_KEYWORDS = frozenset({"fi", "done", "esac", "}"})
_ENV_ASSIGNMENT = re.compile(
    r"""[A-Za-z_][A-Za-z0-9_]*=(?:'[^']*'|"(?:[^"\\]|\\.)*"|\\.|[^\s'"\\])*(?:\s+|$)""",
    re.DOTALL,
)


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
    """The normalized commands a shell line runs, each before those nested inside it."""
    return list(dict.fromkeys(c.text for c in analyze(command).commands))


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
    """One ``bash`` need per distinct command ``command`` can run (see the module doc)."""
    analysis = analyze(command)
    needs: list[PermissionNeed] = []
    if analysis.unparseable:
        # Whatever was extracted is still checked below, so deny rules see it; this need
        # keeps an allow rule from passing a line only partly understood.
        needs.append(
            PermissionNeed(
                "bash", command, command, {"command": command, "unparseable": True}, opaque=True
            )
        )
    seen: set[tuple[str, bool]] = set()
    for sub in analysis.commands:
        text = sub.text
        if (text, sub.opaque) in seen:
            continue
        seen.add((text, sub.opaque))
        if sub.opaque:
            metadata = {"command": sub.source or text, "opaque": True}
            needs.append(PermissionNeed("bash", text, text, metadata, opaque=True))
            continue
        bare = sub.text.removeprefix(" ".join(sub.assignments)).lstrip()
        prefix = " ".join([*sub.assignments, command_prefix(bare) or bare])
        covers = sub.covers
        needs.append(
            PermissionNeed(
                "bash",
                text,
                f"{prefix} *",
                {"command": text},
                covers=covers if covers != text else None,
            )
        )
    return needs
