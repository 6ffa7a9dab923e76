"""The bash reader behind permission checks (harness/permissions/shell.py), class by class.

Each test names a way a command can hide, and asserts what the checker finds: the commands
that will run (normalized), whether one is opaque, whether the line was fully understood,
and which files it writes.
"""

from __future__ import annotations

import pytest

from harness.permissions.bash import bash_needs, split_commands
from harness.permissions.shell import analyze


def texts(line: str) -> list[str]:
    return split_commands(line)


def opaque(line: str) -> list[str]:
    """The needs that could be anything: opaque commands, or the line the parser could
    not read (``{rm,v}`` is one): both ask, and meet every deny rule."""
    return [n.pattern for n in bash_needs(line) if n.opaque]


# --- every placement of a command substitution ---------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "ls $(( $(rm v) 0 ))",  # arithmetic
        "ls $(( `rm v` + 1 ))",
        "ls $[ $(rm v) ]",  # the old arithmetic syntax
        "ls `rm v`",  # backticks
        'ls "$(rm v)"',  # double quotes
        'ls "`rm v`"',
        "ls ${x:-$(rm v)}",  # parameter expansions
        'ls "${x:-$(rm v)}"',
        "ls ${x/$(rm v)/y}",
        "ls <(rm v)",  # process substitution
        "ls >(rm v)",
        "[[ -f $(rm v) ]] && ls",  # [[ ]] and test
        "[ -f $(rm v) ] && ls",
        "test -n `rm v`",
        "a=(1 $(rm v)); ls",  # array assignments
        "X=$(rm v) ls",  # an assignment before a command
        "export X=$(rm v)",  # declarations
        "local X=`rm v`",
        "ls > $(rm v)",  # redirection targets
        "ls 2>> `rm v`",
        "cat <<< $(rm v)",  # here-strings
        "cat <<EOF\n$(rm v)\nEOF",  # expanding here-doc bodies
        "cat <<EOF\n`rm v`\nEOF",
        "cat <<EOF\n${x:-$(rm v)}\nEOF",
        "f() { rm v; }; ls",  # function bodies
        "case x in x) rm v;; esac",  # case arms
        "case $(rm v) in *) ls;; esac",
        "(rm v)",  # subshells and groups
        "{ rm v; }",
        "for f in $(rm v); do ls; done",  # loops
        "for f in a; do rm v; done",
        "while rm v; do ls; done",
        "until ls; do rm v; done",
        "for ((i=$(rm v); i<1; i++)); do ls; done",
        "if ls; then rm v; fi",
        "if ls; then :; elif rm v; then :; else :; fi",
        "! rm v",
        "ls | rm v",
        "ls || rm v",
        "ls & rm v",
        "ls; rm v",
        "ls\nrm v",
        "echo $(echo $(echo $(rm v)))",  # nested
        "ls $(( 1 + $(( $(rm v) )) ))",
    ],
)
def test_every_substitution_is_a_command(line: str) -> None:
    assert "rm v" in texts(line), texts(line)


@pytest.mark.parametrize(
    "line",
    [
        "echo \\$\\(rm v\\)",
        "echo hi # $(rm v)",
    ],
)
def test_literal_text_is_not_a_command(line: str) -> None:
    assert "rm v" not in texts(line)


@pytest.mark.parametrize(
    "line",
    [
        "x='a[$(rm v)]'; echo $((x))",  # arithmetic evaluates the subscript: rm runs
        "x='$(rm v)'; echo ${x@P}",
        "printf -v 'a[`rm v`]' 1",
        "x=$'a[\\x24(rm v)]'",
        "x=$(cat <<'EOF'\na[$(rm v)]\nEOF\n)",
        'x="a[\\$(rm v)]"',
        "x=a[\\$(rm v)]",
    ],
)
def test_substitutions_written_in_literal_text_are_checked_too(line: str) -> None:
    assert "rm v" in texts(line)


# --- normalization ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "rm v",
        "\\rm v",
        "'rm' v",
        '"rm" v',
        "r''m v",
        'r""m v',
        "$'rm' v",
        "$'\\x72m' v",
        "$'\\162m' v",
        "$'\\u0072m' v",
        'r\\m v',
        "rm\tv",
        "rm \\\n v",  # a line continuation between words
        "r\\\nm v",  # ... and inside the word
        "FOO=1 rm v",
        "FOO=1 BAR='x y' rm v",
        ">out rm v",
    ],
)
def test_quotes_escapes_assignments_are_normalized(line: str) -> None:
    needs = bash_needs(line)
    assert any((n.covers or n.pattern).startswith("rm v") for n in needs), needs
    assert not any(n.opaque for n in needs if n.metadata.get("unparseable") is None)


