"""harness's processes start without what its libraries import only for other programs.

Installed by the command line (``harness.cli.main``) before any command runs; a program
that embeds harness keeps its libraries as they are. Measured on a ``harness run``
(issue 14), these are imports no harness process ever uses:

- *structlog* renders tracebacks with ``rich`` (or ``better_exceptions``) and colours
  with ``colorama`` when they are installed; ``rich`` is, for ``harness chat``. harness
  formats exceptions itself (``format_exc_info``) and never colours a log line, yet
  ``structlog.dev`` imported ``rich.traceback`` and with it ``pygments``' lexers: about
  4 MB and 60 modules. structlog already falls back to plain tracebacks when they are
  missing, so while structlog loads they are missing.
- *httpx* imports its command-line client (``httpx._main``) whenever ``click`` is
  installed (it is, for the MCP SDK): ``click``, ``rich``, ``pygments``. Its package
  falls back to a stub ``main`` without them; harness never calls it.
- *structlog* imports ``asyncio`` (29 modules) for its ``async`` logging methods, which
  harness (a Trio program) never calls, and so do the ``mistralai`` SDK's utilities (for
  its client's retries and threads; harness uses only its models). While they load,
  ``asyncio`` is a stand-in that imports the real package on first use, so those
  functions would still work.
- *httpcore* imports ``certifi`` (and ``importlib.resources``) for its default TLS
  context and ``anyio`` for its locks under asyncio: stand-ins until used.
- *pickle* (and ``_compat_pickle``'s tables) for the one exception structlog raises when
  a logger is pickled: ``PicklingError`` comes from ``_pickle``, the same class.
- *ssl* (OpenSSL's TLS state: 2.2 MB, ~10 ms) is imported at module level by Trio,
  httpcore, ``http.client`` and ``urllib.request``, which use it only to make or check
  a TLS connection. A run that never speaks TLS (the scripted model, a local
  ``http://`` server) never needs it; one that does imports it on its first use.
- *hashlib* and *hmac* bind their constructors to OpenSSL's (``_hashlib``) when it loads:
  ``libcrypto`` mapped into the process, 3.4 MB of a run's 53 MB peak RSS (issue 14),
  for a few short SHA-256s (tool-call ids, file snapshots' keys) and ``secrets``'
  ``compare_digest``. While they load ``_hashlib`` is missing, so they use the
  interpreter's own ``_sha256``/``_blake2``/``_md5``… (the same digests; SHA-256 at
  ~200 MB/s instead of ~1.6 GB/s, against the ledger's zlib that is the slower one) and
  ``_operator.compare_digest``. Only OpenSSL-only names (``hashlib.new("ripemd160")``,
  ``scrypt``) are missing; ``ssl``, imported by the first TLS connection, loads OpenSSL
  as always.
- *Trio's thread cache* finds and loads libpthread through ``ctypes`` when it loads
  (``ctypes.util`` runs ``/sbin/ldconfig -p``), to name its worker threads: on Linux
  they are named through ``/proc`` instead (``_ThreadNamesLater``).
- *pydantic* looks for plugins (an ``importlib.metadata`` scan of every installed
  distribution's entry points, 16 more modules) when it builds its first model. harness's
  processes run without pydantic plugins, as ``PYDANTIC_DISABLE_PLUGINS=__all__`` would
  have it, without setting that variable for the commands they run.

And the methods ``dataclasses`` generates for each class come compiled from a cache
(``harness.generated_code``), and the tools' JSON schemas and Mistral's request frames
from another (``harness.machine_cache``).

Each is done only when the module is not loaded yet, and only while its library loads;
anything imported afterwards (``rich`` by ``harness chat``, ``asyncio`` by the MCP SDK,
``ssl`` by the first TLS connection) loads as usual. Another thread importing a
stood-in module meanwhile gets the stand-in, which works; the hidden ones (``rich``,
``click``…) no harness thread imports.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import types
import typing
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from importlib.machinery import ModuleSpec
from typing import TYPE_CHECKING, Any, cast

from harness import generated_code, machine_cache

if TYPE_CHECKING:
    from importlib.abc import Loader  # importlib.abc itself loads importlib.resources

# A library → the optional modules it must not find while its package body runs.
HIDDEN = {
    "structlog": ("rich", "better_exceptions", "colorama"),
    "httpx": ("click", "rich", "pygments"),
    "hashlib": ("_hashlib",),
    "hmac": ("_hashlib",),
}
# A library → the modules it gets as stand-ins that import the real one on first use.
DEFERRED = {
    "structlog": ("asyncio", "pickle"),
    "mistralai.client.utils": ("asyncio",),
    "trio": ("ssl",),
    "httpcore": ("ssl", "certifi", "anyio"),
    "http.client": ("ssl",),
    "urllib.request": ("ssl",),
}
# What a deferred module's importers name in annotations evaluated as they load
# (httpcore/_ssl.py has no ``from __future__ import annotations``): meanwhile, forward
# references; afterwards, asked of the real module like any other name.
ANNOTATED = {"ssl": ("SSLContext",)}
# What a deferred module's importers take from it by name as they load, and where the very
# same object is found without the module: structlog's ``from pickle import
# PicklingError`` (the C accelerator's class, which ``pickle`` itself re-exports).
PROVIDED = {"pickle": {"PicklingError": "_pickle"}}
# pydantic's plugin loader, replaced by one that finds no plugin.
PLUGIN_LOADER = "pydantic.plugin._loader"
# Trio's worker threads, which name their OS threads through ctypes (see _ThreadNamesLater).
THREAD_CACHE = "trio._core._thread_cache"
# attrs' class builder, whose generated methods come compiled from harness.generated_code.
ATTRS_BUILDER = "attr._make"


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent); it leaves when done."""
    if not any(isinstance(finder, _LeanFinder) for finder in sys.meta_path):
        names = (*HIDDEN, *DEFERRED, PLUGIN_LOADER, THREAD_CACHE, ATTRS_BUILDER)
        waiting = {name for name in names if name not in sys.modules}
        if waiting:
            sys.meta_path.insert(0, _LeanFinder(waiting))
    generated_code.install()  # after the finder: its keys are hashed with hashlib
    machine_cache.enable()


