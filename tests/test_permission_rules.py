"""The pure permission rule engine: wildcards, last-match-wins, merging, CLI flags, agents."""

from __future__ import annotations

from typing import Any

import pytest

from harness.agents import AGENTS, UnknownAgentError, get_agent
from harness.messages.model import Rule
from harness.permissions.bash import bash_needs
from harness.permissions.ruleset import (
    DEFAULT_RULES,
    decide,
    decide_need,
    disabled_tools,
    evaluate,
    merge,
    parse_rule_flag,
    permission_for_tool,
)
from harness.permissions.wildcard import could_match, match


def rule(permission: str, pattern: str, action: str) -> Rule:
    return Rule.model_validate({"permission": permission, "pattern": pattern, "action": action})


# --- wildcard ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("*", "", True),
        ("*", "anything/at/all", True),
        ("src/*", "src/a/b.py", True),  # `*` crosses `/`
        ("src/*", "lib/src/a.py", False),  # whole-string match
        ("*.py", "a.pyc", False),
        ("?.py", "a.py", True),
        ("?.py", "ab.py", False),
        ("?.py", ".py", False),
        ("a.b", "axb", False),  # `.` is literal, not a regex
        ("[ab]", "[ab]", True),
        ("(x)+", "(x)+", True),
        ("git status *", "git status", True),  # trailing " *" covers the bare command
        ("git status *", "git status --short", True),
        ("git status *", "git statusx", False),
        ("git *", "git", True),
        ("git *", "gitk", False),
        ("echo *", "echo a\nb", True),  # multi-line commands
        ("Read", "read", False),  # case-sensitive
    ],
)
def test_wildcard(pattern: str, text: str, expected: bool) -> None:
    assert match(pattern, text) is expected


# --- evaluate and merge ------------------------------------------------------------------


def test_last_matching_rule_wins() -> None:
    rules = [rule("bash", "*", "deny"), rule("bash", "git *", "allow"), rule("edit", "*", "deny")]
    assert evaluate("bash", "git log", rules) == ("allow", rules[1])
    assert evaluate("bash", "rm -rf x", rules) == ("deny", rules[0])
    later = [*rules, rule("bash", "git push *", "deny")]
    assert evaluate("bash", "git push origin", later)[0] == "deny"
    assert evaluate("bash", "git pull", later)[0] == "allow"


def test_no_match_asks() -> None:
    assert evaluate("bash", "ls", []) == ("ask", None)
    assert evaluate("websearch", "x", [rule("bash", "*", "allow")]) == ("ask", None)


def test_permission_is_a_wildcard_too() -> None:
    rules = [rule("*", "*", "deny"), rule("todo*", "*", "allow")]
    assert evaluate("todoread", "*", rules)[0] == "allow"
    assert evaluate("read", "a.py", rules)[0] == "deny"


def test_merge_order_session_beats_agent_and_later_allow_beats_earlier_deny() -> None:
    agent = [rule("bash", "*", "allow")]
    config = [rule("bash", "rm *", "deny")]
    session = [rule("bash", "*", "deny")]
    merged = merge(DEFAULT_RULES, agent, config, session)
    assert merged[: len(DEFAULT_RULES)] == list(DEFAULT_RULES)
    assert evaluate("bash", "ls", merged)[0] == "deny"

    approved = [rule("bash", "rm build/*", "allow")]
    merged = merge(DEFAULT_RULES, agent, config, approved)
    assert evaluate("bash", "rm build/x", merged)[0] == "allow"
    assert evaluate("bash", "rm src/x", merged)[0] == "deny"
    assert merge() == []


def test_defaults() -> None:
    for tool in ("read", "glob", "grep", "list", "todoread", "todowrite", "task", "question"):
        assert evaluate(tool, "src/a.py", DEFAULT_RULES)[0] == "allow", tool
    for perm in ("edit", "bash", "webfetch", "external_directory", "doom_loop", "unknown"):
        assert evaluate(perm, "x", DEFAULT_RULES)[0] == "ask", perm


def test_env_files_ask_but_example_is_allowed() -> None:
    assert evaluate("read", "/p/.env", DEFAULT_RULES)[0] == "ask"
    assert evaluate("read", "config/prod.env", DEFAULT_RULES)[0] == "ask"
    assert evaluate("read", "/p/.env.local", DEFAULT_RULES)[0] == "ask"
    assert evaluate("read", "/p/x.env.example", DEFAULT_RULES)[0] == "allow"
    assert evaluate("read", "/p/environment.py", DEFAULT_RULES)[0] == "allow"


# --- CLI flags -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "permission", "pattern"),
    [
        ("bash:git *", "bash", "git *"),
        ("edit", "edit", "*"),
        ("read:src/*", "read", "src/*"),
        ("  bash : ls  ", "bash", "ls"),
        ("bash:echo a:b", "bash", "echo a:b"),  # only the first colon separates
        ("write:docs/*", "edit", "docs/*"),  # write is checked as edit
        ("*", "*", "*"),
    ],
)
def test_parse_rule_flag(text: str, permission: str, pattern: str) -> None:
    assert parse_rule_flag(text, "deny") == rule(permission, pattern, "deny")


@pytest.mark.parametrize("text", ["", "   ", ":git *", "bash:", "bash: ", "my tool:x"])
def test_parse_rule_flag_rejects_bad_input(text: str) -> None:
    with pytest.raises(ValueError, match="rule"):
        parse_rule_flag(text, "allow")


