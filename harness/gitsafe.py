"""The one way harness runs git itself: never a program the repository chose.

A repository's own configuration (``.git/config``, anything it includes) and its
``.gitattributes`` are written by whoever wrote the repository — and in a session, by the
model, through ``edit``. Git runs programs named there: a ``git status`` in the
environment block would otherwise run ``core.fsmonitor = "echo pwned >> PWNED"`` with the
user's rights, whatever the bash rules say. So every git process harness starts (today
``rev-parse`` and ``status`` for the environment block, ``harness/context/system.py``)
goes through ``run_git``, which overrides each setting git 2.39 would run a program from
while reading a repository (command-line ``-c`` options beat every config file):

================================  ========================================================
``core.fsmonitor=false``          the fsmonitor hook, run by ``status`` and any index refresh
``core.hooksPath=/dev/null``      hooks (``post-index-change`` runs when status rewrites
                                  the index; hooks of any later command)
``--no-optional-locks``           status never rewrites the index, so no index hooks and no
                                  write into the repository at all
``core.pager=cat``, ``--no-pager``  the pager (also ``GIT_PAGER=cat``, ``PAGER=cat``)
``pager.<cmd>``                   not consulted under ``--no-pager``
``diff.external=``                an external diff program (``GIT_EXTERNAL_DIFF`` removed);
                                  diff commands also get ``--no-ext-diff --no-textconv``
                                  (``diff.<driver>.textconv`` / ``.command``)
``filter.<name>.clean/smudge/     clean filters run when ``status`` re-reads a tracked file
process=``, ``.required=false``   whose stat data is stale. Driver names are the
                                  repository's choice, so they are read first with
                                  ``git config --get-regexp`` (which runs nothing) and each
                                  one found is emptied: an empty command means "no filter"
``core.sshCommand=false``,        any transport (a partial clone fetches missing objects
``protocol.allow=never``          lazily, through ssh or a remote helper), with
                                  ``GIT_SSH``/``GIT_SSH_COMMAND`` set to ``false``
``credential.helper=``            credential helpers (an empty value resets the list)
``core.askPass=``                 askpass programs (``GIT_ASKPASS``/``SSH_ASKPASS`` removed)
``core.editor=true``,             editors, should anything ever want one
``sequence.editor=true``
``gpg.program=false``, ...        signature checks (``log.showSignature=false``)
``status.submoduleSummary=false`` status would run git in each submodule, whose config is
``--ignore-submodules=all``       just as repository-controlled
================================  ========================================================

The environment is rebuilt too: every ``GIT_*`` variable of the caller is dropped (a
``GIT_DIR``, ``GIT_CONFIG_PARAMETERS`` or ``GIT_TRACE2_EVENT`` inherited from a hook of
another program would change what runs), then ``GIT_CONFIG_NOSYSTEM=1``,
``GIT_TERMINAL_PROMPT=0``, ``GIT_PAGER=cat`` and ``GIT_OPTIONAL_LOCKS=0`` are set. The
user's global ``~/.gitconfig`` still applies (it is the user's, not the repository's),
but every override above wins over it as well. stdin is empty, so nothing can prompt.

The filter listing costs one more short git process (~2 ms) for each command that may read
file contents; ``rev-parse`` and ``config`` never do, and skip it.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

# Settings git would run a program from, emptied or disabled (see the module docstring).
SAFE_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", "true"),
    ("sequence.editor", "true"),
    ("core.askPass", ""),
    ("core.sshCommand", "false"),
    ("core.gitProxy", ""),
    ("protocol.allow", "never"),
    ("credential.helper", ""),
    ("diff.external", ""),
    ("gpg.program", "false"),
    ("gpg.ssh.program", "false"),
    ("gpg.x509.program", "false"),
    ("log.showSignature", "false"),
    ("status.submoduleSummary", "false"),
    ("submodule.recurse", "false"),
)

# Commands that could produce a diff: they also get the flags that refuse external
# diff programs and textconv drivers.
_DIFF_COMMANDS = frozenset({"diff", "log", "show"})
_DIFF_FLAGS = ("--no-ext-diff", "--no-textconv")
_FILTER_KEY = re.compile(r"^filter\.(.+)\.(clean|smudge|process|required)$", re.IGNORECASE)
TIMEOUT = 10.0  # seconds: a git that hangs (a huge tree, a stuck filesystem) is given up


@dataclass(frozen=True, slots=True)
class GitResult:
    returncode: int
    stdout: str
    stderr: str


def git_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without any ``GIT_*`` variable, plus harness's own."""
    env = {
        name: value
        for name, value in (os.environ if base is None else base).items()
        if not name.startswith("GIT_") and name not in ("SSH_ASKPASS", "PAGER")
    }
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_PAGER="cat",
        PAGER="cat",
        GIT_OPTIONAL_LOCKS="0",
        GIT_SSH="false",
        GIT_SSH_COMMAND="false",
        GIT_ASKPASS="",
    )
    return env