class _LeanFinder:
    """Finds nothing itself: wraps the real loader of the few modules named above."""

    def __init__(self, waiting: set[str]) -> None:
        self._waiting = waiting

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> ModuleSpec | None:
        if name not in self._waiting:
            return None
        self._waiting.discard(name)
        if not self._waiting:
            sys.meta_path.remove(self)
        if name == PLUGIN_LOADER:
            return ModuleSpec(name, cast("Loader", _NoPlugins()))
        spec = self._real_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            kinds = {THREAD_CACHE: _ThreadNamesLater, ATTRS_BUILDER: _AttrsBuilder}
            kind = kinds.get(name, _Trimmed)
            trimmed = kind(spec.loader, HIDDEN.get(name, ()), DEFERRED.get(name, ()))
            spec.loader = cast("Loader", trimmed)
        return spec

    def _real_spec(
        self, name: str, path: Sequence[str] | None, target: types.ModuleType | None
    ) -> ModuleSpec | None:
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: ModuleSpec | None = find(name, path, target)
            if spec is not None:
                return spec
        return None


class _Trimmed:
    """The library's own loader, run with some modules hidden or stood in for."""

    def __init__(self, loader: Any, hidden: Sequence[str], deferred: Sequence[str]) -> None:
        self._loader = loader
        self._hidden = hidden
        self._deferred = deferred

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        module: types.ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # The module keeps its real loader (source look-ups, reloads, importlib.resources).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        with ExitStack() as stack:
            for name in self._hidden:
                stack.enter_context(_hidden(name))
            for name in self._deferred:
                stack.enter_context(_stand_in(name))
            self._loader.exec_module(module)


class _AttrsBuilder(_Trimmed):
    """``attr._make``, then its ``compile`` from ``harness.generated_code``."""

    def exec_module(self, module: types.ModuleType) -> None:
        super().exec_module(module)
        generated_code.install_attrs(module)


