"""The key a tool's JSON schema is kept under in the machine's cache (issue 14).

A parameter model's schema is a function of its fields (types, defaults, descriptions,
constraints), its docstring and config, the same of every model and enum its fields
name, the code of the modules defining them, and pydantic's version. The key holds all
of it: each field's ``FieldInfo`` as ``repr`` shows it, walked through the annotations
into nested models, and the size and modification time of each module involved (a
tool's module, its base classes', its nested models'), so that editing a description
in a module, or a constant another module puts in one, is a different key. A model
that is not a module's own top-level class (made by ``create_model``, as Python tools
are) has no key and is always built: what defines it is not a file to stat.
"""

from __future__ import annotations

import enum
import hashlib
import sys
import typing
from typing import Any

import pydantic
import pydantic_core
from pydantic import BaseModel

SCHEMA_CACHE = "tool-schemas"


def schema_key(params: type[BaseModel]) -> str | None:
    """The cache key of ``params.model_json_schema()``, or None when it cannot have one."""
    walk = _Walk()
    try:
        described = walk.model(params)
    except _NoKey:
        return None
    files = [getattr(sys.modules.get(name), "__file__", None) for name in sorted(walk.modules)]
    from harness.machine_cache import source_stamp

    stamp = source_stamp(*files)
    if stamp is None:
        return None
    versions = (sys.version, pydantic.VERSION, pydantic_core.__version__)
    text = repr((versions, described, stamp))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class _NoKey(Exception):
    pass


class _Walk:
    def __init__(self) -> None:
        self.modules: set[str] = set()
        self._seen: set[type] = set()

    def _own_class(self, cls: type) -> None:
        module = sys.modules.get(cls.__module__)
        if module is None or getattr(module, cls.__qualname__, None) is not cls:
            raise _NoKey  # not a module's top-level class: nothing on disk defines it
        self.modules.add(cls.__module__)

    def model(self, model: type[BaseModel]) -> object:
        if model in self._seen:
            return model.__qualname__  # a recursive model, described once
        self._seen.add(model)
        self._own_class(model)
        for base in model.__mro__[1:]:
            if base is BaseModel:
                break
            self._own_class(base)
        config = sorted((k, repr(v)) for k, v in model.model_config.items())
        fields = [
            (name, repr(info), self.annotation(info.annotation))
            for name, info in model.model_fields.items()
        ]
        return (f"{model.__module__}.{model.__qualname__}", model.__doc__, config, fields)

    def annotation(self, annotation: Any) -> object:
        if isinstance(annotation, type):
            if issubclass(annotation, BaseModel):
                return self.model(annotation)
            if issubclass(annotation, enum.Enum):
                self._own_class(annotation)
                return (annotation.__qualname__, [(m.name, repr(m.value)) for m in annotation])
            if annotation.__module__ != "builtins" and not _is_library(annotation):
                self._own_class(annotation)  # a class of ours may shape its schema itself
        args = typing.get_args(annotation)
        if args:
            return (repr(typing.get_origin(annotation)), [self.annotation(a) for a in args])
        return repr(annotation)


def _is_library(cls: type) -> bool:
    """A class from the standard library or pydantic: their versions are in the key."""
    root = cls.__module__.partition(".")[0]
    return root in sys.stdlib_module_names or root in ("pydantic", "pydantic_core")
