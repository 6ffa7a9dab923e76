"""harness.generated_code: dataclasses' generated methods come from a per-machine cache,
identical to what dataclasses compiles itself (each case in fresh interpreters)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

# Classes of every kind dataclasses generates code for, and what their methods look like.
_CLASSES = """
import dataclasses, json, sys
from dataclasses import dataclass, field

@dataclass(slots=True, frozen=True)
class Frozen:
    name: str
    count: int = 0
    tags: tuple[str, ...] = ()

@dataclass(order=True, kw_only=True)
class Ordered:
    rank: int
    items: list[int] = field(default_factory=list)

@dataclass(eq=False, repr=False)
class Plain:
    value: object = None

def consts(code):
    return [consts(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts]

def fingerprint(cls):
    # Every generated method's code, as the interpreter sees it.
    out = {}
    for name, member in sorted(vars(cls).items()):
        code = getattr(member, "__code__", None)
        if code is not None:
            out[name] = [code.co_code.hex(), consts(code), code.co_names,
                         code.co_varnames, code.co_filename, code.co_flags,
                         repr(getattr(member, "__annotations__", None))]
    return out

frozen = Frozen("a", 2)
try:
    frozen.count = 3
    refused = False
except dataclasses.FrozenInstanceError:
    refused = True
checks = [
    repr(frozen), frozen == Frozen("a", 2), hash(frozen) == hash(Frozen("a", 2)), refused,
    Ordered(rank=1) < Ordered(rank=2), Ordered(rank=1).items, Plain() == Plain(),
]
print(json.dumps({
    "fingerprints": {c.__name__: fingerprint(c) for c in (Frozen, Ordered, Plain)},
    "checks": checks,
}))
"""

_WITH_CACHE = """
from harness import generated_code
generated_code.install()
""" + _CLASSES + """
import harness.generated_code as g
print(json.dumps({"compiled": len(g._new)}))
"""


def _run(code: str, cache: Path) -> list[dict[str, object]]:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_cached_methods_are_the_ones_dataclasses_compiles(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (reference,) = _run(_CLASSES, cache)  # no cache at all: dataclasses as shipped
    first, compiled_first = _run(_WITH_CACHE, cache)
    second, compiled_second = _run(_WITH_CACHE, cache)
    assert first == reference and second == reference
    assert reference["checks"] == [
        "Frozen(name='a', count=2, tags=())", True, True, True, True, [], False
    ]
    assert compiled_first["compiled"] > 0  # compiled, then written at exit
    assert compiled_second["compiled"] == 0  # every method came from the file
    files = list((cache / "harness").iterdir())
    assert len(files) == 1 and files[0].name.startswith("generated-code-")
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(files[0].parent.stat().st_mode) == 0o700


def test_an_unreadable_cache_file_is_compiled_afresh_and_replaced(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (reference,) = _run(_CLASSES, cache)
    _run(_WITH_CACHE, cache)
    (path,) = (cache / "harness").iterdir()
    whole = path.read_bytes()
    for junk in (b"", b"\x00garbage", b"\xe3" * 100, whole[:40], whole[: len(whole) // 2]):
        path.write_bytes(junk)
        result, compiled = _run(_WITH_CACHE, cache)
        assert result == reference
        assert compiled["compiled"] > 0
    _, compiled = _run(_WITH_CACHE, cache)
    assert compiled["compiled"] == 0  # the file was written anew


def test_a_cache_file_others_may_write_is_not_trusted(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _run(_WITH_CACHE, cache)
    (path,) = (cache / "harness").iterdir()
    path.chmod(0o666)
    _, compiled = _run(_WITH_CACHE, cache)
    assert compiled["compiled"] > 0  # compiled, not run from that file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # and written anew, private


def test_an_unwritable_cache_directory_is_not_an_error(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.write_text("a file where the directory should be")
    (reference,) = _run(_CLASSES, cache)
    result, compiled = _run(_WITH_CACHE, cache)
    assert result == reference and compiled["compiled"] > 0


def test_harness_run_uses_the_cache(tmp_path: Path, project: Path) -> None:
    from cli_runs import isolated_env, run_harness

    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "ok"}]))
    cache = tmp_path / "cache"
    env = isolated_env(tmp_path, XDG_CACHE_HOME=str(cache))
    run = ["run", "--model", f"scripted:{script}", "--dir", str(project), "hi"]
    assert run_harness(env, *run).stdout.strip() == "ok"
    # written by the first run (beside harness.machine_cache's files)
    (path,) = (cache / "harness").glob("generated-code-*")
    written = path.stat().st_mtime_ns
    assert run_harness(env, *run).stdout.strip() == "ok"
    assert path.stat().st_mtime_ns == written  # the second compiled nothing new


_FORWARD_REFS = """
import json, sys, typing
from harness import generated_code
if sys.argv[1] == "cached":
    generated_code.install()
sources = ["int", "list[str]", "dict[str, typing.Any]", "*Ts", "Optional['X']", "lambda: 1"]
def consts(code):
    return [consts(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts]
codes = []
for source in sources:
    ref = typing.ForwardRef(source)
    code = ref.__forward_code__
    codes.append([code.co_code.hex(), consts(code), code.co_names, code.co_filename,
                  code.co_flags])
value = typing.ForwardRef("dict[str, int]")._evaluate({}, {}, frozenset())
try:
    typing.ForwardRef("1 +")
    error = None
except SyntaxError as exc:
    error = str(exc)
class Typed(typing.TypedDict):
    name: "str"
    count: "list[int]"
print(json.dumps({"codes": codes, "value": repr(value), "error": error,
                  "hints": repr(typing.get_type_hints(Typed)),
                  "compiled": len(generated_code._new)}))
"""


def test_forward_references_compile_from_the_cache_as_the_builtin_compiles_them(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"

    def run(mode: str) -> dict[str, object]:
        env = dict(os.environ, XDG_CACHE_HOME=str(cache))
        done = subprocess.run(
            [sys.executable, "-c", _FORWARD_REFS, mode],
            capture_output=True, text=True, env=env, timeout=60,
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
        return result

    reference = run("builtin")
    first = run("cached")
    second = run("cached")
    for key in ("codes", "value", "error", "hints"):
        assert first[key] == reference[key] and second[key] == reference[key], key
    assert reference["error"] == "Forward reference must be an expression -- got '1 +'"
    assert isinstance(first["compiled"], int) and first["compiled"] >= 8
    assert second["compiled"] == 0  # every expression came from the file


_ATTRS = """
import json, sys
if sys.argv[1] == "cached":
    from harness import install_lean_imports
    install_lean_imports()  # attr._make gets its compile when it loads
import attr
import harness.generated_code as g

@attr.s(hash=True)
class Hashed:
    x = attr.ib()
    y = attr.ib(default=2)

@attr.s(hash=True)
class Empty:  # hash((N,)): a constant tuple
    pass

@attr.s(hash=True, cache_hash=True, frozen=True)
class Cached:
    z = attr.ib()

@attr.define
class Plain:
    w: int = 5

def consts(code):
    return [consts(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts]

out = {}
for cls in (Hashed, Empty, Cached, Plain):
    for name, member in sorted(vars(cls).items()):
        code = getattr(member, "__code__", None)
        if code is not None:
            out[f"{cls.__name__}.{name}"] = [
                code.co_code.hex(), consts(code), code.co_names, code.co_filename,
                code.co_linetable.hex(), code.co_firstlineno,
            ]
checks = [hash(Hashed(1)) == hash(Hashed(1)), hash(Empty()) == hash(Empty()),
          hash(Cached(3)) == hash(Cached(3)), Plain().w, repr(Hashed(1))]
print(json.dumps({"methods": out, "checks": checks, "compiled": len(g._new)}))
"""


def test_attrs_methods_from_the_cache_are_the_ones_attrs_compiles(tmp_path: Path) -> None:
    cache = tmp_path / "cache"

    def run(mode: str, seed: str) -> dict[str, object]:
        # The seed fixes the type hashes attrs puts in __hash__: the same for both modes.
        env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONHASHSEED=seed)
        done = subprocess.run(
            [sys.executable, "-c", _ATTRS, mode], capture_output=True, text=True, env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
        return result

    for seed in ("1", "2", "3"):  # each seed's hashes differ: found in the cache all the same
        reference, cached = run("plain", seed), run("cached", seed)
        assert cached["methods"] == reference["methods"], seed
        assert cached["checks"] == reference["checks"]
    assert run("cached", "3")["compiled"] == 0  # again: every script came from the file


def test_an_attrs_script_that_holds_the_stand_in_number_is_compiled_as_it_is() -> None:
    from harness.generated_code import _AttrsCompile

    def script(number: str, default: str) -> str:
        return (
            f"def __hash__(self):\n    return hash((\n        {number},\n        self.x,\n    ))\n"
            f"def other(self):\n    return {default}\n"
        )

    for number, default in (("1234567", "8888888"), ("-1234567", "-888888"), ("-42", "7")):
        source = script(number, default)
        ours = _AttrsCompile()(source, "<attrs generated methods t.C>", "exec")
        theirs = compile(source, "<attrs generated methods t.C>", "exec")
        for mine, real in zip(ours.co_consts, theirs.co_consts, strict=True):
            if hasattr(real, "co_code"):
                assert mine.co_consts == real.co_consts and mine.co_code == real.co_code
                assert mine.co_linetable == real.co_linetable
            else:
                assert mine == real


_REGEX = """
import json, re, sys
import re._compiler as compiler
from harness import generated_code
generated_code.install()
hook = compiler.compile
assert type(hook).__name__ == "_RegexCompile"
seen = []
def recording(p, flags=0):
    seen.append((p, flags))
    return hook(p, flags)
compiler.compile = recording
import harness.runtime, harness.providers.mistral, httpx, email.parser  # a run's patterns
compiler.compile = hook
patterns = [
    (r"(?P<year>\\d{4})-(?P<month>\\d\\d)", 0), (r"^a.*b$", re.I | re.M | re.S),
    (rb"[\\x00-\\x1f]+", 0), (r"(?x) a  b # comment", 0), (r"(?<=x)y|(?!z)w", 0),
    (r"[\\u00e9\\w]+", re.A), (r"(a)(b)?(?(2)c|d)", 0),
]
checked = 0
for p, flags in seen + patterns:
    ours, theirs = hook(p, flags), hook._original(p, flags)
    assert ours == theirs, p
    same = (ours.flags, ours.groups, ours.groupindex)
    assert same == (theirs.flags, theirs.groups, theirs.groupindex), p
    checked += 1
m = hook(*patterns[0]).match("2026-12")
try:
    hook("(unclosed", 0)
    error = None
except re.error as exc:
    error = str(exc)
print(json.dumps({"checked": checked, "seen": len(seen), "match": m.groupdict(), "error": error,
                  "new": sum(1 for v in generated_code._new.values() if isinstance(v, tuple))}))
"""


def test_regular_expressions_from_the_cache_are_the_ones_re_compiles(tmp_path: Path) -> None:
    cache = tmp_path / "cache"

    def run() -> dict[str, object]:
        env = dict(os.environ, XDG_CACHE_HOME=str(cache))
        done = subprocess.run(
            [sys.executable, "-c", _REGEX], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
        return result

    first, second = run(), run()
    for result in (first, second):
        assert isinstance(result["seen"], int) and result["seen"] >= 50  # the run's own
        assert result["match"] == {"year": "2026", "month": "12"}
        assert result["error"] == "missing ), unterminated subpattern at position 0"
    assert isinstance(first["new"], int) and first["new"] >= 50
    assert second["new"] == 0  # every pattern came from the file, equal to re's own
