"""What a shell line will run, read with a real bash parser (tree-sitter-bash).

``analyze`` finds every simple command a line can start: the sub-commands of lists and
pipelines, every command substitution wherever it sits (arithmetic, double quotes, here-doc
bodies, ``${x:-$(cmd)}``, process substitution, ``[[ ]]``, array values, redirect targets),
function bodies, case arms, subshells and loops. Each command is normalized the way bash
will see it (quotes and escapes removed, ``$'…'`` decoded, assignments stripped), and the
commands that wrappers run (``env``, ``sudo``, ``xargs``, ``find -exec``, ``sh -c STR``,
``eval STR``…) are found inside them too. Redirection targets and ``tee`` files are
collected as writes.

What the text cannot tell is marked, never guessed: a word whose value only running it can
tell (``$X``, ``$(…)``, a glob, a brace expansion) is a hole; a command whose name is a hole
is opaque; a line the parser does not fully understand is ``unparseable``. The rule engine
turns those into asks and lets deny rules through (DESIGN §8).

tree-sitter-bash (MIT, the grammar OpenCode uses) is imported on the first analysis only,
so that ``harness --help`` never pays for it.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tree_sitter import Node

# Past this many nested `sh -c` / `eval` strings the line is called unparseable: a need that
# asks, never a RecursionError or a bypass.
_MAX_DEPTH = 12
# Node types this module understands. Anything else (a newer grammar's construct) makes the
# line unparseable, so it asks instead of being allowed on a partial reading.
_KNOWN = frozenset(
    {
        "program", "command", "command_name", "word", "number", "string", "string_content",
        "raw_string", "ansi_c_string", "translated_string", "concatenation",
        "simple_expansion", "expansion", "variable_name", "special_variable_name",
        "command_substitution", "process_substitution", "arithmetic_expansion",
        "binary_expression", "unary_expression", "postfix_expression", "ternary_expression",
        "parenthesized_expression", "subscript", "list", "pipeline", "redirected_statement",
        "file_redirect", "heredoc_redirect", "heredoc_start", "heredoc_body",
        "heredoc_content", "heredoc_end", "herestring_redirect", "file_descriptor",
        "variable_assignment", "variable_assignments", "array", "subshell",
        "compound_statement", "negated_command", "if_statement", "elif_clause",
        "else_clause", "while_statement", "for_statement", "c_style_for_statement",
        "do_group", "case_statement", "case_item", "function_definition", "test_command",
        "test_operator", "declaration_command", "unset_command", "comment", "regex",
        "extglob_pattern", "brace_expression",
    }
)  # fmt: skip
# Redirection operators that open their target for writing. `>&` and `<&` duplicate a
# descriptor when the target is a number or `-`, and `>& file` is `&> file`.
_WRITE_OPERATORS = frozenset({">", ">>", ">|", "&>", "&>>", ">&", "<>"})
_NOT_FILES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
# After one of these in the same line, a write target named by the text may be elsewhere
# by the time it is opened: the directory moved, or the path became a symlink.
_MOVES_PATHS = frozenset({"cd", "pushd", "popd", "ln", "mv", "cp", "rsync", "install"})
_SAFE_WORD = re.compile(r"[\w@%+=:,./-][\w@%+=:,./#-]*")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Word:
    """One word of a command: its value as the program receives it, when the text says."""

    value: str | None  # None: a hole, only running the line can tell
    source: str  # as written
    glob: str  # a wildcard pattern matching every value the word can take

    @property
    def text(self) -> str:
        if self.value is None:
            return self.source
        return self.value if _SAFE_WORD.fullmatch(self.value) else shlex.quote(self.value)


def _literal(value: str) -> Word:
    return Word(value, value, value)


_HOLE = Word(None, "?", "*")


@dataclass(frozen=True, slots=True)
class Command:
    """A simple command that will run: its words, normalized; redirections kept as text."""

    words: tuple[Word, ...]
    redirects: tuple[str, ...] = ()
    source: str = ""
    # `PATH=. ls` or `LD_PRELOAD=x ls` is not `ls`: allow rules see the assignments.
    assignments: tuple[str, ...] = ()

    @property
    def name(self) -> str | None:
        value = self.words[0].value
        return None if value is None else os.path.basename(value) or value

    @property
    def opaque(self) -> bool:
        """The command word is not a literal: the command could be anything."""
        return self.words[0].value is None

    @property
    def text(self) -> str:
        """What allow rules match: the words as bash passes them, the name as written,
        leading assignments kept."""
        return " ".join([*self.assignments, *(w.text for w in self.words), *self.redirects])

    @property
    def covers(self) -> str:
        """What deny rules are tried against: the name's basename, every hole a ``*``."""
        out = self.name if self.name is not None else "*"
        for word in self.words[1:]:
            # A hole may expand to no word at all, so it swallows the blank before it too.
            out += "*" if word.value is None else " " + word.glob
        return " ".join([out, *self.redirects])