# --- disabled tools ------------------------------------------------------------------------


def test_permission_for_tool() -> None:
    assert [permission_for_tool(t) for t in ("write", "edit", "apply_patch", "bash")] == [
        "edit",
        "edit",
        "edit",
        "bash",
    ]


def test_disabled_tools() -> None:
    tools = ["read", "write", "edit", "bash", "webfetch"]
    assert disabled_tools(tools, DEFAULT_RULES) == set()
    plan = merge(DEFAULT_RULES, get_agent("plan").rules)
    assert disabled_tools(tools, plan) == {"write", "edit", "bash"}
    # A specific allow after the blanket deny keeps the tool usable.
    assert disabled_tools(tools, [*plan, rule("edit", "plans/*", "allow")]) == {"bash"}
    # A deny on one pattern only does not hide the tool.
    assert disabled_tools(["bash"], [rule("bash", "rm *", "deny")]) == set()
    assert disabled_tools(tools, [rule("*", "*", "deny")]) == set(tools)


def test_disabled_tools_kept_per_ruleset_follow_a_changed_rule(monkeypatch: Any) -> None:
    # Kept by the rules' values: the same ruleset again is not matched again, a rule
    # changed in place (a session's PATCH between turns) is, and the answer is a copy.
    from harness.permissions import ruleset

    calls: list[str] = []

    def counted(pattern: str, value: str) -> bool:
        calls.append(value)
        return match(pattern, value)

    monkeypatch.setattr(ruleset, "match", counted)
    tools = ["read", "bash"]
    rules = [rule("bash", "*", "deny")]
    hidden = disabled_tools(tools, rules)
    assert hidden == {"bash"} and calls
    hidden.add("read")
    calls.clear()
    assert disabled_tools(tools, [rule("bash", "*", "deny")]) == {"bash"}
    assert calls == []
    rules[0].action = "allow"
    assert disabled_tools(tools, rules) == set()
    assert calls


# --- agents ----------------------------------------------------------------------------------


def test_agents() -> None:
    assert set(AGENTS) >= {"build", "plan", "general"}
    build = merge(DEFAULT_RULES, get_agent("build").rules)
    assert evaluate("edit", "a.py", build)[0] == "ask"
    assert evaluate("bash", "ls", build)[0] == "ask"
    assert evaluate("read", "a.py", build)[0] == "allow"
    plan = merge(DEFAULT_RULES, get_agent("plan").rules)
    assert evaluate("edit", "a.py", plan)[0] == "deny"
    assert evaluate("bash", "ls", plan)[0] == "deny"
    assert evaluate("webfetch", "https://x", plan)[0] == "ask"
    assert evaluate("grep", "*", plan)[0] == "allow"
    general = get_agent("general")
    assert general.mode == "subagent"
    assert evaluate("todowrite", "*", merge(DEFAULT_RULES, general.rules))[0] == "deny"
    assert get_agent("build").mode == "primary"


def test_unknown_agent() -> None:
    with pytest.raises(UnknownAgentError) as info:
        get_agent("nope")
    assert isinstance(info.value, KeyError)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == "unknown agent 'nope'; available: build, general, plan"


# --- subjects the text cannot pin down (issue 11) ------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "covers", "expected"),
    [
        ("rm *", "rm*", True),
        ("rm *", "*", True),
        ("rm *", "ls*", False),
        ("rm", "rm* x", False),  # `rm $F x` always has the x
        ("git push *", "git*", True),
        ("git push *", "git status*", False),
        ("git push *", "git* --force", True),
        ("?s", "l*", True),
        ("a*b", "*c", False),
        ("", "*", True),
    ],
)
def test_could_match(pattern: str, covers: str, expected: bool) -> None:
    assert could_match(pattern, covers) is expected


def test_an_opaque_subject_meets_every_deny_and_no_allow_but_star() -> None:
    rules = merge(DEFAULT_RULES, [rule("bash", "ls *", "allow"), rule("bash", "rm *", "deny")])
    assert evaluate("bash", "$X v", rules, opaque=True)[0] == "deny"
    rules = merge(DEFAULT_RULES, [rule("bash", "ls *", "allow"), rule("bash", "$X *", "allow")])
    assert evaluate("bash", "$X v", rules, opaque=True)[0] == "ask"
    rules = merge(DEFAULT_RULES, [rule("bash", "*", "allow")])  # `--allow bash`: anything
    assert evaluate("bash", "$X v", rules, opaque=True)[0] == "allow"


def test_covers_lets_deny_rules_see_through_paths_and_holes() -> None:
    rules = merge(DEFAULT_RULES, [rule("bash", "*", "allow"), rule("bash", "rm *", "deny")])
    for line in ["/bin/rm v", "rm $F", "FOO=1 rm v", "git status; rm v"]:
        actions = [decide_need(n, [rules])[0] for n in bash_needs(line)]
        assert "deny" in actions, line
    # Only deny (and ask) rules widen: an allow rule needs the text itself.
    rules = merge(DEFAULT_RULES, [rule("bash", "rm *", "allow")])
    assert [decide_need(n, [rules])[0] for n in bash_needs("/bin/rm v")] == ["ask"]


def test_approvals_never_allow_an_opaque_subject() -> None:
    approvals = [rule("bash", "$X v", "allow")]
    assert decide("bash", "$X v", [DEFAULT_RULES], approvals, opaque=True)[0] == "ask"
