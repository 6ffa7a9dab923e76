"""Import the ``mistralai`` SDK's models without the rest of the SDK (issue 14).

Importing any ``mistralai.client.models`` module first runs ``mistralai/client/__init__``,
which imports the whole client (``Mistral``, its hooks, tracing, configuration): about
0.1 s and 5 MB more than the models themselves, before the first request, for code a
run never calls. Python runs a package's ``__init__`` only when the package is not in
``sys.modules`` yet, so while the models are imported the package is stood in for by a
module made from its own spec and never executed; the stand-in is removed again at once.

The same is done for two more things the models we use do not need:

- ``mistralai.client.models/__init__``: a 10,000-line table of every model's module, and
  the filter-expression models (``And``, ``Or``, ``Not``, ``LogicalExpression``) built and
  rebuilt eagerly. The provider imports each model from the module that defines it
  (``mistralai.client.models.toolmessage`` …), so the package body is not needed.
- ``httpx2``, the SDK's own HTTP client library, imported by ``utils/serializers`` (which
  every model module uses, for ``validate_const``) only to annotate four helpers with
  ``httpx2.Response``. While the models load, ``httpx2`` is a placeholder whose
  ``Response`` is a forward reference; afterwards the helpers' module sees a proxy that
  imports the real ``httpx2`` on first use, and ``import httpx2`` anywhere gets the real
  package as usual. Any other name asked of the placeholder imports the real package then
  and there, so a newer SDK that used more of it would still load correctly (only slower).

What stays true afterwards: the models are the SDK's own classes, in the SDK's own
modules (``mistralai.client.models.*``, ``.types``, ``.utils``), so requests and chunks are
still typed by them (DESIGN §6). Anyone who later imports ``mistralai.client`` (or its
``models``) gets the real package: its ``__init__`` runs then and reuses the modules
already loaded, so ``mistralai.client.models.X`` is the very class we use (a test holds
this). If the SDK was imported before us, nothing is done.

Measured (mistralai 3.7.0, after harness and httpx are loaded, a loaded 2-core machine):
the full SDK ~190 ms and 7 MB; the models without the client ~150 ms; without the models'
package body and ``httpx2`` too ~110 ms, 2.5 MB less. The alternatives: validating with
the SDK only in tests (a lighter path at run time) would give up the contract; a pydantic
``TypeAdapter`` still needs the model classes, hence their modules; importing the SDK in a
thread while start-up goes on gains nothing under the GIL: start-up is CPU-bound (the main
thread is idle for under 5 ms before the first request).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
import typing
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

PACKAGES = ("mistralai.client", "mistralai.client.models")
HTTP_LIBRARY = "httpx2"
# The SDK module that names HTTP_LIBRARY at import time (annotations only, in 3.7.0).
SERIALIZERS = "mistralai.client.utils.serializers"


@contextmanager
def models_without_the_client() -> Iterator[None]:
    """Imports made in this block load ``mistralai.client``'s submodules only."""
    if PACKAGES[0] in sys.modules:
        yield
        return
    with ExitStack() as stack:
        for name in PACKAGES:
            stack.enter_context(_stand_in_package(name))
        stack.enter_context(_http_library_deferred())
        yield


@contextmanager
def _stand_in_package(name: str) -> Iterator[None]:
    if name in sys.modules:
        yield
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        yield  # not installed as expected: the imports fail with Python's own error
        return
    standin = importlib.util.module_from_spec(spec)  # __path__ set, __init__ not run
    sys.modules[name] = standin
    try:
        yield
    finally:
        if sys.modules.get(name) is standin:
            del sys.modules[name]


class _Placeholder(types.ModuleType):
    """``httpx2`` while the models load: ``Response`` for the annotations, else the real one."""

    Response = typing.ForwardRef(f"{HTTP_LIBRARY}.Response")

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_http_library(), name)


class _Deferred:
    """What ``serializers`` holds afterwards: the real ``httpx2``, imported on first use."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_http_library(), name)


def _real_http_library() -> types.ModuleType:
    module = sys.modules.get(HTTP_LIBRARY)
    if isinstance(module, _Placeholder):
        del sys.modules[HTTP_LIBRARY]
    try:
        return importlib.import_module(HTTP_LIBRARY)
    finally:
        if isinstance(module, _Placeholder) and HTTP_LIBRARY not in sys.modules:
            sys.modules[HTTP_LIBRARY] = module  # the import failed: as before


@contextmanager
def _http_library_deferred() -> Iterator[None]:
    if HTTP_LIBRARY in sys.modules or SERIALIZERS in sys.modules:
        yield
        return
    placeholder = _Placeholder(HTTP_LIBRARY)
    sys.modules[HTTP_LIBRARY] = placeholder
    try:
        yield
    finally:
        if sys.modules.get(HTTP_LIBRARY) is placeholder:
            del sys.modules[HTTP_LIBRARY]
        serializers = sys.modules.get(SERIALIZERS)
        if serializers is not None and getattr(serializers, "httpx", None) is placeholder:
            serializers.httpx = _Deferred()  # type: ignore[attr-defined]