@dataclass(frozen=True, slots=True)
class Analysis:
    commands: tuple[Command, ...]  # outer commands before those nested inside them
    writes: tuple[Word, ...]  # redirect and `tee` targets; a hole is a target nobody knows
    unparseable: bool  # the parser did not fully understand the line
    paths_may_move: bool  # a `cd`, `ln`, `mv`… (or an opaque command) may move targets


@dataclass
class _Found:
    commands: list[Command] = field(default_factory=list)
    writes: list[Word] = field(default_factory=list)
    unparseable: bool = False
    paths_may_move: bool = False


@lru_cache(maxsize=1)
def _parser() -> Any:
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


@lru_cache(maxsize=512)
def analyze(line: str) -> Analysis:
    """Everything ``line`` can run and write. Never raises."""
    found = _Found()
    try:
        _analyze_into(line, found, 0)
    except Exception:
        return Analysis(tuple(found.commands), tuple(found.writes), True, True)
    return Analysis(
        tuple(found.commands), tuple(found.writes), found.unparseable, found.paths_may_move
    )


def _analyze_into(line: str, found: _Found, depth: int) -> None:
    if depth > _MAX_DEPTH:
        found.unparseable = True
        return
    _walk(line, found, depth)
    # tree-sitter reads a backslash-newline inside a word (`r\<newline>m`) as a word break,
    # bash as nothing at all. Reading the joined text as well covers both readings.
    joined = line.replace("\\\n", "")
    if joined != line:
        _walk(joined, found, depth)


def _walk(line: str, found: _Found, depth: int) -> None:
    data = line.encode("utf-8", "surrogatepass")
    tree = _parser().parse(data)
    stack: list[Node] = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            found.unparseable = True
        elif node.is_named:
            kind = node.type
            if kind not in _KNOWN:
                found.unparseable = True
            elif kind == "command":
                _command(node, found, depth)
            elif kind == "file_redirect":
                _redirect(node, found)
            elif kind == "heredoc_body":
                _heredoc_backticks(node, found, depth)
            elif kind == "variable_assignment":
                _assignment(node, found, depth)
            elif kind == "heredoc_redirect" and not _heredoc_agrees(node):
                found.unparseable = True
            if kind in _LITERALS and (not node.named_children):
                _latent(node, found, depth)
        stack.extend(reversed(node.children))


# Literal text is data, until something evaluates it again: `x='a[$(rm v)]'; echo $((x))`
# runs rm (arithmetic evaluates subscripts), as do `[[ $x -eq 0 ]]`, `let`, `printf -v`,
# `${x@P}`, and a quoted here-doc read into a variable. Substitutions written in literal
# text are therefore checked as commands too (an ask, and deny rules see them).
_LITERALS = frozenset(
    {"raw_string", "ansi_c_string", "string_content", "word", "heredoc_content", "heredoc_body"}
)


def _latent(node: Node, found: _Found, depth: int) -> None:
    text = _text(node)
    if node.type == "ansi_c_string":
        text = _ansi_c(text[2:-1])
    if "$(" not in text and "`" not in text:
        return
    # No early way out for a plain word: the parser leaves `${x-`cmd`}` a leaf word whose
    # backticks bash still runs, so a leaf holding `$(` or a backtick is never trusted.
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    inner = _Found()
    _analyze_into(f': "{quoted}"', inner, depth + 1)
    # The `:` that carried the text is not a command of the line; whatever the text hid is.
    found.commands.extend(c for c in inner.commands[1:] if c.words)
    found.writes.extend(inner.writes)
    found.paths_may_move = found.paths_may_move or inner.paths_may_move


