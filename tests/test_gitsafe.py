"""Harness's own git never runs what the repository names, and writes under .git ask."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import Config, open_harness
from harness.gitsafe import filter_drivers, git_output, run_git, run_git_sync
from harness.providers.scripted import ScriptedProvider
from harness.tools.apply_patch import ApplyPatchParams, ApplyPatchTool
from harness.tools.base import ToolContext
from harness.tools.edit import EditParams, EditTool
from harness.tools.write import WriteParams, WriteTool


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def hostile_repo(root: Path) -> tuple[Path, Path]:
    """A repository whose config and attributes name a program at every place git looks."""
    repo = root / "repo"
    repo.mkdir()
    marker = root / "PWNED"
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    (repo / "a.txt").write_text("hello\n")
    (repo / "b.md").write_text("# b\n")
    _git(repo, "add", "a.txt", "b.md")
    _git(repo, "commit", "-qm", "init")
    hook = repo / ".git" / "hooks" / "post-index-change"
    hook.write_text(f"#!/bin/sh\necho hook >> {marker}\n")
    hook.chmod(0o755)
    (repo / ".git" / "config").open("a").write(
        "[core]\n"
        f'\tfsmonitor = "echo fsmonitor >> {marker}; true"\n'
        f'\tpager = "echo pager >> {marker}; cat"\n'
        f"\tsshCommand = \"sh -c 'echo ssh >> {marker}'\"\n"
        "[diff]\n"
        f"\texternal = \"sh -c 'echo extdiff >> {marker}'\"\n"
        '[diff "t"]\n'
        f"\ttextconv = \"sh -c 'echo textconv >> {marker}; cat'\"\n"
        '[filter "x"]\n'
        f"\tclean = \"sh -c 'echo clean >> {marker}; cat'\"\n"
        f"\tsmudge = \"sh -c 'echo smudge >> {marker}; cat'\"\n"
        '[filter "with.dots"]\n'
        f"\tclean = \"sh -c 'echo dotted >> {marker}; cat'\"\n"
        "\trequired = true\n"
    )
    (repo / ".gitattributes").write_text("*.txt filter=x diff=t\n*.md filter=with.dots\n")
    # Stale stat data: status must look at the content, through the clean filter.
    os.utime(repo / "a.txt", (1_000_000_000, 1_000_000_000))
    os.utime(repo / "b.md", (1_000_000_000, 1_000_000_000))
    return repo, marker


def test_the_hostile_repository_does_run_programs_under_plain_git(tmp_path: Path) -> None:
    # The control: without gitsafe the same commands run the repository's programs.
    repo, marker = hostile_repo(tmp_path)
    subprocess.run(["git", "status", "--short"], cwd=repo, capture_output=True, check=True)
    (repo / "a.txt").write_text("changed\n")
    subprocess.run(["git", "diff"], cwd=repo, capture_output=True, check=True)
    ran = set(marker.read_text().split())
    assert {"fsmonitor", "clean", "dotted", "extdiff"} <= ran


async def test_run_git_runs_nothing_the_repository_names(tmp_path: Path) -> None:
    repo, marker = hostile_repo(tmp_path)
    status = await git_output(repo, "status", "--short", "--branch")
    assert status is not None and "## " in status
    assert await git_output(repo, "rev-parse", "--show-toplevel") == f"{repo}\n"
    (repo / "a.txt").write_text("changed\n")
    for args in (("status", "--short"), ("diff",), ("log", "-p", "-1"), ("show",)):
        result = await run_git(repo, *args)
        assert result is not None and result.returncode == 0, (args, result)
    diff = await git_output(repo, "diff")
    assert diff is not None and "+changed" in diff  # the real diff, not the external one
    # A push or fetch would go through ssh: refused before anything is spawned.
    fetch = await run_git(repo, "fetch", "ssh://example.invalid/x")
    assert fetch is not None and fetch.returncode != 0
    assert not marker.exists(), marker.read_text()


async def test_inherited_git_variables_do_not_reach_harness_git(
    tmp_path: Path, monkeypatch: Any
) -> None:
    repo, marker = hostile_repo(tmp_path)
    # GIT_CONFIG_PARAMETERS from a parent process would re-enable what -c turned off.
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.fsmonitor")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", f"echo env >> {marker}; true")
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", f"sh -c 'echo envdiff >> {marker}'")
    (repo / "a.txt").write_text("changed\n")
    assert await git_output(repo, "status", "--short") is not None
    assert await git_output(repo, "diff") is not None
    assert not marker.exists(), marker.read_text()


def test_filter_driver_names_are_read_from_the_listing() -> None:
    listing = "filter.x.clean\nfilter.with.dots.clean\nfilter.With.dots.required\nfilter.x.smudge\n"
    assert filter_drivers(listing) == ["x", "with.dots", "With.dots"]
    assert filter_drivers("core.pager\n") == []


async def test_a_turns_environment_block_runs_nothing(tmp_path: Path) -> None:
    repo, marker = hostile_repo(tmp_path)
    provider = ScriptedProvider.from_turns([{"text": "ok"}], record=True)
    config = Config(
        home=tmp_path / "home",
        model="scripted:x",
        provider_factory=lambda model: provider,
        interactive=False,
    )
    async with open_harness(config) as h:
        session = await h.create_session(repo)
        await h.run(session.id, "hello")
    system = "\n".join(provider.requests[0].system)
    assert "Git repository: yes" in system and "?? .gitattributes" in system
    assert not marker.exists(), marker.read_text()


async def test_a_prefetched_environment_is_the_turns_own_and_runs_git_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prefetch_environment`` (what ``harness run`` starts before opening the harness)
    runs the block's git processes on its own; the turn's call then runs none."""
    import shutil

    import trio

    from harness.context import system

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("a\n")
    calls = tmp_path / "git-calls"
    wrapper = tmp_path / "bin" / "git"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {shutil.which("git")} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(system, "_environment", {})

    reference = await system._environment_block(repo.resolve())  # no cache: the block itself
    each = calls.read_text().count("\n")
    assert each >= 2 and "Git status:" in reference.text
    calls.unlink()

    system.prefetch_environment(repo)
    with trio.fail_after(10):  # it runs with nobody waiting for it
        while not calls.exists() or calls.read_text().count("\n") < each:
            await trio.sleep(0.01)
    assert await system.environment_block(repo.resolve()) == reference
    assert calls.read_text().count("\n") == each  # the turn's call ran no git


