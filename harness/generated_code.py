"""The methods ``dataclasses`` generates, compiled once per machine (issue 14).

Every ``@dataclass`` writes the source of its ``__init__``, ``__repr__``, ``__eq__``,
``__hash__`` (and, frozen, ``__setattr__``/``__delattr__``) and compiles it, one
``exec`` per method, each time the class is created. A ``harness run`` creates about 160
dataclasses before its first request (harness's messages, pydantic's, h11's…): 60–80 ms
of compiling, the same source into the same code every time. The same goes for
``attrs`` (Trio's ~50 classes, ~10 ms; the type hash its ``__hash__`` scripts embed,
seeded afresh in each process, is dealt with in ``_AttrsCompile``) and for
``typing.ForwardRef``, which compiles its expression when it is made (~1,150 of them
before the first request, most for pydantic-core's ``TypedDict`` schemas): ``typing``
and ``attr._make`` get a ``compile`` of their own (``_Compile``, ``_AttrsCompile``). And
for ``re``: the ~100 patterns the libraries compile as they load (``_RegexCompile``).

This module keeps the code objects, by their exact source (and file name), in a cache
file as Python keeps a module's bytecode in ``__pycache__``: one file per interpreter
(its cache tag and bytecode magic number in the name), under ``$XDG_CACHE_HOME/harness``
(``~/.cache/harness``). A source found there is not compiled again; one not found is
compiled exactly as the library would have compiled it (same file name, the
``__future__`` flags of the calling code, which the builtin inherits) and the file is
written again at exit. The classes are the libraries' own, built by their own code:
only ``compile`` is skipped. (A machine-wide cache, not ``$HARNESS_HOME``: like
bytecode, it belongs to the interpreter, and is the same for every home.)

It works by giving ``dataclasses`` a module-level ``exec`` of its own, which it finds
before the builtin. Installed by the command
line only (``harness.cli``), like ``harness.lean_imports``. A file that cannot be read
or holds something else is ignored; one that cannot be written is not an error. The
file is trusted as ``__pycache__`` is: it is the user's own, in a directory only they
can enter (0700), and whoever can write there can already run code as them.
"""

from __future__ import annotations
import __future__

import atexit
import builtins
import contextlib
import importlib
import importlib.util
import marshal
import os
import re
import struct
import sys
import types
from pathlib import Path
from typing import Any, TypeGuard

# Entries kept at most: every dataclass of every command and Python tool is a handful of
# methods; far past that, the file starts afresh instead of growing.
MAX_ENTRIES = 20_000
# The file: this tag, the index's size, the index (marshal: digest → (offset, size), the
# offset from the end of the index), the blobs (each one code object, marshalled). Only
# the index is read at start; a code object is read (``pread``) when its class is made,
# so a process never holds more code than it uses, nor all of it at once.
_TAG = b"harness-generated-code-1\n"
_SIZE = struct.Struct("<Q")

# By the digest of (flags, file name, source): a 16-byte key instead of the source.
# Each span as the file has it (offset from the end of the index, size): checked when
# it is used, not all at start (a Python loop over ~3,000 entries was most of install).
_index: dict[bytes, object] = {}
_base = 0  # where the blobs begin in the open file
_fd: int | None = None
# What this process compiled itself, added to the file at exit: code objects, and the
# parts of compiled regular expressions (``_RegexCompile``).
_new: dict[bytes, Any] = {}
_path: Path | None = None


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    tag = sys.implementation.cache_tag or sys.implementation.name
    return Path(base) / "harness" / f"generated-code-{tag}-{importlib.util.MAGIC_NUMBER.hex()}"


def install() -> None:
    """Open the cache and give ``dataclasses`` its ``exec``."""
    global _path, _fd, _base
    if _path is not None:
        return
    try:
        _path = cache_path()
    except (RuntimeError, KeyError):  # no home directory to keep a cache in: compile
        return
    opened = _open(_path)
    if opened is not None:
        _fd, index, _base = opened
        _index.update(index)
    import dataclasses
    import typing

    if "exec" not in vars(dataclasses):
        dataclasses.exec = _Exec(dataclasses)  # type: ignore[attr-defined]
    if "compile" not in vars(typing):
        typing.compile = _Compile()  # type: ignore[attr-defined]
    _install_regex_cache()
    atexit.register(save)