def _text(node: Node) -> str:
    return node.text.decode("utf-8", "surrogateescape") if node.text is not None else ""


# --- words ------------------------------------------------------------------------------


def word_of(node: Node) -> Word:
    value, glob = _evaluate(node)
    return Word(value, _text(node), glob)


def _evaluate(node: Node) -> tuple[str | None, str]:
    """``(value, glob)``: the value bash gives the word (None if unknown), and a pattern."""
    kind = node.type
    if kind in ("word", "number"):
        return _unquoted(_text(node))
    if kind == "raw_string":
        value = _text(node)[1:-1]
        return value, value
    if kind == "ansi_c_string":
        value = _ansi_c(_text(node)[2:-1])
        return value, value
    if kind in ("string", "translated_string"):
        value_parts: list[str] | None = []
        glob_parts: list[str] = []
        for child in node.named_children:
            if child.type == "string_content":
                piece = _double_quoted(_text(child))
                glob_parts.append(piece)
                if value_parts is not None:
                    value_parts.append(piece)
            else:
                value_parts = None
                glob_parts.append("*")
        return ("".join(value_parts) if value_parts is not None else None), "".join(glob_parts)
    if kind == "concatenation":
        values: list[str] | None = []
        globs: list[str] = []
        for child in node.named_children:
            part, part_glob = _evaluate(child)
            globs.append(part_glob)
            if part is None:
                values = None
            elif values is not None:
                values.append(part)
        # The grammar splits `{a,b}` and `[r]m` into pieces: look at the unquoted ones whole.
        shape = "".join(
            _text(c) if c.type == "word" else " " * len(_text(c)) for c in node.named_children
        )
        if _EXPANDS.search(shape):
            values = None
        return ("".join(values) if values is not None else None), "".join(globs)
    return None, "*"


# Unquoted, these expand: `/bin/r?` and `/bin/[r]m` may well be rm, `{rm,v}` is `rm v`.
# (`{}`, `[` alone and `x{y}` stay as written.)
_EXPANDS = re.compile(r"[*?]|\[[^\]]+\]|\{[^{}]*(?:,|\.\.)[^{}]*\}")


def _unquoted(text: str) -> tuple[str | None, str]:
    """An unquoted word: escapes removed; globs and brace expansions are holes."""
    out: list[str] = []
    shape: list[str] = []  # the word with escaped characters blanked, to look for globs
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            escaped = text[i + 1 : i + 2].replace("\n", "")
            out.append(escaped)
            shape.append(" " * len(escaped))
            i += 2
            continue
        out.append(c)
        shape.append(c)
        i += 1
    value = "".join(out)
    if _EXPANDS.search("".join(shape)):
        return None, re.sub(r"[\[\]{}]", "*", value)
    return value, value


_DQ_ESCAPE = re.compile(r"\\([$`\"\\\n])")


def _double_quoted(text: str) -> str:
    return _DQ_ESCAPE.sub(lambda m: "" if m.group(1) == "\n" else m.group(1), text)


_ANSI_ESCAPE = re.compile(
    r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|[0-7]{1,3}|c.|.)", re.DOTALL
)
_ANSI_SIMPLE = {
    "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r",
    "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?",
}  # fmt: skip


def _ansi_c(body: str) -> str:
    """The value of ``$'…'``, so that ``$'\\x72m'`` is ``rm``."""

    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        head = code[0]
        if head in "xuU" and len(code) > 1:
            try:
                return chr(int(code[1:], 16))
            except (ValueError, OverflowError):
                return ""
        if head in "01234567":
            return chr(int(code, 8) & 0xFF)
        if head == "c" and len(code) == 2:
            return chr(ord(code[1].upper()) & 0x1F)
        return _ANSI_SIMPLE.get(code, "\\" + code)

    return _ANSI_ESCAPE.sub(one, body)