class _ThreadNamesLater(_Trimmed):
    """Trio's thread cache, naming its threads without ``ctypes``.

    At import it finds libpthread with ``ctypes.util.find_library`` (which runs
    ``/sbin/ldconfig -p``) and loads it with ``ctypes``: ~10 ms of CPU and a subprocess
    before the first request (ctypes alone is ~9 ms), to name its worker threads as the
    OS shows them (``ps -L``, debuggers) while a named job runs. Trio names a thread only
    from within it, and Linux keeps a thread's name in ``/proc/thread-self/comm``, which
    is what glibc's ``pthread_setname_np`` writes for another thread too. While the
    module loads, ``ctypes`` is a stand-in that finds no library; afterwards its
    ``set_os_thread_name`` writes that file (~6 µs, against ~3 µs through ctypes), and
    falls back to Trio's own function with the real ``ctypes`` for anything else.
    """

    def exec_module(self, module: types.ModuleType) -> None:
        if "ctypes" in sys.modules or not sys.platform.startswith("linux"):
            super().exec_module(module)
            return
        with _stand_in("ctypes"), _stand_in("ctypes.util"):
            stand_in = sys.modules["ctypes"]
            util = sys.modules["ctypes.util"]
            vars(stand_in).update(util=util, CDLL=_no_library_loaded)
            vars(util)["find_library"] = _no_library
            super().exec_module(module)
        namer = getattr(module, "get_os_thread_name_func", None)
        if callable(namer) and getattr(module, "set_os_thread_name", 0) is None:
            vars(module)["set_os_thread_name"] = _ThreadNamer(module, namer)
        if getattr(module, "ctypes", None) is stand_in:
            vars(module)["ctypes"] = _Deferred("ctypes")


def _no_library(name: str) -> None:
    return None


def _no_library_loaded(*args: object, **kwargs: object) -> None:
    raise OSError("ctypes is loaded on first use (harness.lean_imports)")


class _ThreadNamer:
    """Trio's ``set_os_thread_name``: the calling thread's name through ``/proc``."""

    def __init__(self, module: types.ModuleType, make: Any) -> None:
        self._module = module
        self._make = make
        self._encode = getattr(module, "_to_os_thread_name", None)

    def __call__(self, ident: int | None, name: str) -> None:
        if ident is None:
            return  # a thread not started yet, which Trio's function leaves unnamed too
        if ident == threading.get_ident() and callable(self._encode):
            try:
                fd = os.open("/proc/thread-self/comm", os.O_WRONLY)
                try:
                    os.write(fd, self._encode(name))
                finally:
                    os.close(fd)
                return
            except OSError:
                pass
        self._through_ctypes()(ident, name)

    def _through_ctypes(self) -> Any:
        """Trio's own function, made with the real ``ctypes`` (as without harness)."""
        import ctypes.util

        vars(self._module)["ctypes"] = ctypes
        real = self._make() or _unnamed
        vars(self._module)["set_os_thread_name"] = real
        return real


def _unnamed(ident: int | None, name: str) -> None:
    return None


@contextmanager
def _hidden(name: str) -> Iterator[None]:
    """``import name`` raises ImportError in this block, unless it is already loaded."""
    if name in sys.modules:
        yield
        return
    sys.modules[name] = None  # type: ignore[assignment]  # the import system's "absent"
    try:
        yield
    finally:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]


class _Deferred(types.ModuleType):
    """Stands in for a module not imported yet: any attribute asked imports the real one."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute == "__path__":
            # Asked by every ``from name import x`` (is it a package?): answering it would
            # import the real module before ``x`` is even looked up among what we hold.
            raise AttributeError(attribute)
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        return getattr(importlib.import_module(name), attribute)


@contextmanager
def _stand_in(name: str) -> Iterator[None]:
    if name in sys.modules:
        yield
        return
    stand_in = _Deferred(name)
    annotated = ANNOTATED.get(name, ())
    for attribute in annotated:
        setattr(stand_in, attribute, typing.ForwardRef(f"{name}.{attribute}"))
    provided = PROVIDED.get(name, {})
    for attribute, source in provided.items():
        setattr(stand_in, attribute, getattr(importlib.import_module(source), attribute))
    sys.modules[name] = stand_in
    try:
        yield
    finally:
        for attribute in (*annotated, *provided):
            vars(stand_in).pop(attribute, None)
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]


class _NoPlugins:
    """The loader of pydantic's plugin loader: a ``get_plugins`` that finds none."""

    def create_module(self, spec: ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        def get_plugins() -> tuple[()]:
            return ()

        module.get_plugins = get_plugins  # type: ignore[attr-defined]