# --- writes under .git need git_internal ----------------------------------------------------


def _ctx(root: Path, tmp_path: Path) -> ToolContext:
    return ToolContext("ses", "msg", "call", root, tmp_path / "out")


def _perms(needs: list[Any]) -> list[str]:
    return [need.permission for need in needs]


def test_writing_inside_a_git_directory_needs_git_internal(tmp_path: Path) -> None:
    repo, _ = hostile_repo(tmp_path)
    ctx = _ctx(repo, tmp_path)
    (repo / "link").symlink_to(repo / ".git")
    bare = repo / "vendor.git-store"
    _git(tmp_path, "init", "-q", "--bare", str(bare))
    write = WriteTool()
    for raw in (".git/config", ".GIT/hooks/pre-commit", "link/config", f"{bare}/config", ".git"):
        needs = write.permissions(WriteParams(path=raw, content="x"), ctx)
        assert _perms(needs) == ["edit", "git_internal"], raw
    for raw in ("a.txt", ".gitattributes", ".gitignore", "sub/.github/x"):
        needs = write.permissions(WriteParams(path=raw, content="x"), ctx)
        assert _perms(needs) == ["edit"], raw
    edit = EditTool().permissions(
        EditParams(path=".git/config", old_string="a", new_string="b"), ctx
    )
    assert _perms(edit) == ["edit", "git_internal"]
    patch = "*** Begin Patch\n*** Add File: .git/hooks/post-checkout\n+echo hi\n*** End Patch\n"
    needs = ApplyPatchTool().permissions(ApplyPatchParams(patch=patch), ctx)
    assert _perms(needs) == ["edit", "git_internal"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.pop("MISTRAL_API_KEY", None)
    env["HARNESS_HOME"] = str(tmp_path / "home")
    return env


def _run(tmp_path: Path, repo: Path, turns: list[dict[str, Any]], *flags: str) -> Any:
    script = tmp_path / f"script-{len(list(tmp_path.glob('script-*')))}.json"
    script.write_text(json.dumps(turns))
    argv = ["run", "--model", f"scripted:{script}", "--dir", str(repo), *flags, "go"]
    return subprocess.run(
        [sys.executable, "-m", "harness", *argv],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_allow_edit_deny_bash_cannot_turn_a_write_into_a_command(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    config = repo / ".git" / "config"
    original = config.read_text()
    marker = tmp_path / "PWNED"
    hostile = original + f'[core]\n\tfsmonitor = "echo pwned >> {marker}; true"\n'
    arguments = {"path": ".git/config", "content": hostile}
    write = {"tool_calls": [{"name": "write", "arguments": arguments}]}
    done = {"text": "done"}

    first = _run(tmp_path, repo, [write, done], "--allow", "edit", "--deny", "bash")
    assert first.returncode == 4, first.stderr  # stopped by a denial: no terminal to ask
    assert "git_internal" in first.stderr
    assert config.read_text() == original
    assert not marker.exists()

    # The user does allow it: the write lands, and still no git harness runs obeys it.
    flags = ("--allow", "edit", "--allow", "git_internal", "--deny", "bash")
    second = _run(tmp_path, repo, [write, done], *flags)
    assert second.returncode == 0, second.stderr
    assert "fsmonitor" in config.read_text()
    third = _run(tmp_path, repo, [done], "--deny", "bash")
    assert third.returncode == 0, third.stderr
    assert not marker.exists(), marker.read_text()
    # And the write was what it claimed: plain git does run it.
    subprocess.run(["git", "status"], cwd=repo, capture_output=True, env=_env(tmp_path))
    assert marker.exists()


def test_the_sync_variant_runs_nothing_either(tmp_path: Path) -> None:
    repo, marker = hostile_repo(tmp_path)
    (repo / "a.txt").write_text("changed\n")
    described = run_git_sync(repo, "describe", "--always", "--dirty")
    assert described is not None and described.stdout.strip().endswith("-dirty")
    assert not marker.exists(), marker.read_text()