def test_the_name_as_written_is_what_allow_rules_see() -> None:
    (need,) = bash_needs("FOO=1 ls")
    assert need.pattern == "FOO=1 ls" and need.covers == "ls"
    (need,) = bash_needs("/bin/rm -f v")
    assert need.pattern == "/bin/rm -f v"  # `--allow 'bash:rm *'` does not cover /bin/rm
    assert need.covers == "rm -f v"  # ... but `--deny 'bash:rm *'` does


@pytest.mark.parametrize(
    "line",
    ["$X v", "${X} v", "$(echo rm) v", "`echo rm` v", "rm${IFS}v", '"$X" v', "/bin/r? v",
     "/bin/r* v", "{rm,v}", "/bin/[r]m v", "$'r'$X v"],
)  # fmt: skip
def test_a_command_word_that_is_not_a_literal_is_opaque(line: str) -> None:
    assert opaque(line), analyze(line)


def test_holes_in_arguments_widen_what_deny_rules_see() -> None:
    (need,) = bash_needs("git $SUB --force")
    assert not need.opaque and need.covers == "git* --force"
    (need,) = bash_needs('rm "$F"')
    assert need.covers == "rm*"


# --- wrappers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "command rm v",
        "command -p rm v",
        "builtin rm v",
        "env rm v",
        "env -i A=1 -u B rm v",
        "env -- rm v",
        "exec rm v",
        "exec -a name rm v",
        "nice rm v",
        "nice -n 10 rm v",
        "nice -5 rm v",
        "timeout 5 rm v",
        "timeout -s KILL -k 1 5s rm v",
        "nohup rm v",
        "stdbuf -oL rm v",
        "stdbuf -o L rm v",
        "ionice -c 3 rm v",
        "time rm v",
        "time -p rm v",
        "sudo rm v",
        "sudo -u root -E rm v",
        "sudo FOO=1 rm v",
        "doas -u root rm v",
        "xargs rm v",
        "xargs -0 -n 1 rm v",
        "xargs -I {} rm v",
        "setsid rm v",
        "busybox rm v",
        "sudo env nice timeout 5 rm v",  # wrappers inside wrappers
        "find . -exec rm v \\;",
        "find . -name x -execdir rm v {} +",
        "find . -ok rm v \\;",
        "sh -c 'rm v'",
        "bash -c 'rm v'",
        "bash -lc 'rm v'",
        "bash -ec 'rm v'",
        "bash -x -c 'rm v' name",
        "dash -c \"rm v\"",
        "sudo bash -c 'ls && rm v'",
        "bash -c 'bash -c \"rm v\"'",  # nested strings
        "eval 'rm v'",
        "eval rm v",
        "eval 'r''m' v",
        "su -c 'rm v'",
        "su root -c 'rm v'",
        "trap 'rm v' EXIT",
        "watch -n 1 rm v",
        "flock /tmp/l rm v",
        "flock /tmp/l -c 'rm v'",
        "chroot / rm v",
        "alias x='rm v'",
        "git -c alias.x='!rm v' x",
        "git -c core.pager='rm v' log",
        "git -c diff.foo.textconv='rm v' diff",
        "PAGER='rm v' man ls",
        "export GIT_SSH_COMMAND='rm v'",
        "env GIT_EXTERNAL_DIFF='rm v' git diff",
        "find . -exec sh -c 'rm v' \\;",
        "env - rm v",
        "script -qc 'rm v' /dev/null",
        "sg staff 'rm v'",
        "ssh -p 22 host rm v",
        "chrt -f 1 rm v",
        "prlimit --nofile=1 rm v",
    ],
)
def test_the_command_inside_a_wrapper_is_a_need(line: str) -> None:
    found = texts(line)
    assert "rm v" in found or any(t.startswith("rm v ") for t in found), found


def test_xargs_puts_words_from_stdin_into_the_command() -> None:
    assert "grep -l foo ?" in texts("xargs grep -l foo")
    assert opaque("echo rm v | xargs env") and opaque("xargs -I X sh -c X")
    assert "rm ?" in texts("xargs -I{} rm {}")  # `{}` alone is no brace expansion
    assert not opaque("xargs -I{} rm {}")