def _open(path: Path) -> tuple[int, dict[bytes, object], int] | None:
    """The file's descriptor, index and blobs' offset; None when it is missing or not ours."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        # Code is run from it: only a file of this user's that no one else may write.
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise ValueError("not this user's own file")
        head = os.pread(fd, len(_TAG) + _SIZE.size, 0)
        if len(head) == len(_TAG) + _SIZE.size and head.startswith(_TAG):
            (size,) = _SIZE.unpack_from(head, len(_TAG))
            index = marshal.loads(os.pread(fd, size, len(head)))
            if isinstance(index, dict):
                return fd, index, len(head) + size
    except (OSError, ValueError, EOFError, TypeError, OverflowError):
        pass
    os.close(fd)
    return None


def _is_span(span: object) -> TypeGuard[tuple[int, int]]:
    # Exact types, no generator: this runs for every look-up (~1,900 a run).
    return (
        type(span) is tuple
        and len(span) == 2
        and type(span[0]) is int
        and type(span[1]) is int
        and span[0] >= 0
        and span[1] >= 0
    )


def _cached(key: bytes) -> types.CodeType | None:
    code = _cached_value(key)
    return code if isinstance(code, types.CodeType) else None


def _cached_value(key: bytes) -> object:
    """What the file holds for ``key`` (the caller checks its type), or None."""
    span = _index.get(key)
    if _fd is None or not _is_span(span):
        return None
    at, size = span
    try:
        return marshal.loads(os.pread(_fd, size, _base + at))
    except (OSError, ValueError, EOFError, TypeError, OverflowError):
        return None


def _blobs(path: Path) -> dict[bytes, bytes]:
    """Every entry of the file as it is now on disk (others may have added some)."""
    opened = _open(path)
    if opened is None:
        return {}
    fd, index, base = opened
    blobs: dict[bytes, bytes] = {}
    try:
        for key, span in index.items():
            if isinstance(key, bytes) and _is_span(span):
                at, size = span
                blob = os.pread(fd, size, base + at)
                if len(blob) == size:
                    blobs[key] = blob
    except (OSError, OverflowError):
        return {}
    finally:
        os.close(fd)
    return blobs


def save() -> None:
    """Add what this process compiled to the file (atomically, 0600); run at exit."""
    if _path is None or not _new:
        return
    from harness.private import open_private, private_dir

    blobs = _blobs(_path)
    if len(blobs) + len(_new) > MAX_ENTRIES:
        blobs = {}
    for key, value in _new.items():
        with contextlib.suppress(ValueError):  # not marshallable: kept in this process only
            blobs[key] = marshal.dumps(value)
    _new.clear()
    index: dict[bytes, tuple[int, int]] = {}
    offset = 0
    for key, blob in blobs.items():
        index[key] = (offset, len(blob))
        offset += len(blob)
    packed = marshal.dumps(index)
    temporary = _path.with_name(f".{_path.name}.{os.getpid()}")
    try:
        private_dir(_path.parent)
        with open_private(temporary, "wb") as out:
            out.write(_TAG + _SIZE.pack(len(packed)) + packed)
            out.writelines(blobs.values())
        os.replace(temporary, _path)
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            temporary.unlink()


# The compiler flags a ``from __future__`` import sets, which ``compile`` and ``exec``
# inherit from the code that calls them.
_FUTURE_FLAGS = 0
for _name in __future__.all_feature_names:
    _FUTURE_FLAGS |= int(getattr(__future__, _name).compiler_flag)


def _callers_flags() -> int:
    """The ``__future__`` flags the builtin would have inherited from our caller's code."""
    return sys._getframe(2).f_code.co_flags & _FUTURE_FLAGS


def _key(source: str, filename: str, flags: int, mode: str) -> bytes:
    # Imported here, not at the top: ``harness.lean_imports`` must be in place first, so
    # that hashlib loads without OpenSSL (see there).
    import hashlib

    # The mode only when it is not "exec" ("eval", "re"): exec code keeps its old keys.
    text = f"{flags}\0{filename}\0{'' if mode == 'exec' else mode + chr(0)}{source}"
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _compiled(source: str, filename: str, flags: int, mode: str = "exec") -> types.CodeType:
    key = _key(source, filename, flags, mode)
    new = _new.get(key)
    code = new if isinstance(new, types.CodeType) else _cached(key)
    if code is None:
        code = builtins.compile(source, filename, mode, flags=flags, dont_inherit=True)
        _new[key] = code  # missing, or unreadable: the file gets it (again) at exit
    return code


