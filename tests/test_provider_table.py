"""The provider table: every model-string kind in one entry, and every user of it agrees."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.cli import _parser
from harness.context.limits import limits_for
from harness.providers import PROVIDERS, create_provider, resolve_model, split_model
from harness.providers.errors import BadRequestError
from harness.providers.scripted import ScriptedProvider
from harness.providers.table import default_prices, model_usage


def test_the_model_help_names_every_kind_of_the_table() -> None:
    # --help cannot import the table (pydantic), so the help text is a copy: kept equal here.
    run = _parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    (model,) = [action for action in run._actions if action.dest == "model"]
    assert model.help == model_usage()
    assert model_usage() == "mistral/<model>, openai/<model>, scripted:<file> or replay:<cassette>"


@pytest.mark.parametrize(
    ("model", "split"),
    [
        ("mistral/devstral-medium-latest", ("mistral", "devstral-medium-latest")),
        ("openai/org/model", ("openai", "org/model")),
        ("scripted:/tmp/s.json", ("scripted", "/tmp/s.json")),
        ("replay:c.jsonl", ("replay", "c.jsonl")),
        ("scripted:", ("scripted", "")),
    ],
)
def test_split_model(model: str, split: tuple[str, str]) -> None:
    assert split_model(model) == split


@pytest.mark.parametrize("model", ["mistral/", "openai", "gpt-4", "anthropic/claude", ""])
def test_an_unknown_model_names_every_kind(model: str) -> None:
    with pytest.raises(BadRequestError, match="use mistral/<model>, openai/<model>, scripted"):
        split_model(model)


def test_resolve_model_makes_only_file_arguments_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_model("scripted:s.json") == f"scripted:{tmp_path / 's.json'}"
    assert resolve_model("replay:~/c.jsonl") == f"replay:{Path.home() / 'c.jsonl'}"
    assert resolve_model("mistral/x") == "mistral/x"
    assert resolve_model("nobody/x") == "nobody/x"  # the daemon says what is wrong with it


def test_limits_and_prices_come_from_the_table() -> None:
    mistral = PROVIDERS["mistral"]
    assert limits_for("mistral/codestral-latest").context == mistral.limits["codestral-latest"][0]
    assert limits_for("mistral/not-listed").context == 32_000  # the conservative default
    # A kind with shared limits is overridden under its name, whatever its argument.
    assert limits_for("scripted:/any/file", {"scripted": (900, 90)}).context == 900
    assert limits_for("replay:/any/file", {"replay": (900, 90)}).context == 32_000
    price = default_prices("mistral").get("mistral/devstral-medium-latest")
    assert price == mistral.prices["devstral-medium-latest"]
    assert default_prices("openai").get("openai/anything") is None


def test_a_new_kind_is_one_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A second scripted prefix, as a named provider from a config file would be added.
    kind = dataclasses.replace(PROVIDERS["scripted"], prefix="canned:")
    monkeypatch.setitem(PROVIDERS, "canned", kind)
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"text": "hi"}]))
    assert split_model(f"canned:{script}") == ("canned", str(script))
    assert isinstance(create_provider(f"canned:{script}"), ScriptedProvider)
    assert "canned:<file>" in model_usage()
    with pytest.raises(BadRequestError, match="canned:<file>"):
        split_model("nobody/x")


def test_a_bad_script_is_a_bad_request(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text("not json")
    with pytest.raises(BadRequestError):
        create_provider(f"scripted:{script}")