# --- commands ---------------------------------------------------------------------------


def _command(node: Node, found: _Found, depth: int) -> None:
    name = node.child_by_field_name("name")
    if name is None:
        return  # assignments or redirections alone run nothing
    words = [word_of(child) for child in name.named_children] or [_HOLE]
    words += [word_of(child) for child in node.children_by_field_name("argument")]
    redirects = tuple(
        " ".join(_text(child).split())
        for child in node.named_children
        if child.type in ("file_redirect", "herestring_redirect")
    )
    assignments = tuple(
        _assignment_text(child)
        for child in node.named_children
        if child.type == "variable_assignment"
    )
    parent = node.parent
    if parent is not None and parent.type == "redirected_statement":
        for child in parent.children_by_field_name("redirect"):
            redirects += (_redirect_text(child),)
            # tree-sitter gives `echo a >f b` the destinations f and b; bash gives echo `b`.
            words += [word_of(extra) for extra in child.children_by_field_name("destination")[1:]]
    _add(Command(tuple(words), redirects, _text(node), assignments), found, depth)


# Variables whose value some program runs as a shell command line (git, man, ssh, bash).
_CODE_VARIABLES = frozenset(
    {
        "PAGER", "GIT_PAGER", "MANPAGER", "SYSTEMD_PAGER", "GIT_SSH_COMMAND", "GIT_EDITOR",
        "EDITOR", "VISUAL", "GIT_SEQUENCE_EDITOR", "GIT_EXTERNAL_DIFF", "GIT_ASKPASS",
        "SSH_ASKPASS", "PROMPT_COMMAND", "LESSOPEN", "LESSCLOSE",
    }
)  # fmt: skip


