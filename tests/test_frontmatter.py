"""The front matter reader: its fast path never disagrees with PyYAML's safe_load.

``harness/frontmatter.py`` reads plain ``key: value`` lines itself so that launch does not
import PyYAML; whatever it accepts must mean exactly what PyYAML would make of it, and
whatever it is unsure of must go to PyYAML. Checked on hand-picked traps and on random text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import frontmatter
from harness.frontmatter import FrontMatterError, _fast, parse


def _agrees(head: str) -> None:
    fast = _fast(head)
    if fast is None:
        return
    loaded = yaml.safe_load(head)
    assert fast == ({} if loaded is None else loaded), head  # empty: no keys


TRAPS = [
    "name: x\ndescription: plain words, with commas",
    "on: yes",
    "a: no",
    "a: False",
    "a: TRUE",
    "a: fAlse",
    "tools:\n  write: false\n  bash: On",
    "a:\n  b:\n    c: 1\n  d: 2\ne: 3",
    "a:\n    b: 1\n  c: 2",
    "a: off",
    "a: 1.5",
    "a: 012",
    "a: 0x1f",
    "a: 1_000",
    "a: 1:20",
    "a: 2001-12-14",
    "a: null",
    "a: ~",
    "a: .inf",
    "a: b: c",
    "a: x # comment",
    "a: 'quoted'",
    "a: 'it''s'",
    'a: "esc\\n"',
    "a: &anchor x",
    "a: *alias",
    "a: !!str 5",
    "a: [1, 2]",
    "a: {b: 1}",
    "a: >\n  folded",
    "a: |\n  literal",
    "perm:\n  edit: deny\n  'git *': allow",
    "perm:\n  edit: deny\n   bash: ask",
    "perm:\ntop: 1",
    "a:",
    "a: 1\na: 2",
    "a: x\x85y",
    "a: http://example.com/x",
    "a: tab\there",
    "- a\n- b",
    "'': x",
    "a: <<",
    "<<: x",
    "a: =",
]


@pytest.mark.parametrize("head", TRAPS)
def test_the_fast_path_agrees_with_pyyaml_or_declines(head: str) -> None:
    _agrees(head)


_WORDS = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12
) | st.sampled_from(
    ["yes", "No", "on", "false", "TRUE", "Off", "null", "~", "1", "0", "-1", "1.0", "'a'", '"b"']
)
_INDENT = st.sampled_from(["", " ", "  ", "    "])
_COLON = st.sampled_from([": ", ":", " : ", ""])
_LINE = st.tuples(_INDENT, _WORDS, _COLON, _WORDS).map("".join)


@settings(max_examples=3000, deadline=None)
@given(st.lists(_LINE, max_size=6).map("\n".join))
def test_random_front_matter_agrees_with_pyyaml(head: str) -> None:
    fast = _fast(head)
    if fast is None:
        return
    try:
        expected = yaml.safe_load(head)
    except yaml.YAMLError:
        pytest.fail(f"the fast path accepted what PyYAML refuses: {head!r} -> {fast!r}")
    assert fast == ({} if expected is None else expected), head


# Well-formed-looking block mappings: few keys, indents that may or may not line up.
_STRUCTURED = st.lists(
    st.tuples(
        st.sampled_from(["", "  ", "    ", "   ", "      "]),
        st.sampled_from(["a", "b", "edit", "'*'", '"git *"', "on", "x-y"]),
        st.sampled_from([":", ": deny", ": false", ": 3", ": two words", ": 'q'", ": -", ":x"]),
    ).map("".join),
    max_size=8,
).map("\n".join)


_KEYS = st.sampled_from(["a", "b", "edit", "'*'", '"git *"', "x-y", "tools", "on"])
_LEAVES = st.sampled_from(["deny", "false", "True", "3", "two words", "'q'", "-1", "a:b", "x #y"])
_TREES = st.recursive(
    st.dictionaries(_KEYS, _LEAVES, min_size=1, max_size=3),
    lambda inner: st.dictionaries(_KEYS, _LEAVES | inner, min_size=1, max_size=3),
    max_leaves=10,
)


def _render(tree: dict[str, Any], indent: str = "") -> str:
    lines = []
    for key, value in tree.items():
        if isinstance(value, dict):
            lines += [f"{indent}{key}:", _render(value, indent + "  ")]
        else:
            lines.append(f"{indent}{key}: {value}")
    return "\n".join(lines)


@settings(max_examples=3000, deadline=None)
@given(_STRUCTURED | _TREES.map(_render))
def test_nested_front_matter_agrees_with_pyyaml(head: str) -> None:
    fast = _fast(head)
    if fast is None:
        return
    try:
        expected = yaml.safe_load(head)
    except yaml.YAMLError:
        pytest.fail(f"the fast path accepted what PyYAML refuses: {head!r} -> {fast!r}")
    assert fast == ({} if expected is None else expected), head


def test_split_body_and_errors() -> None:
    assert parse("no front matter\n") == ({}, "no front matter\n")
    assert parse("---\nname: a\n---\nbody\n") == ({"name": "a"}, "body\n")
    assert parse("---\n---\nbody") == ({}, "body")
    with pytest.raises(FrontMatterError, match="never closed"):
        parse("---\nname: a\n")
    with pytest.raises(FrontMatterError, match="not a mapping"):
        parse("---\n- a\n---\n")
    with pytest.raises(FrontMatterError, match="not valid YAML"):
        parse("---\na: [\n---\n")
    with pytest.raises(FrontMatterError, match="not valid YAML"):
        parse("---\na: !!python/object:os.system x\n---\n")  # safe_load: no object tags
    assert frontmatter.split("---x\n") == (None, "---x\n")


def test_plain_front_matter_never_imports_yaml() -> None:
    code = (
        "import sys; from harness.frontmatter import parse;"
        "print(parse('---\\nname: a\\ndescription: b c\\n---\\nx')[0]);"
        "print('yaml' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.splitlines() == ["{'name': 'a', 'description': 'b c'}", "False"]


def test_the_store_spares_a_later_process_the_parsing(tmp_path: Path) -> None:
    project = tmp_path / "project"
    skill = project / ".harness" / "skills" / "a" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("---\nname: a\ndescription: 'first: quoted'\n---\nbody\n")
    store = tmp_path / "home" / "cache" / "front-matter.json"
    code = (
        "import sys; from pathlib import Path; import harness.frontmatter as f;"
        f"f.use_store(Path({str(store)!r})); from harness.skills import discover;"
        f"print(discover(Path({str(project)!r}))[0][0].description, 'yaml' in sys.modules)"
    )

    def describe() -> str:
        env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        return done.stdout.strip()

    assert describe() == "first: quoted False"
    assert store.stat().st_mode & 0o777 == 0o600
    # A later process takes the entry as stored while the file is unchanged...
    saved = json.loads(store.read_text())
    [entry] = saved["entries"].values()
    entry[1]["description"] = "from the store"
    store.write_text(json.dumps(saved))
    assert describe() == "from the store False"
    # ...and parses the file again once it changes; a broken store is only a cache miss.
    skill.write_text("---\nname: a\ndescription: second\n---\nbody\n")
    assert describe() == "second False"
    store.write_text("{not json")
    assert describe() == "second False"
