"""Import the ``mistralai`` SDK's models without the rest of the SDK (issue 14).

Importing any ``mistralai.client.models`` module first runs ``mistralai/client/__init__``,
which imports the whole client (``Mistral``, its hooks, tracing, configuration): about
0.1 s and 5 MB more than the models themselves, before the first request, for code a
run never calls. Python runs a package's ``__init__`` only when the package is not in
``sys.modules`` yet, so while the models are imported the package is stood in for by a
module made from its own spec and never executed; the stand-in is removed again at once.

What stays true afterwards: the models are the SDK's own classes, in the SDK's own
modules (``mistralai.client.models``, ``.types``, ``.utils``), so requests and chunks are
still typed by them (DESIGN §6). Anyone who later imports ``mistralai.client`` itself gets
the real package: its ``__init__`` runs then and reuses the modules already loaded, so
``mistralai.client.models.X`` is the very class we use (a test holds this). If the SDK
was imported before us, nothing is done.

Measured (mistralai 3.7.0, after harness and httpx are loaded): the full SDK ~190 ms and
7 MB; the models alone ~95 ms and 2.4 MB. The alternatives: validating with the SDK only in
tests (a lighter path at run time) would give up the contract; a pydantic ``TypeAdapter``
still needs the model classes, hence their modules; importing the SDK in a thread while
start-up goes on gains nothing under the GIL, since both are CPU-bound imports.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

PACKAGE = "mistralai.client"


@contextmanager
def models_without_the_client() -> Iterator[None]:
    """Imports made in this block load ``mistralai.client``'s submodules only."""
    if PACKAGE in sys.modules:
        yield
        return
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.submodule_search_locations is None:
        yield  # not installed as expected: the imports fail with Python's own error
        return
    standin = importlib.util.module_from_spec(spec)  # __path__ set, __init__ not run
    sys.modules[PACKAGE] = standin
    try:
        yield
    finally:
        if sys.modules.get(PACKAGE) is standin:
            del sys.modules[PACKAGE]
