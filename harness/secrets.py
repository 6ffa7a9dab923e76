"""Credentials: which values are secret, and their redaction from all harness keeps or shows.

A key reaches text by many routes — a command that prints its environment, a ``.env``
file the model reads, an error message that quotes a header — so redaction is done where
text leaves harness's hands, not where it is made: tool outputs before they are recorded
(and the files under ``tool-output/``), every ledger write, cassettes, the ephemeral
events (``step.request``, deltas), what ``run`` prints, crash files and log lines. Each
occurrence of a known secret's value becomes ``[REDACTED:NAME]``.

Known secrets are the values of the variables harness reads keys from
(``CREDENTIAL_ENV_NAMES``), of any variable whose name says it holds a credential
(``GITHUB_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``*_API_KEY``...), and of names a caller
adds (``refresh_secrets(extra_names)``, for keys configuration points at). Values shorter
than ``MIN_SECRET_LENGTH`` are ignored: redacting a 3-character value would mangle
ordinary output and hide nothing worth hiding.

The set is computed once (on first use, and again by ``refresh_secrets``, which
``open_harness`` calls), so a redaction costs only the substring searches: nothing at
all when no secret is known. Log lines are also masked by shape (``sk-…``, ``ghp_…``,
``github_pat_…``, ``xox?-…``, ``AKIA…``, JWTs, long ``Bearer`` tokens), which would be too
eager for tool output (a test fixture holding a fake token is legitimate content).

What redaction cannot catch: a secret transformed before it is printed (base64, a slice,
reversed). File snapshots (``blobs``) keep a file's exact bytes, compressed, since revert
must restore them.

A command the model runs is untrusted, so it is never handed a credential in the first
place: every subprocess a tool starts gets ``tool_environment()``, the environment minus
every credential variable (the same test, ``is_credential_name``, as for redaction).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The variables harness itself reads provider keys from.
CREDENTIAL_ENV_NAMES: tuple[str, ...] = ("MISTRAL_API_KEY", "OPENAI_API_KEY")
MIN_SECRET_LENGTH = 8

# A variable named like this holds a credential, whoever reads it.
_CREDENTIAL_NAME = re.compile(
    r"(?:^|_)(?:API_?KEY|TOKEN|SECRET|SECRET_KEY|ACCESS_KEY|ACCESS_KEY_ID"
    r"|PRIVATE_KEY|AUTH_TOKEN|CLIENT_SECRET)$|PASSWORD|PASSWD",
    re.IGNORECASE,
)

# Credential shapes for log lines (see the module docstring for why logs only), each with
# a literal that must be present: a substring search is ~40× cheaper than running the
# alternation over every line.
_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (marker, re.compile(pattern))
    for marker, pattern in (
        ("sk-", r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}"),
        ("gh", r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
        ("github_pat_", r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
        ("xox", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
        ("AKIA", r"\bAKIA[A-Z0-9]{16}\b"),
        ("ASIA", r"\bASIA[A-Z0-9]{16}\b"),
        ("eyJ", r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
        ("earer ", r"(?<=[Bb]earer )[A-Za-z0-9._~+/=-]{20,}"),
    )
)
SHAPE_LABEL = "[REDACTED:credential]"


@dataclass(frozen=True, slots=True)
class _Known:
    # (value as it may appear, replacement), longest first so a secret containing another
    # is replaced whole. Each value also appears JSON-escaped when that form differs.
    pairs: tuple[tuple[str, str], ...]
    byte_pairs: tuple[tuple[bytes, bytes], ...]
    longest: int


_EMPTY = _Known((), (), 0)
_known: _Known | None = None


def is_credential_name(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether the variable ``name`` holds a credential (``extra``: names from config)."""
    return (
        name in CREDENTIAL_ENV_NAMES
        or name in set(extra)
        or _CREDENTIAL_NAME.search(name) is not None
    )