class _Exec:
    """``exec`` for ``dataclasses``: a source string runs from its cached code."""

    def __init__(self, module: types.ModuleType) -> None:
        self._globals = vars(module)  # what the builtin would take for globals=None

    def __call__(self, source: Any, globals: Any = None, locals: Any = None) -> None:
        if isinstance(source, str):
            source = _compiled(source, "<string>", _callers_flags())
        builtins.exec(source, self._globals if globals is None else globals, locals)


class _Compile:
    """``compile`` for ``typing``: a forward reference's expression from the cache.

    ``typing.ForwardRef`` compiles its string when it is made, and a run makes ~1,150
    before its first request (pydantic-core's ``TypedDict`` schemas, the annotations
    pydantic evaluates): 13.4 ms of compiling, 8.2 ms from the cache (best of 10 fresh
    interpreters each, the timing's own overhead included in both). What is
    not a plain expression compile (other modes, an AST, flags of its own) goes to the
    builtin as it was asked; a source that does not parse raises as the builtin does.
    """

    def __call__(
        self,
        source: Any,
        filename: Any,
        mode: str,
        flags: int = 0,
        dont_inherit: bool = False,
        optimize: int = -1,
        **options: Any,
    ) -> Any:
        if not dont_inherit:
            flags |= _callers_flags()
        if isinstance(source, str) and isinstance(filename, str) and mode == "eval" and (
            optimize == -1 and not options and not flags & ~_FUTURE_FLAGS
        ):
            return _compiled(source, filename, flags, mode)
        return builtins.compile(source, filename, mode, flags, True, optimize, **options)


# The line of a ``__hash__`` attrs generates that holds the class's own hash: the hash
# of a string, which Python seeds afresh in each process (``attr._make``).
_ATTRS_TYPE_HASH = re.compile(r"(hash\(\(\n +)(-?[0-9]+)(,\n)")


class _AttrsCompile(_Compile):
    """``compile`` for ``attr._make``: a class's methods from the cache.

    attrs compiles one script per class (Trio's ~50 classes: ~10-15 ms before the first
    request), and a ``__hash__`` among them holds the class's type hash, a number that
    differs in every process. Such a script is looked up with that number replaced by
    ``8``s of the same length (every column the code records stays the same; a folded
    ``-123`` spans its sign as ``8888`` does), and the number is put back into the
    code's constants: the code is what compiling the script itself gives. A class seen
    for the first time is compiled for every length a hash can have (1-20 characters),
    so that no later process, drawing other hashes, misses it. A script with more than
    one such line, or where its stand-in occurs anyway, is compiled as it is.
    """

    def __call__(
        self,
        source: Any,
        filename: Any,
        mode: str,
        flags: int = 0,
        dont_inherit: bool = False,
        optimize: int = -1,
        **options: Any,
    ) -> Any:
        if not dont_inherit:
            flags |= _callers_flags()
        plain = isinstance(source, str) and isinstance(filename, str) and mode == "exec"
        if not plain or optimize != -1 or options or flags & ~_FUTURE_FLAGS:
            return builtins.compile(source, filename, mode, flags, True, optimize, **options)
        found = list(_ATTRS_TYPE_HASH.finditer(source))
        if not found:
            return _compiled(source, filename, flags)
        text = found[0].group(2)
        if len(found) > 1 or "8" * len(text) in source:
            return builtins.compile(source, filename, mode, flags, True)
        start, end = found[0].span(2)
        variants = {n: f"{source[:start]}{'8' * n}{source[end:]}" for n in range(1, 21)}
        code = _cached(_key(variants[len(text)], filename, flags, "exec"))
        if code is None:
            for variant in variants.values():
                _compiled(variant, filename, flags)
            code = _compiled(variants[len(text)], filename, flags)
        return _with_constant(code, int("8" * len(text)), int(text))


