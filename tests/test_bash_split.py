"""Splitting shell lines into sub-commands, BashArity prefixes and bash permission needs.

Since the tree-sitter parser replaced the hand-written scanner, a sub-command comes back
normalized (quotes and escapes removed and re-quoted where needed, leading assignments
kept apart, here-doc bodies left out: they are data); the cases are those of the scanner.
"""

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
    ("command", "normalized"),
    [
        ("echo 'a && b; c | d'", "echo 'a && b; c | d'"),
        ('echo "a && b; c | d"', "echo 'a && b; c | d'"),
        (r"echo a \&\& b \; c", "echo a '&&' b ';' c"),
        ("grep -E 'x|y' f", "grep -E 'x|y' f"),
    ],
)
def test_quotes_and_escapes_keep_operators_literal(command: str, normalized: str) -> None:
    assert split_commands(command) == [normalized]


@pytest.mark.parametrize("command", ["ls 2>&1", "make &> log", "cmd >&2", "echo x >| f"])
def test_redirections_are_not_operators(command: str) -> None:
    assert split_commands(command) == [command]


def test_command_substitution() -> None:
    assert split_commands("echo $(rm -rf x)") == ["echo $(rm -rf x)", "rm -rf x"]
    assert split_commands('echo "$(whoami && id)"') == ['echo "$(whoami && id)"', "whoami", "id"]
    assert split_commands("echo $(a $(b))") == ["echo $(a $(b))", "a $(b)", "b"]
    assert split_commands("x=$(ls)") == ["ls"]  # a bare assignment runs only its value


def test_single_quotes_hide_substitution() -> None:
    # Quoted, `$(rm x)` does not run here; but literal text can be evaluated later
    # (`echo $((x))` runs the substitution in x='a[$(rm x)]'), so it is checked too.
    assert split_commands("echo '$(rm x)'") == ["echo '$(rm x)'", "rm x"]


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
    assert split_commands("echo '#x'") == ["echo '#x'"]


def test_heredoc_body_is_not_split() -> None:
    command = "cat > f.py <<'EOF'\nimport os; os.remove(x)\nEOF\npython f.py"
    assert split_commands(command) == ["cat > f.py <<'EOF'", "python f.py"]


def test_heredoc_inside_substitution() -> None:
    command = "git commit -m \"$(cat <<'EOF'\nfix: don't (x)\nEOF\n)\" && git push"
    assert split_commands(command) == [
        "git commit -m \"$(cat <<'EOF'\nfix: don't (x)\nEOF\n)\"",
        "cat <<'EOF'",
        "git push",
    ]


def test_unquoted_heredoc_substitutions_run() -> None:
    assert split_commands("cat <<EOF\n$(rm x)\nEOF") == ["cat <<EOF", "rm x"]


def test_env_assignments_stay_in_the_text() -> None:
    assert split_commands("FOO=1 BAR='a b' make test && ls") == [
        "FOO=1 BAR='a b' make test",
        "ls",
    ]
    (need, _) = bash_needs("FOO=1 BAR='a b' make test && ls")
    assert need.covers == "make test"  # what deny rules are tried against


@pytest.mark.parametrize(
    ("command", "extracted"),
    [
        ('echo "unbalanced && x', ["echo"]),
        ("echo 'open; rm x", ["echo"]),
        ("echo $(rm x", ["rm x"]),
        ("echo `id", ["id"]),
        ("a )( b", ["a"]),
        ("cat <<", ["cat"]),
        ("cat <<EOF\nno end", []),
        ("trailing \\", []),
    ],
)
def test_odd_input_does_not_raise(command: str, extracted: list[str]) -> None:
    # What the parser could not read whole asks as the whole line, and whatever it could
    # extract is checked too, so that deny rules see it.
    needs = bash_needs(command)
    assert needs[0].pattern == command and needs[0].opaque
    assert needs[0].metadata["unparseable"] is True
    for text in extracted:
        assert text in [n.pattern for n in needs[1:]], text


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
        # The assignment is kept in what "always" stores, so it covers what was asked.
        ("FOO=1 echo $(rm -rf x)", "FOO=1 echo *"),
        ("rm -rf x", "rm *"),
    ]


def test_bash_needs_empty_and_duplicates() -> None:
    assert bash_needs("") == []
    # A lone `;` is a syntax error to bash too: it asks, as the whole line.
    assert [(n.pattern, n.opaque) for n in bash_needs("  ;  ")] == [("  ;  ", True)]
    assert [n.pattern for n in bash_needs("ls && ls; ls -l")] == ["ls", "ls -l"]


def test_always_pattern_covers_the_command_it_came_from() -> None:
    from harness.permissions.wildcard import match

    for command in ["git checkout main", "make test", "sudo rm x", "python -m pytest -k x"]:
        for need in bash_needs(command):  # `sudo rm x` is also the need `rm x`
            assert match(need.always, need.pattern), command


def test_absurd_nesting_does_not_raise() -> None:
    command = "echo " + "$(" * 500 + "rm -rf x" + ")" * 500
    subs = split_commands(command)
    assert subs[0] == command
    assert len(subs) > 2
    assert not any(s.startswith("echo") for s in subs[1:])