# Variables that change which program a command name runs, or load code into every
# program: after `PATH=.:$PATH` (with `ln -s /bin/rm ls` before it), `ls` may be rm.
_PROGRAM_VARIABLES = frozenset(
    {"PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "ENV", "BASH_LOADABLES_PATH"}
)


def _assignment(node: Node, found: _Found, depth: int) -> None:
    name = node.child_by_field_name("name")
    value = node.child_by_field_name("value")
    if name is None:
        return
    _assigned(_text(name), word_of(value) if value is not None else _literal(""), found, depth)


def _assigned(name: str, value: Word, found: _Found, depth: int) -> None:
    if name in _CODE_VARIABLES:
        _code([value], found, depth)
    elif name in _PROGRAM_VARIABLES:
        # What any later command name means is now unknown: an opaque need of its own.
        text = f"{name}={value.text}"
        _add(Command((Word(None, text, "*"),), (), text), found, depth)


def _assignment_text(node: Node) -> str:
    name = node.child_by_field_name("name")
    value = node.child_by_field_name("value")
    head = _text(name) if name is not None else ""
    return f"{head}={word_of(value).text if value is not None else ''}"


def _redirect_text(node: Node) -> str:
    if node.type == "heredoc_redirect":
        start = next((c for c in node.named_children if c.type == "heredoc_start"), None)
        return "<<" + (_text(start) if start is not None else "")
    return " ".join(_text(node).split())


def _add(command: Command, found: _Found, depth: int) -> None:
    """Record a command and everything it runs in turn (wrappers, shells, ``eval``)."""
    found.commands.append(command)
    if command.opaque or command.name in _MOVES_PATHS:
        found.paths_may_move = True
    if command.name == "tee":
        found.writes.extend(_operands(command.words[1:]))
    for inner in _inner(command, found, depth):
        if inner == (_HOLE,):
            # Could be anything: shown as the command that runs it.
            inner = (Word(None, command.text, "*"),)
        if inner:
            _add(Command(inner, (), command.source), found, depth)


def _redirect(node: Node, found: _Found) -> None:
    operator = next((_text(c) for c in node.children if not c.is_named), "")
    destinations = node.children_by_field_name("destination")
    if operator not in _WRITE_OPERATORS or not destinations:
        return
    target = word_of(destinations[0])
    duplicates = operator in (">&", "<&") and target.value is not None
    if duplicates and ((target.value or "").isdigit() or target.value == "-"):
        return  # 2>&1, >&2: a descriptor, not a file
    if target.value in _NOT_FILES:
        return
    found.writes.append(target)


def _heredoc_agrees(node: Node) -> bool:
    """Whether the grammar ends a here-doc where bash does. If it read past bash's end,
    commands bash runs would hide in the body; either way the line is not understood."""
    parts = {c.type: c for c in node.named_children}
    start, body = parts.get("heredoc_start"), parts.get("heredoc_body")
    end = parts.get("heredoc_end")
    if start is None or end is None:
        return False
    delimiter = re.sub(r"[\'\"\\]", "", _text(start))
    tabs = any(_text(c) == "<<-" for c in node.children if not c.is_named)

    def ends(line: str) -> bool:
        return (line.lstrip("\t") if tabs else line) == delimiter

    lines = _text(body).split("\n") if body is not None else []
    return ends(_text(end)) and not any(ends(line) for line in lines)


def _heredoc_backticks(node: Node, found: _Found, depth: int) -> None:
    """Backticks in a here-doc body that expands: the grammar leaves them as plain text."""
    redirect = node.parent
    start = next(
        (c for c in (redirect.named_children if redirect else []) if c.type == "heredoc_start"),
        None,
    )
    if start is None or any(q in _text(start) for q in "'\"\\"):
        return  # a quoted delimiter: the body is literal
    contents = [c for c in node.named_children if c.type == "heredoc_content"]
    # A body with nothing the grammar recognised is one leaf with no content children.
    for text in [_text(c) for c in contents] if node.named_children else [_text(node)]:
        pieces = re.split(r"(?<!\\)`", text)
        if len(pieces) % 2 == 0:
            found.unparseable = True  # an unclosed backtick
        for inner in pieces[1::2]:
            _analyze_into(inner, found, depth + 1)


def _operands(words: tuple[Word, ...] | list[Word]) -> list[Word]:
    """The non-option words (after ``--``, all of them)."""
    out: list[Word] = []
    options = True
    for word in words:
        if options and word.value == "--":
            options = False
        elif options and word.value is not None and word.value[:1] == "-" and word.value != "-":
            continue
        else:
            out.append(word)
    return out


# --- wrappers: commands that run other commands -----------------------------------------


def _after_options(
    words: tuple[Word, ...], start: int, takes_value: frozenset[str], *, assignments: bool = False
) -> int | None:
    """Index of the first word after the options (and ``NAME=value`` words); None if a
    hole sits where an option or the command could be."""
    i = start
    while i < len(words):
        value = words[i].value
        if value is None:
            return None
        if value == "--":
            return i + 1
        if assignments and _ASSIGNMENT.fullmatch(value):
            i += 1
        elif value.startswith("-") and value != "-":
            i += 2 if value in takes_value else 1
        else:
            return i
    return i


def _rest(words: tuple[Word, ...], index: int | None, skip: int = 0) -> tuple[Word, ...]:
    if index is None:
        return (_HOLE,)
    rest = words[index + skip :]
    return rest if index + skip <= len(words) else ()


def _opts(*names: str) -> frozenset[str]:
    return frozenset(names)


# Wrapper → options that take a separate value, and how many operands precede the command.
_WRAPPERS: dict[str, tuple[frozenset[str], int, bool]] = {
    "env": (_opts("-u", "--unset", "-C", "--chdir"), 0, True),
    "command": (_opts(), 0, False),
    "builtin": (_opts(), 0, False),
    "exec": (_opts("-a"), 0, False),
    "nice": (_opts("-n", "--adjustment"), 0, False),
    "timeout": (_opts("-s", "--signal", "-k", "--kill-after"), 1, False),
    "nohup": (_opts(), 0, False),
    "stdbuf": (_opts("-i", "-o", "-e", "--input", "--output", "--error"), 0, False),
    "ionice": (_opts("-c", "--class", "-n", "--classdata", "-p", "-P", "-u", "--pid"), 0, False),
    "time": (_opts("-f", "--format", "-o", "--output"), 0, False),
    "sudo": (
        _opts("-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-T", "-U", "--user", "--group",
              "--chdir", "--prompt", "--role", "--type", "--host", "--close-from",
              "--command-timeout", "--other-user"),
        0,
        True,
    ),
    "doas": (_opts("-u", "-C"), 0, False),
    "xargs": (
        _opts("-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s", "--arg-file", "--delimiter",
              "--eof", "--replace", "--max-lines", "--max-args", "--max-procs", "--max-chars",
              "--process-slot-var"),
        0,
        False,
    ),
    "setsid": (_opts(), 0, False),
    "chroot": (_opts(), 1, False),
    "taskset": (_opts(), 1, False),
    "unshare": (_opts(), 0, False),
    "nsenter": (_opts("-t", "--target"), 0, False),
    "busybox": (_opts(), 0, False),
    "coproc": (_opts(), 0, False),
    "flock": (_opts("-w", "--timeout", "-E", "--conflict-exit-code"), 1, False),
    "chrt": (_opts(), 1, False),
    "prlimit": (_opts("-p", "--pid"), 0, False),
    "systemd-run": (_opts("-p", "--property", "-u", "--unit", "-M", "--machine"), 0, False),
    "firejail": (_opts(), 0, False),
    "unbuffer": (_opts(), 0, False),
    "strace": (
        _opts("-o", "-e", "-p", "-s", "-u", "-E", "-a", "-b", "-I", "-O", "-S", "-P"), 0, False
    ),
    "ltrace": (_opts("-o", "-e", "-p", "-s", "-u", "-n", "-a", "-A", "-D", "-F", "-l"), 0, False),
    "numactl": (
        _opts("-i", "-m", "-N", "-C", "-p", "--interleave", "--membind",
              "--cpunodebind", "--physcpubind", "--preferred"),
        0,
        False,
    ),
    "fakeroot": (_opts("-s", "-i", "-l", "--lib", "--faked"), 0, False),
    "catchsegv": (_opts(), 0, False),
    "valgrind": (_opts(), 0, False),
    "xvfb-run": (_opts("-n", "--server-num", "-s", "--server-args", "-e", "--error-file",
                       "-f", "--auth-file", "-p", "--xauth-protocol"), 0, False),
    "faketime": (_opts("-m", "-f"), 1, False),
    "proxychains": (_opts("-f", "-q"), 0, False),
    "proxychains4": (_opts("-f", "-q"), 0, False),
    "torsocks": (_opts("-u", "-p", "-a", "-P"), 0, False),
    "nocache": (_opts(), 0, False),
}  # fmt: skip
# These run commands read from stdin or a file nobody can see from the line.
_RUN_HIDDEN_CODE = frozenset({"at", "batch"})
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "yash", "fish"})
_SHELL_VALUE_OPTIONS = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
_STDIN_PATHS = ("/dev/stdin", "/dev/fd/", "/proc/self/fd/", "-")
# git configuration whose value git runs as a command line (`!cmd` for an alias).
_GIT_COMMAND_KEY = re.compile(
    r"core\.(pager|editor|sshcommand|fsmonitor|askpass|hookspath)|sequence\.editor"
    r"|diff\.external|diff\..*\.(textconv|command)|filter\..*\.(clean|smudge|process)"
    r"|merge\..*\.driver|pager\..*|credential\..*|gpg\..*program|.*\.cmd|.*command"
    r"|uploadpack\.packobjectshook|alias\..*",
    re.IGNORECASE,
)