def credential_names(
    extra: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> list[str]:
    """The credential variables: the known ones, ``extra``, and those set in ``environ``
    (default ``os.environ``) whose names look like credentials."""
    env = os.environ if environ is None else environ
    extra = tuple(extra)
    names = set(CREDENTIAL_ENV_NAMES) | set(extra)
    names.update(name for name in env if is_credential_name(name, extra))
    return sorted(names)


def tool_environment(
    extra: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment a tool's subprocess gets: ``environ`` without any credential.

    Every credential goes, not only the keys harness reads: a hostile command has no more
    claim to a ``GITHUB_TOKEN`` or a ``DB_PASSWORD`` than to the provider key.
    """
    env = os.environ if environ is None else environ
    secret = set(credential_names(extra, env))
    return {name: value for name, value in env.items() if name not in secret}


def known_secrets(
    environ: Mapping[str, str] | None = None, extra_names: Iterable[str] = ()
) -> dict[str, str]:
    """``{variable name: value}`` of every credential in the environment worth redacting."""
    env = os.environ if environ is None else environ
    extra = set(extra_names)
    found: dict[str, str] = {}
    for name, value in env.items():
        if is_credential_name(name, extra) and len(value) >= MIN_SECRET_LENGTH:
            found[name] = value
    return found


def _build(secrets: Mapping[str, str]) -> _Known:
    pairs: dict[str, str] = {}
    for name, value in secrets.items():
        label = f"[REDACTED:{name}]"
        # As it is, and as JSON writes it inside a string: with non-ASCII kept (the ledger,
        # events) and escaped (log lines, json.dumps's default), the same for ASCII.
        escaped = json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]
        for form in (value, *escaped):
            pairs.setdefault(form, label)
    ordered = tuple(sorted(pairs.items(), key=lambda item: -len(item[0])))
    if not ordered:
        return _EMPTY
    byte_pairs = tuple((v.encode("utf-8"), r.encode("utf-8")) for v, r in ordered)
    return _Known(ordered, byte_pairs, max(len(v) for v, _ in byte_pairs))


def refresh_secrets(
    extra_names: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> None:
    """Read the known secrets again (the environment changed, or config names more)."""
    global _known
    _known = _build(known_secrets(environ, extra_names))


def _current() -> _Known:
    if _known is None:
        refresh_secrets()
    assert _known is not None
    return _known


def has_secrets() -> bool:
    return bool(_current().pairs)


def redact(text: str) -> str:
    """``text`` with each known secret's value replaced by ``[REDACTED:NAME]``."""
    known = _current()
    for value, label in known.pairs:
        if value in text:
            text = text.replace(value, label)
    return text


def secret_start_at_end(text: str) -> int:
    """How many characters at the end of ``text`` could begin a known secret: what a
    stream must hold back until its next piece, so that a secret split across two pieces
    is still redacted (``harness acp``'s live text). 0 when no secret is known."""
    held = 0
    for value, _ in _current().pairs:
        for length in range(min(len(value) - 1, len(text)), held, -1):
            if text.endswith(value[:length]):
                held = length
                break
    return held


def redact_bytes(data: bytes) -> bytes:
    for value, label in _current().byte_pairs:
        if value in data:
            data = data.replace(value, label)
    return data


def redact_data(data: Any) -> Any:
    """A JSON-like value with every string in it redacted (the same object when clean)."""
    if not has_secrets():
        return data
    return _walk(data)


def _walk(data: Any) -> Any:
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, dict):
        return {_walk(k): _walk(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_walk(item) for item in data]
    return data


def redact_log_text(text: str) -> str:
    """Known secrets, then anything shaped like a credential: for log lines."""
    text = redact(text)
    for marker, shape in _SHAPES:
        if marker in text:
            text = shape.sub(SHAPE_LABEL, text)
    return text


_FILE_BLOCK = 1 << 20


def redact_file(path: Path) -> bool:
    """Rewrite a file with every known secret redacted; True when it held one.

    Streams in blocks with an overlap of the longest secret, so a file of any size costs
    one read when it is clean and memory for one block either way.
    """
    known = _current()
    if not known.pairs:
        return False
    overlap = known.longest - 1
    try:
        with path.open("rb") as source:
            tail = b""
            dirty = False
            while block := source.read(_FILE_BLOCK):
                window = tail + block
                if any(value in window for value, _ in known.byte_pairs):
                    dirty = True
                    break
                tail = window[-overlap:] if overlap else b""
        if not dirty:
            return False
        temp = path.with_name(path.name + ".redacting")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with path.open("rb") as source, os.fdopen(fd, "wb") as out:
            pending = b""
            while block := source.read(_FILE_BLOCK):
                window = redact_bytes(pending + block)
                # Hold back what could be the start of a secret cut by the block edge.
                keep = min(overlap, len(window))
                out.write(window[: len(window) - keep])
                pending = window[len(window) - keep :]
            out.write(redact_bytes(pending))
        os.replace(temp, path)
    except OSError:
        return False
    return True


class RedactingStream:
    """A text stream that redacts what is written to it (``run``'s stdout and stderr).

    Everything else (``fileno``, ``isatty``, ``encoding``, ``flush``) is the wrapped
    stream's, so a prompt on a terminal still behaves as one.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(redact(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