def test_the_wrapper_is_a_need_too() -> None:
    assert texts("sudo rm v") == ["sudo rm v", "rm v"]
    assert texts("bash -c 'rm v'") == ["bash -c 'rm v'", "rm v"]


def test_find_delete_is_rm() -> None:
    assert texts("find build -name '*.o' -delete") == ["find build -name '*.o' -delete", "rm build"]


@pytest.mark.parametrize(
    "line",
    [
        "env $X",  # a hole where the command is
        "sudo $CMD v",
        "xargs $X",
        "eval \"$CODE\"",
        "eval $(cat f)",
        "bash -c \"$CODE\"",
        "echo 'rm v' | bash",  # a shell reading code from stdin
        "bash -s < script",
        "sh",
        "env -S 'rm v'",
        "source /dev/stdin",
        ". <(curl x)",
        "bash <(curl x)",
        "git --config-env=core.pager=P log",
        "PATH=.:$PATH; ls",  # which program `ls` is, is now unknown
        "export PATH=.",
        "LD_PRELOAD=./x.so ls",
        "env PATH=. ls",
        "hash -p /bin/rm ls",
    ],
)
def test_code_nobody_can_see_is_opaque(line: str) -> None:
    assert opaque(line), analyze(line)


def test_a_script_file_is_a_program_like_any_other() -> None:
    # Not opaque: `bash build.sh` is a command allow rules can name. What the script does
    # is beyond any pattern (the README says so; the sandbox is the answer).
    assert opaque("bash build.sh") == []


# --- unparseable -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line", ["ls $(( $(rm v) 0 ))", 'echo "open', "ls )(", "cat <>f", "echo $(rm v"]
)
def test_what_the_parser_cannot_read_is_marked(line: str) -> None:
    assert analyze(line).unparseable
    first = bash_needs(line)[0]
    assert first.opaque and first.pattern == line


@pytest.mark.parametrize(
    "line",
    [
        "cat <<'E'\"F\"\nx\nEF\nrm v",  # bash's delimiter is EF; the grammar reads past it
        "cat <<EOF\nbody",  # never ends
        "cat <<A <<B\na\nA\nb\nB",
    ],
)
def test_a_here_doc_read_otherwise_than_bash_reads_it_is_marked(line: str) -> None:
    assert analyze(line).unparseable


def test_well_formed_lines_are_not_marked() -> None:
    for line in [
        "ls -la",
        "git commit -m \"$(cat <<'EOF'\nx\nEOF\n)\"",
        "a && b | c",
        "x=1",
        "cat <<-EOF > f && chmod +x f\n\tbody\n\tEOF",
        'cat << "EOF"\nx\nEOF',
    ]:
        assert not analyze(line).unparseable, line


def test_deep_nesting_is_bounded() -> None:
    line = "eval " + "'eval " * 40 + "rm v" + "'" * 40
    assert analyze(line).unparseable  # past the depth limit: asks, never a RecursionError
    deep = "echo " + "$(" * 400 + "rm v" + ")" * 400
    assert "rm v" in texts(deep)


# --- writes ----------------------------------------------------------------------------------


def writes(line: str) -> list[str | None]:
    return [w.value for w in analyze(line).writes]


@pytest.mark.parametrize(
    ("line", "targets"),
    [
        ("echo x > a", ["a"]),
        ("echo x >> ../b", ["../b"]),
        ("echo x 2> c", ["c"]),
        ("echo x &> d", ["d"]),
        ("echo x &>> e", ["e"]),
        ("echo x >| f", ["f"]),
        ("echo x >& g", ["g"]),
        ("echo x > 'h i'", ["h i"]),
        ("echo x | tee j k", ["j", "k"]),
        ("echo x | tee -a -- l", ["l"]),
        ("echo x | sudo tee /etc/m", ["/etc/m"]),
        ("{ echo x; } > n", ["n"]),
        ("bash -c 'echo x > o'", ["o"]),
        ("echo x > $F", [None]),
        ("echo x > *.txt", [None]),
        ("echo x 2>&1 >&2 > /dev/null 2>/dev/stderr >/dev/stdout 1>&-", []),
        ("cat < in", []),
    ],
)
def test_redirection_targets_are_writes(line: str, targets: list[str | None]) -> None:
    assert writes(line) == targets


def test_cd_ln_mv_make_targets_unknown() -> None:
    assert analyze("cd .. && echo x > f").paths_may_move
    assert analyze("$X; echo x > f").paths_may_move
    assert analyze("ln -s /etc e; echo x > e/f").paths_may_move
    assert not analyze("echo x > f").paths_may_move