def _git_config(words: tuple[Word, ...], found: _Found, depth: int) -> None:
    """``git -c alias.x='!rm v' x``, ``git -c core.pager='rm v' log``: the value is code."""
    for i, word in enumerate(words[1:], start=1):
        if word.value == "-c":
            setting = words[i + 1] if i + 1 < len(words) else _HOLE
        elif word.value is not None and word.value.startswith("--config-env"):
            setting = _HOLE  # the value comes from the environment
        else:
            continue
        if setting.value is None:
            _code([_HOLE], found, depth)
            continue
        key, _, value = setting.value.partition("=")
        if _GIT_COMMAND_KEY.fullmatch(key):
            _code([_literal(value.removeprefix("!"))], found, depth)


def _inner(command: Command, found: _Found, depth: int) -> list[tuple[Word, ...]]:
    """The commands ``command`` runs itself; strings of code are analyzed into ``found``."""
    name, words = command.name, command.words
    if name is None:
        return []
    spec = _WRAPPERS.get(name)
    if name in ("env", "sudo", "export", "declare", "typeset", "local", "readonly"):
        for word in words[1:]:
            key, eq, value = (word.value or "").partition("=")
            if eq and _ASSIGNMENT.fullmatch(word.value or ""):
                _assigned(key, _literal(value), found, depth)
    if name in ("hash", "enable") and any(
        w.value is None or w.value.startswith(("-p", "-f")) for w in words[1:]
    ):
        return [(_HOLE,)]  # `hash -p /bin/rm ls`: the name ls now runs rm
    if spec is not None:
        takes_value, operands, assignments = spec
        if name == "env" and any(
            w.value is not None and (w.value.startswith("-S") or w.value.startswith("--split"))
            for w in words[1:]
        ):
            return [(_HOLE,)]  # `env -S 'rm x'` splits a string into a command
        if name == "flock" and any(w.value in ("-c", "--command") for w in words[1:]):
            return _code_after(words, ("-c", "--command"), found, depth)
        if name == "env":
            words = tuple(w for w in words if w.value != "-")  # `env -` is `env -i`
        index = _after_options(words, 1, takes_value, assignments=assignments)
        inner = _rest(words, index, operands)
        if name == "xargs" and index is not None:
            inner = _xargs(words[:index], inner)
        return [inner]
    if name in _SHELLS:
        return _shell(words, found, depth)
    if name in _RUN_HIDDEN_CODE:
        return [(_HOLE,)]
    if name == "alias":
        # `alias x='rm v'` then `x` on a later line runs rm (with expand_aliases).
        for word in words[1:]:
            if word.value is None:
                return [(_HOLE,)]
            if "=" in word.value:
                _code([_literal(word.value.partition("=")[2])], found, depth)
    elif name in ("source", "."):
        script = _operands(words[1:])[:1]
        if script and (script[0].value is None or script[0].value.startswith(_STDIN_PATHS)):
            return [(_HOLE,)]  # code from a pipe nobody can see
    elif name == "git":
        _git_config(words, found, depth)
    if name in ("su", "runuser", "script", "sg"):
        if name == "sg" and len(_operands(words[1:])) > 1 and not any(
            w.value in ("-c",) for w in words[1:]
        ):
            _code(_operands(words[1:])[1:2], found, depth)  # `sg GROUP CMD`: CMD is code
        return _code_after(words, ("-c", "--command"), found, depth)
    if name in ("compgen", "complete", "mapfile", "readarray"):
        return _code_after(words, ("-C",), found, depth)  # -C CMD: a command they run
    if name == "ssh":
        # `ssh host CMD…`: the words are joined and run by a shell, maybe this machine's.
        index = _after_options(words, 1, _SSH_VALUE_OPTIONS)
        rest = _rest(words, index)
        _code(rest[1:], found, depth)
        return []
    if name == "parallel":
        index = _after_options(words, 1, _opts("-j", "--jobs", "-S", "--sshlogin", "-a"))
        rest = _rest(words, index)
        cut = next((i for i, w in enumerate(rest) if w.value in (":::", "::::")), len(rest))
        return [(*rest[:cut], _HOLE)] if rest[:cut] else [(_HOLE,)]
    if name == "eval":
        _code(words[1:], found, depth)
    elif name == "watch":
        index = _after_options(words, 1, _opts("-n", "--interval", "-d", "-q"))
        _code(_rest(words, index), found, depth)
    elif name == "trap":
        handler = _operands(words[1:])[:1]
        if handler and handler[0].value not in ("-", ""):
            _code(handler, found, depth)
    elif name == "find":
        return _find(words)
    return []


