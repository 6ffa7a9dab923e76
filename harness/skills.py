"""Skills (DESIGN §12): folders with a ``SKILL.md`` (the Agent Skills format).

Found, nearest first, in ``.harness/skills/``, ``.agents/skills/`` and ``.claude/skills/``
of every folder from the session directory up to the repository root (outside a
repository, the session directory's), then in ``$XDG_CONFIG_HOME/harness/skills/``
(default ``~/.config/harness/skills/``). A name found twice is the nearest one's.

A ``SKILL.md`` whose front matter lacks ``name`` or ``description``, does not parse, or is
not a file of reasonable size is a ``Problem``: reported (an event and a log line, by the
turn that finds it) and skipped, never fatal. What a hostile repository or model could
try is decided here:

- a name must be a plain word (letters, digits, ``-``, ``_``, ``.``; no ``/``, no ``..``),
  and the tool only ever looks a name up in the discovered list, never builds a path;
- a project skill whose folder or ``SKILL.md`` resolves (through a symlink) outside the
  repository it was found in is skipped as a problem: a cloned repository must not make
  the model read a file elsewhere on the machine through the skill tool. Global skills
  are the user's own, and may be symlinks to anywhere.

Parsed front matter is kept per process by (mtime, size, inode), so a turn re-reads only
what changed, and a project without skills never imports YAML.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from harness import frontmatter
from harness.project import FolderLook, project_chain

SKILL_FOLDERS = (".harness/skills", ".agents/skills", ".claude/skills")
SKILL_FILE = "SKILL.md"
SKILL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_SKILL_BYTES = 1_000_000  # a SKILL.md is instructions, not data
MAX_DESCRIPTION = 1024  # the Agent Skills limit; longer ones are cut in the tool's list


# NamedTuples, not dataclasses: this module loads with every run, and a dataclass costs
# ten times as much to create at import.
class Skill(NamedTuple):
    name: str
    description: str
    folder: str  # resolved: where the model reads the files the skill ships
    file: str  # its SKILL.md, resolved
    scope: str  # "project" or "global"


class Problem(NamedTuple):
    """A SKILL.md that was skipped, and why."""

    file: str
    reason: str


_Signature = tuple[int, int, int]
_PARSED: dict[str, tuple[_Signature, tuple[str, str] | str]] = {}  # (name, description) or why


def global_folder(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "harness" / "skills"


def _roots(directory: Path, environ: Mapping[str, str] | None) -> list[tuple[Path, Path | None]]:
    """Each skills folder that exists, nearest first, with the folder its project skills
    must stay inside (None for the global one)."""
    chain = project_chain(directory)
    top = chain[-1] if chain else None
    roots: list[tuple[Path, Path | None]] = []
    for folder in chain:
        for relative in SKILL_FOLDERS:
            candidate = folder / relative
            if candidate.is_dir():
                roots.append((candidate, top))
    candidate = global_folder(environ)
    if candidate.is_dir():
        roots.append((candidate, None))
    return roots


# The first folder of each of SKILL_FOLDERS: a folder with none of them holds no skills.
_SKILL_TOPS = tuple(relative.split("/")[0] for relative in SKILL_FOLDERS)


def has_skill_folders(
    directory: str, look: FolderLook, environ: Mapping[str, str] | None = None
) -> bool:
    """Whether any folder ``discover`` reads exists for a session in ``directory``:
    without one there is nothing to find, and a turn need not hand it to a thread."""
    for folder in look.chain(directory):
        if look.missing(folder, _SKILL_TOPS):
            continue
        if any(os.path.isdir(os.path.join(folder, relative)) for relative in SKILL_FOLDERS):
            return True
    env = os.environ if environ is None else environ
    # ``global_folder`` in strings; its last part, "skills", is looked up in its parent.
    parent = os.path.join(env.get("XDG_CONFIG_HOME") or _home_config(), "harness")
    return not look.missing(parent, ("skills",)) and os.path.isdir(os.path.join(parent, "skills"))


def _home_config() -> str:
    return os.path.join(os.path.expanduser("~"), ".config")  # Path.home(), in strings


def _front(path: str, info: os.stat_result) -> tuple[str, str] | str:
    """(name, description) of one SKILL.md, or the reason it is skipped."""
    signature = (info.st_mtime_ns, info.st_size, info.st_ino)
    cached = _PARSED.get(path)
    if cached is not None and cached[0] == signature:
        return cached[1]
    result: tuple[str, str] | str
    if info.st_size > MAX_SKILL_BYTES:
        result = f"larger than {MAX_SKILL_BYTES} bytes"
    else:
        try:
            data, _ = frontmatter.read_cached(Path(path), info, body=False)
        except frontmatter.FrontMatterError as error:
            result = str(error)
        else:
            name, description = data.get("name"), data.get("description")
            if not isinstance(name, str) or not name.strip():
                result = "the front matter has no 'name'"
            elif not isinstance(description, str) or not description.strip():
                result = "the front matter has no 'description'"
            elif not SKILL_NAME.fullmatch(name.strip()):
                result = f"name {name[:80]!r}: use letters, digits, '-', '_' or '.'"
            else:
                result = (name.strip(), " ".join(description.split()))
    _PARSED[path] = (signature, result)
    return result


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def discover(
    directory: Path, environ: Mapping[str, str] | None = None
) -> tuple[list[Skill], list[Problem]]:
    """The skills a session in ``directory`` can load, by name, and the files skipped."""
    found: dict[str, Skill] = {}
    problems: list[Problem] = []
    for root, top in _roots(directory, environ):
        try:
            real_root = os.path.realpath(root, strict=True)
            with os.scandir(real_root) as listing:
                entries = sorted((entry.name, entry) for entry in listing)
        except OSError:
            continue
        # Plain strings, not pathlib, in this loop: it runs for every skill at launch.
        inside = None if top is None else str(top)
        # Without a symlink on the way, a skill's real path is known without resolving it.
        plain_root = inside is None or _inside(real_root, inside)
        for name, entry in entries:
            if name.startswith("."):
                continue
            file = os.path.join(real_root, name, SKILL_FILE)
            try:
                linked = entry.is_symlink()
                if not entry.is_dir():
                    continue
                info = os.lstat(file)
                if linked or not plain_root or stat.S_ISLNK(info.st_mode):
                    real = os.path.realpath(file, strict=True)
                    info = os.stat(real)
                else:
                    real = file
                if not stat.S_ISREG(info.st_mode):
                    continue
            except (OSError, RuntimeError):  # no SKILL.md, a dangling or looping link
                continue
            shown = os.path.join(root, name, SKILL_FILE)
            if inside is not None and not _inside(real, inside):
                problems.append(Problem(shown, f"resolves outside the project: {real}"))
                continue
            parsed = _front(real, info)
            if isinstance(parsed, str):
                problems.append(Problem(shown, parsed))
                continue
            skill_name, description = parsed
            if skill_name not in found:  # the nearest one wins
                scope = "global" if top is None else "project"
                folder = os.path.dirname(real)
                found[skill_name] = Skill(skill_name, description, folder, real, scope)
    frontmatter.flush()
    return [found[name] for name in sorted(found)], problems


def skill_body(skill: Skill) -> str:
    """The instructions of a skill: its SKILL.md after the front matter."""
    try:
        info = os.stat(skill.file)
    except OSError as error:
        raise frontmatter.FrontMatterError(f"cannot be read: {error.strerror}") from None
    if info.st_size > MAX_SKILL_BYTES:
        raise frontmatter.FrontMatterError(f"larger than {MAX_SKILL_BYTES} bytes")
    return frontmatter.read(Path(skill.file))[1].strip()