def _with_constant(code: types.CodeType, old: int, new: int) -> types.CodeType:
    """``code`` with the int constant ``old`` made ``new``, in nested code and tuples."""

    def swap(value: object) -> object:
        if type(value) is int and value == old:
            return new
        if isinstance(value, types.CodeType):
            return _with_constant(value, old, new)
        if type(value) is tuple:
            return tuple(swap(item) for item in value)
        return value

    return code.replace(co_consts=tuple(swap(value) for value in code.co_consts))


def install_attrs(module: types.ModuleType) -> None:
    """Give ``attr._make`` (just loaded) its ``compile``; called by harness.lean_imports."""
    if _path is not None and "compile" not in vars(module):
        vars(module)["compile"] = _AttrsCompile()


def _install_regex_cache() -> None:
    """Give ``re._compiler`` its ``compile`` (CPython 3.11-3.13, where it is the same)."""
    compiler = importlib.import_module("re._compiler")  # no type stubs: a module
    known = sys.version_info < (3, 14) and sys.implementation.name == "cpython"
    parts = ("_parser", "_code", "_sre", "isstring", "SRE_FLAG_DEBUG")
    if (
        known
        and all(hasattr(compiler, name) for name in parts)
        and not isinstance(vars(compiler).get("compile"), _RegexCompile)
    ):
        vars(compiler)["compile"] = _RegexCompile(compiler)


class _RegexCompile:
    """``re``'s compiler: a pattern's code from the cache, not parsed and compiled again.

    A run compiles ~110 regular expressions before its first request (module-level
    ``re.compile`` in the libraries, email's, pydantic's, httpx's…): ~13 ms of parsing
    and code generation in Python, the same every time. What ``re._compiler.compile``
    hands to ``_sre.compile`` (the final flags, the code, the group count and names) is
    kept by the pattern's type, text and flags; a pattern found is made by
    ``_sre.compile`` from exactly those, which checks the code before it takes it. The
    rest is ``re._compiler.compile``'s own steps, unchanged since 3.11 (a test compares
    every pattern with the one ``re`` makes itself).
    """

    def __init__(self, compiler: types.ModuleType) -> None:
        self._compiler = compiler
        self._original = compiler.compile

    def __call__(self, p: Any, flags: int = 0) -> Any:
        compiler = self._compiler
        if not compiler.isstring(p) or flags & compiler.SRE_FLAG_DEBUG:
            return self._original(p, flags)
        text = p if isinstance(p, str) else repr(p)
        key = _key(f"{type(p).__name__}\0{text}", "<regex>", int(flags), "re")
        parts = _new.get(key) or _cached_value(key)
        if _are_regex_parts(parts):
            try:
                return compiler._sre.compile(p, *parts)
            except (RuntimeError, TypeError, ValueError):
                pass  # not code _sre takes: made afresh below
        parsed = compiler._parser.parse(p, flags)
        # Plain ints: the opcodes are an int subclass of re's, which marshal does not take.
        code = [int(word) for word in compiler._code(parsed, flags)]
        groupindex = parsed.state.groupdict
        indexgroup: list[str | None] = [None] * parsed.state.groups
        for name, index in groupindex.items():
            indexgroup[index] = name
        made = (int(flags | parsed.state.flags), code, parsed.state.groups - 1, groupindex)
        parts = (*made, tuple(indexgroup))
        if self._from_a_module_body():
            _new[key] = parts
        return compiler._sre.compile(p, *parts)

    def _from_a_module_body(self) -> bool:
        """Whether ``re`` was called by a module's or a class's body, not a function.

        Those patterns are the module's constants, the same text in every process; a
        function may build its text afresh each time (tokenize's, from a set whose order
        follows the string hash seed), and keeping it would rewrite the file each run.
        """
        package = os.path.dirname(self._compiler.__file__ or "") + os.sep
        frame: types.FrameType | None = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(package):
            frame = frame.f_back
        return frame is not None and not frame.f_code.co_flags & _CO_OPTIMIZED


_CO_OPTIMIZED = 0x0001  # a function's code (inspect.CO_OPTIMIZED); module and class bodies lack it


def _are_regex_parts(parts: object) -> TypeGuard[tuple[Any, ...]]:
    return (
        type(parts) is tuple
        and len(parts) == 5
        and type(parts[0]) is int
        and type(parts[1]) is list
        and type(parts[2]) is int
        and type(parts[3]) is dict
        and type(parts[4]) is tuple
    )