_SSH_VALUE_OPTIONS = _opts(
    "-b", "-c", "-D", "-E", "-e", "-F", "-I", "-i", "-J", "-L", "-l", "-m", "-O", "-o", "-p",
    "-Q", "-R", "-S", "-W", "-w", "-B",
)  # fmt: skip


def _xargs(options: tuple[Word, ...], inner: tuple[Word, ...]) -> tuple[Word, ...]:
    """What xargs runs: the command given, with words from stdin where it puts them.

    Without a command it runs ``echo``. With ``-I R`` (``-i``, ``--replace``) each word
    holding R is replaced; otherwise the stdin words are appended, so ``xargs env`` or
    ``xargs sh -c`` runs a command nobody can see.
    """
    if not inner:
        return ()
    replace: str | None = None
    for i, word in enumerate(options):
        value = word.value or ""
        if value == "-I" and i + 1 < len(options):
            replace = options[i + 1].value
        elif value.startswith("-I") and len(value) > 2:
            replace = value[2:]
        elif value in ("-i", "--replace"):
            replace = "{}"
        elif value.startswith(("-i", "--replace=")):
            replace = value.partition("=")[2] if "=" in value else value[2:]
    if replace is None:
        return (*inner, _HOLE)
    return tuple(_HOLE if replace in (w.value or "") else w for w in inner)