def _config_args(pairs: Sequence[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    for key, value in pairs:
        out += ["-c", f"{key}={value}"]
    return out


def base_command() -> list[str]:
    """``git`` with every fixed override, before any driver-specific one."""
    return ["git", "--no-pager", "--no-optional-locks", *_config_args(SAFE_CONFIG)]


def filter_drivers(config_listing: str) -> list[str]:
    """The filter driver names a ``git config --name-only --get-regexp`` listing defines."""
    names: dict[str, None] = {}
    for line in config_listing.splitlines():
        found = _FILTER_KEY.match(line.strip())
        if found:
            names[found.group(1)] = None
    return list(names)


async def _spawn(argv: list[str], directory: Path, env: dict[str, str]) -> GitResult | None:
    try:
        with trio.move_on_after(TIMEOUT) as scope:
            result = await trio.run_process(
                argv,
                cwd=directory,
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                stdin=b"",
            )
    except OSError:  # git is not installed, or the directory is gone
        return None
    if scope.cancelled_caught:
        return None
    return GitResult(
        result.returncode,
        result.stdout.decode("utf-8", "replace"),
        result.stderr.decode("utf-8", "replace"),
    )


# Reading config runs nothing: no filter, no hook, no fsmonitor is consulted for it.
_LIST_FILTERS = ("config", "--name-only", "--get-regexp", r"^filter\.")
# Commands that never read file contents, so never a filter: no need to list drivers.
_NO_CONTENT = frozenset({"rev-parse", "config"})


def _filter_overrides(listing: GitResult | None) -> list[str]:
    if listing is None or listing.returncode != 0:
        return []  # exit 1: no such keys (or not a repository: then nothing can run either)
    pairs: list[tuple[str, str]] = []
    for name in filter_drivers(listing.stdout):
        pairs += [
            (f"filter.{name}.clean", ""),
            (f"filter.{name}.smudge", ""),
            (f"filter.{name}.process", ""),
            (f"filter.{name}.required", "false"),
        ]
    return _config_args(pairs)


def _argv(filters: GitResult | None, args: Sequence[str]) -> list[str]:
    argv = [*base_command(), *_filter_overrides(filters)]
    if not args:
        return argv
    command, rest = args[0], list(args[1:])
    if command in _DIFF_COMMANDS:
        rest = [*_DIFF_FLAGS, *rest]
    if command == "status":
        rest = ["--ignore-submodules=all", *rest]
    return [*argv, command, *rest]


async def run_git(directory: Path, *args: str) -> GitResult | None:
    """Run ``git ARGS`` in ``directory`` with every repository-chosen program disabled.

    None when git cannot be started or takes longer than ``TIMEOUT``; otherwise the exit
    code and output, whatever they are.
    """
    env = git_environment()
    filters = None
    if not args or args[0] not in _NO_CONTENT:
        filters = await _spawn([*base_command(), *_LIST_FILTERS], directory, env)
    return await _spawn(_argv(filters, args), directory, env)


def _spawn_sync(argv: list[str], directory: Path, env: dict[str, str]) -> GitResult | None:
    try:
        done = subprocess.run(
            argv,
            cwd=directory,
            env=env,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return GitResult(
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def run_git_sync(directory: Path, *args: str) -> GitResult | None:
    """``run_git`` for code outside Trio (benchmark scripts labelling their results)."""
    env = git_environment()
    filters = None
    if not args or args[0] not in _NO_CONTENT:
        filters = _spawn_sync([*base_command(), *_LIST_FILTERS], directory, env)
    return _spawn_sync(_argv(filters, args), directory, env)


async def git_output(directory: Path, *args: str) -> str | None:
    """The stdout of a successful ``run_git``, or None."""
    result = await run_git(directory, *args)
    if result is None or result.returncode != 0:
        return None
    return result.stdout
