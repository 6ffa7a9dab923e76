"""Splitting shell lines into sub-commands, BashArity prefixes and bash permission needs."""

from __future__ import annotations

import pytest

from harness.permissions.bash import bash_needs, command_prefix, split_commands
from harness.tools.base import PermissionNeed

# --- split_commands ----------------------------------------------------------------------


@pytest.mark.parametrize("op", ["&&", "||", ";", "|", "&", "\n", "|&"])
def test_split_on_each_operator(op: str) -> None:
    assert split_commands(f"ls -la {op} rm x") == ["ls -la", "rm x"]


def test_split_chain() -> None:
    assert split_commands("a && b || c; d | e & f\ng") == list("abcdefg")


@pytest.mark.parametrize("command", ["", "   ", "\n\n", ";;", "&&"])
def test_empty(command: str) -> None:
    assert split_commands(command) == []


@pytest.mark.parametrize(
    "command",
    [
        "echo 'a && b; c | d'",
        'echo "a && b; c | d"',
        r"echo a \&\& b \; c",
        "grep -E 'x|y' f",
    ],
)
def test_quotes_and_escapes_keep_operators_literal(command: str) -> None:
    assert split_commands(command) == [command]


@pytest.mark.parametrize("command", ["ls 2>&1", "make &> log", "cmd >&2", "echo x >| f"])
def test_redirections_are_not_operators(command: str) -> None:
    assert split_commands(command) == [command]


def test_command_substitution() -> None:
    assert split_commands("echo $(rm -rf x)") == ["echo $(rm -rf x)", "rm -rf x"]
    assert split_commands('echo "$(whoami && id)"') == ['echo "$(whoami && id)"', "whoami", "id"]
    assert split_commands("echo $(a $(b))") == ["echo $(a $(b))", "a $(b)", "b"]
    assert split_commands("x=$(ls)") == ["x=$(ls)", "ls"]


def test_single_quotes_hide_substitution() -> None:
    assert split_commands("echo '$(rm x)'") == ["echo '$(rm x)'"]


def test_backticks() -> None:
    assert split_commands("echo `whoami`; ls") == ["echo `whoami`", "whoami", "ls"]
    assert split_commands('echo "`id`"') == ['echo "`id`"', "id"]


def test_subshell_contents_are_the_commands() -> None:
    assert split_commands("(cd sub && make) | tee log") == ["cd sub", "make", "tee log"]
    assert split_commands("diff <(sort a) <(sort b)") == [
        "diff <(sort a) <(sort b)",
        "sort a",
        "sort b",
    ]


def test_arithmetic_is_not_a_command() -> None:
    assert split_commands("echo $((1 + (2 * 3)))") == ["echo $((1 + (2 * 3)))"]


def test_compound_keywords_are_stripped() -> None:
    assert split_commands("if grep -q x f; then rm y; else touch y; fi") == [
        "grep -q x f",
        "rm y",
        "touch y",
    ]
    assert split_commands("while true; do sleep 1; done") == ["true", "sleep 1"]
    assert split_commands("{ a; b; } > out") == ["a", "b"]


def test_comments_are_dropped() -> None:
    assert split_commands("echo hi # && rm -rf /") == ["echo hi"]
    assert split_commands("echo a#b") == ["echo a#b"]


def test_heredoc_body_is_not_split() -> None:
    command = "cat > f.py <<'EOF'\nimport os; os.remove(x)\nEOF\npython f.py"
    assert split_commands(command) == [
        "cat > f.py <<'EOF'\nimport os; os.remove(x)\nEOF",
        "python f.py",
    ]


def test_heredoc_inside_substitution() -> None:
    command = "git commit -m \"$(cat <<'EOF'\nfix: don't (x)\nEOF\n)\" && git push"
    assert split_commands(command) == [
        "git commit -m \"$(cat <<'EOF'\nfix: don't (x)\nEOF\n)\"",
        "cat <<'EOF'\nfix: don't (x)\nEOF",
        "git push",
    ]


def test_unquoted_heredoc_substitutions_run() -> None:
    assert split_commands("cat <<EOF\n$(rm x)\nEOF") == ["cat <<EOF\n$(rm x)\nEOF", "rm x"]