def _code(words: tuple[Word, ...] | list[Word], found: _Found, depth: int) -> None:
    """Words joined and run as shell code (``eval``, ``sh -c``): analyzed in turn."""
    if not words:
        return
    if any(w.value is None for w in words):
        source = " ".join(w.source for w in words)
        _add(Command((Word(None, source, "*"),), (), source), found, depth)
        return
    _analyze_into(" ".join(w.value or "" for w in words), found, depth + 1)


def _code_after(
    words: tuple[Word, ...], flags: tuple[str, ...], found: _Found, depth: int
) -> list[tuple[Word, ...]]:
    for i, word in enumerate(words[1:], start=1):
        value = word.value
        if value is None:
            return [(_HOLE,)]
        if value in flags or ("-c" in flags and re.fullmatch(r"-[A-Za-z]*c", value)):
            _code(words[i + 1 : i + 2] or [_HOLE], found, depth)
        elif any(value.startswith(f + "=") for f in flags if f.startswith("--")):
            _code([_literal(value.partition("=")[2])], found, depth)
    return []


def _shell(words: tuple[Word, ...], found: _Found, depth: int) -> list[tuple[Word, ...]]:
    """``bash -c STR``: STR is analyzed. Without ``-c`` and a script the shell reads its
    code from stdin, which nobody can see: an opaque command. A script file is a program
    like any other (DESIGN §8 says what patterns cannot stop)."""
    inline = False
    i = 1
    while i < len(words):
        value = words[i].value
        if value is None:
            return [(_HOLE,)]
        if value == "--":
            i += 1
            break
        if value in _SHELL_VALUE_OPTIONS:
            i += 2
            continue
        if value[:1] in "-+" and len(value) > 1:
            if value[:1] == "-" and not value.startswith("--") and "c" in value[1:]:
                inline = True
            if value[:1] == "-" and not value.startswith("--") and "s" in value[1:]:
                return [(_HOLE,)]  # -s: commands from stdin
            i += 1
            continue
        break
    if inline:
        _code(words[i : i + 1] or [_HOLE], found, depth)
        return []
    return [] if i < len(words) else [(_HOLE,)]


def _find(words: tuple[Word, ...]) -> list[tuple[Word, ...]]:
    inner: list[tuple[Word, ...]] = []
    starts: list[Word] = []
    i = 1
    while i < len(words) and (value := words[i].value) is not None:
        if value.startswith("-") or value in ("(", "!", ")"):
            break
        starts.append(words[i])
        i += 1
    while i < len(words):
        word = words[i]
        if word.value in _FIND_EXEC:
            end = i + 1
            while end < len(words) and words[end].value not in (";", "+"):
                end += 1
            # find puts each file name where `{}` is: `-exec {} v \;` runs what it finds.
            run = tuple(_HOLE if "{}" in (w.value or "") else w for w in words[i + 1 : end])
            inner.append(run or (_HOLE,))
            i = end
        elif word.value == "-delete":
            # find's own deletion is `rm` as far as any deny rule is concerned.
            inner.append((_literal("rm"), *starts))
        i += 1
    return inner