def test_env_assignments_stay_in_the_text() -> None:
    assert split_commands("FOO=1 BAR='a b' make test && ls") == [
        "FOO=1 BAR='a b' make test",
        "ls",
    ]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ('echo "unbalanced && x', ['echo "unbalanced && x']),
        ("echo 'open; rm x", ["echo 'open; rm x"]),
        ("echo $(rm x", ["echo $(rm x", "rm x"]),
        ("echo `id", ["echo `id", "id"]),
        ("a )( b", ["a )( b"]),
        ("cat <<", ["cat <<"]),
        ("cat <<EOF\nno end", ["cat <<EOF\nno end"]),
        ("trailing \\", ["trailing \\"]),
    ],
)
def test_odd_input_does_not_raise(command: str, expected: list[str]) -> None:
    assert split_commands(command) == expected


# --- command_prefix ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "prefix"),
    [
        ("git checkout main", "git checkout"),
        ("git", "git"),
        ("git config user.name me", "git config user.name"),
        ("npm install", "npm install"),
        ("npm run dev -- --port 3", "npm run dev"),
        ("yarn add react", "yarn add"),
        ("pnpm run build", "pnpm run build"),
        ("docker run nginx", "docker run"),
        ("docker compose up -d", "docker compose up"),
        ("kubectl get pods", "kubectl get"),
        ("cargo build --release", "cargo build"),
        ("go test ./...", "go test"),
        ("pip install numpy", "pip install"),
        ("make test", "make test"),
        ("cat a b", "cat"),
        ("ls -la", "ls"),
        ("rm -rf build", "rm"),
        ("cd sub", "cd"),
        ("echo hi", "echo"),
        ("grep -r x .", "grep"),
        ("frobnicate --all x", "frobnicate"),  # unknown: first word
        ("python -m pytest -x", "python -m pytest"),
        ("python3 -m pip install x", "python3 -m pip"),
        (".venv/bin/python -m pytest", ".venv/bin/python -m pytest"),
        ("python script.py --fast", "python script.py"),
        ("python", "python"),
        ("/usr/bin/git log -3", "/usr/bin/git log"),
        ("FOO=1 BAR='x y' git status", "git status"),
        ("FOO=1", "FOO=1"),
        ("", ""),
    ],
)
def test_command_prefix(command: str, prefix: str) -> None:
    assert command_prefix(command) == prefix


@pytest.mark.parametrize(
    "command",
    [
        "sudo rm -rf /tmp/x",
        "xargs rm",
        "find . -delete",
        "source .venv/bin/activate",
        "bash -c 'rm -rf x'",
        'python -c "import os"',
        "node -e 'process.exit()'",
        "git -C elsewhere push --force",  # a flag hides the subcommand
        "python -u script.py",
    ],
)
def test_prefix_is_the_whole_command_when_a_shorter_one_would_cover_anything(
    command: str,
) -> None:
    assert command_prefix(command) == command


def test_prefix_odd_input() -> None:
    assert command_prefix("echo 'unbalanced") == "echo"
    assert command_prefix("git 'check out' x") == "git 'check out'"


# --- bash_needs --------------------------------------------------------------------------


def test_bash_needs() -> None:
    assert bash_needs("git checkout main && npm run dev | tee log") == [
        PermissionNeed(
            "bash", "git checkout main", "git checkout *", {"command": "git checkout main"}
        ),
        PermissionNeed("bash", "npm run dev", "npm run dev *", {"command": "npm run dev"}),
        PermissionNeed("bash", "tee log", "tee *", {"command": "tee log"}),
    ]


def test_bash_needs_nested_and_env() -> None:
    needs = bash_needs("FOO=1 echo $(rm -rf x)")
    assert [(n.pattern, n.always) for n in needs] == [
        ("FOO=1 echo $(rm -rf x)", "echo *"),
        ("rm -rf x", "rm *"),
    ]


def test_bash_needs_empty_and_duplicates() -> None:
    assert bash_needs("") == []
    assert bash_needs("  ;  ") == []
    assert [n.pattern for n in bash_needs("ls && ls; ls -l")] == ["ls", "ls -l"]


def test_always_pattern_covers_the_command_it_came_from() -> None:
    from harness.permissions.wildcard import match

    for command in ["git checkout main", "make test", "sudo rm x", "python -m pytest -k x"]:
        (need,) = bash_needs(command)
        assert match(need.always, need.pattern), command


def test_absurd_nesting_does_not_raise() -> None:
    command = "echo " + "$(" * 500 + "rm -rf x" + ")" * 500
    subs = split_commands(command)
    assert subs[0] == command
    assert len(subs) > 2
    assert not any(s.startswith("echo") for s in subs[1:])
